"""Frozen features of a backbone over in-memory encoded images."""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from pipeline.augment.torch_exec import eval_transform

Preprocess = Callable[[Sequence[bytes]], "tuple[torch.Tensor, np.ndarray]"]


def eval_preprocess(size: int, mean, std) -> Preprocess:
    """The un-augmented view used for kNN and the linear probe: resize, centre-crop, normalise; undecodable
    images are dropped (the returned indices say which were kept)."""
    return partial(eval_transform, size=size, mean=mean, std=std)


@torch.no_grad()
def extract(
    backbone: nn.Module,
    encoded: Sequence[bytes],
    preprocess: Preprocess,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, np.ndarray]:
    """Features [N', D] in eval mode (BN running statistics) and the indices of the N' decodable images.
    The backbone's mode is restored after."""
    was_training = backbone.training
    backbone.eval()
    feats, kept = [], []
    try:
        for i in range(0, len(encoded), batch_size):
            x, k = preprocess(encoded[i : i + batch_size])
            if len(k):
                feats.append(backbone(x.to(device)).float().cpu())
                kept.append(np.asarray(k) + i)
    finally:
        backbone.train(was_training)
    if not feats:
        raise ValueError("no decodable images to extract features from")
    return torch.cat(feats), np.concatenate(kept)
