"""The recipes that claim a framework paper's run (`+experiment=mocov1`, `mocov2`, `simsiam`, `byol`, `simclr`,
`supcon`) against the authors' code, value by value: the argparse defaults and README commands of facebookresearch/moco
(main_moco.py, with --mlp --moco-t 0.2 --aug-plus --cos for v2), facebookresearch/simsiam (main_simsiam.py with
--fix-pred-lr), deepmind-research/byol (configs/byol.py), google-research/simclr (run.py, objective.py,
model_util.py) and HobbitLong/SupContrast (main_supcon.py, losses.py), typed here from those files
(docs/methods/frameworks.md has the table and the file of each row). The loss and schedule conventions these recipes
switch on are checked against the official formulas written out directly."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from torch import nn

from pipeline.augment.colour import colour_distort
from pipeline.augment.params import sample_view_params
from pipeline.augment.recipe import ViewSpec
from pipeline.build import build_method, complete_method
from pipeline.config import compose_config
from pipeline.fields import Checked
from pipeline.methods.base import Encoder
from pipeline.models.heads import ScaleBatchNorm1d
from pipeline.schedules import scaled_lr, warmup_cosine
from pipeline.sections import Config
from pipeline.train.optim import build_optimizer
from pipeline.train.step import schedule_step

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


def _recipe(name: str, data: str = "imagenet") -> dict:
    cfg = compose_config([f"+experiment={name}", f"data={data}"])
    cfg["method"].update(complete_method(Checked.of(Config, cfg)))  # what the job does before building (BN groups)
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
    opt = build_optimizer(method.online, cfg["optim"], lr, fixed_lr=method.fixed_lr_parameters())
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


def _lars_excludes_biases_and_norms(opt: torch.optim.Optimizer, wd: float) -> bool:
    return all(
        (g["weight_decay"], g["lars"]) == ((wd, True) if all(p.ndim > 1 for p in g["params"]) else (0.0, False))
        for g in opt.param_groups
    )


def _tiny_online(method, seed: int = 0) -> None:
    """A float64 linear encoder in place of the recipe's ResNet-50: the loss, not the network, is under test."""
    torch.manual_seed(seed)
    method.online = Encoder(nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 12)), nn.Linear(12, 8)).double()


def _views(n: int = 8, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 3, 4, 4, generator=g, dtype=torch.float64) for _ in range(2)]


# google-research/simclr run.py (v1) with the README's ImageNet flags: --train_batch_size=4096 --train_epochs=100
# --learning_rate=0.3 (linear scaling) --weight_decay=1e-6 --temperature=0.1, warmup_epochs 10, LARS momentum 0.9
# eta 1e-3, proj_out_dim 128, color_jitter_strength 1.0, use_blur True
SIMCLR = {"lr": 0.3, "wd": 1e-6, "t": 0.1, "epochs": 100, "batch": 4096, "warmup": 10, "out": 128}
SIMCLR.update(eta=1e-3, momentum=0.9)


def _simclr_official_loss(h1: torch.Tensor, h2: torch.Tensor, t: float) -> torch.Tensor:
    # objective.py, add_contrastive_loss on one replica: logits against both views, self masked with LARGE_NUM,
    # one softmax cross-entropy per direction, their sum
    large = 1e9
    h1, h2 = F.normalize(h1, dim=1), F.normalize(h2, dim=1)
    n = h1.shape[0]
    labels, mask = torch.arange(n), torch.eye(n, dtype=h1.dtype)
    aa, bb = h1 @ h1.t() / t - mask * large, h2 @ h2.t() / t - mask * large
    ab, ba = h1 @ h2.t() / t, h2 @ h1.t() / t
    loss_a = F.cross_entropy(torch.cat([ab, aa], 1), labels)
    loss_b = F.cross_entropy(torch.cat([ba, bb], 1), labels)
    return loss_a + loss_b


