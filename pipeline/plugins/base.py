"""A plug-in adds views and loss terms to a framework (CO2, CLSA, InvCLR, CoCor).

`Method.total_loss` calls `prepare` before the framework's forward (a plug-in may rewrite the views, e.g. InvCLR's
differentiable colour stage) and `loss` after it, with the StepContext the framework filled (queries, keys, the
queue before this step's keys joined it, in-batch keys or projections, backbone features). `loss` returns
{name: (term, weight)} (weight None: logged, not added).

A plug-in with networks of its own to optimise (CoCor's target network and labelled head) declares their optimisers
in `optimizers`; after the encoder's step the loop asks it for their loss (`outer_loss`), then zeroes, averages
across workers, schedules, steps and checkpoints them as it does the encoder's (pipeline.train.plugin_optim), and
calls `after_outer_step`.

`needs` names the StepContext fields it reads (any one of the sets), checked against the method's `provides` when
the config is validated: a plug-in composes with every method that provides them. Its yaml's `defined_on` lists the
method kinds its paper defines it on (elsewhere the run says so in a notice), and its per-framework constants are
its yaml's `per_method` table (pipeline.plugins.own_settings): no plug-in's code names a method.

Its constructor is `__init__(self, s: Settings, run: PluginRun)`: its own `plugin.<name>.*` keys, checked and typed,
and what it reads of the rest of the run (pipeline.plugins.build_plugins makes both from the config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from pipeline.curve_panels import Panel
from pipeline.fields import Section
from pipeline.methods.context import StepContext
from pipeline.run_shape import RunShape


@dataclass(frozen=True)
class PluginRun:
    """What a plug-in reads of the run beside its own settings (pipeline.plugins.build_plugins makes it from the
    config): the augment section (the views: InvCLR's colour law or Spirograph size, CoCor's composites), the
    method's kind and name (for an outside plug-in; the project's take their per-framework constants from their
    yaml's per_method table), the seed of its random state, the epochs its schedules span (CoCor's target network)
    and the training data CoCor draws its labelled subset from (`data.train`, `data.task`, `data.targets`)."""

    augment: dict[str, Any]
    method_kind: str
    method_name: str
    seed: int = 0
    epochs: int = 1
    data_train: str = ""  # data.train, the path of the training split ("": none given)
    data_task: str = "classification"
    data_targets: list[str] | None = None


@dataclass
class OwnOptimizer:
    """An optimiser over a plug-in's own parameters. `lr(updates, progress)` gives its learning rate for its
    `updates`-th step (counted from 1) at the run's `progress` in [0, 1]; at 0 the loop does not step it at all, so
    not even momentum moves a frozen network."""

    optimizer: torch.optim.Optimizer
    lr: Callable[[int, float], float]


class Plugin(nn.Module):
    Settings: type[Section] = Section  # its plugin.<name>.* keys (conf/plugin/<name>.yaml), checked before the run
    name: ClassVar[str]  # plugin=[<name>] picks it; a class that sets it is registered (pipeline.registry)
    needs: tuple[frozenset[str], ...] = ()  # StepContext fields it reads: any one of these sets

    loss_terms: ClassVar[tuple[str, ...]] = ()  # the terms of `loss` drawn beside the training loss
    panels: ClassVar[tuple[Panel, ...]] = ()  # curves of its own (pipeline.curve_panels)

    @classmethod
    def check(cls, s: Section, shape: RunShape) -> None:
        """What the plug-in asks of the run (its views, torch.compile): ValueError with one line, before anything
        starts. `s` is its `Settings`, already checked; `shape` what it may read of the run."""

    def alpha_grad_views(self) -> tuple[int, ...]:
        """The views whose augmentation parameters it differentiates through (InvCLR's penalty: view 0): the
        method's colour stage makes them tensors requiring grad, handed to `prepare` and `loss` as `alphas`."""
        return ()

    def prepare(self, method, images: list[torch.Tensor], params: list[dict], alphas: dict) -> list[torch.Tensor]:
        """May rewrite the views before the framework's forward; `alphas` maps view -> its differentiable alpha."""
        return images

    def loss(self, method, images: list[torch.Tensor], params: list[dict], ctx: StepContext) -> dict:
        raise NotImplementedError

    def attach(self, method) -> None:
        """Called once the method exists (networks sized by the backbone, e.g. CoCor's classifier)."""

    def schedule(self, steps_per_epoch: int) -> None:
        """Told the run's steps per epoch (pipeline.plan.RunPlan) before training: a plug-in with schedules of its
        own (CoCor's target network) counts them in steps."""

    def optimizers(self) -> dict[str, OwnOptimizer]:
        """Optimisers over parameters of its own, by name, which the loop steps after the encoder's step."""
        return {}

    def outer_loss(
        self, method, images: list[torch.Tensor], params: list[dict], out: dict
    ) -> tuple[torch.Tensor | None, dict]:
        """After the encoder's optimiser step: the loss its own optimisers minimise (None: no step this time) and
        scalars to log. `out` is the encoder step's output."""
        return None, {}

    def after_outer_step(self, method, params: list[dict]) -> dict:
        """After its optimisers stepped (not when the loop held them still): scalars to log."""
        return {}
