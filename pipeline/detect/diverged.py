"""A detector whose training diverged (a non-finite loss): raised by either engine, told to the user in one line
that names the iteration and the settings to change."""

from __future__ import annotations


class Diverged(FloatingPointError):
    def __init__(self, iteration: int, what: str):
        super().__init__(f"{what} at iteration {iteration}")
        self.iteration, self.what = iteration, what


def advice(e: Diverged, label: str, d: dict) -> str:
    """The user's line: where it diverged, and the preset's settings that make it stable (lower first)."""
    clip = d.get("clip_grad_norm")
    clipping = f"lower detect.clip_grad_norm (now {clip:g})" if clip else "set detect.clip_grad_norm (shapes: 1)"
    return (
        f"detection from the {label} backbone diverged ({e.what} at iteration {e.iteration} of {d['iterations']}): "
        f"lower detect.lr (now {d['lr']:g}), {clipping}, or lengthen detect.warmup (now {d['warmup']})"
    )
