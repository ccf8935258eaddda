"""ViT backbones, MoCo v3 and DINO: their losses against direct float64 computations of the papers' equations, the
schedules, the methods' structure and gradient hooks, and the plug-in contract that decides what composes."""

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer

from helpers import assert_close_at_scale, loss_and_grads, optim
from pipeline.build import build_method, check_plugins, plugin_notes
from pipeline.config import CONF_DIR, compose_config
from pipeline.fields import Checked
from pipeline.losses.co2 import co2_consistency_bank
from pipeline.losses.contrastive import mocov3_loss
from pipeline.losses.dino import dino_loss
from pipeline.methods import METHODS
from pipeline.methods.context import FIELDS, StepContext, check_contract, visible
from pipeline.models.backbones import build_backbone
from pipeline.models.heads import DINOHead
from pipeline.plugins import PLUGINS
from pipeline.schedules import Momentum, cosine, warmup_cosine
from pipeline.sections import Config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = {"backbone": "vit_tiny", "image_size": 16, "patch_size": 4}


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _unit(*shape, seed):
    return F.normalize(_randn(*shape, seed=seed), dim=1)


# ---------------------------------------------------------------------------------------------------------- ViT


def test_vit_features_are_torchvisions_class_token_at_the_native_size():
    torch.manual_seed(0)
    net = build_backbone(TINY).eval()
    x = torch.randn(3, 3, 16, 16)
    assert net.feat_dim == 192
    # torchvision's own forward on the same module: heads is Identity, so it returns the class token too
    torch.testing.assert_close(net(x), VisionTransformer.forward(net, x))


def test_vit_takes_other_crop_sizes_through_a_resized_position_embedding():
    torch.manual_seed(0)
    net = build_backbone(TINY).eval()
    pos = net.encoder.pos_embedding
    assert net.position_embedding(4, 4) is pos  # the native 4x4 grid: the embedding as trained
    small = net.position_embedding(2, 2)
    assert small.shape == (1, 1 + 4, 192) and torch.equal(small[:, 0], pos[:, 0])  # the class token's is kept
    # a constant embedding stays constant when resized
    with torch.no_grad():
        pos[:, 1:] = 0.5
    assert torch.allclose(net.position_embedding(3, 3)[:, 1:], torch.full((1, 9, 192), 0.5), atol=1e-6)
    assert net(torch.randn(2, 3, 8, 8)).shape == (2, 192)  # DINO's local crops


def test_the_frozen_patch_projection_is_random_uniform_and_never_trained():
    net = build_backbone(TINY)
    net.freeze_patch_projection()
    w = net.conv_proj.weight
    bound = math.sqrt(6 / (3 * 4 * 4 + 192))
    assert not w.requires_grad and not net.conv_proj.bias.requires_grad and float(w.abs().max()) <= bound
    assert float(w.abs().max()) > 0.9 * bound and torch.equal(net.conv_proj.bias, torch.zeros(192))


def test_the_sincos_position_embedding_matches_its_formula_and_is_never_trained():
    from pipeline.models.backbones import sincos_position_embedding

    g, d = 3, 8
    emb = sincos_position_embedding(g, d)
    q = d // 4
    for p in range(g * g):
        r, c = divmod(p, g)  # conv_proj's patches, row by row
        for k in range(q):
            w = 10000.0 ** (-k / q)
            want = [math.sin(r * w), math.cos(r * w), math.sin(c * w), math.cos(c * w)]
            got = [float(emb[1 + p, j * q + k]) for j in range(4)]
            assert got == pytest.approx(want, abs=1e-6)
    assert torch.equal(emb[0], torch.zeros(d))  # the class token's
    net = build_backbone({**TINY, "pos_embedding": "sincos"})
    pos = net.encoder.pos_embedding
    assert not pos.requires_grad and torch.equal(pos[0], sincos_position_embedding(4, 192))
    assert build_backbone(TINY).encoder.pos_embedding.requires_grad  # DINO's: learned


# ---------------------------------------------------------------------------------------------------------- losses


