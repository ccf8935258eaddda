"""What the MLflow UI shows of a run (pipeline.mlflow_ui), read back through MlflowClient from a tiny store: the
experiment's kind, the printed links, dataset inputs with digests, system metrics, the description, `make
mlflow-ui`'s lines. The end-to-end runs (tests/test_e2e.py) check the same on a real pretraining run."""

import time
from pathlib import Path

import pytest

from pipeline import mlflow_ui, tracking
from pipeline.data import shards
from pipeline.data.manifest import read_manifest
from pipeline.store import Store


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A config whose store is tmp_path/runs/mlflow.db; MLflow's process-wide URI and run stack put back after."""
    import mlflow
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.setattr(mlflow_uri, "_tracking_uri", mlflow_uri._tracking_uri)
    cfg = {"paths": {"runs": str(tmp_path / "runs")}, "tracking": {"uri": None, "experiment": "augssl"}}
    yield cfg
    while mlflow.active_run():
        mlflow.end_run()


def _split(folder: Path, n: int, seed: int) -> Path:
    samples = ({"__key__": f"{i:04d}", "cls": (i + seed) % 3} for i in range(n))
    shards.write_split(samples, folder, maxcount=4, class_names=None, source={"seed": seed}, progress=False)
    return folder


def test_runs_open_in_a_model_training_experiment_described_by_their_command(store, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    # the process's own command line, set here: under pytest-xdist a worker's argv is execnet's, not pytest's
    monkeypatch.setattr("sys.argv", ["jobs/pretrain.py", "method=simclr", "data.root=/a b"])
    run_id = tracking.start_or_resume(Store.of(store), "k1", "r1", job="pretrain")
    client = MlflowClient()
    exp_id = client.get_run(run_id).info.experiment_id
    assert client.get_experiment(exp_id).tags[mlflow_ui.KIND_TAG] == "custom_model_development"
    note = client.get_run(run_id).data.tags[mlflow_ui.NOTE_TAG]
    assert note == "pretrain: `python jobs/pretrain.py method=simclr 'data.root=/a b'`"  # quoted to paste back
    mlflow.end_run()
    # a kind a user picked in the UI stays
    client.set_experiment_tag(exp_id, mlflow_ui.KIND_TAG, "genai_development")
    tracking.start_child(run_id, "k2", "child", job="knn")
    assert client.get_experiment(exp_id).tags[mlflow_ui.KIND_TAG] == "genai_development"


def test_links_open_the_model_training_view_of_the_run_or_the_experiment():
    base = mlflow_ui.ui_base("sqlite:////tmp/runs/mlflow.db")
    assert (
        mlflow_ui.link(base, "3", "ab12")
        == "http://127.0.0.1:5000/#/experiments/3/runs/ab12?workflowType=machine_learning"
    )
    server = mlflow_ui.ui_base("https://mlflow.example.org/")
    assert mlflow_ui.link(server, "3") == "https://mlflow.example.org/#/experiments/3?workflowType=machine_learning"


def test_the_splits_are_logged_as_dataset_inputs_with_digest_source_and_count(store, tmp_path):
    import mlflow

    cfg = {**store, "data": {"train": str(_split(tmp_path / "a" / "train", 10, 0))}}
    cfg["data"]["val"] = str(_split(tmp_path / "a" / "val", 6, 1))
    other = {**store, "data": {"train": str(_split(tmp_path / "b" / "train", 10, 2)), "val": cfg["data"]["val"]}}
    ids = []
    for c in (cfg, other):
        tracking.start_or_resume(Store.of(c), f"k{len(ids)}", "r", job="pretrain")
        mlflow_ui.log_datasets(c["data"])
        ids.append(tracking.active_run_id())
        mlflow.end_run()
    client = mlflow.MlflowClient()
    inputs = [client.get_run(i).inputs.dataset_inputs for i in ids]
    first = {d.tags[0].value: d.dataset for d in inputs[0]}
    assert sorted(first) == ["training", "validation"]
    train = first["training"]
    assert train.name == "a/train" and train.source_type == "local"
    assert (tmp_path / "a" / "train").as_uri() in train.source
    manifest, _ = read_manifest(tmp_path / "a" / "train")
    assert train.digest == mlflow_ui.split_digest(manifest)[:16]
    assert '"num_samples": 10' in train.profile and '"num_shards": 3' in train.profile
    second = {d.tags[0].value: d.dataset for d in inputs[1]}
    assert second["training"].digest != train.digest  # other data, told apart at a glance
    assert second["validation"].digest == first["validation"].digest


def test_a_dataset_another_run_inserted_first_is_linked_on_retry(store, tmp_path, monkeypatch):
    """Two sweep trials start together and log the same splits: the server's lookup-then-insert lets one of them
    fail on the unique constraint (seen on a cluster sweep). The retry links the dataset the other one inserted;
    any other error is raised as it is."""
    import mlflow
    from mlflow.exceptions import MlflowException

    cfg = {**store, "data": {"train": str(_split(tmp_path / "a" / "train", 10, 0))}}
    real, calls = mlflow.log_inputs, []

    def racing(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            real(**kwargs)  # the other trial's insert
            raise MlflowException("BAD_REQUEST: (sqlite3.IntegrityError) UNIQUE constraint failed: datasets.name")
        return real(**kwargs)

    monkeypatch.setattr(mlflow, "log_inputs", racing)
    tracking.start_or_resume(Store.of(cfg), "race", "r", job="pretrain")
    mlflow_ui.log_datasets(cfg["data"])
    run = mlflow.MlflowClient().get_run(tracking.active_run_id())
    assert len(calls) == 2 and [d.dataset.name for d in run.inputs.dataset_inputs] == ["a/train"]
    monkeypatch.setattr(mlflow, "log_inputs", lambda **kw: (_ for _ in ()).throw(MlflowException("store is down")))
    with pytest.raises(MlflowException, match="store is down"):
        mlflow_ui.log_datasets(cfg["data"])


def test_system_metrics_are_sampled_into_the_run_and_can_be_turned_off(store, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    run_id = tracking.start_or_resume(Store.of(store), "k", "r", job="pretrain")
    uri = tracking.tracking_uri(Store.of(store))
    off = mlflow_ui.start_system_metrics(run_id, uri, None, True, enabled=False)
    assert off is None
    monitor = mlflow_ui.start_system_metrics(run_id, uri, "node1", resume=True)
    time.sleep(1.0)
    monitor.finish()
    keys = set(mlflow.MlflowClient().get_run(run_id).data.metrics)
    assert {"system/node1/cpu_utilization_percentage", "system/node1/system_memory_usage_megabytes"} <= keys


def test_starting_system_metrics_never_waits_for_a_store_that_is_away():
    """Resuming asks the store for the run's last steps; with the store away that would hold the training worker
    for MLflow's retries. It starts on a thread of its own: the call returns at once."""
    from helpers import free_port

    t0 = time.monotonic()
    monitor = mlflow_ui.start_system_metrics("0" * 32, f"http://127.0.0.1:{free_port()}", None, resume=True)
    assert time.monotonic() - t0 < 1.0
    monitor.finish()  # gives up waiting for it after a few seconds


def test_the_description_names_the_command_method_data_and_pictures_then_the_results(tmp_path):
    from pipeline.config import compose_config
    from pipeline.fields import Checked
    from pipeline.sections import Config
    from pipeline.train.artifacts import describe_pretrain
    from pipeline.train.spec import PretrainSpec

    cfg = compose_config(["plugin=[co2]"])
    manifest = {"num_samples": 10, "shards": ["s0.tar"]}
    data = [mlflow_ui.split_dataset(str(tmp_path / "spiro" / "train"), manifest)]
    text = describe_pretrain(PretrainSpec.of(Checked.of(Config, cfg)), data)
    assert "`python " in text and "**method** mocov2, plug-ins: co2" in text
    assert f"spiro/train (10 samples, digest {mlflow_ui.split_digest(manifest)[:16]})" in text
    assert "`gallery/`" in text and "`curves/`" in text and "`probe/`" in text
    probe = {"pretrained": {"r2": 0.81}, "random": {"r2": 0.12}}
    results = mlflow_ui.describe_results({"knn/r2": 0.7, "train/loss": 1.0}, probe, 3.25)
    assert "trained in 3.2 min" in results and "knn/r2 0.7000" in results and "train/loss" not in results
    assert "| pretrained | 0.8100 |" in results and "| random | 0.1200 |" in results


def test_make_mlflow_ui_prints_its_command_and_a_link_per_experiment(store, tmp_path, capsys):
    run_id = tracking.start_or_resume(Store.of(store), "k", "r", job="pretrain")
    from mlflow.tracking import MlflowClient

    exp_id = MlflowClient().get_run(run_id).info.experiment_id
    assert mlflow_ui.main(["--runs", store["paths"]["runs"], "--port", "5001", "--print-only"]) == 0
    lines = capsys.readouterr().out.splitlines()
    db = (tmp_path / "runs" / "mlflow.db").resolve()
    assert lines[0].endswith(f"mlflow ui --backend-store-uri sqlite:///{db} --port 5001")
    assert lines[1:] == [f"  augssl: http://127.0.0.1:5001/#/experiments/{exp_id}?workflowType=machine_learning"]


def test_metric_names_group_by_job_and_tune_reads_them_back_under_its_own():
    reported = ["loss", "epoch_loss", "knn_r2", "knn_r2_m", "time_knn_s", "cocor_target_l2", "minutes"]
    logged = [mlflow_ui.metric_name(k) for k in reported]
    assert logged == [
        "train/loss",
        "train/epoch_loss",
        "knn/r2",
        "knn/r2_m",
        "knn/time_s",
        "train/cocor_target_l2",
        "train/minutes",
    ]
    assert [mlflow_ui.report_name(k) for k in logged] == reported
    probe = ["probe/pretrained_r2_m", "probe/invariance_alpha_reference", "system/cpu_utilization_percentage"]
    assert [mlflow_ui.report_name(k) for k in probe] == [
        "probe_pretrained_r2_m",
        "invariance_alpha_reference",
        "system/cpu_utilization_percentage",
    ]
