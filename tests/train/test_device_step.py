"""One bf16 training step of every framework x plug-in, through the project's own step function, on the CPU and
(marked `gpu`) on CUDA: real views from the view maker with their parameters, the optimiser the trainer builds, the
plug-ins' own optimisers (CoCor's bi-level step). Also the device helpers of the loop and of the collectives."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from helpers import encode, natural
from pipeline import dist
from pipeline.augment.view_makers import build_view_maker
from pipeline.build import build_method, matrix_cell
from pipeline.config import CONF_DIR, compose_config
from pipeline.data.labelled import LabelledBatches
from pipeline.data.reader import Split
from pipeline.data.spirograph import sample_params
from pipeline.losses.co2 import co2_consistency
from pipeline.losses.contrastive import info_nce, nt_xent, supcon_loss
from pipeline.losses.predictive import byol_loss
from pipeline.train.optim import build_optimizer
from pipeline.train.plugin_optim import PluginOptimizers
from pipeline.train.precision import bf16_supported
from pipeline.train.step import memory_format, optimisation_step, to_device

# every method config the project ships, by its kind: a new method's step is tested with each plug-in it takes
FRAMEWORKS = {p.stem: yaml.safe_load(p.read_text())["kind"] for p in sorted((CONF_DIR / "method").glob("*.yaml"))}
RECIPE_OF = {
    None: "mocov2",
    "co2": "mocov2",
    "clsa": "clsa",
    "cocor": "cocor",
    "invclr": "invclr",
    "jointcrop": "mocov2",
}
OWN_RECIPE = {"mocov3": "mocov3", "dino": "dino"}  # the frameworks' own recipes where the plug-in needs none
CASES = [
    (m, p, OWN_RECIPE.get(m, r) if r == "mocov2" else r)
    for m, kind in FRAMEWORKS.items()
    for p, r in RECIPE_OF.items()
    if p in (None, "jointcrop") or matrix_cell(kind, p)
] + [("simclr", "invclr", "spirograph"), ("mocov3-resnet", None, "mocov3"), ("dino-resnet", None, "dino")]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (none on this machine)")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
N = 8
# channels_last on the CPU (train.channels_last=true, or torch.compile's inductor): oneDNN's 1x1 stride-2 convolution
# backward (the ResNet shortcut) writes past its buffer with fewer than 16 input channels (oneDNN issue 6035: an abort,
# a hang or wrong gradients), so the layout and compile tests run a backbone wide enough
WIDE_ENOUGH = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(method: str, plugin: str | None, recipe: str, device: str) -> dict:
    data = "spirograph" if recipe == "spirograph" else "cifar10"
    method, _, backbone = method.partition("-")
    over = [
        f"method={method}",
        f"data={data}",
        "model.width=4",
        "train.batch_size=8",
        f"plugin=[{plugin}]" if plugin and plugin != "jointcrop" else "plugin=[]",
    ]
    if recipe != "spirograph":
        over.append(f"augment={recipe}")
    if FRAMEWORKS[method] in ("mocov3", "dino") and backbone != "resnet":  # their papers' backbone, small
        over += ["model.backbone=vit_tiny"]
    if FRAMEWORKS[method] == "dino":
        over += ["method.head.out_dim=64", "method.head.hidden_dim=32", "method.head.bottleneck_dim=16"]
    if plugin == "jointcrop":  # JointCrop and JointBlur on the first two views (DINO's global crops)
        over += ["augment.joint.crop.beta=0", "augment.joint.blur.beta=1"]
    if FRAMEWORKS[method] == "moco":  # one worker: 4 split-BN groups, as trainer.num_workers=1 resolves it
        over += ["method.queue_size=32", "method.bn_splits=4"]
    if plugin == "cocor":  # the learned target moves from the first step
        over += ["plugin.cocor.target_freeze_epochs=0", "plugin.cocor.target_warmup_epochs=0"]
    cfg = compose_config(over)
    cfg["augment"]["executor"] = "torch"
    return cfg


def _raw_batch(recipe: str) -> dict:
    if recipe == "spirograph":
        p = sample_params(N, torch.Generator().manual_seed(0))
        return {
            "json": np.array(
                [json.dumps({k: float(v[i]) for k, v in p.items()}).encode() for i in range(N)], dtype=object
            )
        }
    return {
        "png": np.array([encode(natural(40, 48, seed=i)) for i in range(N)], dtype=object),
        "cls": np.array([str(i % 3).encode() for i in range(N)], dtype=object),
    }


def _labelled_in_memory(plugin, size: int) -> None:
    """CoCor's labelled subset without shards: 16 images of 3 classes (its loader is tested in test_cocor)."""
    g = torch.Generator().manual_seed(5)
    x_all = torch.randn(16, 3, size, size, generator=g)
    split = Split([bytes([i]) for i in range(16)], np.arange(16) % 3, None)
    transform = lambda enc: (x_all[[e[0] for e in enc]], np.arange(len(enc)))  # noqa: E731
    plugin._labelled = LabelledBatches(split, transform, 8, torch.Generator().manual_seed(0), "classification")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method,plugin,recipe", CASES, ids=lambda v: str(v))
