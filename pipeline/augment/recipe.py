"""Augmentation recipes: frozen, typed specs (pydantic, like every config section) holding the *laws* views are
sampled from.

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

from typing import Annotated, Any, Callable, Mapping

from pydantic import BeforeValidator, ConfigDict, StrictFloat, ValidationInfo, model_validator

from pipeline.fields import Bool, Choice, Int, Num, Section, Str, bad, check_model, field

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
JITTER_ORDERS = ("fixed", "random")
HUE_MODES = ("hsv", "yiq")  # torchvision's exact HSV rotation | InvCLR's linear YIQ rotation
COLOR_STAGES = ("executor", "model")
STRONG_POOLS = ("clsa", "fixmatch")
STRONG_LAWS = ("paper", "code", "fixed")


def _tuple(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v  # configs hold lists (YAML, Hydra); a spec keeps tuples


def Floats(n: int, text: str) -> Any:
    """n numbers, stored as a tuple."""
    items = tuple[(StrictFloat,) * n]  # type: ignore[misc]  # a tuple of n floats, n known at runtime
    return field(Annotated[items, BeforeValidator(_tuple)], f"a list of {n} numbers{text}", False)


def Prob() -> Any:
    return Num(ge=0, le=1)


def _ordered(key: str, pair: tuple[float, float], high: float | None) -> None:
    lo, hi = pair
    if not (0 < lo <= hi and (high is None or hi <= high)):
        bound = f" <= {high:g}" if high is not None else ""
        raise bad(key, list(pair), f"expected a list of 2 numbers, 0 < low <= high{bound}")


class Spec(Section):
    """A recipe part: frozen (specs compare and hash), strict, and a key it does not know is a typo. Its relations
    (`relations`, keys named relative to it) are checked whenever one is made; pipeline.fields.check_model names
    them under the part's place in the config (`augment.views.1.scale=[0.5, 0.2]: ...`)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def relations(self) -> None:
        """ConfigError (`bad`) naming the key, relative to this part."""

    @model_validator(mode="after")
    def _checked(self, info: ValidationInfo) -> "Spec":
        if not (info.context or {}).get(DEFAULTS_ONLY):
            self.relations()
        return self


# check_model's context for a view's defaults (`augment.view`): their keys and types checked, not their relations,
# which hold of each view they are merged into (a default hue_mode=yiq with each group's color_stage=model)
DEFAULTS_ONLY = "defaults only"


class ViewSpec(Spec):
    """The law of one view. Defaults = MoCo v2's view.

    Op order (both executors): crop+resize, flip, colour jitter (brightness, contrast, saturation, hue,
    in this order or a random permutation per sample), grayscale, blur, solarize, then `strong_ops` ops
    from the strong pool (CLSA / CoCor; applied after the weak ops, as CLSA's code does).
    """

    name: Str() = "view"
    size: Int(1) = 224
    scale: Floats(2, ", 0 < low <= high <= 1") = (0.2, 1.0)  # crop area, fraction of the image
    ratio: Floats(2, ", 0 < low <= high") = (3 / 4, 4 / 3)  # crop aspect ratio w/h
    p_flip: Prob() = 0.5
    jitter: Floats(4, " >= 0, hue <= 0.5") = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
    p_jitter: Prob() = 0.8
    jitter_order: Choice(*JITTER_ORDERS) = "fixed"  # random: a permutation per sample (torchvision's ColorJitter)
    hue_mode: Choice(*HUE_MODES) = "hsv"  # yiq: InvCLR's linear approximation
    p_gray: Prob() = 0.2
    # true: grayscale as if before the jitter (MoCo v1's RandomGrayscale then ColorJitter): a grey view's saturation
    # and hue are off, which on a grey image they are; brightness and contrast commute with greying
    gray_first: Bool() = False
    blur_sigma: Floats(2, ", 0 < low <= high") = (0.1, 2.0)
    p_blur: Prob() = 0.5
    p_solarize: Prob() = 0.0
    solarize_threshold: Prob() = 0.5  # fraction of full scale; pixels >= it are inverted
    strong_ops: Int(0) = 0  # 0: no strong augmentation
    strong_pool: Choice(*STRONG_POOLS) = "clsa"  # clsa (paper: with Invert) | fixmatch (with Identity)
    strong_p: Prob() = 0.5  # per-op apply probability (CLSA 0.5, CoCor 1)
    strong_law: Choice(*STRONG_LAWS) = "paper"  # magnitude law: paper | code | fixed (strong.py)
    # model: leave jitter and greying to the method (InvCLR differentiates the image w.r.t. them)
    color_stage: Choice(*COLOR_STAGES) = "executor"

    def relations(self) -> None:
        _ordered("scale", self.scale, 1.0)
        _ordered("ratio", self.ratio, None)
        _ordered("blur_sigma", self.blur_sigma, None)
        if min(self.jitter) < 0 or self.jitter[3] > 0.5:
            raise bad("jitter", list(self.jitter), "expected 4 numbers >= 0, the hue (a turn) <= 0.5")
        if self.hue_mode == "yiq" and self.color_stage != "model":
            raise bad(
                "hue_mode",
                "yiq",
                "expected hsv: yiq exists only in the differentiable colour stage (color_stage=model)",
            )