def test_the_simclr_recipe_is_the_authors_imagenet_command():
    cfg = _recipe("simclr")
    o = SIMCLR
    assert (cfg["train"]["epochs"], cfg["train"]["batch_size"]) == (o["epochs"], o["batch"])
    assert (cfg["method"]["temperature"], cfg["method"]["sum_directions"]) == (o["t"], True)
    assert (cfg["optim"]["name"], cfg["optim"]["eta"], cfg["optim"]["momentum"]) == ("lars", o["eta"], o["momentum"])
    assert (cfg["optim"]["warmup_epochs"], cfg["optim"]["weight_decay"]) == (o["warmup"], o["wd"])
    assert scaled_lr(cfg["optim"]["base_lr"], cfg["train"]["batch_size"]) == pytest.approx(o["lr"] * o["batch"] / 256)
    aug = cfg["augment"]  # data_util.py: crop 0.08-1, colour s = 1 (0.8s, 0.8s, 0.8s, 0.2s) p 0.8, grey 0.2, blur
    assert (aug["scale"], aug["jitter"], aug["p_jitter"], aug["p_gray"]) == (
        [0.08, 1.0],
        [0.8, 0.8, 0.8, 0.2],
        0.8,
        0.2,
    )
    assert (aug["p_blur"], aug["blur_sigma"]) == (0.5, [0.1, 2.0])
    method = build_method(cfg)
    blocks = [m for m in method.online.backbone.modules() if m.__class__.__name__ == "Bottleneck"]
    assert len(blocks) == 16 and all(torch.count_nonzero(b.bn3.weight) == 0 for b in blocks)  # init_zero=True
    # model_util.py, projection_head (v1): linear_layer(2048, use_bias=False, use_bn=True) + ReLU, then
    # linear_layer(128, use_bias=False, use_bn=True) whose BN is batch_norm_relu(center=use_bias=False): gamma only
    layers = list(method.online.projector)
    assert [type(m) for m in layers] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, ScaleBatchNorm1d]
    assert [(m.in_features, m.out_features, m.bias) for m in (layers[0], layers[3])] == [
        (2048, 2048, None),
        (2048, o["out"], None),
    ]
    assert layers[1].bias is not None and layers[4].weight is not None and layers[4].bias is None
    opt = build_optimizer(method.online, cfg["optim"], 1.0)
    assert _lars_excludes_biases_and_norms(opt, o["wd"])  # get_optimizer: batch_normalization and bias excluded
    # the loss: the authors' loss_a + loss_b on the same projections, not half of it
    _tiny_online(method)
    images = _views()
    z1, z2 = method.online(images[0]), method.online(images[1])
    got = method.framework_loss(images)["loss"]
    # (the method takes its loss in float32, as under autocast)
    assert got.item() == pytest.approx(_simclr_official_loss(z1, z2, o["t"]).item(), rel=1e-6)


def test_the_output_bn_scales_and_does_not_shift():
    torch.manual_seed(0)
    bn = ScaleBatchNorm1d(5).double()
    assert [n for n, _ in bn.named_parameters()] == ["weight"]
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
    x = torch.randn(16, 5, dtype=torch.float64) * 3 + 1
    # tf batch_normalization(center=False, scale=True) in training: gamma * (x - mean) / sqrt(var + eps)
    direct = bn.weight * (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + bn.eps)
    assert torch.allclose(bn(x), direct, rtol=1e-12, atol=1e-12)
    bn.reset_parameters()
    assert torch.equal(bn.weight, torch.ones(5, dtype=torch.float64))


# HobbitLong/SupContrast, the README's CIFAR command: main_supcon.py --batch_size 1024 --learning_rate 0.5 --temp 0.1
# --cosine; defaults --epochs 1000 --weight_decay 1e-4 --momentum 0.9 --lr_decay_rate 0.1, --model resnet50,
# warm-up 10 epochs when batch_size > 256; SupConLoss(base_temperature=0.07); head 'mlp' 2048 -> 2048 -> 128
SUPCON = {"lr": 0.5, "batch": 1024, "t": 0.1, "base_t": 0.07, "epochs": 1000, "wd": 1e-4, "momentum": 0.9}
SUPCON.update(warmup=10, eta_min=0.5 * 0.1**3)


