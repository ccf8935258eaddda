"""Ray Tune sweeps: the search space, the checks before any trial, the report, and end to end (ASHA stopping a
trial, the MLflow parent/child tree, a finished rerun, resume after the driver is killed)."""

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import heavy_imports, probed, refusals
from pipeline.config import CONF_DIR, ConfigError, compose_config
from pipeline.fields import Checked
from pipeline.tune import report
from pipeline.tune.settings import SweepConfig, check_sweep, compose_sweep, sweep_argv
from pipeline.tune.settings import sweep_name as _sweep_name
from pipeline.tune.space import (
    Dim,
    num_trials,
    override,
    parse_space,
    reported_metrics,
    searched,
    to_tune,
    with_seeds,
)

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))


def sweep_name(cfg: dict) -> str:
    """The name jobs/tune.py gives the sweep of a composed sweep config."""
    return _sweep_name(Checked.of(SweepConfig, cfg))


# ----------------------------------------------------------------------------- the space


def test_parse_space_reads_every_kind_in_order():
    dims = parse_space(
        {
            "a.b": {"grid": [0, 1e-3], "log": True},
            "c": {"choice": ["x", "y"]},
            "d": {"uniform": [0.1, 0.5]},
            "e": {"loguniform": [1e-4, 1e-1]},
        }
    )
    assert [(d.key, d.kind, d.values, d.log) for d in dims] == [
        ("a.b", "grid", (0, 1e-3), True),
        ("c", "choice", ("x", "y"), False),
        ("d", "uniform", (0.1, 0.5), False),
        ("e", "loguniform", (1e-4, 1e-1), True),
    ]


@pytest.mark.parametrize(
    "space, words",
    [
        ({}, "expected a mapping"),
        ({"k": {"grid": []}}, "an empty search range"),
        ({"k": {"uniform": [1.0, 1.0]}}, "an empty search range; expected lo < hi"),
        ({"k": {"uniform": [2.0, 1.0]}}, "an empty search range"),
        ({"k": {"loguniform": [0.0, 1.0]}}, "0 < lo < hi"),
        ({"k": {"uniform": [1.0]}}, "expected [lo, hi]"),
        ({"k": {"grid": [1], "choice": [2]}}, "exactly one of"),
        ({"k": {"range": [1, 2]}}, "exactly one of"),
        ({"k": [1, 2]}, "exactly one of"),
        ({"k": {"grid": [1, 1]}}, "appears twice"),
        ({"k": {"grid": [-1, 1], "log": True}}, "numbers >= 0"),
        ({"k": {"grid": [1, 2], "log": "yes"}}, "expected true or false"),
    ],
)
def test_bad_space_specs_fail_in_one_line_naming_the_key(space, words):
    with pytest.raises(ConfigError) as e:
        parse_space(space)
    assert words in str(e.value) and "\n" not in str(e.value)
    if space:
        assert str(e.value).startswith("sweep.space.k")


def test_to_tune_builds_the_searchers_own_objects():
    from ray.tune.search.sample import Categorical, Float

    space = to_tune(
        parse_space(
            {
                "a": {"grid": [1, 2]},
                "b": {"choice": [3, 4]},
                "c": {"uniform": [0.0, 1.0]},
                "d": {"loguniform": [1e-3, 1.0]},
            }
        )
    )
    assert space["a"] == {"grid_search": [1, 2]}
    assert isinstance(space["b"], Categorical) and space["b"].categories == [3, 4]
    assert isinstance(space["c"], Float) and (space["c"].lower, space["c"].upper) == (0.0, 1.0)
    assert isinstance(space["d"].get_sampler(), Float._LogUniform)


def test_trial_counts_follow_tunes_rule():
    dims = parse_space({"a": {"grid": [1, 2, 3]}, "b": {"grid": [4, 5]}, "c": {"uniform": [0.0, 1.0]}})
    assert num_trials(dims, 1) == 6 and num_trials(dims, 3) == 18
    assert num_trials(parse_space({"c": {"uniform": [0.0, 1.0]}}), 5) == 5