@pytest.mark.parametrize("t", [0.2, 1.0])
def test_mocov3_loss_matches_its_equation(t):
    q, k = _unit(6, 5, seed=0), _unit(6, 5, seed=1)
    direct = 0.0
    for i in range(6):
        logits = [float(q[i] @ k[j]) / t for j in range(6)]
        direct += -(logits[i] - math.log(sum(math.exp(v) for v in logits)))
    assert mocov3_loss(q, k, 0, t).item() == pytest.approx(2 * t * direct / 6, rel=1e-12)


def test_mocov3_loss_on_rank_slices_averages_to_the_global_loss():
    q, k = _unit(8, 5, seed=2), _unit(8, 5, seed=3)
    full = mocov3_loss(q, k, 0, 0.2)
    parts = [mocov3_loss(q[r * 4 : (r + 1) * 4], k, r * 4, 0.2) for r in range(2)]
    assert (sum(parts) / 2).item() == pytest.approx(full.item(), rel=1e-12)


def test_mocov3_keys_carry_no_gradient():
    q, k = _unit(4, 3, seed=4).requires_grad_(), _unit(4, 3, seed=5).requires_grad_()
    mocov3_loss(q, k, 0, 0.2).backward()
    assert q.grad.abs().sum() > 0 and k.grad is None


@pytest.mark.parametrize("tt", [0.04, 0.07])
def test_dino_loss_matches_its_equation(tt):
    student = [_randn(3, 7, seed=i) for i in range(4)]  # 2 global + 2 local crops
    teacher = [_randn(3, 7, seed=10 + i) for i in range(2)]
    center = _randn(7, seed=20)
    direct, pairs = 0.0, 0
    for i, t in enumerate(teacher):
        for j, s in enumerate(student):
            if i == j:
                continue
            for b in range(3):
                pt = [math.exp(float(t[b, c] - center[c]) / tt) for c in range(7)]
                ps = [math.exp(float(s[b, c]) / 0.1) for c in range(7)]
                direct += -sum(pt[c] / sum(pt) * math.log(ps[c] / sum(ps)) for c in range(7)) / 3
            pairs += 1
    assert pairs == 6
    assert dino_loss(student, teacher, center, 0.1, tt).item() == pytest.approx(direct / pairs, rel=1e-10)


def test_dino_teacher_side_is_a_constant():
    s = [_randn(2, 5, seed=i).requires_grad_() for i in range(2)]
    t = [_randn(2, 5, seed=5 + i).requires_grad_() for i in range(2)]
    dino_loss(s, t, torch.zeros(5, dtype=torch.float64), 0.1, 0.04).backward()
    assert all(x.grad.abs().sum() > 0 for x in s) and all(x.grad is None for x in t)


def test_co2_on_a_key_bank_matches_its_equation():
    q, k, bank = _unit(3, 4, seed=0), _unit(3, 4, seed=1), _unit(6, 4, seed=2)
    offset, t = 3, 0.3  # this rank's rows are 3..5 of the bank
    total = 0.0
    for i in range(3):
        negs = [j for j in range(6) if j != offset + i]
        lq = torch.log_softmax(torch.stack([q[i] @ bank[j] for j in negs]) / t, 0)
        lp = torch.log_softmax(torch.stack([k[i] @ bank[j] for j in negs]) / t, 0)
        total += float(0.5 * (lp.exp() * (lp - lq)).sum() + 0.5 * (lq.exp() * (lq - lp)).sum())
    assert co2_consistency_bank(q, k, bank, offset, t).item() == pytest.approx(total / 3, rel=1e-10)


# ---------------------------------------------------------------------------------------------------------- schedules


def test_schedules_follow_their_formulas():
    assert cosine(0.0, 0.04, 0.4) == pytest.approx(0.04) and cosine(1.0, 0.04, 0.4) == pytest.approx(0.4)
    assert cosine(0.5, 0.04, 0.4) == pytest.approx(0.22)
    assert warmup_cosine(0, 100, 10, 1.0) == pytest.approx(0.1)
    assert warmup_cosine(55, 100, 10, 1.0) == pytest.approx(0.5)
    m = Momentum(0.996, to_one=True)  # BYOL / DINO: tau = 1 - (1 - base)(cos(pi p) + 1) / 2
    assert m.at(0.25) == pytest.approx(1 - 0.004 * (math.cos(math.pi / 4) + 1) / 2)
    assert m.update(1.0) == pytest.approx(1.0) and m.value == pytest.approx(1.0)
    assert Momentum(0.99, to_one=False).at(0.7) == 0.99


