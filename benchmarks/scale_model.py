"""Scale on paper: ImageNet-1k ResNet-50 MoCo v2 on 8, 64 and 256 GPUs, from the model the project builds, our
measured CPU decode rate and stated assumptions. Nothing here trains: it builds the method once on the CPU to count
its tensors, then applies one formula per quantity (each function below states its formula).

    python benchmarks/scale_model.py                           # print the tables
    python benchmarks/scale_model.py --out docs/scale.md       # write the doc (docs/scale.md is made so)
    python benchmarks/scale_model.py --moco-img-s 3100         # a measured MoCo v2 rate per GPU instead of the
                                                               # one derived from a published supervised rate
    python benchmarks/scale_model.py --node-gbps 1600 --gpus 8 16 32
    python benchmarks/scale_model.py --help                    # every assumption, with its default

Measured: the model sizes (parameters, momentum encoder, queue, checkpoint tensors: counted on the built method)
and the CPU decode + augment rate (docs/measured.md). Assumed: everything else, each an option.
"""

from __future__ import annotations

import argparse
import functools
import math
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The method docs/gpu.md trains on ImageNet, with MoCo v2's ImageNet queue (conf/method/mocov2.yaml: "65536 for
# ImageNet") and the multi-GPU shuffle-BN layout (bn_splits 1: what `auto` resolves to on more than one worker).
OVERRIDES = (
    "method=mocov2",
    "augment=mocov2",
    "data=imagenet",
    "model.backbone=resnet50",
    "model.cifar_stem=false",
    "model.width=64",
    "method.bn_splits=1",
    "method.queue_size=65536",
)
VIEW_BYTES_PER_VALUE = 4  # the augment executors' views are float32 [B, 3, S, S]; on the wire: --view-wire-bytes
# The exchange facebookresearch/moco runs, the reference table C's text compares the modes with: it gathers the key
# projections twice, to unshuffle them and for the queue.
OFFICIAL_KEY_GATHERS = 2
# A check of the compute model against a published run: facebookresearch/moco's README reports 53 hours for MoCo v2's
# 200 epochs on 8 V100s (batch 256, fp32); NVIDIA's DeepLearningExamples give 367 img/s for one V100 16GB in fp32.
MOCO_REPO_HOURS = 53.0
V100_FP32_IMG_S = 367.0
STALL_TARGET = 0.02  # a checkpoint share of the run the report suggests an interval for, where it is exceeded

DEFAULTS = dict(
    gpus=[8, 64, 256],
    gpus_per_node=8,
    per_gpu_batch=32,
    global_batch=256,
    supervised_img_s=2470.0,
    backward_forwards=2.0,
    moco_img_s=None,
    nvlink_gbytes=230.0,
    node_gbps=400.0,
    overlap=0.5,
    small_allreduce_us=10.0,
    view_wire_bytes=2,
    hop_us=5.0,
    comm_budget=0.10,
    images=1_281_167,
    jpeg_kb=110.0,
    tar_overhead_bytes=1792,
    decode_per_cpu_s=51.1,
    storage_mbytes=500.0,
    epochs=200,
    checkpoint_every=None,
)


# ============================================================================= the formulas, one function each
def moco_rate(supervised_img_s: float, backward_forwards: float) -> float:
    """MoCo v2 image pairs/s per GPU from a supervised ResNet-50 training rate.

    A supervised step costs 1 forward + 1 backward = (1 + r) forwards per image, r = backward_forwards (a backward
    ~ 2 forwards). MoCo v2 per image pair: the query forward and backward on one view plus the key encoder's
    forward (no backward) on the other: (2 + r) forwards. So rate = supervised * (1 + r) / (2 + r) (3/4 at r = 2).
    The 2048-2048-128 head and the 65536-key logits add < 1% and are left out."""
    return supervised_img_s * (1 + backward_forwards) / (2 + backward_forwards)


def compute_time(per_gpu_batch: int, moco_img_s: float) -> float:
    """Seconds of GPU compute per step: t_c = per-GPU batch / per-GPU rate (the rate taken as independent of the
    batch)."""
    return per_gpu_batch / moco_img_s


def backward_time(t_compute: float, backward_forwards: float) -> float:
    """The query encoder's backward in a MoCo step, the only time DDP can hide its all-reduce behind:
    t_b = t_c * r / (2 + r) (half the step at r = 2)."""
    return t_compute * backward_forwards / (2 + backward_forwards)


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each GPU sends (and receives) in a ring all-reduce of `nbytes` over n GPUs: 2 (n - 1) / n * nbytes."""
    return 2 * (n - 1) / n * nbytes


def ring_allgather_bytes(chunk_bytes: float, n: int) -> float:
    """Bytes each GPU receives (and sends) in a ring all-gather of one `chunk_bytes` chunk per GPU: (n - 1) * chunk.
    A node receives about as much: every other GPU's chunk comes in once and is shared over NVLink."""
    return (n - 1) * chunk_bytes


def link_bandwidth(n: int, gpus_per_node: int, nvlink_bytes_s: float, node_bytes_s: float) -> float:
    """Bytes/s a collective's per-GPU ring traffic moves at: NVLink's per-GPU bus bandwidth when the n GPUs share one
    node, else the node's inter-node network (the ring crosses each node boundary once per channel, so a node's
    NICs together carry one GPU's ring traffic)."""
    return nvlink_bytes_s if n <= gpus_per_node else node_bytes_s


def transfer_time(nbytes: float, bytes_s: float) -> float:
    """t = bytes / bandwidth (latency left out: ~100 MB messages are bandwidth-bound)."""
    return nbytes / bytes_s


def exposed_allreduce(t_allreduce: float, t_backward: float, overlap: float) -> float:
    """All-reduce time left on the step after DDP's overlap with backward: t_ar - min(overlap * t_ar, t_b)."""
    return t_allreduce - min(overlap * t_allreduce, t_backward)


def step_time(t_compute: float, t_allreduce_exposed: float, t_exchange: float) -> float:
    """t_step = t_c + exposed all-reduce + the key exchange (blocking: the key encoder waits for its views)."""
    return t_compute + t_allreduce_exposed + t_exchange


