# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
# The interpreter every target runs: .venv's, made on first use; or, once a shell has sourced an offline bundle's
# setup.sh (a node with no network: docs/cluster.md, "Air-gapped nodes"), that node's own Python, and no venv is made.
ifdef AUGSSL_PYTHON
RUN := $(AUGSSL_PYTHON)
STAMP :=
else
RUN := $(VENV_PY)
STAMP := $(VENV)/.installed
endif

.PHONY: demo test test-fast venv clean cluster cluster-stop image mlflow-ui bundle gpu-check

venv: $(STAMP)

# torch/torchvision are pinned in pyproject.toml (PyPI's torchvision only imports beside its own torch).
# detectron2 is not on PyPI: where a folder of wheels holds one (WHEELS), it is installed from there too.
WHEELS ?= ../shared/wheels

ifndef AUGSSL_PYTHON
$(STAMP): pyproject.toml
	test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install -q --upgrade pip
	$(VENV_PY) -m pip install -q -e '.[test,bench]'
	if ls $(WHEELS)/detectron2-*.whl >/dev/null 2>&1; then \
	  $(VENV_PY) -m pip install -q --find-links $(WHEELS) -e '.[test,bench,detectron2]'; fi
	touch $(STAMP)
endif

demo: $(STAMP)
	$(RUN) jobs/pretrain.py

# The whole suite, slow end-to-end runs included (what CI runs). Two pytest-xdist workers, a test file each at a
# time (tests/conftest.py's scheduler: a file's module-scoped Ray cluster or MLflow server stays in one worker,
# tests/infra's shared cluster too): the end-to-end tests wait on process starts and Ray's scheduling much of their
# time, so two overlap well on two cores. XDIST=0 runs the suite in one process.
XDIST ?= 2
test: $(STAMP)
	$(RUN) -m pytest -q -n $(XDIST)

# The fast default while developing: end-to-end runs deselected (on XDIST workers too).
test-fast: $(STAMP)
	$(RUN) -m pytest -q -n $(XDIST) -m "not slow"

# The MLflow UI on this project's store (runs/mlflow.db): prints the command it runs and a link per experiment
# that opens the model-training view (docs/tracking.md). MLFLOW_PORT=5001 for another port.
MLFLOW_PORT ?= 5000
mlflow-ui: $(STAMP)
	$(RUN) -m pipeline.mlflow_ui --runs runs --port $(MLFLOW_PORT)

# A local Ray head whose jobs run in .venv; prints the exports to paste. cluster-stop stops that head alone.
cluster: $(STAMP)
	@bash infra/local_cluster.sh start

cluster-stop:
	@bash infra/local_cluster.sh stop

# The image infra/kuberay-rayjob.yaml and the launcher configs run (Dockerfile), where a Docker engine runs;
# BASE_IMAGE=... replaces NVIDIA's base, DOCKER_FLAGS=... goes to docker build (docs/cluster.md).
IMAGE ?= augssl:latest
image:
	@docker info >/dev/null 2>&1 || { echo "error: make image needs a running Docker engine (docker info fails here)" >&2; exit 2; }
	docker build $(DOCKER_FLAGS) $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) -t $(IMAGE) .

# An offline bundle of the dependencies, for nodes with no network that have a Python and a CUDA torch already
# (docs/cluster.md, "Air-gapped nodes"): PY=3.12 the nodes' Python (default this one), HAS=<their pip freeze>
# (what they have is left out; torch and torchvision always are), EXTRAS=test to carry the test tools, BUNDLE=<folder>.
BUNDLE ?= .bundle
bundle: $(STAMP)
	$(RUN) -m pipeline.bundle $(if $(PY),--python $(PY)) $(foreach f,$(HAS),--has $(f)) \
	  $(if $(EXTRAS),--extras $(EXTRAS)) --out $(BUNDLE)

# On a GPU machine, in one call: pytest -m gpu, benchmarks/gpu and a pretraining run from JPEG shards, each under
# its own time cap, with the logs, the junit XML, performance.md's text and a one-screen summary in OUT (docs/gpu.md).
# Without CUDA it runs what it can (a few minutes) and says what it skipped.
OUT ?= gpu-check
CAPS ?= 200,100,50,190
gpu-check: $(STAMP)
	$(RUN) benchmarks/gpu_check.py --out $(OUT) --caps $(CAPS)

clean:
	rm -rf $(VENV) runs data .pytest_cache
