"""Reproductions at a scale that runs on this 2-core CPU; writes docs/reproductions.md.

Each suite pretrains a baseline and the seed method on the same data and budget (Spirograph for InvCLR, Photos for
the image-recipe seeds; the ResNet-18 layout with CIFAR stem at `model.width`, `data.generate.n_train` images,
`train.epochs` epochs), probes both with the linear probe (and, for InvCLR, feature averaging and the invariance
metrics), and tabulates the result next to the paper's, with the MLflow run ids.

  python jobs/reproductions.py                                   # every suite at the default scale
  python jobs/reproductions.py suites=[invclr] sweeps=[] 'scale=["train.epochs=2","model.width=8"]'   # a quick look
  python jobs/reproductions.py suites=[] sweeps=[invclr_lambda]                 # one sweep's section only

Suites: invclr (SimCLR vs SimCLR + gradient penalty: V, alpha regression against 0.0806, per-target MSE
with and without feature averaging; the paper's Tables 8 and 9), co2 (MoCo v2 vs MoCo v2 + CO2),
clsa (MoCo v2 vs MoCo v2 + CLSA: CLSA needs strong image views), cocor (MoCo v2 vs MoCo v2 + CoCor with fixed
and with learned targets; the learned targets per length over training go in as a PNG); co2, clsa and cocor on
Photos, where image recipes can learn; vit and jointcrop (MoCo v3, DINO) on Photos too.

Downstream (`downstream.finetune`, `downstream.detect`, each a list of the job's arguments; `downstream=null` for none):
each run's 10 % fine-tuning and shapes detection as child runs, random init beside the suite's first run, the
papers' semi-supervised and detection numbers beside ours (compared by direction).

Sweeps (`sweeps=[...]`, each `python jobs/tune.py +sweep=<name>` at its own CPU size, `sweep_args` added to each):
the paper's optimum beside ours, the sweep's table and plot, and whether the best trial beats a random-init
backbone under the same probe. A finished sweep is read back, not run again.

A run whose exact configuration already finished in the MLflow store (same run name: the config hash) is not
trained again: its logged probe results are read back, so an interrupted reproduction resumes where it stopped.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import ConfigError, cli, compose_config, fail  # noqa: E402

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
    # the image-recipe seeds on Photos (Spirograph's colour and scale targets hide their direction; #15), one
    # MoCo v2 baseline shared by the three (the same config: one run)
    "co2": [("MoCo v2", MOCOV2_PHOTOS), ("MoCo v2 + CO2", [*MOCOV2_PHOTOS, "plugin=[co2]"])],
    "clsa": [("MoCo v2", MOCOV2_PHOTOS), ("MoCo v2 + CLSA", ["+experiment=clsa_mocov2", "data=photos"])],
    "cocor": [
        ("MoCo v2", MOCOV2_PHOTOS),
        ("MoCo v2 + CoCor, learned targets (1 % labels)", ["+experiment=cocor_mocov2", "data=photos"]),
        (
            "MoCo v2 + CoCor, fixed targets (Table 9)",
            ["+experiment=cocor_mocov2", "data=photos", "plugin.cocor.target=fixed"],
        ),
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
    # JointCrop's main table (MoCo v3): independent crops vs the joint sampler at beta = 0
    "jointcrop": [
        ("MoCo v3, ViT-tiny", [*MOCOV3_VIT]),
        ("MoCo v3 + JointCrop β=0", [*MOCOV3_VIT, "augment.joint.crop.beta=0"]),
    ],
}
# each suite's paper numbers in the papers' own setting, printed under the suite's table (docs/methods/)
PAPER_LINES = {
    "jointcrop": "The paper (JointCrop Table 1, ImageNet linear top-1, ResNet-50, MoCo v3 at batch 4096): "
    "68.9 → 69.47 at 100 epochs, 72.8 → 73.23 at 300 epochs with JointCrop at β = 0.",
    "vit": "The MoCo v3 and DINO papers train ViT-S/16 and ResNet-50 on ImageNet for hundreds of epochs; what a CPU "
    "run can check is the direction: each run against its own random-init twin under the same probe.",
}
NO_BASELINE = {"vit"}  # suites of frameworks side by side, each against its own random init


# the papers' downstream numbers, baseline -> method (docs/methods/): ImageNet pretraining, ResNet-50; here the same
# direction is what can be compared (Spirograph's fine-tuning R² or Photos' top-1, the shapes set's AP)
PAPER_DOWNSTREAM = {
    "co2": {
        "semi-supervised 10 %": ("MoCo v2 85.1 → + CO2 85.4 top-5 (Table 2)", 85.1, 85.4),
        "semi-supervised 1 %": ("MoCo v2 69.5 → + CO2 70.6 top-5 (Table 2)", 69.5, 70.6),
        "detection": ("MoCo v2 82.4 → + CO2 82.7 VOC AP50 (Table 3)", 82.4, 82.7),
    },
    "clsa": {"detection": ("MoCo v2 82.5 → CLSA 83.2 VOC07+12 AP50 (Table 3)", 82.5, 83.2)},
    "cocor": {"detection": ("MoCo 76.52 → + CoCor 77.41 VOC AP50 (Table 3, R50-C4)", 76.52, 77.41)},
    "invclr": {},
}

# each sweep's optimum in its paper: (values, where the paper says so); docs/methods/ has the derivations
PAPER_SWEEPS = {
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


def same_value(ours, paper, continuous: bool) -> bool:
    """A grid point equals the paper's; a value drawn from a range counts as the same within a factor of 1.5."""
    if isinstance(paper, list):
        return (
            isinstance(ours, list)
            and len(ours) == len(paper)
            and all(same_value(a, b, continuous) for a, b in zip(ours, paper))
        )
    if ours is None or paper is None:
        return ours is paper
    if continuous and ours > 0 and paper > 0:
        return 1 / 1.5 <= ours / paper <= 1.5
    return abs(float(ours) - float(paper)) <= 1e-9 * max(1.0, abs(float(paper)))