# ---------------------------------------------------------------------------------------------------------- methods


def _cfg(*over):
    return compose_config(["data=cifar10", "train.batch_size=8", "model.width=4", *over])


def _views(n=2, size=16, local=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 3, size, size, generator=g) for _ in range(n)] + [
        torch.randn(8, 3, size // 2, size // 2, generator=g) for _ in range(local)
    ]


@pytest.mark.parametrize("backbone, tau, layers", [("vit_tiny", 0.2, 3), ("resnet18", 1.0, 2)])
def test_mocov3_follows_the_paper_by_backbone(backbone, tau, layers):
    """The heads as the authors' moco/builder.py builds them (_build_mlp): every Linear bias-free, BN after each
    hidden Linear, an affine-free BN after the projector's output; after the predictor's on MoCo_ViT, not on
    MoCo_ResNet. Written out layer by layer: (kind, has bias or affine)."""
    m = build_method(_cfg("method=mocov3", f"model.backbone={backbone}"))
    proj, pred = m.online.projector, m.online.predictor

    def layout(seq):
        return [
            ("Linear", x.bias is not None)
            if isinstance(x, nn.Linear)
            else ("BN", x.affine)
            if isinstance(x, nn.BatchNorm1d)
            else (type(x).__name__, None)
            for x in seq
        ]

    hidden = [("Linear", False), ("BN", True), ("ReLU", None)]
    assert layout(proj) == hidden * (layers - 1) + [("Linear", False), ("BN", False)]
    vit = backbone.startswith("vit")
    assert layout(pred) == hidden + [("Linear", False)] + ([("BN", False)] if vit else [])
    assert m.temperature == tau
    if backbone.startswith("vit"):  # the random patch projection, the fixed position embedding
        assert not m.online.backbone.conv_proj.weight.requires_grad


def test_the_mocov3_vit_recipe_fixes_the_position_embedding():
    from pipeline.models.backbones import sincos_position_embedding

    m = build_method(_cfg("+experiment=mocov3_vit", "model.backbone=vit_tiny"))
    pos = m.online.backbone.encoder.pos_embedding
    assert not pos.requires_grad and torch.equal(pos[0], sincos_position_embedding(8, 192))  # 32 px, 4-px patches


def test_mocov3_step_is_the_symmetrised_loss_and_trains_the_online_network_only():
    torch.manual_seed(0)
    m = build_method(_cfg("method=mocov3", "model.backbone=vit_tiny", "model.image_size=16"))
    x1, x2 = _views()
    out = m.framework_loss([x1, x2])
    ctx = out["ctx"]
    with torch.no_grad():  # recompute from the same networks (no BN running-stat effect on train-mode outputs)
        q1, q2 = m.query(x1), m.query(x2)
        k1, k2 = [F.normalize(m.key_encoder(x), dim=1) for x in (x1, x2)]
    expected = mocov3_loss(q1, k2, 0, 0.2) + mocov3_loss(q2, k1, 0, 0.2)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-4)
    assert len(ctx.pairs) == 2 and len(ctx.key_bank) == 2 and ctx.queue is None and ctx.offset == 0
    out["loss"].backward()
    trainable = [p for p in m.online.parameters() if p.requires_grad]
    assert all(p.grad is not None for p in trainable) and all(p.grad is None for p in m.key_encoder.parameters())
    before = [p.clone() for p in m.key_encoder.parameters()]
    m.update_momentum(0.0)
    assert m.momentum.value == pytest.approx(0.99)
    assert any(not torch.equal(a, b) for a, b in zip(before, m.key_encoder.parameters()))


