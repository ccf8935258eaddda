"""The settings every method shares (`method.kind`, `method.name`, the projection head, a predictor), which each
method's own `Settings` extends beside its class (pipeline/methods/moco.py: `MoCo.Settings`). Imports no torch:
the schema checks the shared part before any method is imported, the method's own part after
(pipeline.schema.check_method)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pipeline.fields import Bool, Int, Num, Section, Str, bad


class Head(Section):
    num_layers: Int(1, null=True) = None  # null: the method's choice (MoCo v3: by backbone; 2 elsewhere)
    hidden_dim: Int(1, null=True) = None
    out_dim: Int(1) = 128
    bn: Bool() = False
    last_bias: Bool() = True  # false: the last Linear has no bias (BYOL's official MLP)
    last_bn_scale: Bool() = False  # true: the last Linear is bias-free and followed by BN with γ, no β (SimCLR's)
    bottleneck_dim: Int(1) = 256  # DINO's head


class Predictor(Section):
    num_layers: Int(1) = 2
    hidden_dim: Int(1, null=True) = None
    bn: Bool() = True
    last_bias: Bool() = True


class MethodSettings(Section):
    kind: Str()  # a name in pipeline.methods.METHODS
    name: Str()
    head: Optional[Head] = None
    predictor: Optional[Predictor] = None
    fix_predictor_lr: Bool() = False  # SimSiam's --fix-pred-lr: the predictor's lr stays at the peak

    def check(self, at: str) -> None:
        if self.fix_predictor_lr and self.predictor is None:
            raise bad(f"{at}.fix_predictor_lr", True, f"method={self.name} has no predictor ({at}.predictor)")


class MomentumSettings(MethodSettings):
    """A method with a momentum (EMA) target encoder."""

    momentum: Num(ge=0, le=1)
    momentum_cosine: Bool() = False  # the momentum rises to 1 along a cosine (BYOL, MoCo v3, DINO)


@dataclass(frozen=True)
class MethodRun:
    """What a method reads of the run beside its own settings (pipeline.build.build_method makes it from the config):
    the model section it builds its networks from, the seed of its random state (MoCo's queue and shuffles) and the
    epochs its schedules span (DINO's teacher temperature)."""

    model: dict[str, Any]
    seed: int = 0
    epochs: int = 1