def run_sweep_for_report(name: str, args: list[str]) -> dict:
    """Run (or read back) `python jobs/tune.py +sweep=<name> *args`: its results and how they compare to the paper."""
    from mlflow.tracking import MlflowClient

    from pipeline.train.run_lock import RunBusy
    from pipeline.tune.sweep import prepare, run_sweep

    argv = [f"+sweep={name}", *args]
    try:
        cfg, full, dims, plan = prepare(argv)
        print(f"[reproductions] sweep {name}: {cfg['run']['name']}", flush=True)
        out = run_sweep(cfg, full, dims, plan)
    except (ConfigError, RunBusy) as e:
        fail(f"sweep {name}: {e}")
    run = MlflowClient(cfg["tracking"]["uri"]).get_run(out["run_id"])
    if run.info.status != "FINISHED":
        fail(f"sweep {name} ended {run.info.status} (MLflow run {out['run_id']}); rerun to resume it")
    continuous = {d.key for d in dims if d.is_range}
    paper, where = PAPER_SWEEPS.get(name, ({}, "—"))
    best = out["best"] or {}
    agree = bool(best) and all(same_value(best["params"].get(k), v, k in continuous) for k, v in paper.items())
    return {
        **out,
        "name": name,
        "argv": argv,
        "metric": cfg["sweep"]["metric"],
        "mode": cfg["sweep"]["mode"],
        "minutes": run.data.metrics.get("sweep/minutes", float("nan")),
        "paper": paper,
        "where": where,
        "agree": agree,
    }