def test_one_bf16_step_of_every_framework_and_plugin(method, plugin, recipe, device, monkeypatch):
    from pipeline.plugins.cocor import CoCor

    monkeypatch.setattr(CoCor, "_n_classes", lambda self: 3)  # no shards to read class names from
    dev = torch.device(device)
    if not bf16_supported(dev):
        pytest.skip(f"{dev} has no bfloat16 support")
    torch.manual_seed(0)
    cfg = _cfg(method, plugin, recipe, device)
    m = build_method(cfg)
    if plugin == "cocor":
        _labelled_in_memory(m.plugins[0], cfg["data"]["image_size"])
    fmt = torch.channels_last  # what CUDA runs by default (train.channels_last=auto); forced on the CPU too
    m.to(dev, memory_format=fmt)
    opt = build_optimizer(m.online, cfg["optim"], lr=0.05)
    views = build_view_maker(cfg["augment"], N, seed=0)(_raw_batch(recipe), np.random.default_rng(0))
    images, params = to_device(views.images, views.params, dev, fmt)
    before = [p.detach().clone() for p in m.online.parameters()]
    out = optimisation_step(
        m, opt, images, params, "bf16", dev, progress=0.5, plugin_optimizers=PluginOptimizers(m.plugins)
    )

    assert torch.isfinite(out["loss"]) and out["loss"].dtype == torch.float32
    if plugin and plugin != "jointcrop":  # the plug-in's own term was added, and is finite
        terms = [k for k in out if k.startswith(plugin)]
        assert terms and all(torch.isfinite(torch.as_tensor(out[k])).all() for k in terms), sorted(out)
    grads = [p.grad for p in m.online.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert all(g.device.type == dev.type for g in grads)
    moved = sum(not torch.equal(a, b) for a, b in zip(before, m.online.parameters()))
    assert moved > len(before) // 2  # the optimiser stepped the network
    if plugin == "cocor":
        assert out["cocor_outer_loss"] == pytest.approx(out["cocor_outer_loss"]) and "cocor_target_lr" in out
    for buf in m.buffers():  # queues, momentum encoders, split-BN statistics all live on the device
        assert buf.device.type == dev.type


def test_memory_format_is_channels_last_on_cuda_only_unless_forced():
    assert memory_format("auto", torch.device("cpu")) == torch.contiguous_format
    assert memory_format("auto", torch.device("cuda")) == torch.channels_last
    assert memory_format(True, torch.device("cpu")) == torch.channels_last
    assert memory_format(False, torch.device("cuda")) == torch.contiguous_format


def test_channels_last_step_equals_the_contiguous_step():
    """channels_last changes only the memory layout: the same step gives the same loss and weights."""
    results = []
    for fmt in (torch.contiguous_format, torch.channels_last):
        torch.manual_seed(0)
        cfg = _cfg("simclr", None, "mocov2", "cpu")
        cfg["model"]["width"] = WIDE_ENOUGH
        m = build_method(cfg).to(memory_format=fmt)
        opt = build_optimizer(m.online, cfg["optim"], lr=0.05)
        views = build_view_maker(cfg["augment"], N, seed=0)(_raw_batch("mocov2"), np.random.default_rng(0))
        images, params = to_device(views.images, views.params, torch.device("cpu"), fmt)
        assert images[0].is_contiguous(memory_format=fmt)
        before = [p.detach().clone() for p in m.online.parameters()]
        out = optimisation_step(m, opt, images, params, "fp32", torch.device("cpu"), progress=0.5)
        update = torch.cat([(p.detach() - b).flatten() for p, b in zip(m.online.parameters(), before)])
        results.append((float(out["loss"]), update))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    # The update agrees up to oneDNN's channels_last backward on this CPU: at width 16 the two updates differ by about
    # 1.5 % (forward identical; a bare backbone's gradients agree to 2e-4), so the bound is loose; a layout mix-up
    # (weights read as NCHW while laid out NHWC) gives an unrelated update, far past it.
    (_, a), (_, b) = results
    assert float((a - b).norm() / a.norm()) < 0.1
    assert float(a.norm()) > 0


def test_to_device_moves_views_and_every_parameter():
    images = [torch.rand(2, 3, 4, 4)]
    params = [{"flip": torch.tensor([0, 1]), "sigma": torch.tensor([0.5, 1.0])}]
    meta = torch.device("meta")  # a device that is not the CPU, available everywhere
    moved, moved_params = to_device(images, params, meta)
    assert moved[0].device == meta and all(t.device == meta for t in moved_params[0].values())


def test_reduce_scalar_makes_its_tensor_on_the_given_device(monkeypatch):
    """nccl takes CUDA tensors only: the helper every rank sum goes through must build its tensor on the worker's
    device (the bug: torch.tensor(...) on the CPU crashed the first GPU batch)."""
    seen = []
    monkeypatch.setattr(dist, "is_dist", lambda: True)
    monkeypatch.setattr(dist.dist, "all_reduce", lambda t, op=None: seen.append((t.device, op)))
    with pytest.raises(RuntimeError, match="meta"):  # meta tensors have no value to read back: the collective had it
        dist.reduce_scalar(3, "min", torch.device("meta"))
    assert seen == [(torch.device("meta"), dist.dist.ReduceOp.MIN)]


def test_no_collective_is_called_outside_the_dist_helpers():
    """One place makes the tensors collectives see (pipeline/dist.py); a bare torch.distributed call elsewhere is
    how CPU-made tensors reached nccl."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "pipeline"
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "dist.py"
        and any(
            c in p.read_text()
            for c in ("distributed.all_reduce", "distributed.all_gather", "distributed.broadcast", "distributed.reduce")
        )
    ]
    assert offenders == []


def test_average_is_one_flat_all_reduce(monkeypatch):
    calls = []

    def fake_all_reduce(t, op=None):
        calls.append(t.numel())
        t.mul_(2)  # as if two ranks held the same values

    monkeypatch.setattr(dist, "is_dist", lambda: True)
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist.dist, "all_reduce", fake_all_reduce)
    a, b = torch.arange(6.0).view(2, 3), torch.tensor([5.0, -1.0])
    dist.average_([a, b])
    assert calls == [8]
    torch.testing.assert_close(a, torch.arange(6.0).view(2, 3))
    torch.testing.assert_close(b, torch.tensor([5.0, -1.0]))


def _two_forwards_through_ddp(rank, world, port, q):
    """Symmetric MoCo with a BN head on each rank, wrapped as the trainer wraps it: rank 1's running statistics
    drift (as after a step on its own batch), the step starts with sync_buffers_, runs the online encoder twice,
    then backward."""
    import warnings

    from torch.nn.parallel import DistributedDataParallel

    from helpers import init_gloo

    init_gloo(rank, world, port)
    torch.manual_seed(0)
    cfg = _cfg("mocov2", None, "mocov2", "cpu")
    cfg["method"].update(symmetric=True, bn_splits=1)
    cfg["method"]["head"]["bn"] = True
    cfg["model"]["width"] = WIDE_ENOUGH
    m = build_method(cfg)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m.online = DistributedDataParallel(m.online, **dist.ddp_options())
    deprecated = [str(w.message)[:80] for w in seen if issubclass(w.category, FutureWarning)]
    with torch.no_grad():
        for b in m.online.buffers():
            b.add_(rank)
    dist.sync_buffers_(m.online)
    synced = [b.numpy().copy() for b in m.online.buffers()]
    g = torch.Generator().manual_seed(rank)
    images = [torch.randn(8, 3, 32, 32, generator=g) for _ in range(2)]
    try:
        m.framework_loss(images)["loss"].backward()
        error = None
    except RuntimeError as e:
        error = str(e)[:200]
    q.put((rank, synced, deprecated, error))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def test_two_forwards_through_ddp_then_backward_with_buffers_synced_once_a_step():
    """torch 2.11's DDP rewrote BatchNorm's running statistics in place at a step's second forward, which the first
    forward had saved for backward: symmetric MoCo (BYOL, DINO, CLSA, CoCor alike) failed on two workers. The
    trainer's DDP options sync no buffer inside forward; sync_buffers_ gives every rank rank 0's once a step."""
    from helpers import run_process_group

    (r0, synced0, deprecated0, error0), (r1, synced1, _, error1) = run_process_group(_two_forwards_through_ddp, 2)
    assert (error0, error1) == (None, None)
    assert len(synced0) > 10  # BN running means, variances, counts of backbone and head
    for a, b in zip(synced0, synced1, strict=True):
        np.testing.assert_array_equal(a, b)  # rank 1's drift undone: rank 0's values everywhere
    assert deprecated0 == []  # the option this torch names (forward_sync_buffers from 2.14 on)


def _loss_cases():
    g = torch.Generator().manual_seed(3)
    q, k, z = (torch.nn.functional.normalize(torch.randn(8, 16, generator=g), dim=1) for _ in range(3))
    queue = torch.nn.functional.normalize(torch.randn(32, 16, generator=g), dim=1)
    y = torch.tensor([0, 1, 0, 2, 1, 1, 3, 2])
    return {
        "info_nce": lambda: info_nce(q, k, queue, 0.2),
        "nt_xent": lambda: nt_xent(q, k, 0.1),
        "supcon": lambda: supcon_loss(torch.cat([q, k]), torch.cat([y, y]), 0.1),
        "co2": lambda: co2_consistency(q, k, queue, 0.05),
        "byol": lambda: byol_loss(q, k),
    }


@pytest.mark.parametrize("name", list(_loss_cases()))
def test_losses_run_in_float32_under_bf16_autocast(name):
    """Inside the step's autocast the similarity matmuls would otherwise run in bf16 (SupCon's loss even came out
    in bf16); every loss keeps float32 whatever the context."""
    if not bf16_supported(torch.device("cpu")):
        pytest.skip("this CPU has no bfloat16 autocast")
    fn = _loss_cases()[name]
    exact = fn()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = fn()
    assert inside.dtype == torch.float32
    assert float(inside) == pytest.approx(float(exact), rel=1e-6)


def test_colour_stage_stays_float32_when_autocast_would_lower_its_matmul(monkeypatch):
    """CUDA's autocast runs the YIQ hue einsum in bf16 and index_copy then refused to mix dtypes (InvCLR's image
    recipe crashed on the H100). CPU autocast leaves einsum alone, so this emulates CUDA's policy."""
    from pipeline.augment import colour

    real = torch.einsum

    def cuda_like_einsum(eq, *ops):
        if torch.is_autocast_enabled("cpu"):
            ops = [o.bfloat16() for o in ops]
        return real(eq, *ops)

    monkeypatch.setattr(torch, "einsum", cuda_like_einsum)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 8, 8, generator=g)
    p = {
        "jitter_on": torch.tensor([1, 1, 0, 1, 1, 0]),
        "gray": torch.tensor([0, 1, 0, 0, 1, 0]),
        **{k: torch.rand(6, generator=g) + 0.5 for k in ("brightness", "contrast", "saturation")},
        "hue": torch.rand(6, generator=g) * 0.2 - 0.1,
        "jitter_order": torch.stack([torch.randperm(4, generator=g) for _ in range(6)]),
    }
    exact = colour.colour_distort(x, p, "yiq")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = colour.colour_distort(x, p, "yiq")
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, exact)


