"""End-to-end runs of jobs/pretrain.py on a real local Ray cluster, MLflow store and DALI pipeline."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import heavy_imports, probed

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SPIRO = ["data.generate.n_train=512", "data.generate.n_val=128", "data.generate.maxcount=128"]
SMALL = [
    "model.width=8",
    "train.batch_size=64",
    "train.shuffle_buffer=128",
    "eval.knn.bank_size=256",
    "eval.knn.val_size=128",
    "eval.probe.steps=20",
    "eval.probe.train_size=256",
    "eval.probe.val_size=128",
    "tracking.log_every=2",
]


def pretrain(
    root: Path, *overrides: str, check: bool = True, record: Path | None = None
) -> subprocess.CompletedProcess:
    """jobs/pretrain.py on the small Spirograph set unless `overrides` name data; a job past AUGSSL_E2E_TIMEOUT
    seconds (900; make gpu-check sets less) fails the test with the output it had printed, so that a slow step shows."""
    data = [] if any(o.startswith("data=") for o in overrides) else SPIRO
    timeout = float(os.environ.get("AUGSSL_E2E_TIMEOUT", 900))
    try:
        r = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "pretrain.py"), f"paths.root={root}", *data, *SMALL, *overrides],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=probed(job_env(), record) if record else job_env(),
        )
    except subprocess.TimeoutExpired as e:
        said = "\n".join(o.decode(errors="replace") if isinstance(o, bytes) else o or "" for o in (e.stdout, e.stderr))
        raise AssertionError(f"jobs/pretrain.py still running after {timeout:.0f} s; it had printed:\n{said[-4000:]}")
    if check and r.returncode != 0:
        raise AssertionError(f"pretrain failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def job_env() -> dict:
    """The test process's environment minus an MLflow store it may point at: each job uses its own."""
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def mlflow_runs(root: Path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("augssl")
    return client, client.search_runs([exp.experiment_id])


def _autograph_files() -> set[str]:
    import glob
    import tempfile

    return set(glob.glob(os.path.join(tempfile.gettempdir(), "__autograph_generated_file*.py")))


def test_two_workers_dali_views_and_mlflow_contents(tmp_path, monkeypatch):
    from sim_cluster import SimCluster

    pytest.importorskip("nvidia.dali", reason="DALI is not installed (an offline bundle carries it only with --dali)")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "2")  # MLflow's own knob; 10 s by default
    autograph_before = _autograph_files()
    other = SimCluster(head_cpus=0)  # another Ray head on the machine (`make cluster` up, say): not ours to find
    job = (
        "trainer.num_workers=2",
        "augment=mocov2",
        "augment.executor=dali",
        "train.epochs=2",
        "method.queue_size=256",
        "trainer.count_bytes=true",
    )
    try:
        r = pretrain(tmp_path, *job)
    finally:
        other.shutdown()
    assert "Linear probe on spirograph" in r.stdout
    # the console: quiet by default, 1-based epochs, one summary line per epoch, a closing list of what was made
    console = r.stdout + r.stderr
    assert "Exception in thread" not in console and "multiple active Ray instances" not in console
    # captured, so not a terminal: plain lines, no progress-bar redraws kept (they were 909 redraws, 138 KB)
    assert "\r" not in console and max(len(line) for line in console.splitlines()) < 400
    assert len(console.encode()) < 20_000, f"{len(console.encode())} bytes"
    # DALI's conditionals write generated modules to the temp folder: none is left behind
    assert _autograph_files() - autograph_before == set()
    assert "Started a local Ray instance" not in console and "Creating initial MLflow database" not in console
    assert "PreemptionWatcher" not in console  # Train's spot-node watcher: off on a private cluster
    assert "Token authentication" not in console  # Ray's notice of the auth mode it picked
    assert "DeprecationWarning" not in console  # Ray's own (Train's default ingest options set a deprecated one)
    assert "[train] epoch 1/2 done:" in console and "[train] epoch 2/2 done:" in console
    assert "epoch 0/" not in console and "epoch 3/2" not in console
    assert "Done: run " in r.stdout and "probe chart" in r.stdout and "mlflow ui --backend-store-uri" in r.stdout
    client, runs = mlflow_runs(tmp_path)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert p["method.name"] == "mocov2" and p["trainer.num_workers"] == "2" and p["augment.kind"] == "views"
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(loss) >= 3 and all(m.value == m.value for m in loss)  # per-step, finite
    # trainer.count_bytes: one node, two workers, so key_bn=auto shuffles across both with an all-to-all of the
    # dealt views only (at most the local batch's, never the global batch) and their keys back
    m = run.data.metrics
    assert p["method.key_bn"] == "auto" and m["train/comm_grad_all_reduce_bytes"] > 0
    local_batch, view = int(p["train.batch_size"]) // 2, 3 * int(p["data.image_size"]) ** 2 * 4
    calls = 2 if p["method.symmetric"] == "True" else 1  # a symmetric MoCo encodes keys of both views
    assert 0 < m["train/comm_all_to_all_bytes"] <= calls * local_batch * (view + 4 * int(p["method.head.out_dim"]))
    assert len(client.get_metric_history(run.info.run_id, "train/lr")) == len(loss)
    assert len(client.get_metric_history(run.info.run_id, "train/images_per_s")) == len(loss)
    knn = client.get_metric_history(run.info.run_id, "knn/r2")
    assert len(knn) == 2  # one per epoch
    assert {"probe/pretrained_r2_m", "probe/random_r2_m"} <= set(run.data.metrics)
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "checkpoint", "probe", "gallery"} <= arts
    assert run.info.artifact_uri.startswith((tmp_path / "runs" / "mlartifacts").as_uri())  # not ./mlruns
    gallery = client.list_artifacts(run.info.run_id, "gallery")
    assert [a.path for a in gallery] == ["gallery/mocov2-spirograph.png"] and gallery[0].file_size > 10_000
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")] == ["checkpoint/state.pt"]
    # through the client: mlflow.set_tracking_uri would export MLFLOW_TRACKING_URI to later subprocesses
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    (model,) = [m for m in models if m.name == "backbone" and m.source_run_id == run.info.run_id]
    from importlib.metadata import version

    import mlflow.artifacts

    reqs = Path(mlflow.artifacts.download_artifacts(f"{model.artifact_location}/requirements.txt"))
    assert f"torch=={version('torch')}" in reqs.read_text().split()  # pinned to what trained it, not inferred
    _check_the_ui_view(client, run, r.stdout)
    # the two workers ran one DDP group and the views came from DALI
    assert "[train] 2 worker(s)" in r.stdout + r.stderr
    assert "DALI on cpu" in r.stdout + r.stderr
    # the probe's chart is the run's own file
    assert (tmp_path / "runs" / "probe" / f"{run.info.run_name}.png").exists()
    assert not (tmp_path / "runs" / "probe.png").exists()

    # the same command again: the finished run's results in seconds, nothing trained or logged again
    def logged():
        rid = run.info.run_id
        return (
            {k: len(client.get_metric_history(rid, k)) for k in client.get_run(rid).data.metrics},
            sorted(a.path for a in client.list_artifacts(rid)),
            [a.path for a in client.list_artifacts(rid, "probe")],
            len(client.search_logged_models(experiment_ids=[run.info.experiment_id])),
        )

    before = logged()
    again = pretrain(tmp_path, *job, record=tmp_path / "again.imports")
    assert "ray" not in heavy_imports(tmp_path / "again.imports")  # no cluster started (a time bound flakes)
    assert f"finished before (MLflow run {run.info.run_id}" in again.stdout and "r2_m" in again.stdout
    assert logged() == before
    client, runs = mlflow_runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.end_time == run.info.end_time


