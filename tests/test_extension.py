"""The extension API from outside the repository: tests/ext/augssl_barlow, a package of its own, adds a method
(Barlow Twins), a plug-in (a uniformity term), a generated dataset (blobs) and an evaluation (spread) through the
`augssl.methods`, `augssl.plugins`, `augssl.datasets` and `augssl.evaluations` entry points, and ships their configs
on Hydra's search path. pip installs it into a folder of its own (so this venv's registries stay as they are for
every other test); a Python with that folder on its path composes `method=barlow` and `plugin=[uniformity]`,
validates them, and trains one step of each through the loop's own step function; generates `data=blobs` on first
use as a run's data; and runs the package's evaluation as a suite's step through jobs/evaluate.py. Every step of
docs/extending.md is one of these."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import refusals
from pipeline.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tests" / "ext" / "augssl_barlow"

# run with the package's folder on sys.path: what `pip install augssl-barlow` into the environment gives
STEPS = r"""
import json, sys
import torch
from pipeline.build import build_method
from pipeline.config import compose_config
from pipeline.methods import METHODS
from pipeline.plugins import PLUGINS
from pipeline.schema import validate
from pipeline.train.step import optimisation_step

root, out = sys.argv[1], {"methods": list(METHODS), "plugins": list(PLUGINS)}
common = [f"paths.root={root}", "model.width=8", "trainer.num_workers=1"]
for name, overrides in (("method", ["method=barlow"]), ("plugin", ["method=simclr", "plugin=[uniformity]"])):
    cfg = compose_config([*common, *overrides])
    validate(cfg)
    torch.manual_seed(0)
    method = build_method(cfg)
    images = [torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(v)) for v in (1, 2)]
    with torch.no_grad():
        full = method.total_loss(images)
        bare = method.framework_loss(images)["loss"]
    before = [p.detach().clone() for p in method.online.parameters()]
    opt = torch.optim.SGD(method.online.parameters(), lr=0.1)
    step = optimisation_step(method, opt, images, None, "fp32", torch.device("cpu"), 0.5)
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(method.online.parameters(), before))
    out[name] = {
        "class": f"{type(method).__module__}.{type(method).__name__}",
        "settings": {k: v for k, v in cfg["method"].items() if k in ("kind", "lambd")},
        "plugin": cfg.get("plugin"),
        "loss": float(step["loss"].detach()),
        "added": float(full["loss"] - bare),
        "uniformity": float(full.get("uniformity", float("nan"))),
        "moved": moved,
    }
print(json.dumps(out))
"""


# a run's data made by the package's dataset, and a checkpoint of the package's method trained on it
DATA = r"""
import json, sys
from pathlib import Path
import torch
from pipeline import checkpoint
from pipeline.build import build_method
from pipeline.config import compose_config
from pipeline.data import DATASETS
from pipeline.data.manifest import read_manifest
from pipeline.eval import EVALUATIONS
from pipeline.train.prepare import resolve