@pytest.mark.parametrize(
    "key, value",
    [
        ("method.temperature", 0.07),
        ("plugin.invclr.lam", 1e-4),
        ("augment.joint.crop.beta", None),
        ("augment.joint.crop.beta", -2),
        ("plugin.cocor.fixed_targets", [0.9, 0.85, 0.75]),
        ("method.symmetric", False),
    ],
)
def test_a_sampled_value_round_trips_through_the_command_line(key, value):
    presets = {
        "plugin.invclr.lam": ["plugin=[invclr]"],
        "plugin.cocor.fixed_targets": ["+experiment=cocor_mocov2"],
        "augment.joint.crop.beta": ["augment=mocov2"],
    }.get(key, [])
    cfg = compose_config(presets + [override(key, value)])
    node = cfg
    for part in key.split("."):
        node = node[part]
    assert node == value and type(node) is type(value)


def test_reported_metrics_follow_the_task_and_the_evaluation():
    cfg = compose_config([])
    epoch, final = reported_metrics(cfg["data"], cfg["eval"])
    assert {"epoch_loss", "knn_r2", "knn_r2_m"} <= epoch and "knn_top1" not in epoch
    assert {"probe_pretrained_mse", "probe_pretrained_r2_sigma"} <= final
    off = compose_config(["data=cifar10", "eval.knn.every=0", "eval.probe.after_pretrain=false"])
    epoch, final = reported_metrics(off["data"], off["eval"])
    assert epoch == {"epoch_loss", "epoch_images_per_s"} and final == set()


# ----------------------------------------------------------------------------- the shipped sweeps


@pytest.mark.parametrize("name", SWEEPS)
def test_every_shipped_sweep_composes_and_validates_at_its_cpu_size(name):
    cfg, argv = compose_sweep([f"+sweep={name}"])
    dims = check_sweep(cfg, argv)  # every value of the space composed and validated as its trial would be
    assert cfg["sweep"]["name"] == name and cfg["sweep"]["size"] == "cpu" and dims
    assert sweep_name(cfg).startswith(f"sweep-{name}-")
    epoch, final = reported_metrics(cfg["data"], cfg["eval"])
    assert cfg["sweep"]["metric"] in final  # ranked on the probe at the end
    if cfg["sweep"]["scheduler"] == "asha":
        assert cfg["sweep"]["stop_metric"] in epoch
    if name != "smoke":
        assert "paper" in cfg["sweep"]["sizes"]


@pytest.mark.parametrize("name", [n for n in SWEEPS if n != "smoke"])
def test_every_shipped_sweep_composes_at_paper_size(name):
    cfg, _ = compose_sweep([f"+sweep={name}", "sweep.size=paper"])
    cpu, _ = compose_sweep([f"+sweep={name}"])
    assert cfg["train"]["epochs"] > cpu["train"]["epochs"]
    parse_space(cfg["sweep"]["space"])


def test_the_command_line_wins_over_the_size():
    argv = sweep_argv(["+sweep=invclr_lambda", "train.epochs=3"])
    assert argv[0] == "+sweep=invclr_lambda" and argv.count("train.epochs=3") == 1
    assert not any(a.startswith("train.epochs=5") for a in argv)
    cfg = compose_config(argv)
    assert cfg["train"]["epochs"] == 3 and cfg["data"]["generate"]["n_train"] == 1500


def test_the_sweep_name_follows_what_decides_its_trials():
    a, _ = compose_sweep(["+sweep=smoke"])
    same, _ = compose_sweep(["+sweep=smoke", "verbose=true", "sweep.size=cpu"])
    b, _ = compose_sweep(["+sweep=smoke", "sweep.max_concurrent_trials=1"])
    c, _ = compose_sweep(["+sweep=smoke", "sweep.space={method.temperature: {grid: [0.1, 0.2]}}"])
    d, _ = compose_sweep(["+sweep=smoke", "eval.probe.steps=10"])
    one = {**a, "sweep": {k: v for k, v in a["sweep"].items() if k != "seeds"}}  # from before sweep.seeds
    seeded, _ = compose_sweep(["+sweep=smoke", "sweep.seeds=2"])
    assert sweep_name(one) == sweep_name(a) != sweep_name(seeded)
    assert sweep_name(a) == sweep_name(same)
    assert len({sweep_name(a), sweep_name(b), sweep_name(c), sweep_name(d)}) == 4


# ----------------------------------------------------------------------------- bad input, one line


def _command(args: tuple, root: Path, relative: bool) -> tuple[list[str], Path]:
    """`python jobs/tune.py ...` with its store under `root`: given as paths.root, or (relative) by running a copy of
    the job from `root` with the default paths.root=. (a trial runs in Tune's own folder: the paths must still be the
    driver's). Returns the command and the folder it runs in."""
    if not relative:
        return [sys.executable, str(ROOT / "jobs" / "tune.py"), *args, f"paths.root={root}"], root
    if not (root / "jobs").exists():
        for part in ("jobs", "pipeline", "conf"):
            (root / part).symlink_to(ROOT / part)
    return [sys.executable, "jobs/tune.py", *args], root