def _dino(*over):
    return build_method(
        _cfg(
            "method=dino",
            "model.backbone=vit_tiny",
            "model.image_size=16",
            "method.head.out_dim=32",
            "method.head.hidden_dim=16",
            "method.head.bottleneck_dim=8",
            "train.epochs=10",
            "method.warmup_teacher_epochs=5",
            *over,
        )
    )


def test_dino_head_normalises_its_last_layer():
    head = DINOHead(12, 20, hidden_dim=16, bottleneck_dim=8)
    x = torch.randn(4, 12)
    z = F.normalize(head.mlp(x), dim=1)
    torch.testing.assert_close(head(x), z @ F.normalize(head.last_layer.weight, dim=1).t())
    assert sum(isinstance(m, nn.Linear) for m in head.mlp) == 3 and sum(isinstance(m, nn.GELU) for m in head.mlp) == 2


def test_dino_step_centres_warms_the_teacher_temperature_and_sees_every_crop():
    torch.manual_seed(0)
    m = _dino()
    images = _views(local=2)
    with torch.no_grad():
        teacher = m.teacher(torch.cat(images[:2])).float()
        student = [m.online(x).float() for x in images]
    out = m.framework_loss(images)
    expected = dino_loss(student, list(teacher.chunk(2)), torch.zeros(1, 32), 0.1, 0.04)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-4)
    torch.testing.assert_close(m.center, 0.1 * teacher.mean(0, keepdim=True))  # EMA 0.9 from a zero centre
    assert float(out["teacher_temperature"]) == pytest.approx(0.04) and len(out["ctx"].features) == 2
    m.update_momentum(0.25)  # half of the 5 warm-up epochs of 10
    assert m.teacher_temperature() == pytest.approx(0.055)
    m.update_momentum(0.6)
    assert m.teacher_temperature() == pytest.approx(0.07)


def test_dino_drops_the_last_layers_gradient_in_the_first_epoch_and_clips_each_tensor():
    torch.manual_seed(0)
    m = _dino("method.clip_grad=0.01")
    last = m.online.projector.last_layer.weight
    m.framework_loss(_views(local=1))["loss"].backward()
    m.before_optimizer_step(0.1)  # epoch 1 of 10
    assert last.grad is None
    grads = [p.grad for p in m.online.parameters() if p.grad is not None]
    assert grads and max(float(g.norm()) for g in grads) <= 0.01 * (1 + 1e-4)
    m.zero_grad()
    m.framework_loss(_views(local=1, seed=1))["loss"].backward()
    m.before_optimizer_step(0.2)  # epoch 2: the prototypes train
    assert last.grad is not None and float(last.grad.norm()) <= 0.01 * (1 + 1e-4)
    assert all(p.grad is None for p in m.teacher.parameters())


# ---------------------------------------------------------------------------------------------------------- contract


def test_every_method_provides_only_context_fields_and_every_plugin_needs_only_them():
    for kind, cls in METHODS.items():
        assert cls.provides <= FIELDS, kind
    for name, plugin in PLUGINS.items():
        assert all(need <= FIELDS for need in plugin.needs), name
        defined_on = yaml.safe_load((CONF_DIR / "plugin" / f"{name}.yaml").read_text())["defined_on"]
        for kind in defined_on:  # every framework a paper defines a plug-in on feeds it
            check_contract(kind, METHODS[kind].provides, name, plugin.needs)


def test_a_method_without_the_fields_a_plugin_reads_fails_in_one_line():
    with pytest.raises(
        ValueError,
        match=r"^plugin co2 needs pairs\+queue or key_bank\+pairs or gathered\+projections "
        r"from the method's step; method kind 'simsiam' provides embed, embed_target, features$",
    ):
        check_contract("simsiam", METHODS["simsiam"].provides, "co2", PLUGINS["co2"].needs)