root = Path(sys.argv[1])
small = ["data.generate.n_train=60", "data.generate.n_val=30", "data.generate.maxcount=20", "train.batch_size=32"]
common = [f"paths.root={root}", "method=barlow", "data=blobs", "model.width=8", "trainer.num_workers=1"]
cfg = compose_config(common + small)
plan = resolve(cfg)  # checks data.generate against the dataset's Settings, then generates the shards: first use
torch.manual_seed(0)
method = build_method(cfg)
(root / "ckpt").mkdir()
checkpoint.save(root / "ckpt", method, torch.optim.SGD(method.parameters(), lr=0.1), 1, 1, cfg, plan.as_dict())
manifest = read_manifest(cfg["data"]["train"])[0]
print(json.dumps({"datasets": list(DATASETS), "evaluations": list(EVALUATIONS), "samples": plan.num_train_samples,
                  "train": cfg["data"]["train"], "generate": manifest["generate"], "classes": manifest["class_names"]}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The package pip-installed (no index, no build isolation: offline) into a folder of its own."""
    src = tmp_path_factory.mktemp("src") / "augssl_barlow"
    shutil.copytree(PACKAGE, src)  # pip builds in the source tree: a copy keeps the repository's clean
    site = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation"]
    r = subprocess.run([*cmd, "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (site / "augssl_barlow" / "conf" / "method" / "barlow.yaml").exists()
    return site


def _env(site: Path) -> dict[str, str]:
    """This process's environment with the package (and the project) on PYTHONPATH only, and no MLflow store."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _python(site: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=_env(site), cwd=ROOT, timeout=timeout
    )


@pytest.mark.slow
def test_an_installed_package_adds_a_method_and_a_plugin_that_train(site, tmp_path):
    r = _python(site, "-c", STEPS, str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # registered beside the project's own, which keep their names
    assert out["methods"][-1] == "barlow" and {"moco", "simclr", "dino"} <= set(out["methods"])
    assert out["plugins"][-1] == "uniformity" and "cocor" in out["plugins"]
    method, plugin = out["method"], out["plugin"]
    # the method: its class from the package, its settings from the package's conf/method/barlow.yaml
    assert method["class"] == "augssl_barlow.barlow.BarlowTwins"
    assert method["settings"] == {"kind": "barlow", "lambd": 0.0051}
    assert method["moved"] > 0 and method["loss"] == method["loss"] and method["added"] == 0.0  # no plug-in
    # the plug-in on the project's SimCLR: its term, weighted by conf/plugin/uniformity.yaml, joins the loss
    assert plugin["plugin"] == {"uniformity": {"defined_on": ["barlow", "simclr"], "weight": 0.1, "t": 2.0}}
    assert plugin["uniformity"] < 0  # log of a mean of exp(-t d^2) < 1
    assert plugin["added"] == pytest.approx(0.1 * plugin["uniformity"], rel=1e-5)
    assert plugin["moved"] > 0
    assert not list(tmp_path.rglob("*.tar"))  # validating made no data


@pytest.mark.slow
def test_an_installed_package_adds_a_dataset_and_an_evaluation_a_suite_runs(site, tmp_path):
    r = _python(site, "-c", DATA, str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["datasets"] == ["photos", "spirograph", "blobs"]  # the own by name, then the installed
    assert out["evaluations"] == ["detect", "finetune", "knn", "linear_probe", "spread"]
    # the dataset: generated on first use into the managed folder, its own setting recorded in the manifest
    assert out["samples"] == 60 and Path(out["train"]).parent.name.startswith("blobs-")
    assert Path(out["train"]).is_relative_to(tmp_path / "data")
    assert out["generate"] == {"n_train": 60, "size": 32, "seed": 0, "maxcount": 20, "sigma": 0.08}
    assert out["classes"] == ["one", "two", "three"]
    # the evaluation: a step of the package's suite, its config from the package, into its own MLflow run
    ev = _python(site, "jobs/evaluate.py", f"run={tmp_path / 'ckpt'}", "+suite=spread", f"paths.root={tmp_path}")
    assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-3000:]
    assert "[evaluate] suite spread" in ev.stdout and "| spread | uniformity |" in ev.stdout, ev.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.job = 'spread'")
    m = run.data.metrics
    assert run.info.status == "FINISHED" and m["spread/pretrained_uniformity"] < 0 and m["spread/random_uniformity"] < 0
    assert len(list((tmp_path / "runs" / "evaluate").glob("*-spread.md"))) == 1


SETTINGS = [
    (["data=blobs", "data.generate.sigma=0"], "error: data.generate.sigma=0: expected a number > 0"),
    (["method=barlow", "method.lambd=0"], "error: method.lambd=0: expected a number > 0"),
    (["method=simclr", "plugin=[uniformity]", "plugin.uniformity.t=-2"], "error: plugin.uniformity.t=-2: "),
    (["method=mocov2", "plugin=[uniformity]"], "error: plugin: plugin uniformity needs projections from the method's"),
]


@pytest.fixture(scope="module")
def refused(site, tmp_path_factory):
    """Every SETTINGS command's (exit code, stderr), answered by one Python process with the package on its path."""
    root = tmp_path_factory.mktemp("refused")
    cases = [[f"paths.root={root}", *overrides] for overrides, _ in SETTINGS]
    record = root.parent / f"{root.name}.imports"
    return root, refusals(ROOT / "jobs" / "pretrain.py", cases, _env(site), record, cwd=root)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(SETTINGS)), ids=[w[7:40] for _, w in SETTINGS])
def test_the_packages_settings_are_checked_like_the_projects(refused, case):
    root, said = refused
    code, err = said[case]
    assert code == 2 and err.strip().startswith(SETTINGS[case][1]), err[-2000:]
    assert len(err.strip().splitlines()) == 1 and not any(root.iterdir())  # nothing made where it ran


