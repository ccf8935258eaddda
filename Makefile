# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast venv clean cluster cluster-stop image mlflow-ui

venv: $(STAMP)

# torch/torchvision are pinned in pyproject.toml (PyPI's torchvision only imports beside its own torch).
# detectron2 is not on PyPI: where a folder of wheels holds one (WHEELS), it is installed from there too.
WHEELS ?= ../shared/wheels

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	if ls $(WHEELS)/detectron2-*.whl >/dev/null 2>&1; then \
	  $(PY) -m pip install -q --find-links $(WHEELS) -e '.[test,bench,detectron2]'; fi
	touch $(STAMP)

demo: $(STAMP)
	$(PY) jobs/pretrain.py

# The whole suite, slow end-to-end runs included (what CI runs).
test: $(STAMP)
	$(PY) -m pytest -q

# The fast default while developing: end-to-end runs deselected.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# The MLflow UI on this project's store (runs/mlflow.db): prints the command it runs and a link per experiment
# that opens the model-training view (docs/tracking.md). MLFLOW_PORT=5001 for another port.
MLFLOW_PORT ?= 5000
mlflow-ui: $(STAMP)
	$(PY) -m pipeline.mlflow_ui --runs runs --port $(MLFLOW_PORT)

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

clean:
	rm -rf $(VENV) runs data .pytest_cache
