"""Many small numpy arrays to a device in ONE copy: packed into one host buffer (pinned where the device is CUDA),
copied with non_blocking=True, then cut into views there. The batched executor sends every parameter, index and
constant a batch needs this way, so the device path has no blocking copy and nothing to wait for."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# the dtypes a pack carries: floats as float32 unless asked for float64 (the strong pool's affine matrices),
# everything else as int64 (what index ops take)
SECTIONS = ((np.float32, torch.float32), (np.float64, torch.float64), (np.int64, torch.int64))
ALIGN = 16  # bytes


class HostPack:
    """add(name, array) any number of times, then to(device) -> {name: tensor on device, array's shape}."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def add(self, name: str, array: np.ndarray | list | float, dtype: type | None = None) -> None:
        a = np.asarray(array)
        dtype = dtype or (np.float32 if a.dtype.kind == "f" else np.int64)
        self._arrays[name] = np.ascontiguousarray(a, dtype=dtype)

    def to(self, device: torch.device) -> dict[str, Tensor]:
        # each array at a 16-byte boundary: a compiled consumer (augment.fuse) is specialised on its inputs being
        # 16-byte aligned, and copies an input that is not
        starts, offset = {}, 0
        for np_dtype, _ in SECTIONS:
            for k, a in self._arrays.items():
                if a.dtype == np_dtype:
                    starts[k] = offset
                    offset += -(-a.nbytes // ALIGN) * ALIGN
        host = torch.empty(max(offset, ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda")
        raw = host.numpy()
        for k, at in starts.items():
            a = self._arrays[k]
            raw[at : at + a.nbytes] = a.reshape(-1).view(np.uint8)
        dev = host.to(device, non_blocking=True)
        out = {}
        for np_dtype, torch_dtype in SECTIONS:
            names = [k for k in starts if self._arrays[k].dtype == np_dtype]
            if not names:
                continue
            base, item = dev.view(torch_dtype), np.dtype(np_dtype).itemsize  # the buffer's length is a multiple of 16
            for k in names:
                shape = self._arrays[k].shape
                # one op per array (as_strided, whose offset counts from the storage's start), not a slice and a view
                out[k] = base.as_strided(shape, _contiguous_strides(shape), starts[k] // item)
        return out


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))