def sweep_section(r: dict, docs: Path) -> list[str]:
    """One sweep in the report: command, paper's optimum beside ours, the plot, the table."""
    import shutil

    from pipeline.tune.space import short

    best, base = r["best"], r["baseline"]
    better = (lambda a, b: a < b) if r["mode"] == "min" else (lambda a, b: a > b)
    lines = [
        f"### {r['name']}",
        "",
        f"`python jobs/tune.py {' '.join(r['argv'])}` — MLflow run `{r['run_id']}` (its trials are child runs), "
        f"{r['minutes']:.1f} min.",
        "",
        f"| | optimum | {r['metric']} |",
        "| --- | --- | --- |",
        f"| paper | {short(r['paper']) or '—'} | {r['where']} |",
        f"| here | {short(best['params']) if best else 'no trial finished'} | "
        f"{_fmt(best['metric']) if best else '—'} |",
    ]
    if base is not None:
        lines.append(f"| random-init backbone | — | {_fmt(base)} |")
    lines.append("")
    verdict = "the same optimum as the paper" if r["agree"] else "**a different optimum from the paper's**"
    if best and base is not None and not better(best["metric"], base):
        verdict += (
            "; **no trial beats a random-init backbone** under the same probe, so at this budget the sweep "
            "cannot speak for or against the paper"
        )
    lines += [f"Here: {verdict}.", ""]
    if r["plot"] and Path(r["plot"]).exists():
        img = docs / "img" / f"sweep-{r['name']}.png"
        img.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(r["plot"], img)
        lines += [f"![{r['name']}](img/{img.name})", ""]
    if r["text"]:
        lines += [r["text"].strip(), ""]
    return lines


def run_one(label: str, overrides: list[str], scale: list[str], extra: list[str]) -> dict:
    from pipeline.train.launch import pretrain
    from pipeline.train.prepare import resolve
    from pipeline.train.run_lock import RunBusy

    try:
        # plugin.<name>.* settings apply only to the runs that use that plug-in
        plugins = compose_config([*overrides, *scale]).get("plugin") or {}
        extra = [e for e in extra if not e.startswith("plugin.") or e.split(".")[1] in plugins]
        cfg = compose_config([*overrides, *scale, *extra])
        plan = resolve(cfg)
    except ConfigError as e:
        fail(f"{label}: {e}")
    t0 = time.monotonic()
    print(f"[reproductions] {label}: run {cfg['run']['name']}", flush=True)
    out = finished_run(cfg)
    if out is None:
        try:
            out = pretrain(cfg, plan)
        except (ConfigError, RunBusy) as e:  # the cluster cannot hold it, or the same run is going elsewhere
            fail(f"{label}: {e}")
        out["minutes"] = (time.monotonic() - t0) / 60
    else:
        print(
            f"[reproductions] {label}: finished before as MLflow run {out['run_id']}; reusing its results", flush=True
        )
    out["run_name"] = cfg["run"]["name"]
    out["curves"] = Path(cfg["paths"]["runs"]) / "curves" / f"{cfg['run']['name']}.png"
    out["label"], out["overrides"], out["extra"] = label, overrides, extra
    # the downstream jobs use the run's own store and folders
    out["store"] = [
        *(f"paths.{k}={v}" for k, v in cfg["paths"].items()),
        *(
            f"tracking.{k}={'null' if v is None else v}"
            for k, v in cfg["tracking"].items()
            if k in ("uri", "experiment")
        ),
    ]
    return out


def run_downstream(runs: list[dict], downstream: dict) -> None:
    """Each run's fine-tuning and detection (jobs/finetune.py, jobs/detect.py with `downstream`'s arguments), as child
    runs of it; the random-init baseline with the suite's first run only. Finished ones are read back."""
    from pipeline.eval.suite import SuiteError, run_step

    for i, r in enumerate(runs):
        r["downstream"] = {}
        for job, args in downstream.items():
            if job == "detect" and any("vit" in o for o in r["overrides"]):  # detection transfer takes ResNets
                print(
                    f"[reproductions] {r['label']}: no detection (the detectron2 export takes ResNet backbones)",
                    flush=True,
                )
                continue
            argv = [f"run={r['run_id']}", *r["store"], *args, f"baseline={str(i == 0).lower()}"]
            print(f"[reproductions] {r['label']}: python jobs/{job}.py {' '.join(argv)}", flush=True)
            try:
                r["downstream"][job] = run_step(job, argv)
            except SuiteError as e:
                fail(f"{r['label']}, {job}: {e}")