def _supcon_official_loss(f1: torch.Tensor, f2: torch.Tensor, labels: torch.Tensor, t: float, base_t: float):
    # losses.py, SupConLoss.forward with contrast_mode 'all', written out: features normalised by the model
    features = torch.stack([F.normalize(f1, dim=1), F.normalize(f2, dim=1)], 1)  # [bsz, n_views, dim]
    bsz, views = features.shape[:2]
    mask = (labels.view(-1, 1) == labels.view(1, -1)).to(features.dtype)
    contrast = torch.cat(torch.unbind(features, dim=1), dim=0)
    logits = contrast @ contrast.t() / t
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    mask = mask.repeat(views, views)
    logits_mask = 1 - torch.eye(bsz * views, dtype=features.dtype)
    mask = mask * logits_mask
    exp_logits = torch.exp(logits) * logits_mask
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
    mean_log_prob_pos = (mask * log_prob).sum(1) / mask.sum(1)
    return (-(t / base_t) * mean_log_prob_pos).view(views, bsz).mean()


def test_the_supcon_recipe_is_the_authors_cifar_command():
    cfg = _recipe("supcon", data="cifar10")
    o = SUPCON
    assert (cfg["train"]["epochs"], cfg["train"]["batch_size"]) == (o["epochs"], o["batch"])
    assert (cfg["method"]["temperature"], cfg["method"]["base_temperature"]) == (o["t"], o["base_t"])
    # the README's lr is absolute at its batch; ours scales with the batch and gives the same at 1024
    assert scaled_lr(cfg["optim"]["base_lr"], o["batch"]) == pytest.approx(o["lr"])
    assert cfg["optim"]["min_lr"] == pytest.approx(o["eta_min"]) and cfg["optim"]["warmup_epochs"] == o["warmup"]
    aug = cfg["augment"]  # set_loader: RandomResizedCrop(scale=(0.2, 1.)), flip, jitter p 0.8, grey 0.2, no blur
    assert (aug["scale"], aug["jitter"], aug["p_jitter"], aug["p_gray"], aug["p_blur"]) == (
        [0.2, 1.0],
        [0.4, 0.4, 0.4, 0.1],
        0.8,
        0.2,
        0.0,
    )
    assert (cfg["model"]["backbone"], cfg["model"]["width"], cfg["model"]["cifar_stem"]) == ("resnet50", 64, True)
    method = build_method(cfg)
    linears = [m for m in method.online.projector.modules() if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [(2048, 2048), (2048, 128)]
    opt = build_optimizer(method.online, cfg["optim"], o["lr"])
    assert opt.defaults["momentum"] == o["momentum"] and _every_parameter_decays_at(opt, o["wd"])
    # the loss: the authors' -(τ/base_τ)·mean_log_prob_pos, mean over the 2B anchors
    _tiny_online(method)
    images, labels = _views(), torch.tensor([0, 1, 0, 2, 1, 0, 3, 2])
    z1, z2 = method.online(images[0]), method.online(images[1])
    got = method.framework_loss(images, [{"label": labels}, {"label": labels}])["loss"]
    want = _supcon_official_loss(z1, z2, labels, o["t"], o["base_t"])
    assert got.item() == pytest.approx(want.item(), rel=1e-6)  # float32, as the method takes its loss


# facebookresearch/moco main_moco.py defaults: --lr 0.03 --schedule 120 160 --momentum 0.9 --wd 1e-4 --epochs 200
# -b 256 --moco-dim 128 --moco-k 65536 --moco-m 0.999 --moco-t 0.07; augmentation without --aug-plus:
# RandomResizedCrop(224, scale=(0.2, 1.)), RandomGrayscale(p=0.2), ColorJitter(0.4, 0.4, 0.4, 0.4), flip
MOCO_V1 = {"lr": 0.03, "schedule": [120, 160], "wd": 1e-4, "epochs": 200, "batch": 256, "dim": 128, "k": 65536}
MOCO_V1.update(m=0.999, t=0.07)


def _official_step_lr(epoch: int, lr: float, schedule: list[int]) -> float:
    # adjust_learning_rate without --cos: for milestone in args.schedule: lr *= 0.1 if epoch >= milestone else 1.
    for milestone in schedule:
        lr *= 0.1 if epoch >= milestone else 1.0
    return lr


def test_the_mocov1_recipe_is_main_moco_defaults():
    cfg = _recipe("mocov1")
    o = MOCO_V1
    assert (cfg["train"]["epochs"], cfg["train"]["batch_size"]) == (o["epochs"], o["batch"])
    m = cfg["method"]
    assert (m["queue_size"], m["momentum"], m["temperature"], m["symmetric"]) == (o["k"], o["m"], o["t"], False)
    aug = cfg["augment"]
    assert (aug["scale"], aug["jitter"], aug["p_jitter"], aug["p_gray"], aug["p_blur"]) == (
        [0.2, 1.0],
        [0.4, 0.4, 0.4, 0.4],
        1.0,
        0.2,
        0.0,
    )
    assert aug["gray_first"] is True
    method = build_method(cfg)
    linears = [m for m in method.online.projector.modules() if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features, lin.bias is not None) for lin in linears] == [(2048, o["dim"], True)]
    lr = scaled_lr(cfg["optim"]["base_lr"], cfg["train"]["batch_size"])
    opt = build_optimizer(method.online, cfg["optim"], lr)
    assert opt.defaults["momentum"] == 0.9 and _every_parameter_decays_at(opt, o["wd"])
    steps_per_epoch = 5
    total = steps_per_epoch * o["epochs"]
    for epoch in (0, 119, 120, 159, 160, 199):
        for step in (epoch * steps_per_epoch, epoch * steps_per_epoch + steps_per_epoch - 1):
            got = schedule_step(opt, cfg["optim"], step, total, 0, lr, steps_per_epoch)
            assert got == pytest.approx(_official_step_lr(epoch, o["lr"], o["schedule"]), rel=1e-12), (epoch, step)
            assert all(g["lr"] == got for g in opt.param_groups)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        schedule_step(opt, cfg["optim"], 0, total, 0, lr)
    # `+optim.milestones=[...]` on the command line alone (no lr_decay key): the schema's default 0.1, its one place
    bare = {k: v for k, v in cfg["optim"].items() if k != "lr_decay"} | {"milestones": o["schedule"]}
    assert schedule_step(opt, bare, 125 * steps_per_epoch, total, 0, lr, steps_per_epoch) == pytest.approx(
        _official_step_lr(125, o["lr"], o["schedule"]), rel=1e-12
    )


