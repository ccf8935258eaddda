"""The recipes that claim a framework paper's ImageNet run (`+experiment=mocov2`, `+experiment=simsiam`) against the
authors' code, value by value: the argparse defaults and README commands of facebookresearch/moco (main_moco.py with
--mlp --moco-t 0.2 --aug-plus --cos) and facebookresearch/simsiam (main_simsiam.py with --fix-pred-lr), typed here
from those files (docs/methods/frameworks.md has the table and the file of each row)."""

import math

import pytest
import torch
from torch import nn

from pipeline.build import build_method
from pipeline.config import compose_config
from pipeline.methods import METHODS
from pipeline.schedules import scaled_lr, warmup_cosine
from pipeline.train.optim import build_optimizer

# main_moco.py: --lr 0.03 --momentum 0.9 --wd 1e-4 --epochs 200 -b 256 --moco-dim 128 --moco-k 65536
# --moco-m 0.999 --moco-t 0.2 (v2) --mlp --cos, -a resnet50
MOCO_V2 = {"lr": 0.03, "momentum": 0.9, "wd": 1e-4, "epochs": 200, "batch": 256, "dim": 128, "k": 65536, "m": 0.999}
MOCO_V2.update(t=0.2)
# main_simsiam.py: --lr 0.05 --momentum 0.9 --wd 1e-4 --epochs 100 -b 512 (README) --dim 2048 --pred-dim 512
SIMSIAM = {"lr": 0.05, "momentum": 0.9, "wd": 1e-4, "epochs": 100, "batch": 512, "dim": 2048, "pred_dim": 512}
# --aug-plus (both repositories): RandomResizedCrop(224, scale=(0.2, 1.)), ColorJitter(0.4, 0.4, 0.4, 0.1) p 0.8,
# RandomGrayscale(0.2), GaussianBlur([.1, 2.]) p 0.5, RandomHorizontalFlip
AUG_PLUS = {"scale": [0.2, 1.0], "jitter": [0.4, 0.4, 0.4, 0.1], "p_jitter": 0.8, "p_gray": 0.2}
AUG_PLUS.update(blur_sigma=[0.1, 2.0], p_blur=0.5, p_flip=0.5)


def _recipe(name: str) -> dict:
    cfg = compose_config([f"+experiment={name}", "data=imagenet"])
    METHODS[cfg["method"]["kind"]].complete(cfg)  # what the job does before building (MoCo's BN groups)
    return cfg


def _augment(cfg: dict) -> dict:
    aug = cfg["augment"]
    view = {**aug, **aug.get("view", {})}
    return {k: view.get(k) for k in AUG_PLUS}


def _every_parameter_decays_at(opt: torch.optim.Optimizer, wd: float) -> bool:
    return all(g["weight_decay"] == wd for g in opt.param_groups if g["params"])


def _official_cosine(step: int, total: int, lr: float) -> float:
    # adjust_learning_rate with --cos (per epoch in the authors' code, per step here: the same curve sampled finer)
    return lr * 0.5 * (1.0 + math.cos(math.pi * step / total))


