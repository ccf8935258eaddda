# The image the cluster configs run (infra/kuberay-rayjob.yaml, infra/aws.yaml's docker block): CUDA runtime, the
# project with its pinned torch, Ray, DALI and MLflow, run as a non-root user. `make image` builds it.
# BASE_IMAGE: another Ubuntu 24.04 base where NVIDIA's registry is out of reach (the PyPI torch wheels bring their
# own CUDA libraries; the node's driver comes from the host)
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}
# A PyPI mirror, for builds that cannot reach pypi.org (--build-arg PIP_INDEX_URL=...): set while building only,
# never kept in the image's environment (docker history shows it: a mirror's address, not a secret)
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL

# Python 3.12 from the distribution; a venv keeps pip off the system interpreter (PEP 668). The packages follow
# the base image's release (its security updates), so they are not pinned one by one.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*

# Ray's containers (KubeRay) expect a user with uid 1000; Ubuntu 24.04's images ship one named ubuntu (made here
# on a base without it)
ARG USER=ubuntu
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN (id -u "$USER" >/dev/null 2>&1 || useradd --uid 1000 --create-home "$USER") \
    && python3 -m venv "$VIRTUAL_ENV" && chown -R "$USER" "$VIRTUAL_ENV"
WORKDIR /app
RUN chown "$USER" /app
USER $USER

# dependencies first (a layer kept while only the code changes), then the code
COPY --chown=$USER pyproject.toml README.md ./
RUN mkdir pipeline && touch pipeline/__init__.py \
    && pip install --no-cache-dir -e . \
    && rm -rf pipeline
COPY --chown=$USER pipeline/ pipeline/
COPY --chown=$USER jobs/ jobs/
COPY --chown=$USER conf/ conf/
COPY --chown=$USER infra/ infra/

# Ray's head and dashboard ports (the configs keep the dashboard on loopback or behind the token)
EXPOSE 6379 8265
CMD ["python", "jobs/pretrain.py", "--help"]