def test_grey_first_views_are_main_mocos_grayscale_then_jitter():
    """The official order (RandomGrayscale, then ColorJitter in torchvision's random order) written out with
    torchvision's functional ops, against our executor's order (jitter, then grey) on the parameters drawn with
    gray_first. Pixels stay inside [0, 1] here, where the two orders are equal."""
    spec = ViewSpec(jitter=(0.4, 0.4, 0.4, 0.4), p_jitter=1.0, jitter_order="random", p_gray=0.5, gray_first=True)
    n = 64
    p = sample_view_params([(16, 16)] * n, spec, np.random.default_rng(0))
    plain = sample_view_params(
        [(16, 16)] * n, ViewSpec(**{**spec.__dict__, "gray_first": False}), np.random.default_rng(0)
    )
    grey = p["gray"] > 0
    assert 10 < grey.sum() < n - 10
    # the law: the same draws, with saturation and hue switched off on the grey views only
    assert np.array_equal(p["saturation"], np.where(grey, 1.0, plain["saturation"]).astype(np.float32))
    assert np.array_equal(p["hue"], np.where(grey, 0.0, plain["hue"]).astype(np.float32))
    assert all(np.array_equal(p[k], plain[k]) for k in ("brightness", "contrast", "gray", "jitter_order", "crop"))
    g = torch.Generator().manual_seed(0)
    x = 0.3 + 0.25 * torch.rand(n, 3, 8, 8, generator=g, dtype=torch.float64)  # brightness ≤ 1.4 keeps < 1
    ours = colour_distort(x, {k: torch.as_tensor(v) for k, v in p.items()})
    jitter_then_grey = colour_distort(x, {k: torch.as_tensor(v) for k, v in plain.items()})
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    worst_plain = 0.0
    for i in np.flatnonzero(grey):
        y = TF.rgb_to_grayscale(x[i], num_output_channels=3)
        for k in p["jitter_order"][i]:
            f = float(plain[("brightness", "contrast", "saturation", "hue")[k]][i])  # what torchvision drew
            y = ops[k](y, f)
        # torchvision's own saturation moves a grey image by ~1e-5 (its rounding); the hue our order rotates
        # before greying changes luma by up to ~0.1
        assert torch.allclose(ours[i], y, atol=1e-4), i
        worst_plain = max(worst_plain, float((jitter_then_grey[i] - y).abs().max()))
    assert worst_plain > 1e-2  # without gray_first the grey views differ: the test can tell the orders apart