def _tune(
    *args, root: Path, timeout: int = 240, relative: bool = False, record: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """_command's sweep, run to its end. The timeout is a hang guard: a bad sweep answered in 11 s alone once took
    over a minute beside the rest of the suite."""
    env = env or _env()
    cmd, cwd = _command(args, root, relative)
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=probed(env, record) if record else env
    )


def _env() -> dict:
    """The test's environment without an MLflow store or a Ray cluster it may point at."""
    return {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}


BAD = [
    (
        ["+sweep=smoke", "++sweep.space={method.temprature: {grid: [0.1]}}"],
        "sweep.space.method.temprature: unknown config key",
    ),
    (["+sweep=smoke", "sweep.space={method.temperature: {grid: []}}"], "an empty search range"),
    (
        ["+sweep=smoke", "++sweep.space={method.temperature: {grid: null, uniform: [0.5, 0.1]}}"],
        "an empty search range",
    ),
    (["+sweep=smoke", "sweep.metric=probe_pretrained_top1"], "a metric this sweep's runs never report"),
    (
        ["+sweep=smoke", "sweep.scheduler=asha", "train.epochs=2", "eval.knn.every=0"],
        "sweep.stop_metric=knn_r2: not reported every epoch",
    ),
    (
        ["+sweep=smoke", "sweep.scheduler=asha", "train.epochs=2", "eval.knn.every=2"],
        "eval.knn.every=2: ASHA stops trials on knn_r2",
    ),
    (["+sweep=smoke", "sweep.scheduler=asha"], "sweep.grace_period=1: ASHA judges a trial"),
    (["+sweep=smoke", "+sweep.grace_periods=2"], "sweep.grace_periods: unknown key"),
    (["+sweep=smoke", "sweep.max_concurrent_trials=64"], "sweep.max_concurrent_trials=64:"),
    (
        ["+sweep=smoke", "sweep.space={method.temperature: {grid: [0.1, -1.0], log: false}}"],
        "the trial with method.temperature=-1.0 is refused",
    ),
    (["+sweep=smoke", "++sweep.space={data.image_size: {grid: [16, 32]}}"], "shared by every trial"),
    (["+sweep=smoke", "sweep.scheduler=hyperband"], "sweep.scheduler=hyperband: expected one of asha, fifo"),
    (["+sweep=smoke", "sweep.size=huge"], "sweep.size=huge: expected one of cpu, paper"),
    (
        ["+sweep=temperature", "sweep.seeds=3", "sweep.scheduler=fifo"],
        "sweep.seeds=3: sweep.space.method.temperature is a ",
    ),
    (["+sweep=clsa_beta", "sweep.seeds=2"], "sweep.scheduler=asha with sweep.seeds=2: expected fifo"),
    (["+sweep=smoke", "sweep.seeds=0"], "sweep.seeds=0: expected an integer >= 1"),
    (["train.epochs=2"], "no sweep chosen: add +sweep=<name>"),
    (["+sweep=nosuch"], "nosuch"),
]


@pytest.fixture(scope="module")
def bad_sweeps(tmp_path_factory):
    """Every BAD command's (exit code, stderr), all answered by one Python process (tests/helpers.py's refusals),
    and whether that process ever loaded Ray or MLflow; `root` is every command's paths.root."""
    root = tmp_path_factory.mktemp("bad")
    record = root.parent / f"{root.name}.imports"
    cases = [[*args, f"paths.root={root}"] for args, _ in BAD]
    said = refusals(ROOT / "jobs" / "tune.py", cases, _env(), record, cwd=root)
    return root, said, heavy_imports(record)


@pytest.mark.parametrize("case", range(len(BAD)), ids=[w[:30] for _, w in BAD])
def test_bad_sweeps_fail_in_one_error_line_before_ray_or_mlflow(bad_sweeps, case):
    root, said, heavy = bad_sweeps
    code, err = said[case]
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and BAD[case][1] in lines[0], err
    assert not heavy & {"ray", "mlflow"}  # every one answered before Ray or MLflow loaded
    assert sorted(p.name for p in root.iterdir()) == []  # nothing made where it ran, no store