def downstream_table(suite: str, runs: list[dict], downstream: dict) -> list[str]:
    """Fine-tuning (mean R² over Spirograph's four factors, or top-1 on Photos) and detection AP per run, the paper's
    direction beside ours."""
    fraction = next(
        (a.split("=", 1)[1] for a in downstream.get("finetune", []) if a.startswith("label_fraction=")), "0.1"
    )
    semi = f"semi-supervised {float(fraction) * 100:g} %"
    if not downstream or not all("downstream" in r for r in runs):
        return []
    ft = runs[0]["downstream"].get("finetune", {}).get("pretrained", {})
    ft_key = "r2" if "r2" in ft else "top1"  # Spirograph's factors, or Photos' classes
    cols = [
        (job, key, name)
        for job, key, name in (("finetune", ft_key, semi), ("detect", "AP", "detection"))
        if job in downstream
    ]
    args = {job: " ".join(a) for job, a in downstream.items()}
    lines = [
        "Downstream, each a child run of its pretraining run: "
        + "; ".join(f"`python jobs/{job}.py run=<id> {args[job]}`" for job, _, _ in cols)
        + ".",
        "",
        "| run | "
        + " | ".join(f"{name} ({ {'r2': 'R² mean', 'top1': 'top-1'}.get(key, 'shapes AP') })" for _, key, name in cols)
        + " |",
        "|" + " --- |" * (len(cols) + 1),
    ]

    def cell(results: dict | None, which: str, key: str) -> str:  # "—" where a job did not run (ViT detection)
        if not results or which not in results:
            return "—"
        return f"{results[which][key]:.3f}" if key != "AP" else f"{results[which][key]:.1f}"

    for r in runs:
        lines.append(
            f"| {r['label']} | "
            + " | ".join(cell(r["downstream"].get(job), "pretrained", key) for job, key, _ in cols)
            + " |"
        )
    base = runs[0]["downstream"]
    lines.append("| random init | " + " | ".join(cell(base.get(job), "random", key) for job, key, _ in cols) + " |")
    paper = PAPER_DOWNSTREAM.get(suite, {})
    lines += ["", "| | paper (ImageNet, ResNet-50) | here | same direction |", "| --- | --- | --- | --- |"]
    for job, key, name in cols:
        if job not in runs[0]["downstream"]:
            continue
        here0 = runs[0]["downstream"][job]["pretrained"][key]
        for r in runs[1:]:
            if job not in r["downstream"]:
                continue
            here1 = r["downstream"][job]["pretrained"][key]
            if name in paper:
                text, p0, p1 = paper[name]
                same = "yes" if (here1 - here0) * (p1 - p0) > 0 else "no"
            else:
                text, same = "not reported", "—"
            lines.append(f"| {name}: {r['label']} | {text} | {here0:.4g} → {here1:.4g} | {same} |")
    return lines


def finished_run(cfg: dict) -> dict | None:
    """The results of a FINISHED, probed run of this exact configuration, read back from its MLflow metrics, or
    None (not run, not finished, or never probed: run it again)."""
    from pipeline import tracking
    from pipeline.eval.results import probe_results

    found = tracking.find_run(tracking.setup(cfg), cfg["run"]["name"])
    if found is None or found.info.status != "FINISHED":
        return None
    probe = probe_results(found.data.metrics)
    if not probe:
        return None
    return {
        "run_id": found.info.run_id,
        "probe": probe,
        "minutes": found.data.metrics.get("train/minutes", float("nan")),
    }


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) >= 1e-3 else f"{x:.2e}"


def _metrics(probe: dict) -> list[tuple[str, str, bool]]:
    """(column name, probe key, lower is better) of a run's probe: top-1 on class labels (Photos), else MSE per
    Spirograph target."""
    if "top1" in probe["pretrained"]:
        return [("top-1", "top1", False)]
    return [(f"MSE {t}", f"mse_{t}", True) for t in TARGETS]


