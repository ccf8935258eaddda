"""The settings every method shares (`method.kind`, `method.name`, the projection head, a predictor), which each
method's own `Settings` extends beside its class (pipeline/methods/moco.py: `MoCo.Settings`). Imports no torch:
the schema checks the shared part before any method is imported, the method's own part after
(pipeline.schema.check_method)."""

from __future__ import annotations

from typing import Optional

from pipeline.fields import Bool, Int, Num, Section, Str


class Head(Section):
    num_layers: Int(1, null=True)  # null: the method's choice (MoCo v3: by backbone)
    hidden_dim: Int(1, null=True) = None
    out_dim: Int(1) = 128
    bn: Bool()
    last_bias: Bool() = True  # false: the last Linear has no bias (BYOL's official MLP)
    last_bn_scale: Bool() = False  # true: the last Linear is bias-free and followed by BN with γ, no β (SimCLR's)
    bottleneck_dim: Int(1) = 256  # DINO's head


class Predictor(Section):
    num_layers: Int(1)
    hidden_dim: Int(1, null=True) = None
    bn: Bool()
    last_bias: Bool() = True


class MethodSettings(Section):
    kind: Str()  # a name in pipeline.methods.METHODS
    name: Str()
    head: Optional[Head] = None
    predictor: Optional[Predictor] = None
    fix_predictor_lr: Bool() = False  # SimSiam's --fix-pred-lr: the predictor's lr stays at the peak


class MomentumSettings(MethodSettings):
    """A method with a momentum (EMA) target encoder."""

    momentum: Num(ge=0, le=1)
    momentum_cosine: Bool() = False  # the momentum rises to 1 along a cosine (BYOL, MoCo v3, DINO)