def test_help_lists_the_sweeps(tmp_path):
    r = _tune("--help", root=tmp_path)
    assert r.returncode == 0 and "+sweep:" in r.stdout
    for name in SWEEPS:
        assert name in r.stdout


# ----------------------------------------------------------------------------- the report


def _rows():
    return [
        {
            "trial": "00000",
            "trial_id": "t_00000",
            "params": {"plugin.invclr.lam": 0},
            "status": "done",
            "metric": 0.30,
            "curve": [(1, 0.1), (2, 0.2)],
        },
        {
            "trial": "00001",
            "trial_id": "t_00001",
            "params": {"plugin.invclr.lam": 1e-3},
            "status": "done",
            "metric": 0.20,
            "curve": [(1, 0.2), (2, 0.3)],
        },
        {
            "trial": "00002",
            "trial_id": "t_00002",
            "params": {"plugin.invclr.lam": 1e-1},
            "status": "stopped at epoch 1/2",
            "metric": None,
            "curve": [(1, 0.05)],
        },
        {
            "trial": "00003",
            "trial_id": "t_00003",
            "params": {"plugin.invclr.lam": 1e-2},
            "status": "done",
            "metric": float("nan"),
            "curve": [],
        },
    ]


def test_the_table_ranks_by_the_metric_and_mode_with_unscored_trials_last():
    dims = [Dim("plugin.invclr.lam", "grid", (0, 1e-3, 1e-2, 1e-1), True)]
    text = report.table(_rows(), dims, "probe_pretrained_mse", "min", baseline=0.5)
    body = [ln for ln in text.splitlines() if ln.startswith("| 0")]
    assert [ln.split("|")[1].strip() for ln in body] == ["00001", "00000", "00002", "00003"]
    assert "stopped at epoch 1/2" in body[2] and "| — |" in body[2]
    assert "probe_pretrained_mse = 0.5" in text
    assert report.best(_rows(), "min")["trial"] == "00001"
    assert report.best(_rows(), "max")["trial"] == "00000"
    assert [r["trial"] for r in report.sort_rows(_rows(), "max")][:2] == ["00000", "00001"]


def test_the_plot_puts_a_log_space_with_zero_on_a_symlog_axis(tmp_path):
    import matplotlib.image as mpimg

    dims = [Dim("plugin.invclr.lam", "grid", (0, 1e-3, 1e-2, 1e-1), True)]
    path = report.plot(
        _rows(), dims, "probe_pretrained_mse", "min", tmp_path / "s.png", "sweep", curve_metric="knn_r2", baseline=0.5
    )
    img = mpimg.imread(path)
    assert img.shape[1] > 2 * img.shape[0]  # two panels side by side: the key, the curves
    # categorical and linear keys draw too
    dims = [Dim("plugin.cocor.fixed_targets", "grid", ([0.9, 0.8], [0.7, 0.6]), False)]
    rows = [{**_rows()[0], "params": {"plugin.cocor.fixed_targets": [0.7, 0.6]}}]
    assert report.plot(rows, dims, "m", "min", tmp_path / "c.png", "sweep").exists()


def test_sweep_seeds_cross_a_grid_space_and_refuse_what_cannot_be_seeded():
    grid = parse_space({"a": {"grid": [1, 2, 3]}})
    dims = with_seeds(grid, 4, num_samples=1)
    assert dims[:-1] == grid and dims[-1] == Dim("seed", "grid", (0, 1, 2, 3), False)
    assert num_trials(dims, 1) == 12 and searched(dims) == grid
    assert with_seeds(grid, 1, num_samples=5) == grid
    for space, samples, words in (
        ({"a": {"uniform": [0.0, 1.0]}}, 1, "sweep.space.a is a uniform, drawn anew for every trial"),
        ({"a": {"choice": [1, 2]}}, 1, "sweep.space.a is a choice"),
        ({"a": {"grid": [1, 2]}}, 3, "sweep.num_samples=3 with sweep.seeds=2: expected 1"),
        ({"seed": {"grid": [0, 1]}}, 1, "sweep.space.seed and sweep.seeds=2 both set"),
    ):
        with pytest.raises(ConfigError, match=re.escape(words)):
            with_seeds(parse_space(space), 2, num_samples=samples)
    with pytest.raises(ConfigError, match=re.escape("sweep.scheduler=asha with sweep.seeds=2: expected fifo")):
        with_seeds(grid, 2, num_samples=1, scheduler="asha")


