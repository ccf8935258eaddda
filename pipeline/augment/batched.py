"""The batched view executor (`augment.executor=batched`): the torch executor's views for a whole batch in a fixed
number of batched ops, on any torch device (the training worker's GPU, or the CPU).

Between the encoded bytes and the views there is no per-sample Python on the device and nothing that waits for it:
  * host (numpy): validity from the header sizes the sampler already read; every view's resize taps (PyTorch's
    own antialias weights, resize_taps.py), the colour passes (colour_batch.py), blur taps and rows, masks and
    constants, all packed into one pinned buffer and copied once, non_blocking (host_pack.py);
  * decode: each image once (decode.py: nvJPEG's batched call on CUDA), padded into one [B, 3, H, W] tensor
    (a nested tensor's to_padded_tensor: two ops for any B);
  * per group of views of one size: crop + antialiased resize + flip for all of them as two batched matmuls
    with dense weights scattered from the taps (1/255 folded in), fp32;
  * then colour jitter (fixed or random order), grayscale, a separable Gaussian blur with per-sample taps on the
    rows that blur, solarize, the strong pool (strong_batch.py), normalisation.
It equals TorchExecutor's views to float rounding on the CPU (tests/augment/test_batched.py), and needs no more
ops for 256 images than for 16 (tests/augment/test_batched_ops.py). The strong pool (strong_batch.py) plans its
steps on the host too and sends them in a copy of its own; its op count grows with the ops drawn, not the batch.
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as tnf
from torch import Tensor

from .batch_plan import plan_group, view_groups
from .colour import LUMA
from .colour_batch import HUE_CONSTS, blend_pass, grey, hue_batch
from .decode import decode_batch, default_device
from .fused import FusedStage, Stage
from .host_pack import HostPack
from .params import Params, eval_geometry, valid_samples
from .recipe import Recipe
from .resize_taps import aa_taps
from .strong_batch import apply_strong_batch
from .torch_exec import TorchExecutor, _empty, crop_resize, eval_candidates, eval_images

log = logging.getLogger(__name__)
# The strided nested tensor is only the carrier of a ragged batch into to_padded_tensor (two ops for any batch);
# its "prototype stage" warning would fire on every call.
warnings.filterwarnings(
    "ignore", message="The PyTorch API of nested tensors is in prototype stage", category=UserWarning
)


# Past this many multiply-adds per view row (size x padded height x padded width) a CPU resizes faster one view at a
# time than by the dense matmul, whose work covers the whole padded image: measured crossover ~1-2e6 on this 2-core
# EPYC (64 px from 128 x 128 even, 96 px from 256 x 256 per-sample 1.9x faster, 32 px from 32 x 32 matmul 2.7x;
# docs/performance.md). On a GPU the matmul always runs.
CPU_MATMUL_MAX = 1_500_000


def pad_images(images: Sequence[Tensor], height: int, width: int, device: torch.device, order: Tensor | None) -> Tensor:
    """uint8 [B, 3, height, width] on `device`, each image at the top left, zeros around it. Images on `device`
    (nvJPEG's) and on the host (other formats) are padded apart, the host part copied in one transfer; `order`
    puts the two parts back in the batch's order."""
    here = [im for im in images if im.device == device]
    there = [im for im in images if im.device != device]
    parts = []
    for part in (here, there):
        if part:
            nested = torch.nested.as_nested_tensor(list(part))
            padded = nested.to_padded_tensor(0, output_size=(len(part), 3, height, width))
            if padded.device != device:
                padded = padded.pin_memory().to(device, non_blocking=True)
            parts.append(padded)
    if len(parts) == 1:
        return parts[0]
    assert order is not None, "images on two devices need their order"
    return torch.cat(parts).index_select(0, order)


def resize_group(img: Tensor, d: dict[str, Tensor], key: str, n_views: int, size: int) -> Tensor:
    """Crop + antialiased resize + flip of every view of a group: img float [B, H, 3 * W] (rows, then channels and
    columns) -> [V * B, 3, size, size], view-major. Two batched matmuls with the dense weights scattered from the
    taps; fp32 (no reduced-precision matmul unless the process turned TF32 on)."""
    b, h, w3 = img.shape
    w = w3 // 3
    yi, yt, xi, xt = d[f"{key}.yi"], d[f"{key}.yt"], d[f"{key}.xi"], d[f"{key}.xt"]
    wy = img.new_zeros(b, n_views * size, h).scatter_add_(2, yi, yt)
    wx = img.new_zeros(b * n_views, size, w).scatter_add_(2, xi, xt)
    u = torch.bmm(wy, img)  # [B, V*S, 3W]
    z = torch.bmm(u.view(b * n_views, size * 3, w), wx.transpose(1, 2))  # [B*V, S*3, S]
    return z.view(b, n_views, size, 3, size).permute(1, 0, 3, 2, 4).reshape(n_views * b, 3, size, size)


def resize_per_sample(images: Sequence[Tensor], crops: np.ndarray, flip: Tensor, size: int) -> Tensor:
    """What resize_group makes, one torchvision resize per view (torch_exec.crop_resize, the reference itself):
    on a CPU, past CPU_MATMUL_MAX, cheaper than the dense matmul, which spends its work on the whole padded image.
    crops: [V * B, 4] view-major; flip: [V * B, 1, 1, 1] bool."""
    b = len(images)
    x = torch.stack([crop_resize(images[i % b], c, size) for i, c in enumerate(crops)])
    return torch.where(flip, x.flip(-1), x)


def separable_blur(x: Tensor, rows: Tensor | None, taps: Tensor) -> Tensor:
    """Rows `rows` (None: all) of x blurred with their own taps (taps: [n * 3, 1, 1, k], one row per sample and
    channel), reflect padding k // 2, a horizontal then a vertical depthwise convolution."""
    n3, _, _, k = taps.shape
    half = k // 2
    _, c, h, w = x.shape
    sub = tnf.pad(x if rows is None else x.index_select(0, rows), [half, half, half, half], mode="reflect")
    y = tnf.conv2d(sub.view(1, n3, h + 2 * half, w + 2 * half), taps, groups=n3)
    y = tnf.conv2d(y, taps.view(n3, 1, k, 1), groups=n3).view(n3 // c, c, h, w)
    return y if rows is None else x.index_copy(0, rows, y)


def group_rows(d: dict[str, Tensor], key: str, plan: dict) -> dict[str, Tensor]:
    """The group's per-sample rows by name, each [N, 1, 1, 1] (floats as float32, masks as bool)."""
    rows: dict[str, Tensor] = {}
    shape = (-1, plan["n"], 1, 1, 1)
    if plan["names_f"]:
        rows.update(zip(plan["names_f"], d[f"{key}.f"].view(shape).unbind(0)))
    if plan["names_m"]:
        rows.update(zip(plan["names_m"], (d[f"{key}.m"] != 0).view(shape).unbind(0)))
    return rows


def photometric_group(x: Tensor, d: dict[str, Tensor], key: str, plan: dict, consts: dict[str, Tensor]) -> Tensor:
    """Everything after the resize, for one group: colour passes, hue, grayscale, blur, solarize, strong pool,
    normalisation, in the reference's order (torch_exec.photometric)."""
    rows = group_rows(d, key, plan)
    luma = consts["luma"]

    def one_pass(name: str, uses_gray: bool, uses_mean: bool) -> Tensor:
        p = {k: rows[f"{name}.{k}"] for k in ("f", "omf", "ws", "wc", "active")}
        return blend_pass(x, luma, p, uses_gray, uses_mean)

    for name, uses_gray, uses_mean in plan["pre"]:
        x = one_pass(name, uses_gray, uses_mean)
    if plan["hue"]:
        x = torch.where(rows["hue_on"], hue_batch(x, rows["turns6"], consts), x)
    for name, uses_gray, uses_mean in plan["post"]:
        x = one_pass(name, uses_gray, uses_mean)
    if plan["gray"]:
        x = torch.where(rows["gray_on"], grey(x, luma), x)
    if plan.get("blur_all"):  # a static plan's: every row blurred, those that do not blur kept
        x = torch.where(rows["blur_on"], separable_blur(x, None, d[f"{key}.blur_taps"]), x)
    elif plan["blur"]:
        x = separable_blur(x, d[f"{key}.blur_rows"], d[f"{key}.blur_taps"])
    if plan["solarize"]:
        x = torch.where(rows["sol_on"] & (x >= rows["sol_thr"]), 1.0 - x, x)
    if "strong" in plan:
        x = apply_strong_batch(x, *plan["strong"])
    if plan["normalize"]:
        x = (x - consts["mean"]) / consts["std"]
    return x


def _add_consts(pack: HostPack, recipe: Recipe) -> None:
    """The constants every group uses, [1, 3, 1, 1] each: travelling in the pack, none is made on the device."""
    rows = [LUMA, recipe.mean, recipe.std, HUE_CONSTS["hue_offset"].reshape(3), HUE_CONSTS["hue_n"].reshape(3)]
    pack.add("consts", np.stack([np.asarray(r, np.float32).reshape(1, 3, 1, 1) for r in rows]))
    pack.add("hue_index", np.stack([HUE_CONSTS["hue_first"], HUE_CONSTS["hue_second"]]))


def _unpack_consts(d: dict[str, Tensor]) -> dict[str, Tensor]:
    luma, mean, std, offset, n = d["consts"].unbind(0)
    first, second = d["hue_index"].unbind(0)
    return {
        "luma": luma,
        "mean": mean,
        "std": std,
        "hue_offset": offset,
        "hue_n": n,
        "hue_first": first,
        "hue_second": second,
    }


class BatchedExecutor(TorchExecutor):
    """TorchExecutor's contract, batched on `device` (any torch device; CUDA in training):
    __call__(encoded, params, sizes=None) -> (views on `device`, kept); `skipped` counts dropped samples;
    eval_transform(encoded, size) -> (eval views on `device`, kept)."""

    label = "batched executor"

    def __init__(
        self, recipe: Recipe, device: torch.device | str | None = None, fuse: bool = False, batch_size: int = 0
    ):
        super().__init__(recipe)
        self.device = torch.device(device) if device is not None else default_device()
        self.groups = view_groups(recipe)
        # augment.fuse: the photometric stage compiled for full batches of batch_size images (fused.py)
        if fuse and batch_size < 1:
            raise ValueError("augment.fuse=true compiles the stage for the run's batch size: give batch_size")
        self.fuse = fuse
        full = {f"g{i}": batch_size * len(g.views) for i, g in enumerate(self.groups)}
        self.photometric: Stage = FusedStage(photometric_group, full) if fuse else photometric_group

    def __call__(
        self, encoded: Sequence[bytes], params: Sequence[Params], sizes: Sequence[tuple[int, int]] | None = None
    ) -> tuple[list[Tensor], np.ndarray]:
        candidates = np.flatnonzero(valid_samples(encoded, params, sizes))
        images, kept = decode_batch(encoded, candidates, self.device)
        self._drop_report(len(encoded), kept)
        return self.views_of(images, [{k: v[kept] for k, v in p.items()} for p in params]), kept

    def views_of(self, images: Sequence[Tensor], params: Sequence[Params], normalize: bool = True) -> list[Tensor]:
        """The views of decoded uint8 [3, H, W] images (on `device` or the host) whose params rows are `params`."""
        views: list[Tensor] = [_empty(spec.size, self.device) for spec in self.recipe.views]
        if not images:
            return views
        pack = HostPack()
        height, width = max(im.shape[1] for im in images), max(im.shape[2] for im in images)
        matmul = [self._matmul(g.size, height, width) for g in self.groups]
        plans = [
            plan_group(
                g,
                self.recipe.views,
                params,
                pack,
                f"g{i}",
                normalize,
                mm,
                static=self.fuse,
            )
            for i, (g, mm) in enumerate(zip(self.groups, matmul))
        ]
        d, consts, img = self._upload(images, pack, any(matmul))
        for i, (g, plan) in enumerate(zip(self.groups, plans)):
            if img is not None and "crops" not in plan:
                x = resize_group(img, d, f"g{i}", len(g.views), g.size)
            else:
                x = resize_per_sample(images, plan["crops"], group_rows(d, f"g{i}", plan)["flip"], g.size)
            x = self.photometric(x, d, f"g{i}", plan, consts)
            for v, part in zip(g.views, x.split(len(images))):
                views[v] = part
        return views

    def _matmul(self, size: int, height: int, width: int) -> bool:
        """Resize by dense matmuls (always on a GPU), or per sample (a CPU, past CPU_MATMUL_MAX)?"""
        return self.device.type != "cpu" or size * height * width <= CPU_MATMUL_MAX

    def _upload(
        self, images: Sequence[Tensor], pack: HostPack, pad: bool = True
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor | None]:
        """The pack (with the constants) copied over in one transfer, and (pad=True) the images as one float
        [B, H, 3 * W] tensor (rows, then channels and columns: the vertical resize's layout), zero-padded to the
        largest."""
        _add_consts(pack, self.recipe)
        order = _placement(images, self.device)
        if order is not None:
            pack.add("order", order)
        d = pack.to(self.device)
        if not pad:
            return d, _unpack_consts(d), None
        height, width = max(im.shape[1] for im in images), max(im.shape[2] for im in images)
        padded = pad_images(images, height, width, self.device, d.get("order"))
        img = padded.permute(0, 2, 1, 3).to(torch.float32, memory_format=torch.contiguous_format)
        return d, _unpack_consts(d), img.view(len(images), height, 3 * width)

    def eval_transform(self, encoded: Sequence[bytes], size: int | None = None) -> tuple[Tensor, np.ndarray]:
        """Deterministic resize-short-side + centre crop, normalised (torch_exec.eval_transform); (images, kept).
        Batched like the views: the resize to the short side and the centre crop are one set of taps."""
        size = size or self.recipe.size
        images, kept = decode_batch(encoded, eval_candidates(encoded), self.device)
        self._drop_report(len(encoded), kept)
        if not images:
            return _empty(size, self.device), kept
        if not self._matmul(size, max(im.shape[1] for im in images), max(im.shape[2] for im in images)):
            return eval_images(images, size, self.recipe.mean, self.recipe.std, self.device), kept
        pack = HostPack()
        hw = np.array([im.shape[1:] for im in images], np.int64)
        geo = np.array([eval_geometry(int(h), int(w), size) for h, w in hw], np.int64)  # rh, rw, top, left
        zero = np.zeros(len(images), np.int64)
        yi, yt = aa_taps(zero, hw[:, 0], geo[:, 0], geo[:, 2], size)
        xi, xt = aa_taps(zero, hw[:, 1], geo[:, 1], geo[:, 3], size)
        for name, a in (("yi", yi), ("yt", yt / np.float32(255.0)), ("xi", xi), ("xt", xt)):
            pack.add(f"e.{name}", a)
        d, consts, img = self._upload(images, pack)
        assert img is not None
        x = resize_group(img, d, "e", 1, size)
        return (x - consts["mean"]) / consts["std"], kept


def _placement(images: Sequence[Tensor], device: torch.device) -> np.ndarray | None:
    """Where each image lands when the device-decoded ones are padded first and the host ones after them
    (pad_images); None when they are all on one side."""
    here = np.array([im.device == device for im in images])
    if here.all() or not here.any():
        return None
    rank = np.empty(len(images), np.int64)
    rank[np.flatnonzero(here)] = np.arange(here.sum())
    rank[np.flatnonzero(~here)] = here.sum() + np.arange((~here).sum())
    return rank