def probe_table(runs: list[dict], fa: bool, own_random: bool = False) -> list[str]:
    keys = [k for k in ("pretrained", "pretrained_fa") if fa or k == "pretrained"]
    metrics = _metrics(runs[0]["probe"])
    regression = metrics[0][1].startswith("mse")
    head = "| run | " + " | ".join(
        f"{'FA ' if k.endswith('_fa') else ''}{name}" for k in keys for name, _, _ in metrics
    )
    head += " | R² m / b / σ / f_r |" if regression else " |"
    lines = [head, "|" + " --- |" * (1 + len(keys) * len(metrics) + regression)]

    def row(label: str, p: dict, which: list[str]) -> str:
        cells = [_fmt(p[k][key]) for k in which for _, key, _ in metrics]
        r2 = [" / ".join(f"{p[which[0]][f'r2_{t}']:.3f}" for t in TARGETS)] if regression else []
        return f"| {label} | " + " | ".join(cells + r2) + " |"

    random = [k.replace("pretrained", "random") for k in keys]
    for r in runs:
        lines.append(row(r["label"], r["probe"], keys))
        if own_random:  # suites of different architectures: each run's random-init twin
            lines.append(row(f"{r['label']}: random init", r["probe"], random))
    if not own_random:
        lines.append(row("random init", runs[0]["probe"], random))
    return lines


def invclr_section(runs: list[dict]) -> list[str]:
    out = invariance_table(runs)
    for reg in runs[1:]:
        out += ["", f"Direction of each change ({reg['label']} against {runs[0]['label']}), here and in the paper:", ""]
        out += direction_table(runs[0], reg)
    return out


def invariance_table(runs: list[dict]) -> list[str]:
    inv = {r["label"]: r["probe"]["invariance"] for r in runs}
    base = runs[0]
    ref = base["probe"]["invariance"]["invariance_alpha_reference"]
    out = ["| | conditional variance V | α-regression test MSE | reference |", "| --- | --- | --- | --- |"]
    for r in runs:
        i = inv[r["label"]]
        out.append(
            f"| {r['label']} | {_fmt(i['invariance_pretrained_conditional_variance'])} | "
            f"{_fmt(i['invariance_pretrained_alpha_mse'])} | {_fmt(ref)} |"
        )
    for name, p in PAPER_INVCLR.items():
        out.append(f"| paper, {name} | {p['conditional_variance']} | {p['alpha_mse']} | 0.0806 |")
    return out


def direction_table(base: dict, reg: dict) -> list[str]:
    out = ["| quantity | here | paper | same direction |", "| --- | --- | --- | --- |"]
    b, g = base["probe"]["invariance"], reg["probe"]["invariance"]
    pb, pg = PAPER_INVCLR["no regularization"], PAPER_INVCLR["gradient regularization"]
    rows = [
        (
            "V",
            b["invariance_pretrained_conditional_variance"],
            g["invariance_pretrained_conditional_variance"],
            pb["conditional_variance"],
            pg["conditional_variance"],
        ),
        (
            "α-regression MSE",
            b["invariance_pretrained_alpha_mse"],
            g["invariance_pretrained_alpha_mse"],
            pb["alpha_mse"],
            pg["alpha_mse"],
        ),
    ]
    for t in TARGETS:
        rows.append(
            (
                f"probe MSE {t}",
                base["probe"]["pretrained"][f"mse_{t}"],
                reg["probe"]["pretrained"][f"mse_{t}"],
                pb[f"mse_{t}"],
                pg[f"mse_{t}"],
            )
        )
        if "pretrained_fa" in base["probe"]:
            rows.append(
                (
                    f"FA probe MSE {t} (vs single-sample, penalty run)",
                    reg["probe"]["pretrained"][f"mse_{t}"],
                    reg["probe"]["pretrained_fa"][f"mse_{t}"],
                    None,
                    None,
                )
            )
    for name, here0, here1, paper0, paper1 in rows:
        here = f"{_fmt(here0)} → {_fmt(here1)} ({(here1 / here0 - 1) * 100:+.0f} %)"
        if paper0 is None:
            out.append(f"| {name} | {here} | lower (Fig. 5) | {'yes' if here1 < here0 else 'no'} |")
            continue
        paper = f"{_fmt(paper0)} → {_fmt(paper1)} ({(paper1 / paper0 - 1) * 100:+.0f} %)"
        same = (here1 - here0) * (paper1 - paper0) > 0
        out.append(f"| {name} | {here} | {paper} | {'yes' if same else 'no'} |")
    return out