def _check_the_ui_view(client, run, stdout: str) -> None:
    """What the MLflow UI shows of a finished pretraining run (docs/tracking.md)."""
    rid, exp_id = run.info.run_id, run.info.experiment_id
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"
    link = f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs/{rid}?workflowType=machine_learning"
    assert f"run page   {link}" in stdout and "browse it: make mlflow-ui" in stdout
    inputs = {d.tags[0].value: d.dataset for d in client.get_run(rid).inputs.dataset_inputs}
    assert sorted(inputs) == ["training", "validation"] and inputs["training"].name.endswith("/train")
    assert '"num_samples": 512' in inputs["training"].profile and '"num_samples": 128' in inputs["validation"].profile
    assert len(inputs["training"].digest) == 16 and inputs["training"].digest != inputs["validation"].digest
    assert "system/cpu_utilization_percentage" in run.data.metrics  # sampled on the training node
    note = run.data.tags["mlflow.note.content"]
    assert "jobs/pretrain.py" in note and "**method** mocov2, plug-ins: none" in note and "/train (512 samples" in note
    assert "**Results**" in note and "| pretrained |" in note and "knn/r2" in note
    # params under their config paths; metrics grouped by job, the epoch a metric of its own on the step axis
    groups = {k.split(".")[0] for k in run.data.params if "." in k}
    assert {"method", "augment", "data", "train", "trainer", "optim", "model"} <= groups
    assert {k for k in run.data.params if "." not in k} == {"seed", "verbose"}
    assert {k.split("/")[0] for k in run.data.metrics} == {"train", "knn", "probe", "system"}
    epochs = sorted(client.get_metric_history(rid, "train/epoch"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in epochs] == [(8, 1.0), (16, 2.0)]  # 512 samples / batch 64 = 8 steps an epoch


def _imagefolder(root: Path, n_per_class: int, seed: int) -> Path:
    """Three classes a linear probe can tell apart: red, green or blue dominated noisy JPEGs (~64x48)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(["red", "green", "blue"]):
        (root / name).mkdir(parents=True)
        for i in range(n_per_class):
            img = rng.integers(0, 120, size=(48 + i % 5, 64, 3), dtype=np.uint8)
            img[..., c] += 120
            Image.fromarray(img).save(root / name / f"{i}.jpg", quality=90)
    return root


def test_imagefolder_classification_with_a_corrupt_image_and_probe_by_run_id(tmp_path):
    from pipeline.data.imagefolder import iter_imagefolder
    from pipeline.data.shards import write_split

    src = _imagefolder(tmp_path / "src" / "train", 48, 0)
    _imagefolder(tmp_path / "src" / "val", 16, 1)
    mk = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "make_shards.py"),
            "source=imagefolder",
            f"input={tmp_path / 'src'}",
            f"output={tmp_path / 'shards'}",
            "split=val",
            "maxcount=20",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=job_env(),
    )
    assert mk.returncode == 0, mk.stderr
    # a training split with one undecodable JPEG among the good ones (the writer itself would skip it)
    samples = list(iter_imagefolder(src))
    samples.insert(7, {"__key__": "corrupt", "jpg": b"\xff\xd8\xff\xe0 not really a jpeg", "cls": 0})
    write_split(
        iter(samples),
        tmp_path / "shards" / "train",
        maxcount=40,
        class_names=["blue", "green", "red"],
        source="test",
        progress=False,
    )

    data = [
        "data=cifar10",
        f"data.train={tmp_path / 'shards' / 'train'}",
        f"data.val={tmp_path / 'shards' / 'val'}",
        "data.name=toy",
    ]
    # 145 samples in 5 batches of 29: the corrupt one cannot fall into a dropped remainder. SupCon + CoCor: class
    # labels ride from the shards' cls member through Ray Data into the views' parameters, and CoCor's outer loss is
    # cross-entropy on a class-balanced labelled subset (1 % of 48 per class -> 1 each). Views by the batched
    # executor, on the worker's device (the CPU here), the corrupt JPEG dropped by it.
    r = pretrain(
        tmp_path,
        *data,
        "+experiment=cocor_supcon",
        "train.epochs=1",
        "train.batch_size=29",
        "eval.knn.k=5",
        "augment.executor=batched",
        "plugin.cocor.target_freeze_epochs=0",
        "plugin.cocor.target_warmup_epochs=0",
    )
    client, runs = mlflow_runs(tmp_path)
    run = runs[0]
    assert "[cocor] labelled subset: 3 samples" in r.stdout + r.stderr
    assert "views by BatchedExecutor on cpu" in r.stdout + r.stderr
    outer = client.get_metric_history(run.info.run_id, "train/cocor_outer_loss")
    assert outer and all(0 < m.value < 10 for m in outer)  # cross-entropy over 3 classes
    # the learned targets' per-length curves: they start at Table 9's and stay ordered by length (the network is
    # monotone); the step on two workers (target network and head all-reduced by hand) is tests/plugins/test_cocor.py's
    hist = {
        k: client.get_metric_history(run.info.run_id, f"train/{k}")
        for k in ("cocor_target_l1", "cocor_target_l3", "cocor_sim_l2", "cocor_target_lr")
    }
    assert all(hist.values()), {k: len(v) for k, v in hist.items()}
    assert abs(hist["cocor_target_l1"][0].value - 0.80) < 0.05
    assert all(a.value > b.value for a, b in zip(hist["cocor_target_l1"], hist["cocor_target_l3"]))
    assert max(m.value for m in hist["cocor_target_lr"]) > 0
    assert [a.path for a in client.list_artifacts(run.info.run_id, "curves")] == [f"curves/{run.info.run_name}.png"]
    assert run.data.metrics["train/skipped_images"] == 1.0
    assert 0.0 <= run.data.metrics["knn/top1"] <= 1.0
    assert "probe/pretrained_top1" in run.data.metrics
    assert "skipped 1 undecodable images" in r.stdout + r.stderr

    # probe by run id with no data= on the command line: the run's data, model and image size, into a child run
    (tmp_path / "tmp").mkdir()
    probe = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "linear_probe.py"),
            f"paths.root={tmp_path}",
            f"run={run.info.run_id}",
            "eval.probe.steps=30",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**job_env(), "TMPDIR": str(tmp_path / "tmp")},
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "top1" in probe.stdout
    client, runs = mlflow_runs(tmp_path)
    (child,) = [c for c in runs if c.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert child.info.status == "FINISHED" and "probe/pretrained_top1" in child.data.metrics
    from omegaconf import OmegaConf

    from pipeline.augment.view_makers import eval_settings

    run_cfg = OmegaConf.load(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "dl")))
    size = eval_settings(OmegaConf.to_container(run_cfg.augment, resolve=True))[0]
    assert child.data.params["image_size"] == str(size) and f"at {size} px" in probe.stdout
    assert child.data.params["data.name"] == "toy"
    assert not list(tmp_path.glob("state.pt")) and not list((tmp_path / "tmp").rglob("state.pt"))
    assert (tmp_path / "runs" / "probe" / f"{child.info.run_name}.png").exists()
    assert not (tmp_path / "runs" / "probe.png").exists()
    top1 = {
        ln.split()[0]: [float(x) for x in ln.split()[1:]] for ln in probe.stdout.splitlines() if ln.startswith("top1")
    }["top1"]
    assert top1[0] > 0.9  # colour classes are linearly separable even for a barely trained backbone

    # at once (each is mostly a Python start): a run that does not exist; a bad value on top of the run's config
    # (the schema's one line, and no probe run made); the run's backbone exported as detectron2's .pkl, by run id,
    # into a child run of it
    jobs = {
        "no run": ["linear_probe.py", "run=no-such-run"],
        "bad value": ["linear_probe.py", f"eval.probe.checkpoint={run.info.run_id}", "eval.probe.steps=-3"],
        "export": ["export.py", f"run={run.info.run_id}"],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "jobs" / script), f"paths.root={tmp_path}", *args],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=job_env(),
        )
        for name, (script, *args) in jobs.items()
    }
    done = {name: (*p.communicate(timeout=300), p.returncode) for name, p in procs.items()}
    _, err, rc = done["no run"]
    assert rc == 2 and err.strip().startswith("error:") and len(err.strip().splitlines()) == 1, err[-2000:]
    _, err, rc = done["bad value"]
    assert rc == 2 and err.strip().startswith("error: eval.probe.steps") and len(err.strip().splitlines()) == 1, err
    probes = [c for c in mlflow_runs(tmp_path)[1] if c.data.tags.get("job") == "linear_probe"]
    assert len(probes) == 1  # the one above
    out, err, rc = done["export"]
    assert rc == 0, err[-3000:]
    pkl = tmp_path / "runs" / "export" / f"{run.info.run_name}.pkl"
    assert pkl.exists() and str(pkl) in out
    client, runs = mlflow_runs(tmp_path)
    (child,) = [c for c in runs if c.data.tags.get("job") == "export"]
    assert child.data.tags["mlflow.parentRunId"] == run.info.run_id and child.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(child.info.run_id, "export")] == [f"export/{pkl.name}"]