def bandwidth_for_budget(
    allreduce_bytes: float,
    exchange_bytes: float,
    t_compute: float,
    t_backward: float,
    overlap: float,
    budget: float,
    fixed_s: float = 0.0,
) -> float:
    """Bandwidth B at which the step's communication costs `budget` * t_c, with E(B) = exposed all-reduce + the key
    exchange's G / B + F: B1 = ((1 - overlap) A + G) / (budget t_c - F) while overlap * A / B1 <= t_b (the hidden
    part fits in backward), else B2 = (A + G) / (budget t_c - F + t_b). A, G: the all-reduce and exchange bytes per
    GPU (or node) on B; F: the exchange's seconds that B does not change (exchange_load). Infinite when F alone
    exceeds the budget."""
    room = budget * t_compute - fixed_s
    if room <= 0:
        return math.inf
    b1 = ((1 - overlap) * allreduce_bytes + exchange_bytes) / room
    if b1 == 0 or overlap * allreduce_bytes / b1 <= t_backward:
        return b1
    return (allreduce_bytes + exchange_bytes) / (room + t_backward)


def steps_per_epoch(images: int, n: int, per_gpu_batch: int) -> int:
    """Optimiser steps per epoch as pipeline/train/prepare.py counts them: (images // n) // per-GPU batch."""
    return (images // n) // per_gpu_batch


def read_bytes_s(images_s: float, bytes_per_image: float) -> float:
    """Shard bytes/s read = images/s * (mean JPEG bytes + tar bytes per sample); each sample is read once an epoch."""
    return images_s * bytes_per_image


def decode_cpus(images_s: float, images_per_cpu_s: float) -> float:
    """CPUs to decode and augment on the host = images/s / images per CPU-second."""
    return images_s / images_per_cpu_s


def checkpoint_bytes(method) -> int:
    """Tensor bytes of what pipeline/checkpoint.py saves: the method's state (online and momentum encoders with their
    BN buffers, the queue) + the optimiser state (SGD's or LARS's momentum buffer: one more copy of every trainable
    parameter). The pickled keys, the config and the zip records add a few hundred bytes a tensor on top."""
    from pipeline.checkpoint import method_state

    state = sum(t.numel() * t.element_size() for t in method_state(method).values())
    momentum = sum(p.numel() * p.element_size() for p in method.online.parameters() if p.requires_grad)
    return state + momentum


def write_time(nbytes: float, bytes_s: float) -> float:
    """Checkpoint seconds = bytes / storage write bandwidth. Blocking: ray.train.report uploads before it returns
    (Ray Train's default SYNC mode), and every rank waits in report."""
    return nbytes / bytes_s


def lost_work(interval_s: float) -> float:
    """Training lost to a failure: at most one checkpoint interval (trainer.max_failures restarts from the last
    checkpoint), half of one on average; plus the restart itself, not modelled."""
    return interval_s


def epochs_for_stall(stall: float, checkpoint_s: float, epoch_s: float) -> int:
    """The fewest whole epochs between checkpoints that keep the blocking write within `stall` of the run:
    t_ckpt / (k t_epoch + t_ckpt) <= stall, so k = ceil(t_ckpt (1 - stall) / (stall t_epoch))."""
    return max(1, math.ceil(checkpoint_s * (1 - stall) / (stall * epoch_s)))


# ------------------------------------------------------------------ method.key_bn (pipeline/methods/key_bn.py)
KEY_BN_MODES = ("shuffle", "shuffle_node", "sync", "split")  # key_bn.MODES less `auto`, which resolves to one


def node_list(n: int, gpus_per_node: int) -> list[int]:
    """Every rank's node on n GPUs that fill nodes of gpus_per_node in rank order: rank r on node r // g (the layout
    `dist.node_ranks()` reports to key_bn.resolve)."""
    return [r // gpus_per_node for r in range(n)]


def auto_mode(n: int, gpus_per_node: int) -> str:
    """The mode `method.key_bn=auto` trains with on this layout, from the code's own rule
    (pipeline/methods/key_bn.py resolve): split on one GPU, shuffle on one node, shuffle_node on several nodes of
    two or more GPUs each, else shuffle."""
    from pipeline.methods.key_bn import resolve

    return resolve("auto", node_list(n, gpus_per_node))


def small_allreduce_latency(n: int, gpus_per_node: int, floor_us: float, hop_us: float) -> float:
    """Seconds one small (latency-bound) all-reduce takes: NCCL's tree, 2 log2(nodes) inter-node hops on top of the
    in-node floor: floor + 2 log2(nodes) x hop."""
    nodes = math.ceil(n / gpus_per_node)
    return (floor_us + 2 * math.log2(nodes) * hop_us) * 1e-6


def exchange_load(mode: str, n: int, b: int, sizes: dict, a: argparse.Namespace) -> tuple[float, float, float]:
    """(bytes each GPU sends in a step, bytes on the link B, seconds B does not change) for one key_bn mode, the
    queue's key all-gather included. B is link_bandwidth's: NVLink on one node, the node's network past it; the
    exchange takes F + bytes on B / B (key_exchange). V2: a view on the wire (--view-wire-bytes a value: 2, bf16
    under autocast); K: a key (float32); g: GPUs in a node.

    shuffle: an all-to-all of the b (N - 1) / N views dealt to other ranks and their keys back: b (N - 1) / N
      (V2 + K) per GPU, in expectation (the permutation is random); past one node the node's NICs carry every GPU's
      cross-node share, b (N - g) / N (V2 + K) x g on B (the NVLink share runs alongside, so it adds no time).
    shuffle_node: the same within a node of g GPUs, over NVLink: b (g - 1) / g (V2 + K); past one node it is F.
    sync: one all-reduce of (2 C + 1) float64 per BN layer: ring bytes 2 (N - 1) / N (2 C + 1) 8 on B, and F = the
      layers' small_allreduce_latency (they run in sequence, so nothing hides it).
    split: nothing crosses.
    Every mode then all-gathers the b keys for the queue: (N - 1) b K on B."""
    g = min(n, a.gpus_per_node)
    nvlink = a.nvlink_gbytes * 1e9
    one_node = n <= a.gpus_per_node
    row = sizes["view_bytes"] // VIEW_BYTES_PER_VALUE * a.view_wire_bytes + sizes["key_bytes"]
    queue = ring_allgather_bytes(b * sizes["key_bytes"], n)
    if mode == "shuffle":
        sent = b * (n - 1) / n * row
        on_link = sent if one_node else b * (n - g) / n * row * g
        return sent + queue, on_link + queue, 0.0
    if mode == "shuffle_node":
        sent = b * (g - 1) / g * row
        if one_node:
            return sent + queue, sent + queue, 0.0
        return sent + queue, queue, transfer_time(sent, nvlink)
    if mode == "sync":
        sent = sum(ring_allreduce_bytes((2 * c + 1) * 8, n) for c in sizes["bn_channels"])
        latency = small_allreduce_latency(n, a.gpus_per_node, a.small_allreduce_us, a.hop_us)
        return sent + queue, sent + queue, latency * len(sizes["bn_channels"])
    if mode == "split":
        return queue, queue, 0.0
    raise ValueError(f"unknown key_bn mode {mode!r}")


def key_exchange(mode: str, n: int, b: int, sizes: dict, a: argparse.Namespace) -> tuple[float, float]:
    """(bytes each GPU sends in a step, seconds the key encoder waits for them) for one key_bn mode:
    (sent, F + bytes on B / B) of exchange_load, which states each mode's formula."""
    sent, on_link, fixed = exchange_load(mode, n, b, sizes, a)
    link = link_bandwidth(n, a.gpus_per_node, a.nvlink_gbytes * 1e9, a.node_gbps * 1e9 / 8)
    return sent, fixed + transfer_time(on_link, link)


def official_exchange(n: int, b: int, sizes: dict, a: argparse.Namespace) -> tuple[float, float]:
    """(bytes each GPU receives in a step, seconds) of facebookresearch/moco's shuffle-BN (`_batch_shuffle_ddp`),
    the reference the modes are compared with: the global batch's float32 views all-gathered and the keys gathered
    twice, (N - 1) b (V4 + 2 K), on the link B."""
    sent = ring_allgather_bytes(b * sizes["view_bytes"], n)
    sent += OFFICIAL_KEY_GATHERS * ring_allgather_bytes(b * sizes["key_bytes"], n)
    link = link_bandwidth(n, a.gpus_per_node, a.nvlink_gbytes * 1e9, a.node_gbps * 1e9 / 8)
    return sent, transfer_time(sent, link)


def exchange_scenario(
    n: int, b: int, sizes: dict, a: argparse.Namespace, exchange: tuple[float, float], compress: bool = False
) -> dict:
    """Step time, efficiency and bytes per GPU with a key exchange of (bytes, seconds); compress: the gradient
    all-reduce in bf16 (trainer.grad_compression=bf16: half the bytes)."""
    rate = a.moco_img_s or moco_rate(a.supervised_img_s, a.backward_forwards)
    bw = link_bandwidth(n, a.gpus_per_node, a.nvlink_gbytes * 1e9, a.node_gbps * 1e9 / 8)
    t_c = compute_time(b, rate)
    ar = ring_allreduce_bytes(sizes["grad_bytes"] / (2 if compress else 1), n)
    t_ar = exposed_allreduce(transfer_time(ar, bw), backward_time(t_c, a.backward_forwards), a.overlap)
    sent, t_x = exchange
    t_step = step_time(t_c, t_ar, t_x)
    return {"n": n, "bytes": ar + sent, "exchange_bytes": sent, "t_step": t_step, "efficiency": t_c / t_step}


def mode_scenario(mode: str, n: int, b: int, sizes: dict, a: argparse.Namespace, compress: bool = False) -> dict:
    """exchange_scenario with one key_bn mode's exchange (key_exchange)."""
    return {"mode": mode, **exchange_scenario(n, b, sizes, a, key_exchange(mode, n, b, sizes, a), compress)}


# ============================================================================= the model the project builds
@functools.lru_cache(maxsize=4)
def model_sizes(overrides: tuple[str, ...] = OVERRIDES) -> dict:
    """Counted on `build_method(compose_config(overrides))` on the CPU (no training)."""
    import torch

    from pipeline.build import build_method
    from pipeline.config import compose_config

    cfg = compose_config(list(overrides))
    method = build_method(cfg)
    online = [p for p in method.online.parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in online)
    size = int(cfg["augment"]["size"])
    return {
        "overrides": list(overrides),
        "trainable": sum(p.numel() for p in online),
        "backbone": sum(p.numel() for p in method.online.backbone.parameters()),
        "head": sum(p.numel() for p in method.online.projector.parameters()),
        "momentum": sum(p.numel() for p in method.key_encoder.parameters()),
        "queue_shape": tuple(method.queue.keys.shape),
        "queue_bytes": method.queue.keys.numel() * method.queue.keys.element_size(),
        "grad_bytes": grad_bytes,
        "grad_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in online}),
        "checkpoint_bytes": checkpoint_bytes(method),
        "image_size": size,
        "bn_channels": [
            mod.num_features
            for mod in method.key_encoder.modules()
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)
        ],
        "view_bytes": 3 * size * size * VIEW_BYTES_PER_VALUE,
        "key_bytes": int(cfg["method"]["head"]["out_dim"]) * 4,
        "checkpoint_every": int(cfg["train"]["checkpoint_every"]),
        "base_lr": float(cfg["optim"]["base_lr"]),
    }


# ============================================================================= one column of a table
def scenario(n: int, per_gpu_batch: int, sizes: dict, a: argparse.Namespace) -> dict:
    """Every quantity for n GPUs at this per-GPU batch, with the key exchange of the mode `method.key_bn=auto` runs
    on this layout (auto_mode)."""
    from pipeline.schedules import scaled_lr

    rate = a.moco_img_s or moco_rate(a.supervised_img_s, a.backward_forwards)
    nodes = math.ceil(n / a.gpus_per_node)
    per_node = min(n, a.gpus_per_node)
    bw = link_bandwidth(n, a.gpus_per_node, a.nvlink_gbytes * 1e9, a.node_gbps * 1e9 / 8)
    t_c = compute_time(per_gpu_batch, rate)
    t_b = backward_time(t_c, a.backward_forwards)
    ar_bytes = ring_allreduce_bytes(sizes["grad_bytes"], n)
    mode = auto_mode(n, a.gpus_per_node)
    x_bytes, x_on_link, x_fixed = exchange_load(mode, n, per_gpu_batch, sizes, a)
    _, t_exchange = key_exchange(mode, n, per_gpu_batch, sizes, a)
    t_ar = transfer_time(ar_bytes, bw)
    t_ar_exposed = exposed_allreduce(t_ar, t_b, a.overlap)
    t_step = step_time(t_c, t_ar_exposed, t_exchange)
    gpu_img_s = per_gpu_batch / t_step
    steps = steps_per_epoch(a.images, n, per_gpu_batch)
    epoch_s = steps * t_step
    ckpt_s = write_time(sizes["checkpoint_bytes"], a.storage_mbytes * 1e6)
    interval_s = a.checkpoint_every * epoch_s
    return {
        "n": n,
        "nodes": nodes,
        "per_node": per_node,
        "per_gpu_batch": per_gpu_batch,
        "global_batch": per_gpu_batch * n,
        "lr": scaled_lr(sizes["base_lr"], per_gpu_batch * n),
        "moco_img_s": rate,
        "link": "NVLink" if n <= a.gpus_per_node else "inter-node",
        "bandwidth_bytes_s": bw,
        "t_compute": t_c,
        "t_backward": t_b,
        "allreduce_bytes": ar_bytes,
        "t_allreduce": t_ar,
        "t_allreduce_exposed": t_ar_exposed,
        "key_bn": mode,
        "exchange_bytes": x_bytes,
        "queue_gather_bytes": ring_allgather_bytes(per_gpu_batch * sizes["key_bytes"], n),
        "t_exchange": t_exchange,
        "t_step": t_step,
        "efficiency": t_c / t_step,
        "gpu_img_s": gpu_img_s,
        "total_img_s": gpu_img_s * n,
        "bandwidth_needed_bytes_s": bandwidth_for_budget(
            ar_bytes, x_on_link, t_c, t_b, a.overlap, a.comm_budget, x_fixed
        ),
        "allreduce_needed_bytes_s": ar_bytes / t_b,
        "node_read_bytes_s": read_bytes_s(gpu_img_s * per_node, a.jpeg_kb * 1e3 + a.tar_overhead_bytes),
        "cpus_per_gpu": decode_cpus(gpu_img_s, a.decode_per_cpu_s),
        "cpus_per_node": decode_cpus(gpu_img_s * per_node, a.decode_per_cpu_s),
        "steps_per_epoch": steps,
        "epoch_s": epoch_s,
        "epochs": a.epochs,
        "train_h": a.epochs * epoch_s / 3600,
        "checkpoint_s": ckpt_s,
        "interval_s": interval_s,
        "checkpoint_stall": ckpt_s / (interval_s + ckpt_s),
        "lost_s": lost_work(interval_s),
        "lost_gpu_h": lost_work(interval_s) * n / 3600,
    }


# ============================================================================= the report
def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def _mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB"


def _gbps(bytes_s: float) -> str:
    return f"{bytes_s * 8 / 1e9:,.0f} Gb/s"


def _minutes(s: float) -> str:
    return f"{s / 60:,.1f} min"


def _link(c: dict, bytes_s: float) -> str:
    """A bandwidth as the link it is on is quoted: GB/s per GPU on NVLink, Gb/s per node between nodes."""
    if math.isinf(bytes_s):
        return "none: the NVLink share alone exceeds the budget"
    if c["link"] == "NVLink":
        return f"{bytes_s / 1e9:,.0f} GB/s per GPU (NVLink)"
    return f"{_gbps(bytes_s)} per node"


ROWS = [  # (label, cell)
    ("nodes x GPUs", lambda c: f"{c['nodes']} x {c['per_node']}"),
    ("per-GPU / global batch", lambda c: f"{c['per_gpu_batch']} / {c['global_batch']:,}"),
    ("lr (SGD, linear scaling: base_lr x global / 256)", lambda c: f"{c['lr']:.3g}"),
    ("compute per step (t_c; backward t_b)", lambda c: f"{_ms(c['t_compute'])} ({_ms(c['t_backward'])})"),
    ("gradient all-reduce, bytes sent per GPU", lambda c: _mb(c["allreduce_bytes"])),
    ("all-reduce time over the link (exposed after overlap)", lambda c: f"{_ms(c['t_allreduce'])} "
     f"({_ms(c['t_allreduce_exposed'])})"),
    ("link on which the all-reduce takes t_b", lambda c: _link(c, c["allreduce_needed_bytes_s"])),
    ("`method.key_bn=auto` runs (key_bn.resolve on this layout)", lambda c: f"`{c['key_bn']}`"),
    ("key exchange (views dealt out, keys back, the queue's key all-gather), bytes sent per GPU", lambda c:
     f"{_mb(c['exchange_bytes'])} (queue {_mb(c['queue_gather_bytes'])})"),
    ("key exchange time (not overlapped)", lambda c: _ms(c["t_exchange"])),
    ("**step time**", lambda c: f"**{_ms(c['t_step'])}**"),
    ("scaling efficiency (t_c / t_step)", lambda c: f"{c['efficiency']:.0%}"),
    ("images/s per GPU; all GPUs", lambda c: f"{c['gpu_img_s']:,.0f}; {c['total_img_s']:,.0f}"),
    ("link for communication <= budget x t_c", lambda c: _link(c, c["bandwidth_needed_bytes_s"])),
    ("shard read per node", lambda c: f"{c['node_read_bytes_s'] / 1e6:,.0f} MB/s"),
    ("Ray Data CPUs to decode, per GPU (per node)", lambda c: f"{c['cpus_per_gpu']:.1f} ({c['cpus_per_node']:.0f})"),
    ("steps per epoch; epoch time", lambda c: f"{c['steps_per_epoch']:,}; {_minutes(c['epoch_s'])}"),
    ("training time", lambda c: f"{c['train_h']:,.1f} h ({c['epochs']} epochs)"),
    ("checkpoint write (blocking); share of an interval", lambda c: f"{c['checkpoint_s']:.2f} s; "
     f"{c['checkpoint_stall']:.2%}"),
    ("work lost to a failure, at most", lambda c: f"{_minutes(c['lost_s'])} = {c['lost_gpu_h']:,.1f} GPU-h"),
]  # fmt: skip


def table(columns: list[dict]) -> str:
    """One markdown table: a row per quantity, a column per GPU count."""
    lines = ["| quantity | " + " | ".join(f"{c['n']} GPUs" for c in columns) + " |"]
    lines.append("| --- |" + " --- |" * len(columns))
    lines += [f"| {label} | " + " | ".join(cell(c) for c in columns) + " |" for label, cell in ROWS]
    return "\n".join(lines)


def assumptions(a: argparse.Namespace, sizes: dict) -> list[tuple[str, str, str]]:
    """(option, value, where it comes from) for every input that is not counted on the built method."""
    derived = moco_rate(a.supervised_img_s, a.backward_forwards)
    rate = (
        f"{a.moco_img_s:,.0f} img/s per GPU, given"
        if a.moco_img_s
        else f"none: derived, {a.supervised_img_s:,.0f} x (1 + {a.backward_forwards:g}) / (2 + "
        f"{a.backward_forwards:g}) = {derived:,.1f} image pairs/s per GPU"
    )
    return [
        (
            "--supervised-img-s",
            f"{a.supervised_img_s:,.0f} img/s",
            "ASSUMPTION, not measured here: the mixed-precision training rate NVIDIA publishes for one A100 80GB "
            "(DeepLearningExamples, PyTorch ResNet50 v1.5 README, DGX A100 table, pytorch-21.03 container), "
            "torchvision's ResNet-50 being v1.5 too. Measured at that benchmark's own per-GPU batch; at 32 a GPU "
            "is busy a smaller share of the time, so the rate is optimistic",
        ),
        (
            "--backward-forwards",
            f"{a.backward_forwards:g}",
            "ASSUMPTION: a backward costs r forwards; MoCo v2 = (2 + r) forwards per pair against (1 + r) supervised",
        ),
        ("--moco-img-s", rate, "replace with the MoCo v2 row of `python benchmarks/gpu` once a GPU has run it"),
        (
            "--gpus-per-node",
            f"{a.gpus_per_node}",
            "ASSUMPTION: 8-GPU nodes; 8 GPUs share one node and talk over NVLink only",
        ),
        (
            "--nvlink-gbytes",
            f"{a.nvlink_gbytes:g} GB/s per GPU",
            "ASSUMPTION: NCCL all-reduce bus bandwidth inside an 8 x A100 NVSwitch node (NVLink 3: 300 GB/s per "
            "direction per GPU, less what NCCL achieves)",
        ),
        (
            "--node-gbps",
            f"{a.node_gbps:g} Gb/s per node",
            "ASSUMPTION: inter-node network of a cloud A100 node (e.g. 4 x 100 Gb/s EFA); a DGX A100 has "
            "8 x 200 Gb/s InfiniBand = 1600",
        ),
        (
            "--overlap",
            f"{a.overlap:g}",
            "ASSUMPTION: the share of the all-reduce DDP hides behind backward (bucketed, fired as gradients "
            "are ready), capped at the backward's time",
        ),
        (
            "--view-wire-bytes",
            f"{a.view_wire_bytes} B a value",
            "a key view's values on the wire in method.key_bn's all-to-all; 2 under bf16 autocast (the GPU "
            "default: pipeline/methods/key_bn.py wire_dtype), 4 in float32",
        ),
        (
            "--small-allreduce-us, --hop-us",
            f"{a.small_allreduce_us:g} us, {a.hop_us:g} us",
            "ASSUMPTION, table C's sync: a small all-reduce's floor in a node and each inter-node tree hop (H100 "
            "NVLink 5-10 us end to end; InfiniBand NDR 2-5 us a hop; NCCL's tree: 2 log2(nodes) hops)",
        ),
        (
            "--comm-budget",
            f"{a.comm_budget:g}",
            "target for the 'link for communication' row: exposed communication <= this x t_c",
        ),
        ("--images", f"{a.images:,}", "ImageNet-1k train images"),
        (
            "--jpeg-kb",
            f"{a.jpeg_kb:g} kB",
            "ASSUMPTION: mean JPEG size of ImageNet-1k train (its train archive: ~140 GB for 1.28 M images)",
        ),
        (
            "--tar-overhead-bytes",
            f"{a.tar_overhead_bytes:,} B",
            "per sample in our shards: a 512 B tar header for each of the jpg and cls members, the label's "
            "512 B block, half a block of padding after the JPEG on average",
        ),
        (
            "--decode-per-cpu-s",
            f"{a.decode_per_cpu_s:g} img per CPU-second",
            "MEASURED: docs/measured.md, `python benchmarks/augment.py --images 512 --batch 64 --threads 1`, "
            "the DALI executor on the CPU, MoCo v2's two views at 224 px from 500x375 JPEGs",
        ),
        (
            "--storage-mbytes",
            f"{a.storage_mbytes:g} MB/s",
            "ASSUMPTION: rank 0's upload bandwidth to trainer.storage (S3, GCS or a shared filesystem)",
        ),
        ("--epochs", f"{a.epochs}", "MoCo v2's 200-epoch ImageNet schedule (800 for its best numbers)"),
        (
            "--checkpoint-every",
            f"{a.checkpoint_every} epoch(s)",
            "train.checkpoint_every of the composed config (conf/config.yaml)",
        ),
    ]


MODE_NOTES = {
    "shuffle": "all-to-all of the dealt views (bf16) and keys; `auto` on one node",
    "shuffle_node": "the same within each node; `auto` on several nodes of 2 or more GPUs",
    "sync": "the key encoder's BN synced: a latency-bound all-reduce per layer",
    "split": "BN groups within a GPU: nothing crosses (the shuffle stays in one GPU's batch)",
}


def modes_table(modes: dict, gpus: list[int]) -> list[str]:
    """Efficiency and bytes per GPU per step for each key_bn mode, with and without bf16 gradients."""
    lines = [
        "| method.key_bn | " + " | ".join(f"{n} GPUs: efficiency; GB per GPU a step" for n in gpus) + " | what |",
        "| --- |" + " --- |" * (len(gpus) + 1),
    ]
    for (mode, compress), cols in modes.items():
        label = f"`{mode}`" + (" + bf16 gradients" if compress else "")
        cells = " | ".join(f"{c['efficiency']:.0%}; {c['bytes'] / 1e9:.3f}" for c in cols)
        lines.append(f"| {label} | {cells} | {MODE_NOTES[mode] if not compress else ''} |")
    return lines


def report(
    command: str,
    sizes: dict,
    a: argparse.Namespace,
    weak: list[dict],
    fixed: list[dict],
    modes: dict | None = None,
    official: list[dict] | None = None,
) -> str:
    counts = ", ".join(str(n) for n in a.gpus)
    rate = a.moco_img_s or moco_rate(a.supervised_img_s, a.backward_forwards)
    q_rows, q_dim = sizes["queue_shape"]
    last_w, last_f = weak[-1], fixed[-1]
    multi = [c for c in weak if c["link"] != "NVLink"]
    view_wire = sizes["view_bytes"] // VIEW_BYTES_PER_VALUE * a.view_wire_bytes
    lines = [
        f"# Scale on paper: MoCo v2, ResNet-50, ImageNet-1k on {counts} GPUs",
        "",
        "Written by `benchmarks/scale_model.py`; rerun the command to refresh it. Every number below comes from the",
        "method the project builds (counted on the CPU) and the inputs listed under Assumptions, one formula each",
        "(the script's functions state them).",
        "",
        f"- command: `{command}`",
        f"- config: `{' '.join(sizes['overrides'])}`",
        "",
        "The per-GPU training rate is an assumption ({:,.0f} MoCo v2 image pairs/s per GPU, from a published".format(
            rate
        ),
        "supervised ResNet-50 rate): every time below scales with it. The one GPU run so far ([gpu.md](gpu.md), an",
        "H200) measured MoCo v2's step at 3,162 img/s, but at 256 images a GPU, not 32; pass a rate measured at 32",
        "a GPU with `--moco-img-s` and regenerate this page.",
        "",
        "## The model, counted",
        "",
        f"- online (trainable) parameters: {sizes['trainable']:,} = ResNet-50 backbone {sizes['backbone']:,} +"
        f" MoCo v2 head (2048-2048-128 MLP) {sizes['head']:,}",
        f"- momentum (key) encoder parameters: {sizes['momentum']:,}: updated by EMA on every rank, never reduced",
        f"- queue: {q_rows:,} x {q_dim} float32 = {_mb(sizes['queue_bytes'])}: every rank enqueues the same"
        " gathered keys, never reduced",
        f"- gradient all-reduce payload: {_mb(sizes['grad_bytes'])} ({'/'.join(sizes['grad_dtypes'])} gradients:"
        " `ray.train.torch.prepare_model` wraps the online encoder in DDP with no compression hook, and bf16"
        " autocast leaves parameters and their gradients float32)",
        f"- key exchange (`method.key_bn`, `pipeline/methods/key_bn.py`): the key views are dealt out at random"
        " (over every rank with `shuffle`, over the node's with `shuffle_node`); a rank sends only the views dealt"
        " to other ranks, in one all-to-all (float32 3 x"
        f" {sizes['image_size']} x {sizes['image_size']} = {sizes['view_bytes']:,} B a view,"
        f" {view_wire:,} B on the wire at {a.view_wire_bytes} B a value: bf16 under autocast), and gets their key"
        f" projections back ({sizes['key_bytes']} B a key); the queue then all-gathers every rank's keys",
        f"- checkpoint (`pipeline/checkpoint.py`: method state with both encoders, BN buffers and queue, plus"
        f" SGD's momentum buffers): {_mb(sizes['checkpoint_bytes'])} of tensors, the same at every GPU count",
        "",
        f"## A (primary): weak scaling, {a.per_gpu_batch} images per GPU",
        "",
        f"{a.per_gpu_batch} a GPU, so the global batch grows with the GPUs; at {weak[0]['n']} GPUs it is "
        f"{weak[0]['global_batch']:,}. MoCo v2's paper trains 256 on 8 GPUs (32 each) with lr 0.03; the project "
        "scales lr linearly (`optim.base_lr` x global / 256). Past a few thousand images a batch, LARS "
        "(`optim=lars`) with warm-up is the usual choice; its step costs the same here. The "
        f"{q_rows:,}-key queue holds the keys of the last "
        + " / ".join(f"{q_rows // c['global_batch']:,}" for c in weak)
        + " steps.",
        "",
        table(weak),
        "",
        "Run as: `python jobs/pretrain.py "
        + " ".join(sizes["overrides"][2:])
        + " trainer.use_gpu=true trainer.num_workers=<GPUs> train.batch_size=<global batch>`, with data.train,"
        " data.val and trainer.storage on shared storage as in [jobs.md](jobs.md).",
        "",
        f"## B: the paper's global batch {a.global_batch} at every GPU count",
        "",
        table(fixed),
        "",
    ]
    if modes:
        lines += [
            f"## C: the key encoder's BatchNorm (`method.key_bn`), {a.per_gpu_batch} images per GPU",
            "",
            "Tables A and B run the mode `auto` resolves to on each layout; here is every mode at "
            f"{a.per_gpu_batch} a GPU. Each mode's step: compute, the exposed gradient all-reduce, and its own "
            "exchange (`exchange_load` states each formula). `sync` pays "
            f"a small all-reduce's latency at every BN layer ({len(sizes['bn_channels'])} in the key encoder): "
            f"{a.small_allreduce_us:g} us inside a node plus {a.hop_us:g} us per tree hop between nodes, 2 log2(nodes) "
            "hops (NCCL's tree for small messages; the floor and per-hop values are the usual published H100 "
            "NVLink and InfiniBand NDR figures, `--small-allreduce-us`, `--hop-us`)."
            + (
                " For comparison, facebookresearch/moco's shuffle-BN, in which every rank all-gathers the global "
                "batch's float32 views and the keys twice (`official_exchange`), models at "
                + ", ".join(f"{c['efficiency']:.0%} at {c['n']} GPUs" for c in official)
                + "."
                if official
                else ""
            ),
            "",
            *modes_table(modes, a.gpus),
            "",
        ]
    small = [c for c in fixed if c["per_gpu_batch"] < 16]
    if small:
        lines += [
            "Per-GPU batches of " + " and ".join(str(c["per_gpu_batch"]) for c in small) + " keep a GPU mostly idle"
            " (the rate above is taken as batch-independent, so these step times are lower bounds) and give each"
            " GPU's BatchNorm, which MoCo's shuffle-BN relies on, statistics of that few images"
            + (": a per-GPU batch of 1 is not trainable as configured." if any(c["per_gpu_batch"] < 2 for c in small)
               else "."),
            "",
        ]  # fmt: skip
    lines += ["## What the tables say", ""]
    # the calibration run is fp32: no autocast, so the views travel as float32 (key_bn.wire_dtype)
    v100 = argparse.Namespace(
        **{**vars(a), "supervised_img_s": V100_FP32_IMG_S, "moco_img_s": None, "epochs": 200, "view_wire_bytes": 4}
    )
    calibration = scenario(8, 32, sizes, v100)
    first = weak[0]
    worst = max([("A", c) for c in weak] + [("B", c) for c in fixed], key=lambda tc: tc[1]["checkpoint_stall"])
    stall_epochs = epochs_for_stall(STALL_TARGET, worst[1]["checkpoint_s"], worst[1]["epoch_s"])
    lines.append(
        f"- On {'one node' if first['nodes'] == 1 else str(first['nodes']) + ' nodes'} ({first['n']} GPUs) `auto` "
        f"runs `{first['key_bn']}` and the step is {'compute-bound: ' if first['efficiency'] >= 0.9 else ''}"
        f"{_ms(first['t_step'])} against {_ms(first['t_compute'])} of compute ({first['efficiency']:.0%}); the key "
        f"exchange sends {_mb(first['exchange_bytes'])} a GPU ({_ms(first['t_exchange'])})."
    )
    if multi:
        m = multi[0]
        exchange_wins = m["t_exchange"] > m["t_allreduce_exposed"]
        on_nvlink = ", which keeps the views on NVLink" if m["key_bn"] == "shuffle_node" else ""
        lines.append(
            f"- Past one node `auto` runs `{m['key_bn']}`{on_nvlink}, and the gradient all-reduce is "
            f"{'not ' if exchange_wins else ''}the main cost: at {m['n']} GPUs it sends {_mb(m['allreduce_bytes'])} "
            f"per GPU ({_ms(m['t_allreduce_exposed'])} exposed), the key exchange {_mb(m['exchange_bytes'])} "
            f"({_ms(m['t_exchange'])}), {_mb(m['queue_gather_bytes'])} of it the queue's key all-gather. That "
            f"all-gather grows with the global batch ({_mb(last_w['queue_gather_bytes'])} at {last_w['n']} GPUs in "
            f"A), the all-reduce does not ({_mb(last_w['allreduce_bytes'])})."
        )
        compressed = ""
        if modes and (m["key_bn"], True) in modes:
            by_n = {c["n"]: c for c in modes[(m["key_bn"], True)]}
            if m["n"] in by_n and last_w["n"] in by_n:
                compressed = (
                    " `trainer.grad_compression=bf16` (the all-reduce in bf16: half its bytes) takes A to "
                    f"{by_n[m['n']]['efficiency']:.0%} and {by_n[last_w['n']]['efficiency']:.0%} (table C)."
                )
        lines.append(
            f"- At {a.node_gbps:g} Gb/s a node, A reaches {m['efficiency']:.0%} at {m['n']} GPUs and "
            f"{last_w['efficiency']:.0%} at {last_w['n']}; keeping communication within {a.comm_budget:.0%} of "
            f"compute needs {_link(m, m['bandwidth_needed_bytes_s'])} and "
            f"{_link(last_w, last_w['bandwidth_needed_bytes_s'])}.{compressed}"
        )
        lines.append(
            f"- B (global {a.global_batch}) keeps the key exchange small ({_mb(last_f['exchange_bytes'])} at "
            f"{last_f['n']} GPUs) but leaves the full all-reduce for a {last_f['per_gpu_batch']}-image step: "
            f"{last_f['efficiency']:.0%} there."
        )
    lines += [
        f"- Host decoding at the measured {a.decode_per_cpu_s:g} images per CPU-second would need "
        f"{first['cpus_per_gpu']:.0f} CPUs per GPU at {first['n']} GPUs ({first['cpus_per_node']:.0f} a node; a DGX "
        "A100 has 128 cores, 16 a GPU). On GPUs the views come from `augment.executor=auto`, which decodes with "
        "nvJPEG and augments on the GPU (DALI mixed, or the batched executor), leaving the CPUs to read and shuffle; "
        "that GPU time is not in the rate above (`python benchmarks/gpu --e2e` measures it).",
        f"- Shard reads: {first['node_read_bytes_s'] / 1e6:,.0f} MB/s a node at {first['n']} GPUs in A "
        f"({first['node_read_bytes_s'] * 8 / (a.node_gbps * 1e9):.0%} of a {a.node_gbps:g} Gb/s network if read "
        "remotely, as they are from s3:// or gs://); less per node where communication slows the steps.",
        f"- The checkpoint ({_mb(sizes['checkpoint_bytes'])}) takes {first['checkpoint_s']:.1f} s at "
        f"{a.storage_mbytes:g} MB/s every {a.checkpoint_every} epoch(s): at most {worst[1]['checkpoint_stall']:.2%} "
        f"of the run in any column ({worst[0]} at {worst[1]['n']} GPUs, where an epoch takes "
        f"{worst[1]['epoch_s']:.1f} s)"
        + (
            f"; `train.checkpoint_every={stall_epochs}` keeps it within {STALL_TARGET:.0%} there"
            if worst[1]["checkpoint_stall"] > STALL_TARGET
            else ""
        )
        + ". A failure costs at most one interval of work: `trainer.max_failures` (0 in conf/trainer/local.yaml: "
        "the job stops) restarts Ray Train from the last checkpoint; the interval is whole epochs "
        "(`train.checkpoint_every`).",
        f"- A check of the compute model: at NVIDIA's fp32 V100 rate (`--supervised-img-s {V100_FP32_IMG_S:g}`) "
        f"it gives {calibration['train_h']:.0f} h for 200 epochs on 8 GPUs, against the {MOCO_REPO_HOURS:g} h "
        "facebookresearch/moco reports for that run (8 V100s, fp32, PIL data loading): the model leaves out the "
        "data loading and framework overheads, so its times are lower bounds.",
        "",
        "Left out: latency (but for table C's `sync`) and NCCL's tree/NVLS algorithms (bandwidth-bound ring and"
        " all-to-all only), DDP's buffer broadcast and the scalar all-reduces (< 1 MB a step), the kNN monitor at"
        " each epoch's end, data-loader stalls, and restarts.",
        "",
        "## Formulas",
        "",
        "r = backward cost in forwards; b = per-GPU batch; N = GPUs; g = GPUs in a node; P = gradient bytes;",
        f"v = bytes of a key view on the wire ({view_wire:,}); k = bytes of a key ({sizes['key_bytes']});",
        "B = the link's bandwidth (NVLink per GPU on one node, the node's network otherwise).",
        "",
        "| quantity | formula |",
        "| --- | --- |",
        "| MoCo v2 pairs/s per GPU | supervised img/s x (1 + r) / (2 + r) |",
        "| compute t_c; backward t_b | b / rate; t_c x r / (2 + r) |",
        "| all-reduce bytes per GPU | 2 (N - 1) / N x P (ring) |",
        "| key exchange bytes per GPU | shuffle: b (N - 1) / N x (v + k); shuffle_node: b (g - 1) / g x (v + k)"
        " (all-to-all of the views dealt to other ranks, their keys back); + (N - 1) x b x k (ring all-gather of"
        " the keys for the queue) |",
        "| key exchange time | bytes on B / B; past one node, shuffle puts b (N - g) / N x (v + k) x g on a node's"
        " network and shuffle_node its views on NVLink (b (g - 1) / g x (v + k) / NVLink), only the queue's"
        " all-gather on B |",
        "| exposed all-reduce | A / B - min(overlap x A / B, t_b) |",
        "| step | t_c + exposed all-reduce + key exchange time |",
        "| steps per epoch | (images // N) // b (pipeline/train/prepare.py) |",
        "| shard read per node | node img/s x (JPEG bytes + tar bytes) |",
        "| decode CPUs per GPU | GPU img/s / img per CPU-second |",
        "| checkpoint write | checkpoint bytes / storage bandwidth; lost work <= checkpoint_every x epoch |",
        "",
        "Units: MB = 10^6 B, GB/s = 10^9 B/s, Gb/s = 10^9 bit/s.",
        "",
        "## Assumptions",
        "",
        "| option | value | source |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{o}` | {v} | {s} |" for o, v, s in assumptions(a, sizes)]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    d = DEFAULTS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=d["gpus"], help="GPU counts, one column each (8 64 256)")
    ap.add_argument("--gpus-per-node", type=int, default=d["gpus_per_node"], help="GPUs in a node (8)")
    ap.add_argument("--per-gpu-batch", type=int, default=d["per_gpu_batch"], help="scenario A's per-GPU batch (32)")
    ap.add_argument("--global-batch", type=int, default=d["global_batch"], help="scenario B's global batch (256)")
    ap.add_argument(
        "--supervised-img-s",
        type=float,
        default=d["supervised_img_s"],
        help="ASSUMED supervised ResNet-50 mixed-precision training img/s per GPU (2470: NVIDIA's A100 80GB figure)",
    )
    ap.add_argument(
        "--backward-forwards", type=float, default=d["backward_forwards"], help="a backward's cost in forwards (2)"
    )
    ap.add_argument(
        "--moco-img-s",
        type=float,
        default=d["moco_img_s"],
        help="MoCo v2 image pairs/s per GPU, e.g. measured by benchmarks/gpu (default: derived from the above)",
    )
    ap.add_argument(
        "--nvlink-gbytes", type=float, default=d["nvlink_gbytes"], help="NVLink bus bandwidth, GB/s per GPU (230)"
    )
    ap.add_argument("--node-gbps", type=float, default=d["node_gbps"], help="inter-node network, Gb/s per node (400)")
    ap.add_argument("--overlap", type=float, default=d["overlap"], help="share of the all-reduce hidden (0.5)")
    ap.add_argument(
        "--small-allreduce-us", type=float, default=d["small_allreduce_us"], help="small all-reduce floor, us (10)"
    )
    ap.add_argument("--hop-us", type=float, default=d["hop_us"], help="latency per inter-node tree hop, us (5)")
    ap.add_argument(
        "--view-wire-bytes",
        type=int,
        default=d["view_wire_bytes"],
        help="bytes a view value takes on the wire in key_bn's exchange: 2 under bf16 autocast (key_bn.wire_dtype), 4 "
        "in float32 (2)",
    )
    ap.add_argument(
        "--comm-budget", type=float, default=d["comm_budget"], help="exposed communication target, x t_c (0.1)"
    )
    ap.add_argument("--images", type=int, default=d["images"], help="training images (1281167)")
    ap.add_argument("--jpeg-kb", type=float, default=d["jpeg_kb"], help="mean JPEG size, kB (110)")
    ap.add_argument("--tar-overhead-bytes", type=int, default=d["tar_overhead_bytes"], help="tar bytes/sample (1792)")
    ap.add_argument(
        "--decode-per-cpu-s",
        type=float,
        default=d["decode_per_cpu_s"],
        help="images per CPU-second of the host decode + augment (51.1: docs/measured.md, DALI on the CPU)",
    )
    ap.add_argument("--storage-mbytes", type=float, default=d["storage_mbytes"], help="checkpoint upload MB/s (500)")
    ap.add_argument("--epochs", type=int, default=d["epochs"], help="epochs of the run (200)")
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=d["checkpoint_every"],
        help="epochs between checkpoints (default: train.checkpoint_every of the composed config)",
    )
    ap.add_argument("--out", default=None, help="also write the report here (docs/scale.md)")
    args = ap.parse_args(argv)
    bad = [n for n in args.gpus if args.global_batch % n]
    if bad:
        ap.error(f"--global-batch {args.global_batch} does not split evenly over {bad} GPUs")
    return args


