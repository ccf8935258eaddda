"""The config's schema: one validation pass over the whole composed config, before any work starts.

`validate(cfg)` checks, in this order, and raises `pipeline.config.ConfigError` with one line naming the key,
its value and what is allowed (`train.epochs=abc: expected an integer >= 1`); it returns the config typed beside
the config as composed (pipeline.fields.Checked), what a job makes its typed objects from:

1. types, ranges and choices of every key the jobs read (pipeline.sections, strict:
   `train.epochs=abc`, `=1.5` or `=true` is not an integer), `method.kind` a registered method (the method's
   own keys are its `Settings`', step 8). Unknown keys are allowed (plug-ins, presets and newer keys add some);
2. relations between keys: each section's own (its `check`: the kNN k against its bank, the probe's milestones,
   LARS' eta, a regression's targets, a predictor's fixed lr), then those between sections (the global batch over
   the workers, the smallest image the backbone takes, CPU layouts, Spirograph's recipe);
3. the augmentation recipe (its own checks: probabilities in [0, 1], view sizes, unknown keys);
4. paths (steps 4, 5 and 7 are pipeline.locations'): paths.root, paths.data, paths.runs, trainer.storage and
   gallery.out neither are nor lie under an existing file, and can be created where they are missing;
5. the tracking store: a SQLite store (the default `<paths.runs>/mlflow.db`, or tracking.uri=sqlite:///...)
   that exists must be a readable, uncorrupted SQLite database (opened read-only; never created here);
6. the plug-ins: each one's fit to the method, its `Settings`, its `check` (CLSA's strong views, InvCLR's penalty
   against torch.compile) and its constructor (torch is imported only when plug-ins are used);
7. the data folders: a local data.train / data.val must exist, except the managed Spirograph folders, which
   are generated (pipeline.train.prepare.prepare_data reads the manifests, checks every shard and the
   Spirograph provenance);
8. the method: its `Settings` and `check` (MoCo's BN groups in the per-worker batch), which import it and torch.

It starts nothing and creates nothing (no folder, no MLflow store, no Ray). Steps 1-5 and 7 import no torch, so
a bad command line is answered in about a second. Called by
pipeline.train.prepare.resolve (every training job) and by jobs/gallery.py; any job can call it on the config
`pipeline.config.cli` returns.
"""

from typing import Any, Mapping

from pipeline.config import ConfigError
from pipeline.data import DATASETS
from pipeline.data.generated import Generate
from pipeline.fields import Checked, bad, check_model, sections_of, show
from pipeline.locations import check_data, check_paths, check_tracking
from pipeline.methods import METHODS
from pipeline.models.catalogue import is_vit, shortcut_widening, vit_patch
from pipeline.registry import RegistryError
from pipeline.run_shape import RunShape
from pipeline.sections import Config, Model
from pipeline.store import Store

# The backbone's total downsampling: an image smaller than this leaves the last stage less than one pixel
# of its own (the rest is padding).
STRIDE = {True: 8, False: 32}  # by model.cifar_stem


# ----------------------------------------------------------------------------- validate


def validate(cfg: dict, method: bool = True) -> Checked[Config]:
    """Check the whole composed config (see the module docstring); ConfigError with one line, or the config typed.
    method=False: all but step 8 (the method's own checks, which import torch); the caller runs check_method when
    it is time (pipeline.train.prepare.resolve: after the shards' checks)."""
    c = Checked.of(Config, cfg)
    _check_components(c.typed)
    _check_relations(c.typed, cfg["augment"])
    check_augment(cfg["augment"], c.typed.model)
    check_paths(cfg["paths"], c.typed.trainer.storage, c.typed.gallery.out)
    check_tracking(Store.of(cfg))
    _check_plugins(c)
    check_data(cfg["data"], c.typed.paths.data)
    if method:
        check_method(c)
    return c


def _stride(model: Model) -> int:
    """The backbone's total downsampling: a ViT's patch size, a ResNet's by its stem."""
    if is_vit(model.backbone):
        return int(model.patch_size or vit_patch(model.backbone))
    return STRIDE[bool(model.cifar_stem)]


def _check_components(c: Config) -> None:
    """The method's kind among the registered ones, and a generated dataset's settings (its module loads no torch)."""
    try:
        kinds = METHODS.names()
        if c.data.generate is not None:
            name = c.data.name
            check_model(DATASETS[name].Settings if name in DATASETS else Generate, c.data.generate, "data.generate")
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    if c.method.kind not in kinds:
        raise bad("method.kind", c.method.kind, "expected one of " + ", ".join(kinds))