def test_a_plugin_sees_only_the_fields_its_needs_name():
    """Method.total_loss hands each plug-in the step's context with every field its `needs` does not name left
    empty: a plug-in cannot come to depend on a field it did not declare."""
    t = torch.ones(2, 3)
    full = StepContext(
        features=[t],
        pairs=[(t, t)],
        queue=t,
        key_bank=[t],
        projections=(t, t),
        gathered=(t, t),
        offset=4,
        temperature=0.2,
        embed=torch.nn.functional.normalize,
        embed_target=torch.nn.functional.normalize,
    )
    clsa = visible(full, PLUGINS["clsa"].needs)  # pairs + embed, with a queue or a key bank and a temperature
    assert clsa.pairs and clsa.queue is t and clsa.key_bank and clsa.temperature == 0.2 and clsa.embed is not None
    assert clsa.features == [] and clsa.projections is None and clsa.gathered is None and clsa.embed_target is None
    invclr = visible(full, PLUGINS["invclr"].needs)
    assert invclr.features == [t] and invclr.pairs == [] and invclr.queue is None and invclr.embed is None
    assert invclr.offset == 4  # where this worker's rows are: always shown
    assert full.queue is t and full.projections is not None  # the method's own context is left as it was


@pytest.mark.parametrize(
    "plugin, recipe", [("co2", "mocov3"), ("clsa", "clsa"), ("cocor", "cocor"), ("invclr", "invclr")]
)
def test_mocov3_takes_every_plugin_whose_fields_it_provides_and_notes_those_its_papers_did_not_define(plugin, recipe):
    cfg = _cfg("method=mocov3", f"augment={recipe}", f"plugin=[{plugin}]")
    check_plugins(Checked.of(Config, cfg))
    notes = plugin_notes(cfg["method"]["kind"], cfg["plugin"])
    if plugin == "invclr":  # InvCLR's paper: MoCo and SimCLR; it reads the backbone's features, which MoCo v3 has
        assert notes == [
            "plugin invclr on method kind 'mocov3': its paper defines it on moco, simclr; "
            "here it works from what the method provides (features)"
        ]
    else:
        assert notes == []


@pytest.mark.parametrize("plugin, recipe", [("co2", "dino"), ("clsa", "clsa"), ("cocor", "cocor")])
def test_dino_refuses_the_plugins_whose_fields_it_does_not_provide_naming_both(plugin, recipe):
    with pytest.raises(ValueError, match=f"^plugin {plugin} needs .* method kind 'dino' provides features$"):
        check_plugins(Checked.of(Config, _cfg("method=dino", f"augment={recipe}", f"plugin=[{plugin}]")))


# ---------------------------------------------------------------------------------------------------------- 2 workers


def _two_worker_step(kind, images, distributed):
    """One step on BN-free networks (DINO: a tiny ViT; MoCo v3: linear layers in place of its BN heads), so one
    process and two see the same maths; returns the loss and the online gradients."""
    from pipeline.methods.base import Encoder
    from pipeline.methods.predictor import PredictorEncoder
    from pipeline.models.momentum import momentum_copy

    torch.manual_seed(0)
    if kind == "dino":
        m = _dino("model.image_size=8")
    else:
        m = build_method(_cfg("method=mocov3", "model.backbone=vit_tiny", "model.image_size=8"))
        torch.manual_seed(1)
        enc = Encoder(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 12)), nn.Linear(12, 6))
        m.online = PredictorEncoder(enc.backbone, enc.projector, nn.Linear(6, 6))
        m.key_encoder = momentum_copy(enc)
    return (*loss_and_grads(m, images, distributed=distributed), m)


def _views_for_workers():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(8, 3, 8, 8, generator=g) for _ in range(2)] + [torch.randn(8, 3, 4, 4, generator=g)]


def _worker(rank, world, port, q):
    import torch.distributed as tdist

    from helpers import init_gloo

    init_gloo(rank, world, port)
    images = [v.chunk(world)[rank] for v in _views_for_workers()]
    res = {}
    for kind in ("dino", "mocov3"):
        loss, grads, m = _two_worker_step(kind, images, True)
        res[kind] = (loss, [g.numpy() for g in grads], m.center.numpy() if kind == "dino" else None)
    q.put((rank, res))
    tdist.barrier()
    tdist.destroy_process_group()


