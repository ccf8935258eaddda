"""The precision every loss runs in: the `float32` decorator the loss modules share."""

from __future__ import annotations

import functools

import torch


def _f32(x):
    if torch.is_tensor(x):
        return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x  # float64 stays float64
    if isinstance(x, (list, tuple)):
        return type(x)(_f32(v) for v in x)
    return x


def float32(fn):
    """Run a loss in float32 whatever the step's autocast says: under bf16 autocast the similarity matmuls would
    otherwise run in bf16 (about 3 significant digits: at τ = 0.1 a logit of 10 is off by up to 0.06) and some
    losses would come out in bf16. Float32 and float64 inputs pass through as the same tensors, so autograd.grad
    w.r.t. them still works.

    Args:
        fn: the loss. Its bf16 and fp16 tensor arguments, positional or keyword, and those inside a list or tuple
            argument, are cast to float32; it runs with autocast disabled on the device type of its first tensor
            argument (cpu when there is none).

    Example: `@float32` above `def info_nce(q, k, queue, temperature): ...`
    """

    @functools.wraps(fn)
    def run(*args, **kwargs):
        device = next((t.device.type for t in (*args, *kwargs.values()) if torch.is_tensor(t)), "cpu")
        with torch.autocast(device_type=device, enabled=False):
            return fn(*_f32(args), **{k: _f32(v) for k, v in kwargs.items()})

    return run
