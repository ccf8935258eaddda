"""The config's sections, typed: the pydantic models of every key the jobs read (pipeline.fields' strict Section,
unknown keys allowed: plug-ins, presets and newer keys add some). pipeline.schema validates a composed config
against `Config` and checks what the fields alone do not say; the jobs' typed objects (PretrainSpec, ProbeSpec,
RunShape, ...) are made from the typed config. Imports no torch."""

from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import Field, StrictFloat, StrictInt, StrictStr

from pipeline.data.formats import ON_BAD_SHARD
from pipeline.fields import Allowed, Bool, Choice, Int, Ints, Num, Nums, Section, Str, bad, check_model, field
from pipeline.methods.settings import MethodSettings
from pipeline.models.catalogue import BACKBONES

# Choices that live with heavy (torch) modules; tests/test_cli.py checks they match those registries. Method kinds
# are the method registry's names (pipeline.methods.METHODS: the project's and installed packages').
OPTIMIZERS = ("sgd", "lars", "adamw")  # pipeline.train.optim.build_optimizer


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
    outage_s: Num(ge=0) = 600.0
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

    def check(self, at: str) -> None:
        if self.every and self.k > self.bank_size:
            raise bad(f"{at}.k", self.k, f"expected at most {at}.bank_size={self.bank_size}")


class ProbeSgd(Section):
    epochs: Int(1)
    lr: Num(gt=0)
    milestones: Annotated[list[StrictInt], Allowed("a list of epochs")]
    gamma: Num(gt=0, le=1)
    momentum: Num(ge=0, lt=1)
    weight_decay: Num(ge=0)
    batch_size: Int(1)

    def check(self, at: str) -> None:
        m = self.milestones
        if m != sorted(m) or any(not 0 < e < self.epochs for e in m):
            raise bad(f"{at}.milestones", m, f"increasing epochs between 1 and {at}.epochs={self.epochs} - 1")


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

    def check(self, at: str) -> None:
        if self.name == "lars" and self.eta is None:
            raise bad(f"{at}.eta", None, f"expected a number > 0 with {at}.name=lars (LARS' trust coefficient)")

    @classmethod
    def of(cls, data: "Mapping[str, Any] | Optim") -> "Optim":
        """The section typed, the schema's defaults filled in (ConfigError with one line where a key is bad)."""
        if isinstance(data, Optim):
            return data
        optim = check_model(cls, dict(data), "optim")
        optim.check("optim")
        return optim


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
    generate: Optional[dict] = None  # a generated dataset's Settings (pipeline.data.generated): schema's checks
    on_bad_shard: Choice(*ON_BAD_SHARD) = "fail"

    def check(self, at: str) -> None:
        if self.task == "regression" and not self.targets:
            raise bad(f"{at}.targets", self.targets, "a regression task needs its target names")


class Augment(Section):
    # the recipe's own keys (sizes, probabilities, ops) are checked by the recipe (check_augment)
    name: Str()
    kind: Choice("views", "spirograph") = "views"
    # `gpu` was this executor's old name: refused in one line that names the new one
    executor: field(
        Literal["auto", "dali", "torch", "batched"], "one of auto, dali, torch, batched (gpu is now batched)", False
    )
    device: Choice("auto", "cpu", "gpu") = "auto"
    # the batched executor's photometric stage compiled for full batches (augment/fused.py); off: unmeasured on a GPU
    fuse: Bool() = False

    def check(self, at: str) -> None:
        if self.fuse and self.executor in ("torch", "dali"):
            raise bad(
                f"{at}.fuse",
                True,
                f"expected false with {at}.executor={self.executor}: only the batched executor has a stage to compile",
            )


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