def _seeded_rows(metrics: dict) -> list[dict]:
    rows = []
    for (t, seed), value in metrics.items():
        n = len(rows)
        status = "done" if value is not None else "failed: x"
        params = {"method.temperature": t, "seed": seed}
        rows.append({"trial": f"{n:05d}", "trial_id": f"t{n}", "params": params, "status": status, "metric": value})
    return rows


def test_a_seeded_sweep_gives_each_configuration_its_t_interval_and_its_paired_difference_to_the_best():
    from scipy import stats

    a, b, c = [1.0, 1.2, 1.1], [1.5, 1.6, 1.7], [1.05, 1.1, 1.3]
    metrics = {(0.1, s): a[s] for s in range(3)} | {(0.5, s): b[s] for s in range(3)}
    metrics |= {(0.2, s): c[s] for s in range(3)} | {(0.9, 0): None, (0.9, 1): None}
    rows = _seeded_rows(metrics)
    dims = [Dim("method.temperature", "grid", (0.1, 0.2, 0.5, 0.9), False)]
    groups = report.by_config(rows, dims, "min")
    assert [g["params"]["method.temperature"] for g in groups] == [0.1, 0.2, 0.5, 0.9]  # best mean first
    half = stats.t.ppf(0.975, 2) * np.std(b, ddof=1) / math.sqrt(3)
    iv = groups[2]["interval"]
    assert (iv.mean, iv.n) == (pytest.approx(np.mean(b)), 3)
    assert (iv.low, iv.high) == (pytest.approx(np.mean(b) - half), pytest.approx(np.mean(b) + half))
    assert groups[3]["values"] == {} and groups[3]["trials"] == ["00009", "00010"]
    assert [g["params"]["method.temperature"] for g in report.by_config(rows, dims, "max")][:3] == [0.5, 0.2, 0.1]

    text = report.seeded_table(groups, dims, "probe_pretrained_mse")
    lines = {ln.split("|")[1].strip(): ln for ln in text.splitlines()[2:]}
    d = np.subtract(b, a)  # 0.5 minus the best, seed by seed
    dh = stats.t.ppf(0.975, 2) * np.std(d, ddof=1) / math.sqrt(3)
    assert f"{d.mean():+.4g} [{d.mean() - dh:+.4g}, {d.mean() + dh:+.4g}] | no |" in lines["0.5"]
    assert "| best |" in lines["0.1"] and lines["0.2"].endswith("| yes |")  # 0.2's interval holds 0
    assert "| — | 0 | — |" in lines["0.9"]

    # a configuration missing seeds (its trials failed) ranks after every complete one, whatever its partial mean;
    # one that shares no finished seed with the best has no paired difference
    lucky = _seeded_rows({(0.05, 0): 0.5, (0.05, 1): None, (0.05, 2): None} | metrics)
    groups = report.by_config(lucky, dims, "min")
    assert [g["params"]["method.temperature"] for g in groups] == [0.1, 0.2, 0.5, 0.05, 0.9]
    alone = _seeded_rows({(0.1, 0): 1.0, (0.1, 1): 1.1, (0.3, 0): None, (0.3, 1): None, (0.3, 2): 0.7})
    text = report.seeded_table(report.by_config(alone, dims, "min"), dims, "m")
    assert "| 0.1 | 1.05 [" in text and "| 2 | — |  |" in text and "nan" not in text


def test_a_seeded_sweep_plot_draws_each_configurations_interval(tmp_path):
    import matplotlib.image as mpimg

    rows = _seeded_rows({(t, s): 1.0 + t + 0.1 * s for t in (0.1, 0.5) for s in range(3)})
    dims = [Dim("method.temperature", "grid", (0.1, 0.5), False)]
    configs = report.by_config(rows, dims, "min")
    path = report.plot(rows, dims, "m", "min", tmp_path / "s.png", "sweep", configs=configs)
    assert mpimg.imread(path).shape[0] > 100


