"""Frozen features of a backbone over in-memory encoded images."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.io import ImageReadMode, decode_image


def eval_preprocess(encoded: list[bytes], size: int, mean, std) -> torch.Tensor:
    """Decode, resize the short side to `size` (x1.14 for >64 px images, the usual 256/224), centre-crop,
    normalise: the un-augmented view used for kNN and the linear probe."""
    short = size if size <= 64 else int(round(size * 256 / 224))
    out = []
    for b in encoded:
        img = decode_image(torch.frombuffer(bytearray(b), dtype=torch.uint8), mode=ImageReadMode.RGB)
        h, w = img.shape[-2:]
        if min(h, w) != short:
            img = F.interpolate(img[None].float(), scale_factor=short / min(h, w), mode="bilinear",
                                antialias=True, align_corners=False, recompute_scale_factor=False)[0]
        h, w = img.shape[-2:]
        top, left = (h - size) // 2, (w - size) // 2
        out.append(img[..., top:top + size, left:left + size].float() / 255.0)
    x = torch.stack(out)
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    return (x - m) / s


@torch.no_grad()
def extract(backbone: nn.Module, encoded: list[bytes], preprocess: Callable[[list[bytes]], torch.Tensor],
            batch_size: int = 256, device: str | torch.device = "cpu") -> torch.Tensor:
    """Features [N, D] in eval mode (BN running statistics); the backbone's mode is restored after."""
    was_training = backbone.training
    backbone.eval()
    feats = []
    try:
        for i in range(0, len(encoded), batch_size):
            feats.append(backbone(preprocess(encoded[i:i + batch_size]).to(device)).float().cpu())
    finally:
        backbone.train(was_training)
    return torch.cat(feats)