def run(argv: list[str]) -> dict:
    """Every scenario and the report text for these arguments; writes nothing (main prints and writes it)."""
    args = parse(argv)
    command = "python benchmarks/scale_model.py" + (" " + shlex.join(argv) if argv else "")
    sizes = model_sizes(OVERRIDES)
    if args.checkpoint_every is None:
        args.checkpoint_every = sizes["checkpoint_every"]
    weak = [scenario(n, args.per_gpu_batch, sizes, args) for n in args.gpus]
    fixed = [scenario(n, args.global_batch // n, sizes, args) for n in args.gpus]
    modes = {
        (mode, compress): [mode_scenario(mode, n, args.per_gpu_batch, sizes, args, compress) for n in args.gpus]
        for mode in KEY_BN_MODES
        for compress in (False, True)
    }
    b = args.per_gpu_batch
    official = [exchange_scenario(n, b, sizes, args, official_exchange(n, b, sizes, args)) for n in args.gpus]
    text = report(command, sizes, args, weak, fixed, modes, official)
    return {
        "sizes": sizes,
        "weak": weak,
        "fixed": fixed,
        "modes": modes,
        "official": official,
        "text": text,
        "args": args,
    }


def main(argv: list[str] | None = None) -> dict:
    result = run(list(sys.argv[1:] if argv is None else argv))
    print(result["text"], end="")
    out = result["args"].out
    if out:
        Path(out).write_text(result["text"])
        print(f"[scale_model] wrote {out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