def test_forward_to_tune_carries_metrics_forward_and_adds_the_clock():
    from pipeline.tune.trial import CLOCK, TRAINED, ForwardToTune

    class Queue:
        def __init__(self):
            self.items = []

        def put(self, item):
            self.items.append(item)

    cb = ForwardToTune.__new__(ForwardToTune)  # outside a Tune session: the queue by hand
    cb.epochs, cb.last, cb._training_actor_item_queue = 3, {}, Queue()
    cb.after_report(None, [{"epoch": 0, "epoch_loss": 5.0, "knn_r2": 0.2}], None)
    cb.after_report(None, [{"epoch": 1, "epoch_loss": 4.0}], None)  # an epoch without the kNN monitor
    cb.after_report(None, [{"epoch": 2, "epoch_loss": 3.0, "knn_r2": 0.4}], None)
    first, second, last = cb._training_actor_item_queue.items
    assert first[CLOCK] == 1 and second[CLOCK] == 2
    assert second["knn_r2"] == 0.2 and second["epoch_loss"] == 4.0
    # the last epoch carries no clock: ASHA, which ignores such a result, cannot stop a trial before its probe
    assert CLOCK not in last and last["knn_r2"] == 0.4
    assert [r[TRAINED] for r in (first, second, last)] == [1, 2, 3]


# ----------------------------------------------------------------------------- end to end


# one at a time, so the trials' order is fixed; ASHA judges them after their first of two epochs
SMOKE = ["+sweep=smoke", "sweep.max_concurrent_trials=1", "sweep.scheduler=asha", "train.epochs=2"]


