"""The plug-in contract: what a method's step leaves for the plug-ins, as one typed record.

A method fills the fields it has and declares them in `provides`; a plug-in declares in `needs` the sets of
fields it can work from (any one set suffices, e.g. CO2: a queue, or a batch of keys, or in-batch projections).
`check_contract` compares the two when the config is validated, so a pairing that cannot work fails in one line
before anything runs, and no method fills a field with a stand-in it does not have.

Every tensor here is float32 (losses run in float32 under autocast); projections and keys are L2-normalised.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch


@dataclass
class StepContext:
    features: list[torch.Tensor] = field(default_factory=list)
    """Backbone features of the views the method encoded with gradient, in view order (views 0 and 1)."""
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """(query, its positive key) per direction of the loss: [B, D] each; keys carry no gradient."""
    queue: torch.Tensor | None = None
    """MoCo v1/v2's negatives [K, D], as they were before this step's keys joined the queue."""
    key_bank: list[torch.Tensor] = field(default_factory=list)
    """MoCo v3's in-batch keys: per pair, every worker's keys of the key view [N, D]; row i of this worker's
    queries has its positive at `offset + i`, every other row is a negative."""
    projections: tuple[torch.Tensor, torch.Tensor] | None = None
    """SimCLR/SupCon: this worker's projections of views 0 and 1 [b, D] (with gradient)."""
    gathered: tuple[torch.Tensor, torch.Tensor] | None = None
    """SimCLR/SupCon: every worker's projections of views 0 and 1 [N, D], this worker's rows at `offset`."""
    offset: int = 0
    """This worker's first row in `gathered` and `key_bank`."""
    temperature: float | None = None
    """The method's contrastive temperature (MoCo, MoCo v3, SimCLR, SupCon)."""
    embed: Callable[[torch.Tensor], torch.Tensor] | None = None
    """The method's embedding of a further view, with gradient (Method.embed: the query path, the predictor's
    output where the method has one): plug-ins that add views (CLSA's strong ones, CoCor's composites) encode
    them through it."""
    embed_target: Callable[[torch.Tensor], torch.Tensor] | None = None
    """The same without gradient, by the path a target takes (Method.embed_target: no predictor)."""
    alphas: dict[int, torch.Tensor] = field(default_factory=dict)
    """View index -> its differentiable augmentation parameters (set by Method.total_loss, not by the method)."""


FIELDS = frozenset(f.name for f in fields(StepContext)) - {"alphas", "offset"}


def visible(ctx: StepContext, needs: tuple[frozenset[str], ...]) -> StepContext:
    """What a plug-in sees of the step: the fields its `needs` name (any of its sets), the rest left empty, so a
    plug-in cannot come to depend on a field it did not declare."""
    shown = (FIELDS & frozenset().union(*needs)) | {"alphas", "offset"}
    kept: dict[str, Any] = {name: getattr(ctx, name) for name in shown}
    return StepContext(**kept)


def satisfied(provides: frozenset[str], needs: tuple[frozenset[str], ...]) -> bool:
    """Whether `provides` covers one of the alternatives in `needs` (a plug-in that needs nothing always fits)."""
    return not needs or any(need <= provides for need in needs)


def check_contract(method_kind: str, provides: frozenset[str], plugin: str, needs: tuple[frozenset[str], ...]) -> None:
    """ValueError in one line when the method leaves none of the field sets the plug-in can work from."""
    if not satisfied(provides, needs):
        wanted = " or ".join("+".join(sorted(need)) for need in needs)
        raise ValueError(
            f"plugin {plugin} needs {wanted} from the method's step; method kind {method_kind!r} "
            f"provides {', '.join(sorted(provides)) or 'nothing'}"
        )
