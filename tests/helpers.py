"""Shared test helpers: photo-like images, encoding, and spawning gloo process groups."""

from __future__ import annotations

import importlib.util
import io
import os
import socket
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# installed, not imported here: importing detectron2 costs every test module that uses these helpers a second
HAVE_D2 = importlib.util.find_spec("detectron2") is not None
needs_d2 = pytest.mark.skipif(
    not HAVE_D2,
    reason="detectron2 is not installed (make venv installs it from ../shared/wheels when that folder exists)",
)


def job_env() -> dict[str, str]:
    """The environment for a job run as a subprocess: this process's, less a store an in-process test exported
    (mlflow.set_tracking_uri sets MLFLOW_TRACKING_URI), so a job uses its own paths.root's store."""
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


PROBE = Path(__file__).parent / "imports_probe"


def probed(env: dict[str, str], record: Path) -> dict[str, str]:
    """`env` for a subprocess whose processes each append the heavy packages they imported (torch, ray, mlflow,
    DALI, detectron2) to `record` at exit; read it with heavy_imports."""
    path = os.pathsep.join(p for p in (str(PROBE), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, "AUGSSL_IMPORTS_TO": str(record)}


def heavy_imports(record: Path) -> set[str]:
    """The heavy packages any probed process imported. Fails when none wrote its line (it died before exit)."""
    assert record.exists(), f"no process wrote {record}: it did not exit through Python"
    return {name for line in record.read_text().splitlines() for name in line.split()[1:]}


_REFUSALS = """
import contextlib, io, json, runpy, sys
script, cases = sys.argv[1], json.loads(sys.argv[2])
said = []
for args in cases:
    sys.argv, err, code = [script, *args], io.StringIO(), 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    said.append((code, err.getvalue()))
print(json.dumps(said))
"""


def refusals(
    script: Path, cases: list[list[str]], env: dict[str, str], record: Path, cwd: Path, timeout: float = 300
) -> list:
    """(exit code, stderr) of `python <script> <args>` for each of `cases`, run one after another in one Python
    process started in `cwd` (each a Python start of torch and the config stack when run alone: seconds each);
    `record` gets the heavy packages that process imported, for heavy_imports."""
    import json
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _REFUSALS, str(script), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=probed(env, record),
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return [tuple(x) for x in json.loads(r.stdout.splitlines()[-1])]


def encode(arr: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buf.getvalue()


def natural(h: int, w: int, seed: int, waves: int = 3, rects: int = 4) -> np.ndarray:
    """Smooth colour waves plus a few hard-edged rectangles: like a photo, but deterministic."""
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(waves):
            fy, fx, ph = r.uniform(0.5, 6), r.uniform(0.5, 6), r.uniform(0, 6)
            img[..., c] += np.sin(2 * np.pi * (fy * yy + fx * xx) + ph)
    img = (img - img.min()) / (img.max() - img.min()) * 255
    for _ in range(rects):
        y0, x0 = r.integers(0, max(1, h - 20)), r.integers(0, max(1, w - 20))
        img[y0 : y0 + r.integers(5, 50), x0 : x0 + r.integers(5, 50)] = r.integers(0, 256, 3)
    return img.astype(np.uint8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _then_wait(target, done, *args) -> None:
    """Run target, then stay alive until the parent has read the queue: a tensor put on it is passed as a file
    descriptor this process serves, and one that exited first leaves the parent a FileNotFoundError."""
    target(*args)
    done.wait(300)


def run_process_group(target, world: int = 2, args: tuple = ()) -> list:
    """Run target(rank, world, port, queue, *args) in `world` spawned processes; returns what they put on the
    queue, sorted (put tuples starting with the rank)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, port, done = ctx.Queue(), free_port(), ctx.Event()
    procs = [ctx.Process(target=_then_wait, args=(target, done, r, world, port, q, *args)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted(q.get(timeout=120) for _ in range(world))
    finally:
        done.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return results


def assert_close_at_scale(actual, expected, rel: float = 1e-4) -> None:
    """`actual` equals `expected` up to float rounding of sums taken in another order (one process against two,
    whose all-reduce adds partial sums differently). Each element's rounding error is a few units in the last place
    of the largest terms summed into it, not of the element itself: an element near zero beside large ones moves by
    about eps x the tensor's scale. So the bound is rel x max|expected| for every element (rel = 1e-4 is about 840
    units in float32's last place, far below what a missing average or a wrong scale changes: a factor)."""
    bound = rel * float(expected.abs().max())
    worst = float((actual - expected).abs().max())
    assert worst <= bound, f"differs by {worst:.3g} where its scale allows {bound:.3g} (rel {rel} of {bound / rel:.3g})"


def loss_and_grads(method, images, params=None, *, distributed: bool, plugins: bool = False):
    """One forward and backward of `method` (its online network in DDP when `distributed`): the loss, and the
    gradient of every online parameter (a parameter left without one fails here). `plugins`: total_loss (the
    plug-ins' terms too) instead of framework_loss."""
    from torch import nn

    from pipeline import dist

    if distributed:  # as the trainer wraps it (pipeline/train/loop.py)
        method.online = nn.parallel.DistributedDataParallel(method.online, **dist.ddp_options())
    out = (method.total_loss if plugins else method.framework_loss)(images, params)
    out["loss"].backward()
    online = getattr(method.online, "module", method.online)
    return out["loss"].item(), [p.grad.clone() for p in online.parameters()]


def init_gloo(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)


def fake_source(backbone: str, cifar: bool, width: int, seed: int = 0, cfg: dict | None = None):
    """A checkpoint as jobs/pretrain.py writes it (the online backbone under the method's keys), random weights
    with BatchNorm statistics that differ from their defaults. `cfg`: the run's config (default: the few keys
    an export reads)."""
    import torch

    from pipeline.eval.source import Source
    from pipeline.models.backbones import build_backbone

    torch.manual_seed(seed)
    net = build_backbone({"backbone": backbone, "cifar_stem": cifar, "width": width})
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
    cfg = cfg or {
        "model": {"backbone": backbone, "cifar_stem": cifar, "width": width},
        "data": {"image_size": 32, "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]},
        "augment": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]},
        "run": {"name": "fake-run"},
    }
    state = {"method": {f"online.backbone.{k}": v for k, v in net.state_dict().items()}, "cfg": cfg}
    return Source(state, cfg, None, "fake")


def same_views(n_views: int = 2, **view):
    """A recipe of `n_views` views with one law (MoCo v1/v2, SimCLR); keyword arguments are ViewSpec fields."""
    from pipeline.augment.recipe import Recipe, ViewSpec

    return Recipe(views=(ViewSpec(**view),) * int(n_views))


def optim(**keys):
    """An `optim` section typed, the keys a test does not care about at plain SGD values."""
    from pipeline.sections import Optim

    return Optim.of({"name": "sgd", "base_lr": 0.03, "momentum": 0.9, "weight_decay": 0.0, "warmup_epochs": 0, **keys})


SMOKE_CLAIMS = """\
paper: {file: smoke-paper.txt, title: "the smoke suite's made-up paper"}
claims:
  - id: smoke-tau
    variant: "SimCLR, τ=0.2"
    baseline: SimCLR
    metric: probe MSE m
    direction: -1
    source: Table 1
    paper: {baseline: 0.2, variant: 0.1, units: "made-up MSE"}
    quote: "SimCLR 0.2, at τ = 0.2 0.1"
    primary: true
    why_primary: the suite's one claim
    gain: null
    sesoi: 0.001
    sesoi_why: a made-up margin
    differs: a smoke test of the machinery
"""


def smoke_claims(root: Path) -> Path:
    """A claims folder holding a made-up claim for the smoke suite (conf/claims holds the papers' only)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "smoke.yaml").write_text(SMOKE_CLAIMS)
    return root