def _runs(root: Path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("augssl")
    return client, client.search_runs([exp.experiment_id])


def _child_statuses(root: Path) -> dict:
    # not before a trial has started: the driver made and migrated the store by then, and opening a store that is
    # still being made would run MLflow's migration a second time, from here, racing the driver's
    if not list((root / "runs" / "sweep").glob("*/*.log")):
        return {}
    try:
        _, runs = _runs(root)
    except Exception:  # noqa: BLE001  the store is being created
        return {}
    return {r.info.run_name.split()[0]: r.info.status for r in runs if "mlflow.parentRunId" in r.data.tags}


def _tune_saved_finished(root: Path, trial: str) -> bool:
    """Whether Tune's newest saved experiment state (synced to trainer.storage) has the trial TERMINATED: what a
    restore keeps. Tune's own file, read here only to time the kill: MLflow says FINISHED a moment before Tune
    marks the trial and saves it."""
    import json

    states = sorted((root / "runs" / "ray").glob("sweep-smoke-*/experiment_state-*.json"))
    try:
        trials = [json.loads(t[0]) for t in json.loads(states[-1].read_text())["trial_data"]] if states else []
    except (ValueError, KeyError, IndexError, OSError):  # being written
        return False
    return any(t["trial_id"].endswith(f"_{trial}") and t["status"] == "TERMINATED" for t in trials)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke sweep for the end-to-end checks below: two two-epoch trials, one at a time, ASHA on kNN R². Its
    driver (and its local Ray) is SIGKILLed once the first trial has finished (in MLflow and in Tune's saved state)
    and the second has started, and the same command then resumes it: the first trial is kept, the second starts
    again and is judged against the first trial's rung as saved with the experiment. Run as the README shows it,
    from the project's folder with no paths.root: its store lands in <project>/runs, so the test works on a copy of
    the project. Tune saves the experiment once a second here (TUNE_GLOBAL_CHECKPOINT_S; every 10 s or more by
    default), so that the second trial has not reached its first rung by then."""
    root = tmp_path_factory.mktemp("sweep")
    env = {**_env(), "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    cmd, cwd = _command(SMOKE, root, relative=True)
    first_log = root.parent / f"{root.name}-first.log"
    with first_log.open("w") as log:
        first = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline, ready = time.monotonic() + 600, False
    try:
        while time.monotonic() < deadline and first.poll() is None:
            ready = _child_statuses(root) == {"00000": "FINISHED", "00001": "RUNNING"}
            ready = ready and _tune_saved_finished(root, "00000")
            if ready:  # kill at once: the second trial is on its way to its first rung
                break
            time.sleep(0.5)
        assert ready and first.poll() is None, first_log.read_text()[-3000:]
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert "[tune] trial 00000 done: probe_pretrained_mse=" in first_log.read_text()
    client, runs = _runs(root)
    second = next(x for x in runs if x.info.run_name.startswith("00001"))
    assert not client.get_metric_history(second.info.run_id, "knn/r2"), "killed after its first epoch's result"
    r = _tune(*SMOKE, root=root, timeout=900, relative=True, env=env)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return root, r


@pytest.mark.slow
def test_a_killed_asha_sweep_resumes_keeping_its_finished_trial_and_its_rungs(smoke):
    """Without the first trial's rung restored, the second trial would be alone at it and run on to the end."""
    root, r = smoke
    client, runs = _runs(root)
    children = sorted((c for c in runs if c.data.tags.get("mlflow.parentRunId")), key=lambda c: c.info.run_name)
    assert [c.info.run_name for c in children] == ["00000 temperature=0.2", "00001 temperature=10"]
    first, second = children
    knn = [client.get_metric_history(c.info.run_id, "knn/r2")[-1].value for c in children]
    # ASHA's rule with two trials and reduction factor 2: the second to reach the rung continues only if it is
    # at least as good as the first there
    assert knn[1] < knn[0], knn
    assert first.info.status == "FINISHED" and "probe/pretrained_mse" in first.data.metrics
    assert second.info.status == "KILLED" and "probe/pretrained_mse" not in second.data.metrics
    assert second.data.tags["stopped_early"] == "stopped at epoch 1/2 by ASHA"
    out = r.stdout
    assert "[tune] trial 00001 stopped early by the scheduler after epoch 1/2" in out
    assert "resuming sweep sweep-smoke-" in out and "restoring the Tune experiment" in out
    assert "trial 00000 started" not in out and "[tune] trial 00001 started" in out  # kept; run again
    log1 = next((root / "runs" / "sweep").glob("sweep-smoke-*/*_00001.log")).read_text()
    assert "resuming run" in log1  # into its MLflow run, which the kill left RUNNING
    assert len(client.get_metric_history(second.info.run_id, "knn/r2")) == 1


@pytest.mark.slow
def test_the_sweep_is_one_mlflow_parent_with_a_child_per_trial(smoke):
    root, r = smoke
    client, runs = _runs(root)
    parents = [p for p in runs if "mlflow.parentRunId" not in p.data.tags]
    assert len(parents) == 1 and len(runs) == 3
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["job"] == "tune"
    assert parent.info.run_name.startswith("sweep-smoke-")
    assert parent.data.params["space.method.temperature"] == "grid [0.2, 10.0] (log)"
    assert parent.data.params["sweep.metric"] == "probe_pretrained_mse"
    inputs = client.get_run(parent.info.run_id).inputs.dataset_inputs  # the trials' data, on the sweep's page too
    assert sorted(d.tags[0].value for d in inputs) == ["training", "validation"]
    m = parent.data.metrics
    assert (m["sweep/trials_done"], m["sweep/trials_stopped"], m["sweep/trials_failed"]) == (1, 1, 0)
    assert "sweep/random_probe_pretrained_mse" in m and "sweep/best_probe_pretrained_mse" in m
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "sweep")}
    assert arts == {"sweep/table.md", "sweep/sweep.png", "sweep/best.yaml"}
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"config.yaml", "gallery", "sweep"}
    best = client.download_artifacts(parent.info.run_id, "sweep/best.yaml", str(root))
    text = Path(best).read_text()
    assert "method.temperature: 0.2" in text and "python jobs/pretrain.py +sweep=smoke" in text
    done = next(c for c in runs if c.info.run_name.startswith("00000"))
    assert done.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert done.data.params["method.temperature"] == "0.2" and done.data.tags["job"] == "tune-trial"
    assert m["sweep/best_probe_pretrained_mse"] == done.data.metrics["probe/pretrained_mse"]
    child_arts = {a.path for a in client.list_artifacts(done.info.run_id)}
    assert {"config.yaml", "checkpoint", "curves", "probe"} <= child_arts and "gallery" not in child_arts
    assert (
        len(client.get_metric_history(done.info.run_id, "train/epoch_loss")) == 2
    )  # its own curves, one point an epoch
    name = parent.info.run_name
    assert (root / "runs" / "sweep" / f"{name}.png").stat().st_size > 10_000
    table = (root / "runs" / "sweep" / f"{name}.md").read_text()
    assert table.index("| 00000 |") < table.index("| 00001 |")
    # the console: the sweep's own lines, not Tune's tables or the trials' prints
    assert "Done: sweep sweep-smoke-" in r.stdout and "Trial status" not in r.stdout
    assert "View detailed results" not in r.stdout and "Linear probe on spirograph" not in r.stdout


