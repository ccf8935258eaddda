"""The probe that scales: Ray Data feature extraction to disk, MoCo's SGD probe, the streamed kNN, the kNN job."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import encode, fake_source, job_env
from pipeline.data.shards import write_split
from pipeline.eval.knn import knn_metrics, knn_streamed
from pipeline.eval.probe.sgd import SgdSchedule, fit_sgd, score

ROOT = Path(__file__).resolve().parents[2]


def test_streamed_knn_reads_the_bank_in_chunks_and_votes_as_the_in_memory_one():
    g = torch.Generator().manual_seed(0)
    bank, query = torch.randn(300, 16, generator=g), torch.randn(50, 16, generator=g)
    y, qy = torch.randint(0, 7, (300,), generator=g), torch.randint(0, 7, (50,), generator=g)
    whole = knn_metrics(bank, y, query, qy, "classification", k=20, temperature=0.07)
    streamed = knn_streamed(
        bank.numpy(),
        y.numpy(),
        query.numpy(),
        qy.numpy(),
        "classification",
        k=20,
        temperature=0.07,
        num_classes=7,
        chunk=37,
        block=16,
    )
    assert streamed == pytest.approx(whole)
    yr, qyr = torch.randn(300, 2, generator=g), torch.randn(50, 2, generator=g)
    whole = knn_metrics(bank, yr, query, qyr, "regression", k=10, temperature=0.1, names=["a", "b"])
    streamed = knn_streamed(
        bank.numpy(),
        yr.numpy(),
        query.numpy(),
        qyr.numpy(),
        "regression",
        k=10,
        temperature=0.1,
        names=["a", "b"],
        chunk=64,
    )
    assert streamed == pytest.approx(whole, rel=1e-5)


def test_one_full_batch_sgd_epoch_is_one_step_down_the_cross_entropy_gradient():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
    s = SgdSchedule(epochs=1, lr=0.5, milestones=[], gamma=0.1, momentum=0.0, weight_decay=1e-3, batch_size=64)
    head = fit_sgd(x.numpy(), y.numpy(), "classification", 3, s, seed=5)
    torch.manual_seed(5)  # the same initial layer, by hand: N(0, 0.01) weights, zero bias
    lin = torch.nn.Linear(8, 3)
    torch.nn.init.normal_(lin.weight, std=0.01)
    w = lin.weight.detach().clone().requires_grad_(True)
    b = torch.zeros(3, requires_grad=True)
    loss = F.cross_entropy(x @ w.t() + b, y)
    gw, gb = torch.autograd.grad(loss, (w, b))
    assert torch.allclose(head.weight, w - 0.5 * (gw + 1e-3 * w), atol=1e-6)
    assert torch.allclose(head.bias, b - 0.5 * gb, atol=1e-6)


def test_sgd_probe_separates_separable_classes_and_scores_regression_by_hand():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 16, generator=g) * 3
    y = torch.randint(0, 4, (400,), generator=g)
    x = centres[y] + 0.3 * torch.randn(400, 16, generator=g)
    s = SgdSchedule(epochs=10, lr=1.0, milestones=[6, 8], gamma=0.1, momentum=0.9, weight_decay=0.0, batch_size=32)
    head = fit_sgd(x[:300].numpy(), y[:300].numpy(), "classification", 4, s)
    assert score(head, x[300:].numpy(), y[300:].numpy(), "classification")["top1"] > 0.95
    lin = torch.nn.Linear(16, 2)
    t = torch.randn(100, 2, generator=g)
    res = score(lin, x[:100].numpy(), t.numpy(), "regression", ["m", "b"])
    with torch.no_grad():
        err = ((lin(x[:100]) - t) ** 2).mean(0)
    assert res["mse_m"] == pytest.approx(float(err[0]), rel=1e-5) and res["mse"] == pytest.approx(float(err.mean()))
    with pytest.raises(FloatingPointError, match="lower eval.probe.sgd.lr"):
        fit_sgd(
            x.numpy(),
            (t.repeat(4, 1) * 1e6).numpy(),
            "regression",
            2,
            SgdSchedule(epochs=40, lr=1e3, milestones=[], gamma=0.1, momentum=0.9, weight_decay=0.0, batch_size=400),
        )


def _shards(root: Path, n: int, corrupt_at: int | None = None) -> Path:
    """32 px images (no resize in the eval view) of 4 classes; one undecodable JPEG where asked."""
    rng = np.random.default_rng(0)
    samples = [
        {"__key__": f"{i:08d}_s{i}", "png": encode(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)), "cls": i % 4}
        for i in range(n)
    ]
    if corrupt_at is not None:
        samples[corrupt_at] = {"__key__": "broken", "jpg": b"\xff\xd8\xff\xe0 not a jpeg", "cls": 0}
    write_split(iter(samples), root, maxcount=16, class_names=list("abcd"), source="test", progress=False)
    return root


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_extraction_matches_the_in_memory_features_and_is_reused(tmp_path, ray_local):
    from pipeline.data.reader import load_split
    from pipeline.eval.extract import extract_split, load_features
    from pipeline.eval.features import eval_preprocess, extract
    from pipeline.models.backbones import build_backbone

    split = _shards(tmp_path / "train", 50, corrupt_at=7)
    torch.manual_seed(0)
    net = build_backbone({"backbone": "resnet18", "cifar_stem": True, "width": 4}).eval()
    model = {"backbone": "resnet18", "cifar_stem": True, "width": 4}
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    meta = extract_split(
        net.state_dict(),
        model,
        str(split),
        tmp_path / "f",
        32,
        mean,
        std,
        "classification",
        None,
        batch_size=8,
        actors=1,
    )
    assert meta["n"] == 49 and meta["dim"] == net.feat_dim and meta["images_per_s"] > 0
    feat, y = load_features(tmp_path / "f")
    keys = (tmp_path / "f" / "keys.txt").read_text().split()
    assert feat.shape == (49, net.feat_dim) and len(keys) == 49 and "broken" not in keys
    mem = load_split(str(split), "classification")
    ref, kept = extract(net, mem.encoded, eval_preprocess(32, mean, std), batch_size=8)
    order = [keys.index(f"{i:08d}_s{i}") for i in range(50) if i != 7]  # Ray's blocks may arrive in any order
    assert torch.allclose(torch.from_numpy(np.asarray(feat))[order], ref, atol=1e-4)
    assert np.array_equal(np.asarray(y)[order], mem.y[kept])
    # a complete folder is not extracted again (no weights: loading them would fail)
    again = extract_split({}, model, str(split), tmp_path / "f", 32, mean, std, "classification", None)
    assert again == meta


def test_extraction_actors_the_cluster_cannot_place_are_refused_in_one_line(ray_local):
    from pipeline.config import ConfigError
    from pipeline.eval.extract import actor_plan, check_actors

    # a CPU cluster: CPUs only; the custom resources on top
    assert actor_plan(3, {"gpu_node": 0.5}) == (3, {"CPU": 1.0, "gpu_node": 0.5})
    check_actors(3, None)  # one CPU each: 3 fit on this 3-CPU node
    with pytest.raises(ConfigError) as e:
        check_actors(4, None, "eval.probe.")
    msg = str(e.value)
    assert msg.startswith("4 feature-extraction actors x (1 CPU) do not fit") and "room for 3" in msg
    assert "eval.probe.actors and eval.probe.actor_resources" in msg
    with pytest.raises(ConfigError, match="no node offers gpu_node; check actors"):
        check_actors(1, {"gpu_node": 1})
    # the probe's (jobs/linear_probe.py, and pretraining's own probe before its run is made): sgd alone extracts
    from pipeline.eval.probe.compare import check_probe_actors

    spec = _probe_spec(solver="sgd", actors=None, actor_resources={"gpu_node": 1.0})
    assert not spec.autoscale
    with pytest.raises(ConfigError, match="no node offers gpu_node; check eval.probe.actors and eval.probe.actor_"):
        check_probe_actors(spec)
    check_probe_actors(replace(spec, autoscale=True))  # the autoscaler is asked by the pending actors
    check_probe_actors(_probe_spec(solver="lbfgs", actor_resources={"gpu_node": 1.0}))  # in memory: no actors


def _probe_spec(train: Path | None = None, **probe):
    """The probe's spec of the default config, with `probe`'s eval.probe keys and data.train=`train` on top."""
    from pipeline.config import compose_config
    from pipeline.eval.probe.spec import ProbeSpec
    from pipeline.fields import Checked
    from pipeline.sections import Config

    spec = ProbeSpec.of(Checked.of(Config, compose_config()))
    data = spec.data.model_copy(update={"train": str(train)}) if train else spec.data
    return replace(spec, probe=spec.probe.model_copy(update=probe), data=data)


def test_the_probe_picks_its_solver_from_the_split_size(tmp_path):
    from pipeline.eval.probe.compare import probe_solver

    split = _shards(tmp_path / "train", 20)
    assert probe_solver(_probe_spec(split, solver="auto", lbfgs_max=19, train_size=None)) == "sgd"
    assert probe_solver(_probe_spec(split, solver="auto", lbfgs_max=19, train_size=10)) == "lbfgs"
    assert probe_solver(_probe_spec(split, solver="sgd", lbfgs_max=19, train_size=10)) == "sgd"
    assert probe_solver(_probe_spec(split, solver="auto", lbfgs_max=20, train_size=None)) == "lbfgs"


def _job(tmp_path: Path, job: str, *args: str, timeout: int = 600):
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs" / f"{job}.py"), f"paths.root={tmp_path}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=job_env(),
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["k=0"], "error: k=0: expected an integer >= 1"),
        (["temperature=-1"], "error: temperature=-1: expected a number > 0"),
        (["run=nowhere"], "error: checkpoint 'nowhere' is neither a path nor an MLflow run"),
    ],
)
def test_knn_refuses_bad_input_in_one_line(tmp_path, args, needle):
    r = _job(tmp_path, "knn", "run=x", *args, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith(needle), r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_knn_job_and_the_sgd_probe_on_a_checkpoint(tmp_path):
    """The kNN job: both backbones, quiet, a finished run a rerun reads back; the linear probe with solver=sgd
    finds the same extracted features and says which solver it used."""
    import mlflow

    from pipeline.config import compose_config

    train, val = _shards(tmp_path / "d" / "train", 64), _shards(tmp_path / "d" / "val", 24)
    cfg = compose_config(
        [
            "data=cifar10",
            f"data.train={train}",
            f"data.val={val}",
            "data.name=noise",
            "model.width=4",
            f"paths.root={tmp_path}",
            "run.name=noise-run",
        ]
    )
    ckpt = tmp_path / "ckpt" / "state.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save(fake_source("resnet18", True, 4, cfg=cfg).state, ckpt)
    r = _job(tmp_path, "knn", f"run={ckpt}", "k=5", "batch_size=16")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "| pretrained |" in r.stdout and "| random |" in r.stdout and "bank 64, queries 24" in r.stdout
    assert "INFO" not in r.stdout + r.stderr and "Warning" not in r.stderr, r.stderr[-2000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["job"] == "knn"
    assert all(0.0 <= run.data.metrics[f"knn/{b}_top1"] <= 1.0 for b in ("pretrained", "random"))
    assert sorted(d.tags[0].value for d in client.get_run(run.info.run_id).inputs.dataset_inputs) == [
        "training",
        "validation",
    ]
    assert len(list((tmp_path / "runs" / "features").glob("*/meta.json"))) == 4  # 2 backbones x 2 splits
    again = _job(tmp_path, "knn", f"run={ckpt}", "k=5", "batch_size=16", timeout=120)
    assert again.returncode == 0 and "finished before" in again.stdout
    probe = _job(
        tmp_path,
        "linear_probe",
        f"run={ckpt}",
        "eval.probe.solver=sgd",
        "eval.probe.sgd.epochs=3",
        "eval.probe.sgd.milestones=[2]",
        "eval.probe.batch_size=16",
    )
    assert probe.returncode == 0, probe.stderr[-4000:]
    assert "SGD, MoCo's protocol, on features extracted by Ray Data" in probe.stdout
    assert len(list((tmp_path / "runs" / "features").glob("*/meta.json"))) == 4  # the kNN's features, reused
    runs = client.search_runs([run.info.experiment_id], filter_string="tags.job = 'linear_probe'")
    assert runs[0].data.tags["probe_solver"] == "sgd" and "probe/pretrained_top1" in runs[0].data.metrics
    assert sorted(d.tags[0].value for d in client.get_run(runs[0].info.run_id).inputs.dataset_inputs) == [
        "training",
        "validation",
    ]