def test_dino_and_mocov3_same_on_one_and_two_workers():
    from helpers import run_process_group

    results = [res for _, res in run_process_group(_worker, 2)]
    for kind in ("dino", "mocov3"):
        images = _views_for_workers() if kind == "dino" else _views_for_workers()[:2]
        loss1, grads1, m1 = _two_worker_step(kind, images, False)
        assert sum(r[kind][0] for r in results) / 2 == pytest.approx(loss1, rel=1e-5), kind
        for g1, g2 in zip(grads1, results[0][kind][1], strict=True):
            assert_close_at_scale(torch.from_numpy(g2), g1)
        if kind == "dino":  # the centre is the global batch mean on every worker
            for r in results:
                assert_close_at_scale(torch.from_numpy(r[kind][2]), m1.center, rel=1e-5)


# ----------------------------------------------------------------------------- against the authors' code
# Each test below computes the authors' formula directly (facebookresearch/dino main_dino.py and utils.py,
# facebookresearch/moco-v3 main_moco.py and moco/builder.py) and holds ours to it; docs/methods/frameworks.md
# lists every knob.
@pytest.mark.parametrize("epochs, per_epoch, warmup", [(10, 7, 3), (4, 5, 1), (6, 3, 0), (3, 4, 30)])
def test_dino_teacher_temperature_is_the_authors_per_epoch_schedule(epochs, per_epoch, warmup):
    """main_dino.py: teacher_temp_schedule = concat(linspace(warmup_temp, temp, W), ones(E - W) * temp), read at
    the epoch; a warm-up longer than the run is ours shortened to the run (the CPU runs)."""
    import numpy as np

    m = _dino(f"train.epochs={epochs}", f"method.warmup_teacher_epochs={warmup}")
    w = min(warmup, epochs)
    official = np.concatenate((np.linspace(0.04, 0.07, w), np.ones(epochs - w) * 0.07))
    total = epochs * per_epoch
    for it in range(total):
        assert m.teacher_temperature() == pytest.approx(official[it // per_epoch], abs=1e-12), it
        m.update_momentum((it + 1) / total)  # what the loop calls after each step


def test_dino_teacher_momentum_at_iteration_it_is_the_authors_schedule_at_it():
    """utils.cosine_scheduler(0.996, 1, E, ipe)[it] = 1 + 0.5 (0.996 - 1)(1 + cos(pi it / T)), used by the update
    that follows iteration it: 0.996 at the first, never exactly 1."""
    m = _dino()
    total = 23
    seen = []
    for it in range(total):
        m.update_momentum((it + 1) / total)
        seen.append(m.momentum.value)
    official = [1 + 0.5 * (0.996 - 1) * (1 + math.cos(math.pi * it / total)) for it in range(total)]
    assert seen == pytest.approx(official, abs=1e-15)


def test_a_resumed_dino_run_takes_the_temperature_where_it_stopped():
    m = _dino()  # 10 epochs, 5 of warm-up
    m.set_progress(0.6)  # _Trainer.restore: step / total_steps of the checkpoint
    assert m.teacher_temperature() == pytest.approx(0.07)


def test_the_lr_ends_at_min_lr_on_the_authors_cosine():
    """utils.cosine_scheduler(base, final, E, ipe, warmup_epochs): after the warm-up, final + 0.5 (base - final)
    (1 + cos(pi i / (T - W))) at step W + i. (The warm-up itself: the authors' starts at 0 and reaches base a step
    later than ours, which starts at base / W: at most base / W apart, for W steps.)"""
    from pipeline.train.step import schedule_step

    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(2))], lr=1.0)
    total, warm, peak, final = 50, 10, 2e-3, 1e-6
    for step in range(warm, total):
        lr = schedule_step(opt, optim(min_lr=final), step, total, warm, peak)
        i = step - warm
        assert lr == pytest.approx(final + 0.5 * (peak - final) * (1 + math.cos(math.pi * i / (total - warm))))
    assert schedule_step(opt, optim(min_lr=final), total, total, warm, peak) == pytest.approx(final)