@pytest.mark.slow
def test_a_finished_sweep_rerun_prints_its_results_and_logs_nothing(smoke):
    root, _ = smoke
    _, before = _runs(root)
    r = _tune(*SMOKE, root=root, relative=True, record=root.parent / f"{root.name}.imports")
    assert r.returncode == 0, r.stderr
    assert "finished before" in r.stdout and "| 00000 | 0.2 |" in r.stdout
    _, after = _runs(root)
    assert [x.info.run_id for x in after] == [x.info.run_id for x in before]
    assert "ray" not in heavy_imports(root.parent / f"{root.name}.imports")  # no cluster started (a time bound flakes)


def test_threads_share_the_cores_among_the_trials_that_can_run_at_once(monkeypatch):
    from dataclasses import replace

    from pipeline.tune import sweep
    from pipeline.tune.settings import SweepSpec
    from pipeline.tune.space import Dim

    monkeypatch.setenv("AUGSSL_CORES", "8")  # the cores a machine lends (pipeline/cores.py)
    cfg, _ = compose_sweep(["+sweep=smoke", "sweep.max_concurrent_trials=2", "trainer.num_workers=2"])
    spec = SweepSpec.of(Checked.of(SweepConfig, cfg))
    assert spec.trainer["num_workers"] == 2 and spec.sweep.max_concurrent_trials == 2
    one = [Dim("method.temperature", "grid", (0.2,), False)]
    five = [Dim("plugin.invclr.lam", "grid", (0, 1e-4, 1e-3, 1e-2, 1e-1), True)]
    assert sweep._threads(spec, five) == 2  # 2 trials x 2 workers on 8 cores
    assert sweep._threads(spec, one) == 4  # a one-trial sweep: its workers get every core
    many = replace(spec, sweep=spec.sweep.model_copy(update={"max_concurrent_trials": 16}))
    assert sweep._threads(many, five) == 1  # never below one thread


def test_stopped_trials_end_killed_even_where_their_process_ended_them_failed(tmp_path):
    """ASHA's stop can reach a trial as an error (its Train run torn down) before its process is ended: the run
    it closed FAILED is still a stopped trial, KILLED, its error kept aside; a really failed trial stays FAILED."""
    from mlflow.tracking import MlflowClient

    from pipeline.tune import results

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("s", artifact_location=str(tmp_path / "art"))
    parent = client.create_run(exp).info.run_id
    ids = {}
    for trial, end in (
        ("t_00000", "FAILED"),
        ("t_00001", None),
        ("t_00002", "RUNNING"),
        ("t_00003", "FINISHED"),
        ("t_00004", "FAILED later"),
    ):
        run = client.create_run(exp, tags={"mlflow.parentRunId": parent, "tune_trial_id": trial})
        ids[trial] = run.info.run_id
        if end == "FAILED":
            client.set_tag(run.info.run_id, "error", "TrainingFailedError: the controller was shut down")
        if end in ("FAILED", "FINISHED"):
            client.set_terminated(run.info.run_id, end)

    def fail_late(run_id: str) -> None:  # a stopped trial's process closing its run after Tune has returned
        client.set_tag(run_id, "error", "TrainingFailedError: the controller was shut down")
        client.set_terminated(run_id, "FAILED")

    late = threading.Timer(0.5, fail_late, args=(ids["t_00004"],))
    rows = [
        {"trial_id": "t_00000", "status": "stopped at epoch 1/2"},
        {"trial_id": "t_00001", "status": "stopped at epoch 1/2"},
        {"trial_id": "t_00002", "status": "failed: ValueError: nan loss"},
        {"trial_id": "t_00003", "status": "done"},
        {"trial_id": "t_00004", "status": "stopped at epoch 1/2"},
    ]
    late.start()
    t0 = time.monotonic()
    results._close_children(uri, parent, rows, settle_s=3)
    # t_00001's process never closes its run (killed outright): it is closed once the settling time is over
    assert 3 <= time.monotonic() - t0 < 30
    late.join()
    got = {t: client.get_run(i) for t, i in ids.items()}
    assert [got[t].info.status for t in sorted(got)] == ["KILLED", "KILLED", "FAILED", "FINISHED", "KILLED"]
    for t in ("t_00000", "t_00004"):
        assert got[t].data.tags["stopped_early"] == "stopped at epoch 1/2 by ASHA"
        assert "error" not in got[t].data.tags
        assert got[t].data.tags["stop_error"].startswith("TrainingFailedError")
    assert got["t_00002"].data.tags["error"] == "ValueError: nan loss"
    assert [r["run_id"] for r in rows] == [ids[t] for t in sorted(ids)]