def baseline_deltas(runs: list[dict], baseline: bool = True) -> list[str]:
    """Each method's probe against the baseline's (the first run; without a baseline, every run against its own
    random init) and against its random-init twin: the papers claim improvement over the baseline, and every
    method should beat random init."""
    metrics = _metrics(runs[0]["probe"])
    better = lambda new, old, lower: new < old if lower else new > old  # noqa: E731
    against = runs[0]["label"] if baseline else "random init"
    out = [
        "Probe change against "
        + against
        + " ("
        + ", ".join(f"{name}: {'negative' if lower else 'positive'} = better" for name, _, lower in metrics[:1])
        + "):",
        "",
        "| run | " + " | ".join(name for name, _, _ in metrics) + " | improved | beats random init |",
        "|" + " --- |" * (len(metrics) + 3),
    ]
    for r in runs[1:] if baseline else runs:
        p, rnd = r["probe"]["pretrained"], r["probe"]["random"]
        base = runs[0]["probe"]["pretrained"] if baseline else rnd
        change = [(p[key] / base[key] - 1) * 100 for _, key, _ in metrics]
        improved = sum(better(p[key], base[key], lower) for _, key, lower in metrics)
        beats = sum(better(p[key], rnd[key], lower) for _, key, lower in metrics)
        out.append(
            f"| {r['label']} | "
            + " | ".join(f"{c:+.1f} %" for c in change)
            + f" | {improved} of {len(metrics)} | {beats} of {len(metrics)} |"
        )
    return out


def cocor_curves(runs: list[dict], docs: Path) -> list[str]:
    """The learned run's per-length targets and similarities over training, copied next to the report."""
    import shutil

    out = []
    for r in runs:
        if "learned" in r["label"] and Path(r["curves"]).exists():
            img = docs / "img" / "cocor_learned_targets.png"
            img.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(r["curves"], img)
            out += [
                f"Training curves of {r['label']} (MLflow run `{r['run_id']}`, artifact `curves/`): the "
                "learned target g(v) per composite length (solid) and the batch-mean latent similarity it "
                "constrains (dashed).",
                "",
                f"![CoCor learned targets](img/{img.name})",
            ]
    return out