def test_dino_prototypes_start_as_nn_linears_default():
    """The authors' last layer is weight_norm(nn.Linear(bottleneck, K, bias=False)): kaiming-uniform with a = sqrt 5,
    i.e. uniform in +-1/sqrt(in)."""
    torch.manual_seed(0)
    w = DINOHead(12, 4096, hidden_dim=16, bottleneck_dim=256).last_layer.weight
    bound = 1 / math.sqrt(256)
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.99 * bound
    assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.02)


def test_drop_path_drops_whole_residual_branches_per_sample_and_never_in_the_teacher():
    """timm's DropPath in DINO's ViT: per sample, a branch is zero or scaled by 1/(1 - p), p rising linearly
    over the blocks to drop_path_rate; the teacher is built without it."""
    m = _dino("model.drop_path=0.3")
    blocks = list(m.online.backbone.encoder.layers)
    assert [b.drop_prob for b in blocks] == pytest.approx([0.3 * i / (len(blocks) - 1) for i in range(len(blocks))])
    assert all(b.drop_prob == 0 for b in m.teacher.backbone.encoder.layers)
    block = blocks[-1]
    block.drop_prob = 0.5
    x = torch.randn(64, 5, 192)
    h = block.ln_1(x)
    attn = block.self_attention(h, h, h, need_weights=False)[0]
    torch.manual_seed(0)
    block.train()
    y = block(x)
    # each sample: attention branch kept (x + 2 attn) or dropped (x); then the MLP branch likewise
    kept_attn = [bool(torch.allclose(y[i] - x[i], 0 * x[i])) for i in range(64)]
    assert 10 < sum(not k for k in kept_attn) and sum(kept_attn) > 5  # both happen at p = 0.5
    block.eval()
    mid = x + attn
    torch.testing.assert_close(block(x), mid + block.mlp(block.ln_2(mid)))  # eval: torchvision's block exactly
    assert set(m.online.backbone.state_dict()) == set(VisionTransformer(16, 4, 4, 3, 192, 768).state_dict()) - {
        "heads.head.weight",
        "heads.head.bias",
    }