def _check_relations(c: Config, aug: Mapping[str, Any]) -> None:
    """Each section's own relations (its `check`), then those between sections (`c`: the config, typed; `aug`: the
    recipe, as the config has it)."""
    for at, section in sections_of(c):
        section.check(at)
    _check_batch_split(c)
    stride = _stride(c.model)
    _check_image_sizes(c, stride)
    _check_cpu_layout(c)
    if aug.get("kind", "views") == "spirograph":
        _check_spirograph_recipe(aug, stride)


def _check_batch_split(c: Config) -> None:
    workers = c.trainer.num_workers
    if c.train.batch_size % workers:
        raise bad(
            "train.batch_size",
            c.train.batch_size,
            f"does not split evenly over trainer.num_workers={workers} workers; use a multiple of {workers}",
        )


def _check_image_sizes(c: Config, stride: int) -> None:
    """The data's images at least one pixel of the backbone's last stage (one ViT patch); the views: check_augment."""
    model = c.model
    if c.data.image_size < stride:
        why = f"{model.backbone}'s patches" if is_vit(model.backbone) else f"model.cifar_stem={show(model.cifar_stem)}"
        raise bad(
            "data.image_size",
            c.data.image_size,
            f"expected an integer >= {stride}: the backbone downsamples by {stride} with {why}",
        )


def _check_cpu_layout(c: Config) -> None:
    """channels_last and compile against a narrow ResNet on the CPU, where oneDNN's kernel is wrong."""
    model, t = c.model, c.train
    cpu_resnet = not c.trainer.use_gpu and not is_vit(model.backbone)
    shortcut = model.width * shortcut_widening(model.backbone) if cpu_resnet else 0
    for key in ("channels_last", "compile"):  # inductor lays the CPU's convolutions out channels_last too
        if getattr(t, key) is True and cpu_resnet and shortcut < 16:
            raise bad(
                f"train.{key}",
                True,
                f"on the CPU with model.width={model.width}: oneDNN's channels_last backward of the 1x1 "
                f"stride-2 shortcut convolution writes past its buffer below 16 input channels (oneDNN issue 6035; "
                f"a crash or wrong gradients); use model.width >= 16, or leave train.{key} at its default",
            )


def _check_spirograph_recipe(aug: Mapping[str, Any], stride: int) -> None:
    """Spirograph's own view maker: no joint samplers (they draw an image recipe's crops, blur and colour)."""
    for part, spec in (aug.get("joint") or {}).items():
        if isinstance(spec, dict) and spec.get("beta") is not None:
            raise bad(
                f"augment.joint.{part}.beta",
                spec["beta"],
                "null with augment=spirograph: the joint "
                "samplers draw an image recipe's crops, blur and colour (e.g. augment=mocov2)",
            )
    for key, lo in (("size", stride), ("n_views", 2)):
        v = aug.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise bad(f"augment.{key}", v, f"expected an integer >= {lo}")


def check_augment(aug: dict, model: Model) -> None:
    """An image recipe's own checks (its keys typed where they are written; no torch imported), and each view at
    least one pixel of the backbone's last stage. Its executor and kind are the Augment section's, checked before
    this by validate's typing (pipeline.sections.Config)."""
    from pipeline.augment.recipe import ViewSpec, image_recipe

    stride = _stride(model)
    too_small = (
        f"smaller than one patch of {model.backbone}"
        if is_vit(model.backbone)
        else f"the backbone downsamples by {stride}"
    )

    def at_least_a_pixel(view: ViewSpec, at: str) -> None:
        if view.size < stride:
            raise bad(f"{at}.size", view.size, f"expected an integer >= {stride}: {too_small}")

    if aug.get("kind", "views") == "views":
        image_recipe(aug, at_least_a_pixel)


def check_method(c: Checked[Config]) -> None:
    """The method's own settings and checks (its `Settings`, `check`: pipeline.build), which import it and torch."""
    from pipeline import build  # torch: only once the cheap checks have passed

    build.check_method(c.raw["method"], RunShape.of(c))


def _check_plugins(c: Checked[Config]) -> None:
    """The plug-ins' settings and checks, and their fit to the method (pipeline.build): torch is imported only
    when plug-ins are used."""
    if not c.raw.get("plugin"):
        return
    from pipeline.build import check_plugins  # torch

    try:
        check_plugins(c)
    except ConfigError:  # a settings key named in full: plugin.<name>.<key>=...
        raise
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"plugin: {e}") from None