@pytest.mark.slow
def test_the_packages_method_trains_through_the_job_with_the_package_on_pythonpath_only(site, tmp_path):
    """jobs/pretrain.py method=barlow plugin=[uniformity] with the package on PYTHONPATH and installed nowhere else:
    the private cluster's workers get the driver's PYTHONPATH (after the project's root), the preflight finds both
    components on the node, and the run trains to its end."""
    from test_e2e import SMALL, SPIRO, mlflow_runs

    args = [f"paths.root={tmp_path}", *SPIRO, *SMALL, "method=barlow", "plugin=[uniformity]", "train.epochs=1"]
    r = _python(site, "jobs/pretrain.py", *args, "eval.probe.after_pretrain=false", "eval.knn.every=0", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    _, runs = mlflow_runs(tmp_path)
    assert runs[0].info.status == "FINISHED" and runs[0].data.params["method.kind"] == "barlow"
    assert "train/uniformity" in runs[0].data.metrics or any("uniformity" in k for k in runs[0].data.metrics)


def test_a_node_that_cannot_load_an_outside_component_is_named_in_one_line(site):
    """The preflight's two halves without a cluster: the driver (package on its path) lists the outside components;
    a worker without the package reports each; check_workers_see turns a node's report into one ConfigError line."""
    code = (
        "import json, sys; from pipeline.worker_check import outside_components as o, cannot_load as c;"
        "found = o('barlow', ['uniformity', 'co2']); print(json.dumps([found, c(found)]))"
    )
    r = _python(site, "-c", code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    found, missing = json.loads(r.stdout.strip().splitlines()[-1])
    assert found == [["augssl.methods", "barlow", "augssl-barlow"], ["augssl.plugins", "uniformity", "augssl-barlow"]]
    assert missing == []  # the driver's own environment loads them
    from pipeline import worker_check

    here = worker_check.cannot_load([tuple(f) for f in found])  # this process: the package is not on its path
    assert len(here) == 2 and here[0].startswith("augssl.methods 'barlow' (not registered here")

    components = [tuple(f) for f in found]
    worker_check.refuse_missing({"10.0.0.6": []}, components)  # a node that loads them: nothing to say
    with pytest.raises(ConfigError) as e:
        worker_check.refuse_missing({"10.0.0.6": [], "10.0.0.7": here}, components)
    line = str(e.value)
    assert "\n" not in line and "10.0.0.7 cannot load augssl.methods 'barlow'" in line
    assert "package augssl-barlow" in line and "install it on every node" in line
    # the project's own components need no check: no task is started
    assert worker_check.outside_components("simclr", ["co2"]) == []


def test_the_uniformity_and_barlow_losses_are_their_equations():
    """The example package's losses against float64 loops over their definitions (what docs/extending.md asks of
    a new loss)."""
    import torch

    sys.path.insert(0, str(PACKAGE))
    try:
        from augssl_barlow.barlow import barlow_loss
        from augssl_barlow.uniformity import uniformity
    finally:
        sys.path.remove(str(PACKAGE))
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(12, 5, generator=g, dtype=torch.float64), torch.randn(12, 5, generator=g, dtype=torch.float64)
    n, d = z1.shape
    s1 = [(z1[:, j] - z1[:, j].mean()) / z1[:, j].std(unbiased=False) for j in range(d)]
    s2 = [(z2[:, j] - z2[:, j].mean()) / z2[:, j].std(unbiased=False) for j in range(d)]
    c = [[float(sum(s1[i][k] * s2[j][k] for k in range(n)) / n) for j in range(d)] for i in range(d)]
    expected = sum((1 - c[i][i]) ** 2 for i in range(d)) + 0.5 * sum(
        c[i][j] ** 2 for i in range(d) for j in range(d) if i != j
    )
    assert float(barlow_loss(z1, z2, 0.5)) == pytest.approx(expected, rel=1e-9)
    u = torch.nn.functional.normalize(z1, dim=1)
    pairs = [float(((u[i] - u[j]) ** 2).sum()) for i in range(n) for j in range(i + 1, n)]
    expected = float(torch.tensor([torch.exp(torch.tensor(-2.0 * p)) for p in pairs]).mean().log())
    assert float(uniformity(u, 2.0)) == pytest.approx(expected, rel=1e-9)
