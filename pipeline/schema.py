"""The config's schema: one validation pass over the whole composed config, before any work starts.

`validate(cfg)` checks, in this order, and raises `pipeline.config.ConfigError` with one line naming the key,
its value and what is allowed (`train.epochs=abc: expected an integer >= 1`):

1. types, ranges and choices of every key the jobs read (pydantic models below and pipeline.fields, strict:
   `train.epochs=abc`, `=1.5` or `=true` is not an integer), `method.kind` a registered method (the method's
   own keys are its `Settings`', step 8). Unknown keys are allowed (plug-ins, presets and newer keys add some);
2. relations between keys: the global batch over the workers, the kNN k against its bank, the smallest image
   the backbone takes;
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

from typing import Annotated, Any, Mapping, Optional, Union

from pydantic import Field, StrictFloat, StrictInt, StrictStr

from pipeline.config import ConfigError
from pipeline.data import DATASETS
from pipeline.data.formats import ON_BAD_SHARD
from pipeline.data.generated import Generate
from pipeline.fields import Allowed, Bool, Choice, Int, Ints, Num, Nums, Section, Str, bad, check_model, field, show
from pipeline.locations import check_data, check_paths, check_tracking
from pipeline.methods import METHODS
from pipeline.methods.settings import MethodSettings
from pipeline.registry import RegistryError
from pipeline.run_shape import RunShape
from pipeline.store import Store

# Choices that live with heavy (torch) modules; tests/test_cli.py checks they match those registries. Method kinds
# are the method registry's names (pipeline.methods.METHODS: the project's and installed packages').
BACKBONES = ("resnet18", "resnet34", "resnet50", "vit_tiny", "vit_s16", "vit_b16")  # models.backbones.BACKBONES
OPTIMIZERS = ("sgd", "lars", "adamw")  # pipeline.train.optim.build_optimizer
# The backbone's total downsampling: an image smaller than this leaves the last stage less than one pixel
# of its own (the rest is padding).
STRIDE = {True: 8, False: 32}  # by model.cifar_stem
VIT_PATCH = {"vit_tiny": 4, "vit_s16": 16, "vit_b16": 16}  # pipeline.models.backbones.VITS


# ----------------------------------------------------------------------------- the config's sections


class Run(Section):
    # a folder and lock-file name: no "/"; a number (run.name=7) is fine
    name: Annotated[
        Union[Annotated[StrictStr, Field(pattern=r"^[^/\\]+$")], StrictInt, None],
        Allowed("a name without '/' or null"),
    ] = None


class Paths(Section):
    root: Str()
    data: Str()
    runs: Str()


class Tracking(Section):
    uri: Str(null=True) = None
    experiment: Str()
    log_every: Int(1)
    flush_every_s: Num(ge=0) = 5.0
    system_metrics: Bool() = True


class Model(Section):
    backbone: Choice(*BACKBONES)
    cifar_stem: Bool()
    width: Int(1)
    zero_init_residual: Bool() = False  # ResNets: each block's last BN scale starts at 0
    patch_size: Int(1, null=True) = None
    image_size: Int(1, null=True) = None
    pos_embedding: Choice("learned", "sincos") = "learned"
    num_heads: Int(1, null=True) = None  # ViTs: null = the architecture's (MoCo v3's ViT-S: 12)
    drop_path: Num(ge=0, lt=1) = 0.0  # ViTs: stochastic depth of the last block (DINO's ViT-S: 0.1)
    vit_init: Choice("torchvision", "mocov3", "dino") = "torchvision"  # ViTs: whose initialisation


class Train(Section):
    epochs: Int(1)
    batch_size: Int(1)
    checkpoint_every: Int(1)
    shuffle_buffer: Int(1)
    views_ahead: Int(0) = 1
    precision: Choice("auto", "bf16", "fp32")
    channels_last: Choice("auto", True, False) = "auto"
    compile: Bool() = False
    deterministic_data: Bool() = False


# custom resources a worker or actor also asks for: a node type's label ({gpu_node: 1}), which places it
Resources = Annotated[
    Optional[dict[StrictStr, Annotated[StrictFloat, Field(gt=0)]]],
    Allowed("a map of resource name to a number > 0 ({gpu_node: 1}) or null"),
]


class Knn(Section):
    every: Int(0)
    k: Int(1)
    temperature: Num(gt=0)
    bank_size: Int(1)
    val_size: Int(1)


class ProbeSgd(Section):
    epochs: Int(1)
    lr: Num(gt=0)
    milestones: Annotated[list[StrictInt], Allowed("a list of epochs")]
    gamma: Num(gt=0, le=1)
    momentum: Num(ge=0, lt=1)
    weight_decay: Num(ge=0)
    batch_size: Int(1)


class Probe(Section):
    checkpoint: Str(null=True) = None
    after_pretrain: Bool()
    steps: Int(1)
    weight_decay: Num(ge=0)
    train_size: Int(1, null=True) = None
    val_size: Int(1, null=True) = None
    batch_size: Int(1)
    solver: Choice("auto", "lbfgs", "sgd")
    lbfgs_max: Int(1)
    sgd: ProbeSgd
    baseline: Bool() = True
    actors: Int(1, null=True) = None
    actor_resources: Resources = None


class FeatureAveraging(Section):
    m: Int(0)


class Invariance(Section):
    enabled: Bool()
    copies: Int(2)
    samples: Int(2)


class Eval(Section):
    knn: Knn
    probe: Probe
    feature_averaging: FeatureAveraging
    invariance: Invariance


class Gallery(Section):
    n_images: Int(1)
    out: Str(null=True) = None
    at_pretrain: Bool()


class Debug(Section):
    fail_at_epoch: Int(0, null=True) = None
    fail_marker: Str(null=True) = None


class Trainer(Section):
    num_workers: Int(1)
    use_gpu: Bool()
    cpus_per_worker: Num(gt=0)
    gpus_per_worker: Num(gt=0)
    torch_threads: Int(1, null=True) = None
    max_failures: Int(-1)
    storage: Str()
    autoscale: Bool() = False
    resource_wait_s: Num(ge=0) = 1800
    address: Str(null=True) = None
    # custom resources each worker also asks for (a node type's label, e.g. {gpu_node: 1}), and how Ray places
    # the workers over the nodes (ScalingConfig's placement_strategy)
    worker_resources: Resources = None
    placement_strategy: Choice("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD") = "PACK"
    count_bytes: Bool() = False  # each collective's bytes per step, logged as train/comm_* (pipeline/dist.py)
    grad_compression: Choice("bf16", null=True) = None  # DDP's gradient all-reduce in bf16: half the bytes


class Optim(Section):
    name: Choice(*OPTIMIZERS)
    base_lr: Num(gt=0)
    momentum: Num(ge=0, lt=1)
    weight_decay: Num(ge=0)
    eta: Num(gt=0, null=True) = None  # LARS' trust coefficient
    betas: Optional[Nums(2, gt=0)] = None  # AdamW's
    weight_decay_end: Num(ge=0, null=True) = None
    warmup_epochs: Num(ge=0)
    min_lr: Num(ge=0) = 0.0  # where the cosine ends (DINO: 1e-6)
    # a step schedule instead of the cosine: the lr times lr_decay from each of these epochs on (MoCo v1: 120, 160)
    milestones: Ints(1, null=True) = None
    lr_decay: Num(gt=0, le=1) = 0.1
    decay_bias_and_norm: Bool() = False  # true: biases and norms decay too under SGD/AdamW (MoCo v3's AdamW)


class Data(Section):
    name: Str()
    train: Str()
    val: Str()
    task: Choice("classification", "regression")
    targets: field(
        Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1)],
        "a non-empty list of names",
        True,
    ) = None
    image_size: Int(1)
    mean: Nums(3)
    std: Nums(3, gt=0)
    generate: Optional[dict] = None  # a generated dataset's Settings (pipeline.data.generated), checked below
    on_bad_shard: Choice(*ON_BAD_SHARD) = "fail"


class Augment(Section):
    # the recipe's own keys (sizes, probabilities, ops) are checked by the recipe (check_augment)
    name: Str()
    kind: Choice("views", "spirograph") = "views"
    executor: Choice("auto", "dali", "torch", "gpu")
    device: Choice("auto", "cpu", "gpu") = "auto"


class Config(Section):
    seed: Int(0)
    verbose: Bool() = False
    run: Run
    paths: Paths
    tracking: Tracking
    model: Model
    train: Train
    eval: Eval
    gallery: Gallery
    debug: Debug = Debug()
    trainer: Trainer
    optim: Optim
    data: Data
    method: MethodSettings  # the shared keys; the method's own: check_method (step 8)
    augment: Augment


# ----------------------------------------------------------------------------- validate


def validate(cfg: dict, method: bool = True) -> None:
    """Check the whole composed config (see the module docstring); ConfigError with one line, or None.
    method=False: all but step 8 (the method's own checks, which import torch); the caller runs check_method when
    it is time (pipeline.train.prepare.resolve: after the shards' checks)."""
    c = _check_types(cfg)
    _check_relations(c, cfg["augment"])
    check_augment(cfg["augment"])
    check_paths(cfg["paths"], c.trainer.storage, c.gallery.out)
    check_tracking(Store.of(cfg))
    _check_plugins(cfg)
    check_data(cfg["data"], c.paths.data)
    if method:
        check_method(cfg)


BOTTLENECK_RESNETS = ("resnet50", "resnet101", "resnet152")  # their shortcuts see 4x the width


def _stride(model: Model) -> int:
    """The backbone's total downsampling: a ViT's patch size, a ResNet's by its stem."""
    if model.backbone in VIT_PATCH:
        return int(model.patch_size or VIT_PATCH[model.backbone])
    return STRIDE[bool(model.cifar_stem)]


def _check_types(cfg: dict) -> Config:
    """Every section's typed keys, the method's kind and a generated dataset's settings; the config, typed."""
    typed = check_model(Config, cfg)
    try:
        kinds = METHODS.names()
        generate = cfg["data"].get("generate")
        if generate is not None:  # the generated dataset's settings (its module loads no torch)
            name = cfg["data"]["name"]
            check_model(DATASETS[name].Settings if name in DATASETS else Generate, generate, "data.generate")
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    if cfg["method"]["kind"] not in kinds:
        raise bad("method.kind", cfg["method"]["kind"], "expected one of " + ", ".join(kinds))
    return typed


def _check_relations(c: Config, aug: Mapping[str, Any]) -> None:
    """Relations between typed keys (`c`: the config typed by _check_types); `aug`: the recipe, as the config has it."""
    t, tr, m, data, model = c.train, c.trainer, c.method, c.data, c.model
    workers = tr.num_workers
    if t.batch_size % workers:
        raise bad(
            "train.batch_size",
            t.batch_size,
            f"does not split evenly over trainer.num_workers={workers} workers; use a multiple of {workers}",
        )
    if m.fix_predictor_lr and m.predictor is None:
        raise bad("method.fix_predictor_lr", True, f"method={m.name} has no predictor (method.predictor)")
    stride = _stride(model)
    if data.image_size < stride:
        stem = f"model.cifar_stem={show(model.cifar_stem)}"
        why = f"{model.backbone}'s patches" if model.backbone in VIT_PATCH else stem
        raise bad(
            "data.image_size",
            data.image_size,
            f"expected an integer >= {stride}: the backbone downsamples by {stride} with {why}",
        )
    if aug.get("kind", "views") == "views":
        for i, v in enumerate(aug.get("views") or []):
            size = v.get("size", (aug.get("view") or {}).get("size")) if isinstance(v, dict) else None
            if isinstance(size, int) and not isinstance(size, bool) and size < stride:
                raise bad(
                    f"augment.views.{i}.size",
                    size,
                    f"expected an integer >= {stride}: smaller than one patch of {model.backbone}"
                    if model.backbone in VIT_PATCH
                    else f"expected an integer >= {stride}: the backbone downsamples by {stride}",
                )
    if data.task == "regression" and not data.targets:
        raise bad("data.targets", data.targets, "a regression task needs its target names")
    knn = c.eval.knn
    if knn.every and knn.k > knn.bank_size:
        raise bad("eval.knn.k", knn.k, f"expected at most eval.knn.bank_size={knn.bank_size}")
    sgd = c.eval.probe.sgd
    if sgd.milestones != sorted(sgd.milestones) or any(not 0 < e < sgd.epochs for e in sgd.milestones):
        raise bad(
            "eval.probe.sgd.milestones",
            sgd.milestones,
            f"increasing epochs between 1 and eval.probe.sgd.epochs={sgd.epochs} - 1",
        )
    if c.optim.name == "lars" and c.optim.eta is None:
        raise bad("optim.eta", None, "expected a number > 0 with optim.name=lars (LARS' trust coefficient)")
    shortcut = model.width * (4 if model.backbone in BOTTLENECK_RESNETS else 1)
    cpu_resnet = not tr.use_gpu and not model.backbone.startswith("vit")
    for key in ("channels_last", "compile"):  # inductor lays the CPU's convolutions out channels_last too
        if getattr(t, key) is True and cpu_resnet and shortcut < 16:
            raise bad(
                f"train.{key}",
                True,
                f"on the CPU with model.width={model.width}: oneDNN's channels_last backward of the 1x1 "
                f"stride-2 shortcut convolution writes past its buffer below 16 input channels (oneDNN issue 6035; "
                f"a crash or wrong gradients); use model.width >= 16, or leave train.{key} at its default",
            )
    if aug.get("kind", "views") == "spirograph":
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


def check_augment(aug: dict) -> None:
    """An image recipe's own checks (no torch imported). Its executor and kind are the Augment model's, checked
    before this by _check_types."""
    from pipeline.augment.recipe import image_recipe

    if aug.get("kind", "views") == "views":
        try:
            image_recipe(aug)
        except (TypeError, ValueError, KeyError) as e:
            raise ConfigError(f"augment: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def check_method(cfg: dict) -> None:
    """The method's own settings and checks (its `Settings`, `check`: pipeline.build), which import it and torch."""
    from pipeline import build  # torch: only once the cheap checks have passed

    build.check_method(cfg["method"], RunShape.of(cfg))


def _check_plugins(cfg: dict) -> None:
    """The plug-ins' settings and checks, and their fit to the method (pipeline.build): torch is imported only
    when plug-ins are used."""
    if not cfg.get("plugin"):
        return
    from pipeline.build import check_plugins  # torch

    try:
        check_plugins(cfg)
    except ConfigError:  # a settings key named in full: plugin.<name>.<key>=...
        raise
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"plugin: {e}") from None
