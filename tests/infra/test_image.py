"""The deployable image (Dockerfile, `make image`), where a Docker engine runs and the image is built: it runs as
a user, not root, and a pretraining job runs inside it end to end (its own Ray, generated shards, an MLflow store)
on the CPU. Without an engine, `make image` stops in one line, which is checked everywhere."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("AUGSSL_IMAGE", "augssl:latest")


def _engine() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


def test_make_image_without_an_engine_says_so_in_one_line():
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # an engine that does not answer
    r = subprocess.run(["make", "-s", "image"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[0].startswith("error: make image needs a running")
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("error:")]) == 1, r.stderr


@pytest.fixture(scope="module")
def image() -> str:
    if not _engine():
        pytest.skip("no Docker engine runs here (docker info fails): the image is built with make image elsewhere")
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"no image {IMAGE}: build it first (make image, or set AUGSSL_IMAGE)")
    return IMAGE


def _in(image: str, script: str) -> subprocess.CompletedProcess:
    """`bash -c script` in a fresh container of the image, its stdout and stderr in one stream, in order."""
    return subprocess.run(
        ["docker", "run", "--rm", "--shm-size=1g", image, "bash", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_the_image_runs_a_pretraining_job_as_a_user(image):
    r = _in(
        image,
        "set -e; id -u; python -c 'import ray, mlflow, torch, nvidia.dali, pipeline; print(\"imports\")';"
        " cd /tmp && python /app/jobs/pretrain.py paths.root=/tmp/r data.generate.n_train=128 data.generate.n_val=64"
        " data.generate.maxcount=64 model.width=8 train.batch_size=32 train.epochs=1 eval.knn.every=0"
        " eval.probe.steps=5 gallery.at_pretrain=false",
    )
    assert r.returncode == 0, r.stdout[-4000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "1000" and lines[1] == "imports", r.stdout[-2000:]  # uid 1000, as KubeRay expects
    assert "[train] epoch 1/1 done:" in r.stdout and "Done: run " in r.stdout
    assert "Linear probe on spirograph" in r.stdout


@pytest.mark.slow
def test_the_image_is_a_ray_head_with_token_auth(image):
    """What KubeRay and the launchers start in it: a head with token auth, which takes a job submitted with the token
    and refuses one without it."""
    job = "import ray; ray.init(); print('ON_CLUSTER', ray.cluster_resources()['CPU'])"
    r = _in(
        image,
        "export RAY_AUTH_MODE=token; ray get-auth-token --generate >/dev/null;"
        " ray start --head --dashboard-host 127.0.0.1 --num-cpus 2 --disable-usage-stats >/dev/null 2>&1;"
        f' ray job submit --address http://127.0.0.1:8265 -- python -c "{job}";'
        " mv ~/.ray/auth_token /tmp/elsewhere; echo REFUSED_NEXT;"
        " RAY_AUTH_MODE=disabled ray job submit --address http://127.0.0.1:8265 -- echo ran_without_token; true",
    )
    with_token, _, without = r.stdout.partition("REFUSED_NEXT")
    assert "ON_CLUSTER 2.0" in with_token and "succeeded" in with_token, r.stdout[-3000:]
    assert "Token authentication is enabled" in without and "succeeded" not in without, r.stdout[-3000:]
    assert not any(line.strip() == "ran_without_token" for line in without.splitlines())
