"""Mixed precision: bfloat16 autocast where the hardware has it (AMX / AVX512-BF16 CPUs, recent GPUs).

Losses are computed in float32 by the methods (they cast embeddings before the softmax), so only the
backbone and heads run in bfloat16.
"""

from __future__ import annotations

import contextlib

import torch


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(choice: str, device: torch.device) -> str:
    """ "auto" -> "bf16" where supported, else "fp32"; an explicit "bf16" on hardware without it is an error."""
    if choice not in ("auto", "bf16", "fp32"):
        raise ValueError(f"train.precision must be auto, bf16 or fp32, not {choice!r}")
    if choice == "auto":
        return "bf16" if bf16_supported(device) else "fp32"
    if choice == "bf16" and not bf16_supported(device):
        raise ValueError(f"train.precision=bf16 but {device} has no bfloat16 support")
    return choice


def autocast(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