def test_the_mocov3_vit_recipe_is_the_authors():
    """main_moco.py's ViT recipe: 4096-wide heads (--mlp-dim), vits.vit_small's 12 heads, AdamW with torch's
    default betas and weight decay on every parameter (optimizer = AdamW(model.parameters(), lr, wd))."""
    cfg = _cfg("+experiment=mocov3_vit", "model.image_size=32")
    m = build_method(cfg)
    proj, pred = m.online.projector, m.online.predictor
    assert proj[0].out_features == 4096 and pred[0].out_features == 4096
    assert m.online.backbone.encoder.layers[0].self_attention.num_heads == 12
    from pipeline.train.optim import build_optimizer

    torch.manual_seed(0)
    x = torch.randn(4, 3, 32, 32)
    ours = build_optimizer(m.online, cfg["optim"], lr=1e-3)
    twin = build_method(cfg)
    twin.load_state_dict(m.state_dict())
    theirs = torch.optim.AdamW([p for p in twin.online.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.1)
    for net, opt in ((m.online, ours), (twin.online, theirs)):
        net.train()
        net(x).pow(2).sum().backward()
        opt.step()
    for a, b in zip(m.online.parameters(), twin.online.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


# ----------------------------------------------------------------------------- the authors' ViT initialisations


def _uniform_law(w: torch.Tensor, bound: float) -> None:
    """w looks drawn from U(-bound, bound): inside it, reaching near it, std bound/√3."""
    assert float(w.abs().max()) <= bound + 1e-7 and float(w.abs().max()) > 0.98 * bound
    assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.03)


def test_mocov3_vit_init_follows_the_authors_vits_py():
    """moco-v3 vits.py VisionTransformerMoCo.__init__: for a Linear named qkv, val = sqrt(6 / (shape[0] // 3 +
    shape[1])) (Q, K, V each Xavier over D x D); other Linears xavier_uniform; every bias 0; cls_token N(0, 1e-6);
    patch_embed.proj U(±sqrt(6 / (3·p·p + D))), bias 0."""
    torch.manual_seed(0)
    net = build_backbone({"backbone": "vit_s16", "image_size": 32, "vit_init": "mocov3", "pos_embedding": "sincos"})
    d = 384
    for block in net.encoder.layers:
        attn = block.self_attention
        shape = attn.in_proj_weight.shape  # the authors' qkv Linear: (3D, D)
        for w in attn.in_proj_weight.detach().chunk(3):
            _uniform_law(w, math.sqrt(6.0 / (shape[0] // 3 + shape[1])))
        linears = [attn.out_proj, *[m for m in block.mlp if isinstance(m, torch.nn.Linear)]]
        for lin in linears:
            _uniform_law(lin.weight.detach(), math.sqrt(6.0 / (lin.weight.shape[0] + lin.weight.shape[1])))
            assert not lin.bias.any()
        assert not attn.in_proj_bias.any()
    cls = net.class_token.detach()
    assert cls.any() and float(cls.std()) == pytest.approx(1e-6, rel=0.2)
    _uniform_law(net.conv_proj.weight.detach(), math.sqrt(6.0 / (3 * 16 * 16 + d)))
    assert not net.conv_proj.bias.any()


def test_dino_vit_init_follows_the_authors_init_weights():
    """dino vision_transformer.py VisionTransformer._init_weights: every Linear (qkv included) trunc_normal(std
    0.02), bias 0; LayerNorm weight 1, bias 0; pos_embed and cls_token trunc_normal(std 0.02); the patch Conv2d
    keeps PyTorch's default (U(±1/√fan_in) here: kaiming-uniform with a = √5)."""
    torch.manual_seed(0)
    net = build_backbone({"backbone": "vit_s16", "image_size": 64, "vit_init": "dino"})
    for block in net.encoder.layers:
        attn = block.self_attention
        weights = [attn.in_proj_weight, attn.out_proj.weight, *[m.weight for m in block.mlp if hasattr(m, "weight")]]
        for w in weights:
            assert float(w.std()) == pytest.approx(0.02, rel=0.03) and abs(float(w.mean())) < 1e-3
        biases = [attn.in_proj_bias, attn.out_proj.bias, *[m.bias for m in block.mlp if hasattr(m, "bias")]]
        assert not any(b.any() for b in biases)
        for ln in (block.ln_1, block.ln_2):
            assert bool((ln.weight == 1).all()) and not ln.bias.any()
    pos = net.encoder.pos_embedding.detach()  # 1 + 4·4 tokens x 384
    assert float(pos.std()) == pytest.approx(0.02, rel=0.08)
    assert float(net.class_token.std()) == pytest.approx(0.02, rel=0.15)
    _uniform_law(net.conv_proj.weight.detach(), 1.0 / math.sqrt(3 * 16 * 16))


def test_torchvision_vit_init_is_the_default_and_unchanged():
    torch.manual_seed(0)
    a = build_backbone({"backbone": "vit_tiny", "image_size": 32})
    torch.manual_seed(0)
    b = build_backbone({"backbone": "vit_tiny", "image_size": 32, "vit_init": "torchvision"})
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(ValueError, match="unknown ViT init 'timm'"):
        build_backbone({"backbone": "vit_tiny", "image_size": 32, "vit_init": "timm"})


def test_the_probe_rebuilds_a_runs_vit_from_its_config_and_checkpoint():
    """What the probe after DINO pretraining (and a probe by run id) loads: the online ViT, rebuilt from the run's
    model section alone, gives the trained network's features on a view of the probe's size."""
    from pipeline.eval.probe.compare import backbone_from

    cfg = compose_config(["+experiment=dino_vit", "model.backbone=vit_tiny", "method.head.out_dim=256"])
    torch.manual_seed(0)
    m = build_method(cfg)
    with torch.no_grad():  # away from any initialisation a fresh build could reproduce
        for p in m.online.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    state = {"cfg": cfg, "method": m.state_dict()}
    net = backbone_from(state)
    size = cfg["data"]["image_size"]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    m.eval(), net.eval()
    with torch.no_grad():
        torch.testing.assert_close(net(x), m.online.backbone(x))
        assert not torch.allclose(net(x), build_backbone(cfg["model"]).eval()(x))
