"""What the reproductions run and what they compare against: each suite's runs (label, overrides) at CPU scale, and
the papers' numbers (probe, invariance, downstream, each sweep's optimum) printed beside ours."""

from __future__ import annotations

from typing import Any

# the paper's numbers (docs/methods/invclr.md §5 (Tables 8, 9)): Spirograph, ResNet-18, 100k images, 50 epochs
PAPER_INVCLR = {
    "no regularization": {
        "conditional_variance": 0.789,
        "alpha_mse": 0.0751,
        "mse_m": 0.0006773,
        "mse_b": 0.011248,
        "mse_sigma": 0.0000914,
        "mse_f_r": 0.0000232,
    },
    "gradient regularization": {
        "conditional_variance": 0.0016,
        "alpha_mse": 0.0808,
        "mse_m": 0.0005073,
        "mse_b": 0.0073607,
        "mse_sigma": 0.0000527,
        "mse_f_r": 0.0000028,
    },
}
TARGETS = ("m", "b", "sigma", "f_r")

# DINO at CPU scale: 2 local crops instead of 6 and 1024 prototypes instead of 65536 (a ViT-tiny step with 6 locals
# takes 3x as long here)
DINO_CPU = ["augment.views.1.count=2", "method.head.out_dim=1024"]
MOCOV2_PHOTOS = ["method=mocov2", "data=photos"]  # Photos picks the image recipe (augment=mocov2)
# MoCo v3 at CPU scale: MLP heads as wide as the ViT-tiny (192) instead of the recipe's 4096
MOCOV3_VIT = [
    "+experiment=mocov3_vit",
    "model.backbone=vit_tiny",
    "data=photos",
    "optim.warmup_epochs=2",
    "method.head.hidden_dim=null",
    "model.num_heads=null",  # ViT-tiny's own 3 heads (the recipe's 12 are ViT-S's)
]
# a ResNet-50 recipe at CPU scale: the default quarter-width ResNet-18 with the CIFAR stem (MoCo v3's heads as wide
# as it)
RESNET_CPU = ["model.backbone=resnet18", "model.width=16", "model.cifar_stem=true"]
SUITES = {
    "invclr": [
        ("SimCLR", ["method=simclr"]),
        ("SimCLR + InvCLR", ["+experiment=invclr_spirograph"]),
        ("SimCLR + InvCLR, λ=0.001", ["+experiment=invclr_spirograph", "plugin.invclr.lam=0.001"]),
    ],
    # the image-recipe seeds on Photos (Spirograph's colour and scale targets hide their direction), one
    # MoCo v2 baseline shared by the three (the same config: one run)
    "co2": [("MoCo v2", MOCOV2_PHOTOS), ("MoCo v2 + CO2", [*MOCOV2_PHOTOS, "plugin=[co2]"])],
    # CLSA (one strong view, 96 px) and CLSA* (five strong views, 224..96 px, scaled to the data's 32 px)
    "clsa": [
        ("MoCo v2", MOCOV2_PHOTOS),
        ("MoCo v2 + CLSA", ["+experiment=clsa_mocov2", "data=photos"]),
        ("MoCo v2 + CLSA* (multi-crop)", ["+experiment=clsa_mocov2", "data=photos", "augment=clsa_multi"]),
    ],
    "cocor": [
        ("MoCo v2", MOCOV2_PHOTOS),
        ("MoCo v2 + CoCor, learned targets (1 % labels)", ["+experiment=cocor_mocov2", "data=photos"]),
        (
            "MoCo v2 + CoCor, fixed targets (Table 9)",
            ["+experiment=cocor_mocov2", "data=photos", "plugin.cocor.target=fixed"],
        ),
    ],
    # CO2 on SimCLR with a ResNet-18 (its Table 4, ImageNet-100): the seed's claim nearest this scale, on Photos
    "co2_simclr": [
        ("SimCLR", ["method=simclr", "data=photos"]),
        ("SimCLR + CO2", ["method=simclr", "data=photos", "plugin=[co2]"]),
    ],
    # CoCor's largest gain, on SimSiam (its Tables 1, 3 and 7): learned targets, the method as proposed
    "cocor_simsiam": [
        ("SimSiam", ["method=simsiam", "data=photos"]),
        ("SimSiam + CoCor, learned targets (1 % labels)", ["+experiment=cocor_simsiam", "data=photos"]),
    ],
    # MoCo v3 and DINO on Photos (their image recipes), ViT and ResNet, each against its random-init twin; the
    # paper recipes' warm-up (40 and 10 epochs) shortened to the runs' length
    "vit": [
        ("MoCo v3, ViT-tiny", [*MOCOV3_VIT]),
        (
            "DINO, ViT-tiny",
            ["+experiment=dino_vit", "model.backbone=vit_tiny", "data=photos", "optim.warmup_epochs=2", *DINO_CPU],
        ),
        (
            "MoCo v3, ResNet-18",
            [
                "+experiment=mocov3_resnet",
                "data=photos",
                "optim.warmup_epochs=2",
                *RESNET_CPU,
                "method.head.hidden_dim=null",
            ],
        ),
        (
            "DINO, ResNet-18",
            ["+experiment=dino_resnet", "data=photos", "optim.warmup_epochs=2", *DINO_CPU, *RESNET_CPU],
        ),
    ],
    # CLSA's Table 5: DDM against the strong views' plain contrastive loss (the same views; DDM's runs are clsa's)
    "clsa_ddm": [
        ("MoCo v2 + CLSA, contrastive loss", ["+experiment=clsa_mocov2", "data=photos", "+plugin.clsa.loss=infonce"]),
        ("MoCo v2 + CLSA", ["+experiment=clsa_mocov2", "data=photos"]),
    ],
    # the machinery's smoke test (tests/jobs/test_reproductions.py: seeds=2, concurrent=2, a tiny scale): one
    # change of SimCLR's temperature on Spirograph
    "smoke": [("SimCLR", ["method=simclr"]), ("SimCLR, τ=0.2", ["method=simclr", "method.temperature=0.2"])],
    # JointCrop's main table (MoCo v3): independent crops vs the joint sampler at beta = 0
    "jointcrop": [
        ("MoCo v3, ViT-tiny", [*MOCOV3_VIT]),
        ("MoCo v3 + JointCrop β=0", [*MOCOV3_VIT, "augment.joint.crop.beta=0"]),
    ],
    # JointCrop's β ablation (Table 5's MoCo v2 column) as seeded arms: every β against independent crops, the
    # paper's optimum against the other end of the range; the MoCo v2 baseline is CO2's and CLSA's (one run)
    "jointcrop_table5": [
        ("MoCo v2", MOCOV2_PHOTOS),
        *((f"MoCo v2 + JointCrop β={b}", [*MOCOV2_PHOTOS, f"augment.joint.crop.beta={b}"]) for b in (2, 1, 0, -1, -2)),
    ],
}
# JointCrop Table 5, MoCo v2 on Tiny-ImageNet (ResNet-18, linear top-1): independent crops, then each β
PAPER_TABLE5 = {None: 46.07, 2: 46.65, 1: 47.81, 0: 48.45, -1: 48.66, -2: 48.78}
# each suite's paper numbers in the papers' own setting, printed under the suite's table (docs/methods/)
PAPER_LINES = {
    "jointcrop": "The paper (JointCrop Table 1, ImageNet linear top-1, ResNet-50, MoCo v3 at batch 4096): "
    "68.9 → 69.47 at 100 epochs, 72.8 → 73.23 at 300 epochs with JointCrop at β = 0.",
    "jointcrop_table5": "The paper (JointCrop Table 5, Tiny-ImageNet linear top-1, ResNet-18, MoCo v2): 46.07 with "
    "independent crops; β = 2, 1, 0, −1, −2: 46.65, 47.81, 48.45, 48.66, 48.78 (every β better, −2 best). "
    "`python jobs/tune.py +sweep=jointcrop_beta` sweeps the same β as one unseeded Tune sweep (on Spirograph).",
    "vit": "The MoCo v3 and DINO papers train ViT-S/16 and ResNet-50 on ImageNet for hundreds of epochs; what a CPU "
    "run can check is the direction: each run against its own random-init twin under the same probe.",
}
NO_BASELINE = {"vit"}  # suites of frameworks side by side, each against its own random init


# each sweep's optimum in its paper: (values, where the paper says so); docs/methods/ has the derivations
PAPER_SWEEPS: dict[str, tuple[dict[str, Any], str]] = {
    "invclr_lambda": ({"plugin.invclr.lam": 1e-3}, "InvCLR Fig. 6: total downstream MSE lowest near λ = 1e-3"),
    "co2_alpha_tau": (
        {"plugin.co2.alpha": 10, "plugin.co2.temperature": 0.04},
        "CO2 Fig. 2 (ResNet-18): α = 10, τ_con = 0.04; α ≥ 20 worse",
    ),
    "jointcrop_beta": (
        {"augment.joint.crop.beta": -2},
        "JointCrop Table 5 (MoCo v2, Tiny-ImageNet): β = −2 best; every β beats independent crops",
    ),
    "clsa_beta": ({"plugin.clsa.beta": 1}, "CLSA: β = 1 throughout (no sweep reported)"),
    "cocor_constants": (
        {"plugin.cocor.fixed_targets": [0.8, 0.75, 0.65]},
        "CoCor Table 9 / Fig. 7 (MoCo): targets 0.80 / 0.75 / 0.65",
    ),
    "temperature": ({"method.temperature": 0.2}, "MoCo v2: τ = 0.2"),
}
