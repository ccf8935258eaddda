"""Losses without negatives, where an online predictor regresses a stop-gradient target of the other view: BYOL's
normalised L2 (Grill et al. 2020) and SimSiam's negative cosine (Chen & He 2021). Tested against direct float64
computations in tests/methods/test_frameworks.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.losses.precision import float32


@float32
def byol_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """BYOL's regression loss (Grill et al. 2020, Eq. 2), mean over the batch.

        L = ‖p̄ − z̄'‖² = 2 − 2·⟨p, z'⟩ / (‖p‖·‖z'‖).
    The target is a stop-gradient (z is detached): only the online side is trained. The symmetric BYOL loss is
    byol_loss(p1, z2') + byol_loss(p2, z1') (Eq. 2's L + L̃).

    Args:
        p: [B, D] online predictions q_θ(z_θ) (not necessarily normalised; L2-normalised here).
        z: [B, D] target projections z'_ξ of the other view (not necessarily normalised; L2-normalised here).

    Example: `loss = byol_loss(p1, t2) + byol_loss(p2, t1)`
    """
    p = F.normalize(p, dim=1)
    z = F.normalize(z.detach(), dim=1)
    return (2 - 2 * (p * z).sum(dim=1)).mean()


@float32
def negative_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """SimSiam's D(p, stopgrad(z)) (Chen & He 2021, Eqs. 1 and 3), mean over the batch.

    D(p, z) = −⟨p/‖p‖, z/‖z‖⟩; z is detached (the stop-gradient that prevents collapse). The symmetric SimSiam loss
    is ½ negative_cosine(p1, z2) + ½ negative_cosine(p2, z1) (Eq. 2/3), minimum −1.

    Args:
        p: [B, D] predictions.
        z: [B, D] projections of the other view.

    Example: `loss = 0.5 * negative_cosine(p1, z2) + 0.5 * negative_cosine(p2, z1)`
    """
    p = F.normalize(p, dim=1)
    z = F.normalize(z.detach(), dim=1)
    return -(p * z).sum(dim=1).mean()