@pytest.mark.slow
def test_compiled_backbones_give_the_eager_step_and_keep_checkpoint_keys():
    """train.compile=true (torch.compile of every backbone, in place): same losses over two steps as eager (inductor
    on the CPU here), and the same state-dict keys, so a checkpoint loads with or without it. MoCo for its two
    backbones, in one BN group: split BN makes inductor's cold build six times longer here (240 s against 42 s), so
    tests/models/test_models.py compiles a split-BN layer alone."""
    from pipeline.train.step import compile_backbones

    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        cfg = _cfg("mocov2", None, "mocov2", "cpu")
        cfg["method"]["bn_splits"] = 1
        cfg["model"]["width"] = WIDE_ENOUGH  # inductor runs the CPU's convolutions channels_last
        m = build_method(cfg)
        keys = list(m.state_dict())
        if compiled:
            compile_backbones(m)
            assert list(m.state_dict()) == keys
        opt = build_optimizer(m.online, cfg["optim"], lr=0.05)
        views = build_view_maker(cfg["augment"], N, seed=0)(_raw_batch("mocov2"), np.random.default_rng(0))
        runs.append(
            [
                float(optimisation_step(m, opt, views.images, views.params, "fp32", torch.device("cpu"), 0.5)["loss"])
                for _ in range(2)
            ]
        )
    assert runs[1] == pytest.approx(runs[0], rel=1e-4)
    assert runs[0][0] != runs[0][1]  # the second step saw updated weights


def test_compile_with_the_invclr_penalty_is_refused_before_ray(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.train.prepare import resolve

    cfg = compose_config([f"paths.root={tmp_path}", "+experiment=invclr_spirograph", "train.compile=true"])
    with pytest.raises(ConfigError, match="double backward"):
        resolve(cfg)
