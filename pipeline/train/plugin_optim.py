"""The plug-ins' own optimisers (pipeline.plugins.base.OwnOptimizer: CoCor's target network and labelled head),
stepped by the loop after the encoder's step the way it steps the encoder's: the plug-in's `outer_loss`
backpropagated into freshly zeroed gradients, the gradients averaged across workers (these networks are outside
DDP), the step held back on every rank where any gradient is not finite, the learning rates set from the plug-in's
schedules, the optimisers stepped, and their state checkpointed beside the encoder's.
"""

from __future__ import annotations

from typing import Iterable

import torch

from pipeline import dist
from pipeline.plugins.base import OwnOptimizer, Plugin


class PluginOptimizers:
    """Every plug-in's own optimisers, with the count of outer steps each plug-in has taken and skipped."""

    def __init__(self, plugins: Iterable[Plugin]) -> None:
        declared = [(p, p.optimizers()) for p in plugins]
        self.owners: list[tuple[Plugin, dict[str, OwnOptimizer]]] = [(p, opts) for p, opts in declared if opts]
        self.updates = {p.name: 0 for p, _ in self.owners}
        self.skipped = {p.name: 0 for p, _ in self.owners}

    def __bool__(self) -> bool:
        return bool(self.owners)

    def step(self, method, images: list[torch.Tensor], params: list[dict], out: dict, progress: float) -> dict:
        """One outer step of every plug-in that has optimisers; returns the scalars to log."""
        logged: dict = {}
        for plugin, opts in self.owners:
            loss, extra = plugin.outer_loss(method, images, params, out)
            logged.update(extra)
            if loss is None:
                continue
            for o in opts.values():
                o.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            owned = [p for o in opts.values() for g in o.optimizer.param_groups for p in g["params"]]
            _average_grads(owned)
            self.updates[plugin.name] += 1
            # a non-finite loss on any rank (averaged in) must not reach the plug-in's networks: every rank skips
            if not _all_finite([p.grad for p in owned if p.grad is not None]):
                self.skipped[plugin.name] += 1
                logged[f"{plugin.name}_skipped_updates"] = float(self.skipped[plugin.name])
                continue
            for name, o in opts.items():
                lr = float(o.lr(self.updates[plugin.name], progress))
                for group in o.optimizer.param_groups:
                    group["lr"] = lr
                if lr > 0:
                    o.optimizer.step()
                logged[f"{plugin.name}_{name}_lr"] = lr
            logged[f"{plugin.name}_skipped_updates"] = float(self.skipped[plugin.name])
            logged.update(plugin.after_outer_step(method, params))
        return logged

    def state_dict(self) -> dict:
        return {
            p.name: {
                "updates": self.updates[p.name],
                "optimizers": {n: o.optimizer.state_dict() for n, o in opts.items()},
            }
            for p, opts in self.owners
        }

    def load_state_dict(self, state: dict) -> None:
        for plugin, opts in self.owners:
            mine = state.get(plugin.name)
            if mine is None:
                continue
            self.updates[plugin.name] = int(mine["updates"])
            for name, o in opts.items():
                if name in mine["optimizers"]:
                    o.optimizer.load_state_dict(mine["optimizers"][name])


def _average_grads(params: list[torch.Tensor]) -> None:
    if not dist.is_dist():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    dist.average_([p.grad for p in params if p.grad is not None])  # none is None: set above


def _all_finite(grads: list[torch.Tensor]) -> bool:
    """One read back to the host for all of them (one per tensor stalled a GPU's queue as often)."""
    return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
