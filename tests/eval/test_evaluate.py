"""jobs/evaluate.py: suites of downstream evaluations, picked by the run's method, resumable."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from helpers import HAVE_D2, fake_source, job_env
from pipeline.config import compose_config
from pipeline.eval.suite import SuiteError, check, load_suite, pick, steps, suites

ROOT = Path(__file__).resolve().parents[2]


def test_paper_picks_the_suite_of_the_runs_method():
    assert pick("paper", {"co2": {"alpha": None}}, {}) == "co2"
    assert pick("paper", ["invclr"], {}) == "invclr"
    assert pick("paper", [], {"joint": {"crop": {"beta": 1}, "blur": {"beta": None}}}) == "jointcrop"
    assert pick("paper", [], {"joint": {"crop": {"beta": None}}}) == "standard"
    assert pick("clsa", ["co2"], {}) == "clsa"  # asked for by name


def _cfg(**kw) -> dict:
    return {**compose_config(["run=R", "+suite=standard", *[f"{k}={v}" for k, v in kw.items()]], "evaluate")}


def test_steps_carry_the_run_the_store_the_size_and_extra_arguments():
    cfg = _cfg(size="cpu")
    cfg["extra"] = {"detect": {"device": "cpu", "detect": {"steps": [1, 2], "norm": None}}}
    cfg["skip"] = ["kNN"]
    out = steps(check(cfg), load_suite("standard"))
    assert [n for n, _, _ in out] == ["linear probe", "semi-supervised 1%", "semi-supervised 10%", "detection"]
    name, job, argv = out[-1]
    assert job == "detect" and argv[0] == "run=R"
    assert argv[-5:] == ["engine=detectron2", "detect=shapes", "device=cpu", "detect.steps=[1,2]", "detect.norm=null"]
    assert {f"paths.{k}={v}" for k, v in cfg["paths"].items()} <= set(argv) and "tracking.uri=null" in argv
    cfg["skip"] = ["detections"]
    with pytest.raises(SuiteError, match="'detections' is no step of suite standard"):
        steps(check(cfg), load_suite("standard"))


@pytest.mark.parametrize("name", [s for s in suites() if s != "paper"])
@pytest.mark.parametrize("size", ["cpu", "paper"])
def test_every_step_of_every_suite_composes_and_passes_its_jobs_checks(name, size, monkeypatch):
    """What the suites ship is valid for the job each step runs (up to the run it reads): no typo waits in a
    suite for the one day someone runs it at paper size."""
    if not HAVE_D2:  # the check only asks that detectron2 imports; the suites' settings are checked all the same
        monkeypatch.setitem(sys.modules, "detectron2", types.ModuleType("detectron2"))
    from pipeline.detect.job_errors import DetectError
    from pipeline.eval import EVALUATIONS
    from pipeline.eval.probe.job import split_run
    from pipeline.fields import check_model
    from pipeline.sections import Config

    cfg = _cfg(size=size)
    for step, job, argv in steps(check(cfg), load_suite(name)):
        if job == "linear_probe":
            _, rest = split_run(argv)
            composed = compose_config(rest)
            check_model(Config, composed)  # the typed keys; the run's own sections come in at run time
            continue
        config = {"knn": "knn", "finetune": "finetune", "detect": "detection"}[job]
        if job == "detect" and size == "paper":
            argv = [*argv, "detect.data.root=" + str(ROOT)]  # VOC's files are the user's to give
            with pytest.raises(DetectError, match=f"detect.data.root={ROOT}: no "):
                EVALUATIONS[job]().job(compose_config(argv, config))
            continue
        typed = EVALUATIONS[job]().job(compose_config(argv, config))
        assert typed.source == cfg["run"] and typed.store.runs == cfg["paths"]["runs"]


def _evaluate(tmp_path: Path, *args: str, timeout: int = 900):
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "evaluate.py"), f"paths.root={tmp_path}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=job_env(),
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        ([], "error: pick the evaluations with +suite=<name>: one of clsa, co2"),
        (["+suite=standard", "size=huge"], "error: size=huge: expected one of cpu, paper"),
        (
            ["+suite=standard", "+extra.fit.a=1"],
            "error: extra={'linear_probe': {}, 'knn': {}, 'finetune': {}, 'detect': {}, 'fit': {'a': 1}}: "
            "expected settings under extra.detect, extra.finetune, extra.knn, extra.linear_probe",
        ),
    ],
)
def test_evaluate_refuses_bad_input_in_one_line(tmp_path, args, needle):
    r = _evaluate(tmp_path, "run=x", *args, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith(needle), r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_suite_runs_every_step_into_child_runs_and_an_interrupted_one_resumes(tmp_path):
    import mlflow
    from test_finetune import colour_shards

    root = colour_shards(tmp_path / "shards", {"train": 10, "val": 3})
    cfg = compose_config(
        [
            "data=cifar10",
            f"data.train={root / 'train'}",
            f"data.val={root / 'val'}",
            "data.name=colours",
            "model.width=4",
            f"paths.root={tmp_path}",
            "run.name=colour-run",
            "plugin=[co2]",
        ]
    )
    ckpt = tmp_path / "ckpt" / "state.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save(fake_source("resnet18", True, 4, cfg=cfg).state, ckpt)
    # a pretraining run in the store as jobs/pretrain.py logs one: its checkpoint and config.yaml as artifacts
    # (through a client of its own: mlflow.set_tracking_uri would export the store to every later test's jobs)
    from pipeline import tracking
    from pipeline.config import to_yaml
    from pipeline.store import Store

    store = Store.of(cfg)
    client = mlflow.MlflowClient(tracking.tracking_uri(store))
    exp_id = client.create_experiment("augssl", artifact_location=tracking.artifact_root(store))
    ref = client.create_run(exp_id, run_name="colour-run", tags={"job": "pretrain"}).info.run_id
    client.log_artifact(ref, str(ckpt), "checkpoint")
    client.log_text(ref, to_yaml(cfg), "config.yaml")
    client.set_terminated(ref)
    small = [
        "+extra.linear_probe.eval.probe.steps=5",
        "+extra.finetune.epochs=2",
        "+extra.finetune.milestones=[1]",
        "+extra.finetune.batch_size=8",
    ]
    tiny = [
        "+extra.detect.engine=torchvision",
        "+extra.detect.detect.iterations=2",
        "+extra.detect.detect.steps=[1]",
        "+extra.detect.detect.warmup=1",
        "+extra.detect.detect.batch_size=2",
        "+extra.detect.detect.data.generate.n_train=4",
        "+extra.detect.detect.data.generate.n_val=2",
        "+extra.detect.detect.data.generate.size=64",
        "+extra.detect.detect.min_size=64",
        "+extra.detect.detect.max_size=64",
        "+extra.detect.detect.fpn_channels=8",
    ]
    # a bad value for the last step: refused before the first step runs
    bad = _evaluate(tmp_path, f"run={ref}", "+suite=paper", *small, "+extra.detect.detect.iterations=0", timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr[-3000:]
    assert bad.stderr.startswith("error: step 4/4 (detection): detect.iterations=0: expected an integer >= 1")
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("augssl")
    assert [x.info.run_id for x in client.search_runs([exp.experiment_id])] == [ref]  # nothing but the parent
    # the last step fails when it runs (no CUDA here): the suite stops there, naming it, after three finished steps
    stopped = _evaluate(tmp_path, f"run={ref}", "+suite=paper", *small, *tiny, "+extra.detect.device=cuda")
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1] == (
        "error: step 4/4 (detection) failed: device=cuda: torch sees "
        "no CUDA device here (device=auto picks what there is); "
        "rerun the same command to resume there"
    )
    assert "[evaluate] suite co2 (CO2, Tables 1-3) at size cpu" in stopped.stdout
    r = _evaluate(tmp_path, f"run={ref}", "+suite=paper", *small, *tiny)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count("nothing to run") == 3  # the probe and both fine-tunings are read back
    runs = [x for x in client.search_runs([exp.experiment_id]) if x.info.run_id != ref]
    assert sorted(x.data.tags["job"] for x in runs) == ["detect", "finetune", "finetune", "linear_probe"]
    assert all(x.info.status == "FINISHED" and x.data.tags["mlflow.parentRunId"] == ref for x in runs)
    assert [a.path for a in client.list_artifacts(ref, "evaluate")] == ["evaluate/co2.md"]
    table = (tmp_path / "runs" / "evaluate" / "colour-run-co2.md").read_text()
    assert "| detection | AP |" in table and "| semi-supervised 10% | top1 |" in table
