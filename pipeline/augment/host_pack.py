"""Many small numpy arrays to a device in ONE copy: packed into one host buffer (pinned where the device is CUDA),
copied with non_blocking=True, then cut into views there. The batched executor sends every parameter, index and
constant a batch needs this way, so the device path has no blocking copy and nothing to wait for."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class HostPack:
    """add(name, array) any number of times, then to(device) -> {name: tensor on device, array's shape}.
    Floats travel as float32, everything else as int64 (what index ops take)."""

    def __init__(self) -> None:
        self._floats: dict[str, np.ndarray] = {}
        self._ints: dict[str, np.ndarray] = {}

    def add(self, name: str, array: np.ndarray | list | float) -> None:
        a = np.asarray(array)
        if a.dtype.kind == "f":
            self._floats[name] = np.ascontiguousarray(a, dtype=np.float32)
        else:
            self._ints[name] = np.ascontiguousarray(a, dtype=np.int64)

    def to(self, device: torch.device) -> dict[str, Tensor]:
        n_f = sum(a.size for a in self._floats.values())
        n_f += n_f % 2  # the int64 section starts 8-byte aligned
        n_i = sum(a.size for a in self._ints.values())
        host = torch.empty(4 * n_f + 8 * n_i, dtype=torch.uint8, pin_memory=device.type == "cuda")
        raw = host.numpy()
        floats, ints = raw[: 4 * n_f].view(np.float32), raw[4 * n_f :].view(np.int64)
        spans: dict[str, tuple[bool, int, tuple[int, ...]]] = {}
        for section, arrays, is_float in ((floats, self._floats, True), (ints, self._ints, False)):
            at = 0
            for name, a in arrays.items():
                section[at : at + a.size] = a.reshape(-1)
                spans[name] = (is_float, at, a.shape)
                at += a.size
        dev = host.to(device, non_blocking=True)
        f_dev, i_dev = dev[: 4 * n_f].view(torch.float32), dev[4 * n_f :].view(torch.int64)
        # one op per array (as_strided, whose offset counts from the storage's start), not a slice and a view
        out = {}
        for name, (is_float, at, shape) in spans.items():
            base = f_dev if is_float else i_dev
            out[name] = base.as_strided(shape, _contiguous_strides(shape), base.storage_offset() + at)
        return out


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))
