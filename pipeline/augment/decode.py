"""Decoding a batch for the batched executor: the batch's JPEGs (magic FF D8 FF) in one
`torchvision.io.decode_jpeg(list, device=...)` call, nvjpeg's batched decoder on CUDA (libjpeg, one by one, on the
CPU). One corrupt JPEG fails the whole call; the JPEGs are then decoded one at a time to find it. Other formats
(PNG, ...) and JPEGs the device decoder refuses go through torch_exec.decode_rgb and stay on the host: the executor
pads them into one batch and copies it in one transfer. Undecodable samples are dropped and counted like the torch
executor does. No EXIF rotation (as everywhere here).
"""

from __future__ import annotations

from typing import Sequence, cast

import numpy as np
import torch
from torch import Tensor
from torchvision.io import ImageReadMode, decode_jpeg

from .torch_exec import decode_rgb

JPEG_MAGIC = b"\xff\xd8\xff"


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _bytes_tensor(encoded: bytes) -> Tensor:
    return torch.frombuffer(bytearray(encoded), dtype=torch.uint8)


def _decode_host(encoded: bytes) -> Tensor | None:
    try:
        return decode_rgb(encoded)
    except RuntimeError:
        return None


def _decode_jpeg_one(data: Tensor, encoded: bytes, device: torch.device) -> Tensor | None:
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except Exception:  # RuntimeError from libjpeg / nvjpeg (ValueError for some unsupported streams)
        pass
    # What the torch executor does: torchvision on the host, then PIL (CMYK / lossless JPEGs nvjpeg refuses).
    return _decode_host(encoded)


def decode_batch(
    encoded: Sequence[bytes], candidates: Sequence[int] | np.ndarray, device: torch.device | str
) -> tuple[list[Tensor], np.ndarray]:
    """Decode encoded[i] for i in candidates to uint8 [3, H, W] RGB; (images, kept indices), in candidate order.
    JPEGs come back on `device` (one batched decode_jpeg call), other formats on the host: see the docstring."""
    device = torch.device(device)
    candidates = [int(i) for i in candidates]
    jpegs = [i for i in candidates if encoded[i][:3] == JPEG_MAGIC]
    decoded: dict[int, Tensor | None] = {}
    if jpegs:
        data = [_bytes_tensor(encoded[i]) for i in jpegs]
        try:
            decoded.update(zip(jpegs, decode_jpeg(data, mode=ImageReadMode.RGB, device=device)))
        except Exception:  # one bad JPEG fails the batch: find it
            decoded.update((i, _decode_jpeg_one(d, encoded[i], device)) for i, d in zip(jpegs, data))
    for i in candidates:
        if i not in decoded:
            decoded[i] = _decode_host(encoded[i])
    kept = [i for i in candidates if decoded[i] is not None]
    return cast(list[Tensor], [decoded[i] for i in kept]), np.asarray(kept, dtype=np.int64)  # kept: not None
