"""Augmentation recipes: plain dataclasses holding the *laws* views are sampled from.

A recipe is a list of view specs (one per output view: two for MoCo, 2 global + N local for DINO,
2 weak + 1-5 strong for CLSA, 2 + 3 composites for CoCor) plus the normalisation and the joint
samplers that tie the first two views together (JointCrop / JointBlur / JointColor). Samplers
(params.py, joint.py, strong.py) read it to draw per-sample parameters; executors (torch_exec.py,
dali_exec.py with its graphs in dali_graph.py) read it for the fixed settings (output sizes, which ops can occur,
normalisation).

Config form (conf/augment/*.yaml), either flat (every view alike, `n_views` of them):
    size: 224, scale: [0.2, 1.0], p_blur: 0.5, n_views: 2, ...
or grouped, with per-view overrides inside a group:
    view: {jitter: [0.4, 0.4, 0.2, 0.1]}          # defaults for every group
    views:
      - {name: global, count: 2, size: 224, per_view: [{p_blur: 1.0}, {p_blur: 0.1, p_solarize: 0.2}]}
      - {name: local, count: 6, size: 96, scale: [0.05, 0.4]}
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
JITTER_ORDERS = ("fixed", "random")
HUE_MODES = ("hsv", "yiq")  # torchvision's exact HSV rotation | InvCLR's linear YIQ rotation
COLOR_STAGES = ("executor", "model")
STRONG_POOLS = ("clsa", "fixmatch")
STRONG_LAWS = ("paper", "code", "fixed")


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


@dataclass(frozen=True)
class ViewSpec:
    """The law of one view. Defaults = MoCo v2's view.

    Op order (both executors): crop+resize, flip, colour jitter (brightness, contrast, saturation, hue,
    in this order or a random permutation per sample), grayscale, blur, solarize, then `strong_ops` ops
    from the strong pool (CLSA / CoCor; applied after the weak ops, as CLSA's code does).
    """

    name: str = "view"
    size: int = 224
    scale: tuple[float, float] = (0.2, 1.0)  # crop area, fraction of the image
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop aspect ratio w/h
    p_flip: float = 0.5
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
    p_jitter: float = 0.8
    jitter_order: str = "fixed"  # fixed | random (torchvision's ColorJitter permutes)
    hue_mode: str = "hsv"  # hsv | yiq (InvCLR's linear approximation)
    p_gray: float = 0.2
    # true: grayscale as if before the jitter (MoCo v1's RandomGrayscale then ColorJitter): a grey view's saturation
    # and hue are off, which on a grey image they are; brightness and contrast commute with greying
    gray_first: bool = False
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    p_blur: float = 0.5
    p_solarize: float = 0.0
    solarize_threshold: float = 0.5  # fraction of full scale; pixels >= it are inverted
    strong_ops: int = 0  # 0: no strong augmentation
    strong_pool: str = "clsa"  # clsa (paper: with Invert) | fixmatch (with Identity)
    strong_p: float = 0.5  # per-op apply probability (CLSA 0.5, CoCor 1)
    strong_law: str = "paper"  # magnitude law: paper | code | fixed (strong.py)
    color_stage: str = "executor"  # executor | model: leave jitter+gray to the method
    # (InvCLR differentiates the image w.r.t. them)

    def __post_init__(self) -> None:
        # Configs arrive as lists (YAML / Hydra ListConfig); store tuples so specs compare and hash.
        for name in ("scale", "ratio", "jitter", "blur_sigma"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        for name in ("size", "strong_ops"):
            object.__setattr__(self, name, int(getattr(self, name)))
        _check(isinstance(self.gray_first, bool), f"view {self.name}: gray_first must be true or false")
        for name in ("p_flip", "p_jitter", "p_gray", "p_blur", "p_solarize", "strong_p", "solarize_threshold"):
            object.__setattr__(self, name, float(getattr(self, name)))
        _check(self.size > 0, f"view {self.name}: size must be positive")
        _check(len(self.scale) == 2 and 0 < self.scale[0] <= self.scale[1] <= 1, f"bad scale {self.scale}")
        _check(len(self.ratio) == 2 and 0 < self.ratio[0] <= self.ratio[1], f"bad ratio {self.ratio}")
        _check(len(self.jitter) == 4 and min(self.jitter) >= 0, f"bad jitter {self.jitter}")
        _check(self.jitter[3] <= 0.5, f"hue jitter must be <= 0.5 turn, got {self.jitter[3]}")
        _check(
            len(self.blur_sigma) == 2 and 0 < self.blur_sigma[0] <= self.blur_sigma[1],
            f"bad blur_sigma {self.blur_sigma}",
        )
        for name in ("p_flip", "p_jitter", "p_gray", "p_blur", "p_solarize", "strong_p", "solarize_threshold"):
            _check(0.0 <= getattr(self, name) <= 1.0, f"view {self.name}: {name} must be in [0, 1]")
        _check(self.strong_ops >= 0, "strong_ops must be >= 0")
        for name, allowed in (
            ("jitter_order", JITTER_ORDERS),
            ("hue_mode", HUE_MODES),
            ("color_stage", COLOR_STAGES),
            ("strong_pool", STRONG_POOLS),
            ("strong_law", STRONG_LAWS),
        ):
            _check(getattr(self, name) in allowed, f"view {self.name}: {name} must be one of {allowed}")
        _check(
            self.hue_mode == "hsv" or self.color_stage == "model",
            "hue_mode=yiq exists only in the differentiable colour stage (color_stage=model)",
        )


@dataclass(frozen=True)
class JointSpec:
    """Joint samplers over the first two views (docs/methods/jointcrop.md). beta None = independent."""

    crop_beta: float | None = None
    blur_beta: float | None = None
    color_beta: float | None = None
    color_factor: str = "brightness"  # brightness | contrast

    def __post_init__(self) -> None:
        _check(self.color_factor in ("brightness", "contrast"), "joint color factor must be brightness or contrast")

    @property
    def active(self) -> bool:
        return any(b is not None for b in (self.crop_beta, self.blur_beta, self.color_beta))


@dataclass(frozen=True)
class Recipe:
    views: tuple[ViewSpec, ...] = (ViewSpec(), ViewSpec())
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    joint: JointSpec = field(default_factory=JointSpec)

    def __post_init__(self) -> None:
        object.__setattr__(self, "views", tuple(self.views))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        _check(len(self.views) > 0, "a recipe needs at least one view")
        _check(len(self.mean) == 3 and len(self.std) == 3 and min(self.std) > 0, "mean/std need 3 channels")
        _check(not self.joint.active or len(self.views) >= 2, "joint sampling needs two views")

    @property
    def n_views(self) -> int:
        return len(self.views)

    @property
    def size(self) -> int:
        """The first view's size: the size evaluation views use."""
        return self.views[0].size

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(v.size for v in self.views)


_VIEW_FIELDS = {f.name for f in fields(ViewSpec)}
_GROUP_KEYS = {"count", "per_view"}


def _view_kwargs(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(d) - _VIEW_FIELDS)
    _check(not unknown, f"unknown view keys {unknown} in {where}; known: {sorted(_VIEW_FIELDS)}")
    return dict(d)


def _joint(d: Mapping[str, Any] | None) -> JointSpec:
    d = dict(d or {})
    unknown = sorted(set(d) - {"crop", "blur", "color"})
    _check(not unknown, f"unknown joint keys {unknown}; known: crop, blur, color")

    def beta(key: str) -> float | None:
        b = (d.get(key) or {}).get("beta")
        return None if b is None else float(b)

    return JointSpec(
        crop_beta=beta("crop"),
        blur_beta=beta("blur"),
        color_beta=beta("color"),
        color_factor=(d.get("color") or {}).get("factor", "brightness"),
    )


# keys of conf/augment/*.yaml that choose how views are computed, not their law
EXECUTION_KEYS = ("name", "kind", "executor", "device")


def image_recipe(aug: Mapping[str, Any]) -> Recipe:
    """The Recipe an image augment config describes (ValueError on unknown keys or bad values)."""
    return recipe_from_dict({k: v for k, v in aug.items() if k not in EXECUTION_KEYS})


def recipe_from_dict(d: Mapping[str, Any]) -> Recipe:
    """Build a recipe from a plain config mapping (flat or grouped form, see the module docstring);
    unknown keys are an error (catches typos)."""
    d = dict(d)
    top = {
        "mean": d.pop("mean", IMAGENET_MEAN),
        "std": d.pop("std", IMAGENET_STD),
        "joint": _joint(d.pop("joint", None)),
    }
    if "views" not in d:  # flat form
        n_views = int(d.pop("n_views", 2))
        spec = ViewSpec(**_view_kwargs(d, "augment"))
        return Recipe(views=(spec,) * n_views, **top)
    groups, base = d.pop("views"), _view_kwargs(d.pop("view", None) or {}, "augment.view")
    _check(not d, f"unknown augment keys {sorted(d)} next to views; put view defaults under `view:`")
    specs: list[ViewSpec] = []
    for i, g in enumerate(groups):
        g = dict(g)
        count, per_view = int(g.pop("count", 1)), list(g.pop("per_view", None) or [])
        _check(count > 0, f"augment.views[{i}].count must be positive")
        _check(
            not per_view or len(per_view) == count,
            f"augment.views[{i}].per_view has {len(per_view)} entries for count {count}",
        )
        spec = ViewSpec(**{**base, **_view_kwargs(g, f"augment.views[{i}]")})
        for j in range(count):
            specs.append(
                replace(spec, **_view_kwargs(per_view[j], f"augment.views[{i}].per_view[{j}]")) if per_view else spec
            )
    return Recipe(views=tuple(specs), **top)