def write_report(
    results: dict[str, list[dict]],
    scale: list[str],
    path: Path,
    sweeps: list[dict] = (),
    downstream: dict | None = None,
) -> None:
    """Rewrite the sections of `path` this command made (a suite's, the sweeps'); keep the others as they are.
    Each section's first line says the command and date that made it."""
    command = " ".join(["python jobs/reproductions.py", *sys.argv[1:]])
    stamp = f"_Made by `{command}` on {time.strftime('%Y-%m-%d')}._"
    made: dict[str, list[str]] = {}
    for suite, runs in results.items():
        data = "Photos" if any("data=photos" in o for o in runs[0]["overrides"]) else "Spirograph"
        lines = [
            stamp,
            "",
            f"Scale: `{' '.join(scale)}` ({data}; ResNet-18 layout with CIFAR stem unless a run names a ViT).",
            "",
        ]
        lines += [
            f"- {r['label']}: `python jobs/pretrain.py {' '.join(r['overrides'] + scale + r['extra'])}` "
            f"— MLflow run "
            f"`{r['run_id']}`, {r['minutes']:.1f} min"
            for r in runs
        ]
        lines.append("")
        lines += probe_table(runs, fa="pretrained_fa" in runs[0]["probe"], own_random=suite in NO_BASELINE)
        lines.append("")
        lines += invclr_section(runs) if suite == "invclr" else baseline_deltas(runs, suite not in NO_BASELINE)
        if suite in PAPER_LINES:
            lines += ["", PAPER_LINES[suite]]
        lines.append("")
        table = downstream_table(suite, runs, downstream or {})
        if table:
            lines += [*table, ""]
        if suite == "cocor":
            lines += cocor_curves(runs, path.parent)
            lines.append("")
        made[suite] = lines
    if sweeps:
        lines = [
            stamp,
            "",
            "Each paper's own sweep of its constant (`conf/sweep/`, docs/tune.md) at its CPU size: Spirograph, "
            "a few thousand images, 4–5 epochs, ranked by the linear probe's mean test MSE over the four "
            "factors (lower is better). The papers sweep on ImageNet-scale data for hundreds of epochs.",
            "",
        ]
        for r in sweeps:
            lines += sweep_section(r, path.parent)
        made["Sweeps"] = lines
    notes = path.with_name(path.stem + "_notes.md")  # hand-written reading of the numbers, kept across reruns
    note_text = notes.read_text().strip() if notes.exists() else ""
    kept = report_sections(path.read_text() if path.exists() else "", skip=note_text.splitlines()[:1])
    sections = {**kept, **made}
    order = [s for s in [*SUITES, "Sweeps"] if s in sections] + [
        s for s in sections if s not in SUITES and s != "Sweeps"
    ]
    out = [
        "# Reproductions at CPU scale",
        "",
        "Each section below is made by `python jobs/reproductions.py` (its first line gives the command and the "
        "date); rerunning a suite or a sweep rewrites its section and keeps the others. Every number comes from "
        "the command that made its section; rerun it to check. The papers train on 100k images for 50 epochs "
        "(InvCLR) or on ImageNet for 200 epochs (CO2, CLSA, CoCor); this is a small fraction of that, so what "
        "matters is the direction of each change, not its size.",
        "",
    ]
    for name in order:
        body = list(sections[name])
        while body and not body[-1].strip():  # one blank line between sections, however often it is rewritten
            body.pop()
        out += [f"## {name}", "", *body, ""]
    if note_text:
        out += [note_text]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out).rstrip() + "\n")
    print(f"[reproductions] wrote {path}", flush=True)


def report_sections(text: str, skip: list[str] = ()) -> dict[str, list[str]]:
    """The `## name` sections of a report: name -> its lines (heading and blank line after it left out); the
    text before the first section and the sections headed by a line in `skip` (the notes) are dropped."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("## "):
            name = None if line in skip else line[3:].strip()
            if name is not None:
                out[name] = []
        elif name is not None:
            if out[name] or line.strip():
                out[name].append(line)
    return out


def main(argv: list[str]) -> int:
    cfg = cli(argv, __doc__, config_name="reproductions")
    unknown = sorted(set(cfg["suites"]) - set(SUITES))
    if unknown:
        fail(f"unknown suites {unknown}; known: {sorted(SUITES)}")
    unknown = sorted(set(cfg["sweeps"]) - set(PAPER_SWEEPS))
    if unknown:
        fail(f"unknown sweeps {unknown}; known: {sorted(PAPER_SWEEPS)}")
    from pipeline.tune.settings import check_sweep, compose_sweep

    for name in cfg["sweeps"]:  # bad sweep_args fail now, not after the suites have trained
        try:
            check_sweep(*compose_sweep([f"+sweep={name}", *cfg["sweep_args"]]))
        except ConfigError as e:
            fail(f"sweep {name}: {e}")
    downstream = {job: list(args) for job, args in (cfg["downstream"] or {}).items()}
    if set(downstream) - {"finetune", "detect"}:
        fail(f"downstream: {sorted(downstream)}: expected finetune and/or detect")
    if any(a.startswith("baseline=") for args in downstream.values() for a in args):
        fail("downstream: baseline= is set here (random init beside each suite's first run)")
    scale, results = list(cfg["scale"]), {}
    for suite in cfg["suites"]:
        extra = list(cfg["extra"].get(suite) or [])
        results[suite] = [run_one(label, ov, scale, extra) for label, ov in SUITES[suite]]
        run_downstream(results[suite], downstream)
    sweeps = [run_sweep_for_report(name, list(cfg["sweep_args"])) for name in cfg["sweeps"]]
    write_report(results, scale, Path(cfg["out"]), sweeps, downstream)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