def test_the_mocov2_recipe_is_main_moco_with_the_v2_flags():
    cfg = _recipe("mocov2")
    o = MOCO_V2
    assert (cfg["train"]["epochs"], cfg["train"]["batch_size"]) == (o["epochs"], o["batch"])
    assert (cfg["method"]["queue_size"], cfg["method"]["momentum"], cfg["method"]["temperature"]) == (
        o["k"],
        o["m"],
        o["t"],
    )
    assert not cfg["method"]["momentum_cosine"] and not cfg["method"]["symmetric"]
    assert (cfg["model"]["backbone"], cfg["model"]["width"], cfg["model"]["cifar_stem"]) == ("resnet50", 64, False)
    assert _augment(cfg) == AUG_PLUS
    method = build_method(cfg)
    # --mlp: fc = Sequential(Linear(2048, 2048), ReLU(), Linear(2048, 128)), biases on both (nn.Linear's default)
    linears = [m for m in method.online.projector.modules() if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features, lin.bias is not None) for lin in linears] == [
        (2048, 2048, True),
        (2048, o["dim"], True),
    ]
    assert not any(isinstance(m, nn.BatchNorm1d) for m in method.online.projector.modules())
    lr = scaled_lr(cfg["optim"]["base_lr"], cfg["train"]["batch_size"])
    assert lr == pytest.approx(o["lr"] * o["batch"] / 256)
    opt = build_optimizer(method.online, cfg["optim"], lr)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == o["momentum"]
    assert _every_parameter_decays_at(opt, o["wd"])  # SGD(model.parameters(), ..., weight_decay=args.wd)
    assert not any(g.get("nesterov") for g in opt.param_groups)
    total = 1000
    warm = cfg["optim"]["warmup_epochs"] * (total // cfg["train"]["epochs"])
    for step in (0, 1, 250, 500, 999):
        assert warmup_cosine(step, total, warm, lr) == pytest.approx(_official_cosine(step, total, lr), rel=1e-12)


def test_the_simsiam_recipe_is_main_simsiam_with_fix_pred_lr():
    cfg = _recipe("simsiam")
    o = SIMSIAM
    assert (cfg["train"]["epochs"], cfg["train"]["batch_size"]) == (o["epochs"], o["batch"])
    assert (cfg["model"]["backbone"], cfg["model"]["width"], cfg["model"]["cifar_stem"]) == ("resnet50", 64, False)
    assert cfg["method"]["fix_predictor_lr"] and _augment(cfg) == AUG_PLUS
    method = build_method(cfg)
    # zero_init_residual=True: every bottleneck's last BN scale starts at 0
    blocks = [m for m in method.online.backbone.modules() if m.__class__.__name__ == "Bottleneck"]
    assert len(blocks) == 16 and all(torch.count_nonzero(b.bn3.weight) == 0 for b in blocks)
    proj = [m for m in method.online.projector.modules() if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features) for lin in proj] == [(2048, 2048), (2048, 2048), (2048, o["dim"])]
    pred = [m for m in method.online.predictor.modules() if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features) for lin in pred] == [
        (o["dim"], o["pred_dim"]),
        (o["pred_dim"], o["dim"]),
    ]
    lr = scaled_lr(cfg["optim"]["base_lr"], cfg["train"]["batch_size"])
    assert lr == pytest.approx(o["lr"] * o["batch"] / 256)  # init_lr = args.lr * args.batch_size / 256
    opt = build_optimizer(method.online, cfg["optim"], lr, fixed_lr=method.online.predictor.parameters())
    assert opt.defaults["momentum"] == o["momentum"] and _every_parameter_decays_at(opt, o["wd"])
    held = [p for g in opt.param_groups if g.get("fixed_lr") for p in g["params"]]
    assert {id(p) for p in held} == {id(p) for p in method.online.predictor.parameters()}
    assert cfg["optim"]["warmup_epochs"] == 0


# deepmind-research/byol configs/byol.py at 1000 epochs: _LR_PRESETS[1000] 0.2, _WD_PRESETS[1000] 1.5e-6,
# _EMA_PRESETS[1000] 0.996, batch_size 4096, warmup_epochs 10, projector 4096 -> 256, predictor 4096 -> 256, LARS
# eta 1e-3 momentum 0.9 with biases and norms excluded (utils/optimizers.py, exclude_bias_and_norm)
BYOL = {"lr": 0.2, "wd": 1.5e-6, "tau": 0.996, "epochs": 1000, "batch": 4096, "warmup": 10, "hidden": 4096, "out": 256}
BYOL.update(eta=1e-3, momentum=0.9)


def test_the_byol_recipe_is_the_authors_thousand_epoch_config():
    cfg = _recipe("byol")
    o = BYOL
    assert (cfg["train"]["epochs"], cfg["train"]["batch_size"]) == (o["epochs"], o["batch"])
    assert (cfg["method"]["momentum"], cfg["method"]["momentum_cosine"]) == (o["tau"], True)
    assert (cfg["optim"]["name"], cfg["optim"]["eta"], cfg["optim"]["momentum"]) == ("lars", o["eta"], o["momentum"])
    assert (cfg["optim"]["warmup_epochs"], cfg["optim"]["weight_decay"]) == (o["warmup"], o["wd"])
    assert scaled_lr(cfg["optim"]["base_lr"], cfg["train"]["batch_size"]) == pytest.approx(o["lr"] * o["batch"] / 256)
    method = build_method(cfg)
    # utils/networks.py, MLP: Linear(hidden) -> BN -> ReLU -> Linear(output, with_bias=False), for both heads
    for head, dims in (
        (method.online.projector, [(2048, o["hidden"]), (o["hidden"], o["out"])]),
        (method.online.predictor, [(o["out"], o["hidden"]), (o["hidden"], o["out"])]),
    ):
        linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
        assert [(lin.in_features, lin.out_features) for lin in linears] == dims
        assert linears[-1].bias is None
        assert sum(isinstance(m, nn.BatchNorm1d) for m in head.modules()) == 1
    opt = build_optimizer(method.online, cfg["optim"], 1.0)
    for g in opt.param_groups:  # weights: decay and LARS; biases and norms: neither
        matrices = all(p.ndim > 1 for p in g["params"])
        assert (g["weight_decay"], g["lars"]) == ((o["wd"], True) if matrices else (0.0, False)), g.keys()