class JointPart(Spec):
    beta: Num(null=True) = None  # None: the two views drawn independently


class JointColour(JointPart):
    factor: Choice("brightness", "contrast") = "brightness"


class JointSpec(Spec):
    """Joint samplers over the first two views (docs/methods/jointcrop.md), in the config's form
    (`joint: {crop: {beta: 1}}`)."""

    crop: JointPart = JointPart()
    blur: JointPart = JointPart()
    color: JointColour = JointColour()

    @property
    def crop_beta(self) -> float | None:
        return self.crop.beta

    @property
    def blur_beta(self) -> float | None:
        return self.blur.beta

    @property
    def color_beta(self) -> float | None:
        return self.color.beta

    @property
    def color_factor(self) -> str:
        return self.color.factor

    @property
    def active(self) -> bool:
        return any(b is not None for b in (self.crop_beta, self.blur_beta, self.color_beta))


class Recipe(Spec):
    views: Annotated[tuple[ViewSpec, ...], BeforeValidator(_tuple)] = (ViewSpec(), ViewSpec())
    mean: Floats(3, "") = IMAGENET_MEAN
    std: Floats(3, " > 0") = IMAGENET_STD
    joint: JointSpec = JointSpec()

    def relations(self) -> None:
        if not self.views:
            raise bad("views", [], "expected at least one view")
        if min(self.std) <= 0:
            raise bad("std", list(self.std), "expected 3 numbers > 0")
        if self.joint.active and len(self.views) < 2:
            raise bad(
                "views",
                f"{len(self.views)} view",
                "expected two views or more with augment.joint: it ties the first two",
            )

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


# keys of conf/augment/*.yaml that choose how views are computed, not their law
EXECUTION_KEYS = ("name", "kind", "executor", "device", "fuse")


EachView = Callable[[ViewSpec, str], None]


def _mapping(d: Mapping[str, Any], key: str, at: str) -> dict[str, Any]:
    """d[key] as a mapping ({} where it is missing or null); a value of another shape: ConfigError."""
    v = d.get(key)
    if v is not None and not isinstance(v, Mapping):
        raise bad(f"{at}.{key}", v, "expected a mapping of keys")
    return dict(v or {})


def image_recipe(aug: Mapping[str, Any], each_view: EachView | None = None) -> Recipe:
    """The Recipe an image augment config describes (ConfigError, one line naming the key, on an unknown key or a
    bad value); `each_view(spec, place)`: a further check of each view where the config writes it."""
    return recipe_from_dict({k: v for k, v in aug.items() if k not in EXECUTION_KEYS}, "augment", each_view)


def recipe_from_dict(d: Mapping[str, Any], at: str = "augment", each_view: EachView | None = None) -> Recipe:
    """Build a recipe from a plain config mapping (flat or grouped form, see the module docstring); each key is
    checked where it is written (`augment.views.1.p_blur`), an unknown one included (a typo)."""

    def _view(d: Mapping[str, Any], at: str) -> ViewSpec:
        spec = check_model(ViewSpec, dict(d), at)
        if each_view is not None:
            each_view(spec, at)
        return spec

    d = dict(d)
    top: dict[str, Any] = {k: d.pop(k) for k in ("mean", "std", "joint") if k in d}
    if "views" not in d:  # flat form
        n_views = d.pop("n_views", 2)
        if not isinstance(n_views, int) or isinstance(n_views, bool) or n_views < 1:
            raise bad(f"{at}.n_views", n_views, "expected an integer >= 1")
        if n_views < 2 and any(
            isinstance(j, Mapping) and j.get("beta") is not None for j in _mapping(top, "joint", at).values()
        ):
            raise bad(f"{at}.n_views", n_views, "expected 2 or more with augment.joint: it ties the first two views")
        views = (_view(d, at),) * n_views
    else:
        groups, base = d.pop("views"), _mapping(d, "view", at)
        d.pop("view", None)
        if d:
            raise bad(f"{at}.{sorted(d)[0]}", d[sorted(d)[0]], "unknown key next to views; view defaults go under view")
        if not isinstance(groups, (list, tuple)) or not groups:
            raise bad(f"{at}.views", groups, "expected a non-empty list of view groups (mappings)")
        check_model(ViewSpec, base, f"{at}.view", context={DEFAULTS_ONLY: True})
        specs: list[ViewSpec] = []
        for i, g in enumerate(groups):
            where = f"{at}.views.{i}"
            if not isinstance(g, Mapping):
                raise bad(where, g, "expected a mapping of view keys (count, per_view, size, ...)")
            g = dict(g)
            count, per_view = g.pop("count", 1), g.pop("per_view", None) or []
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise bad(f"{where}.count", count, "expected an integer >= 1")
            if not isinstance(per_view, (list, tuple)) or not all(isinstance(p, Mapping) for p in per_view):
                raise bad(f"{where}.per_view", per_view, "expected a list of mappings, one per view")
            if per_view and len(per_view) != count:
                raise bad(f"{where}.per_view", per_view, f"expected {count} entries, one per view (count={count})")
            group = {**base, **g}
            spec = _view(group, where)
            specs += [_view({**group, **p}, f"{where}.per_view.{j}") for j, p in enumerate(per_view)] or [spec] * count
        views = tuple(specs)
    return check_model(Recipe, {"views": views, **top}, at)
