"""Linear probe of a pretrained backbone, and the same probe on a randomly initialised twin.

Optional, both off by default (docs/methods/invclr.md §1.3, §4.2, §4.4):
* eval.feature_averaging.m > 0: the probe is also trained and tested on feature-averaged representations
  z^(m) (Eq. 14, m transformed copies through the training transformations, train and test splits, both
  backbones); reported beside the single-sample probe as "<backbone>, FA m=<m>" (metrics probe/<backbone>_fa_*).
* eval.invariance.enabled: conditional variance V (Eq. 7) and the test MSE of a linear regression of alpha
  from z, with its reference Mean_i Var(alpha_i), for both backbones (metrics probe/invariance_*).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import mlflow
import torch
from omegaconf import OmegaConf

from pipeline import checkpoint as ck
from pipeline.augment.view_makers import eval_settings
from pipeline.data.manifest import read_manifest
from pipeline.data.reader import load_split
from pipeline.eval.downstream import pick_device
from pipeline.eval.extract import check_actors, load_features, split_features
from pipeline.eval.features import eval_preprocess, extract
from pipeline.eval.invariance import (
    alpha_names,
    alpha_reference,
    alpha_regression,
    averaged_features,
    conditional_variance_of,
    split_targets,
    transformed_features,
)
from pipeline.eval.job_settings import ProbeRequest
from pipeline.eval.probe.lbfgs import probe
from pipeline.eval.probe.sgd import SgdSchedule, fit_sgd, score
from pipeline.eval.probe.spec import ProbeSpec
from pipeline.eval.results import format_table
from pipeline.models.backbones import build_backbone
from pipeline.sections import Invariance

RUN_SECTIONS = ("method", "model", "augment", "data")  # what a probe of a run's checkpoint takes from the run


def config_for_run(request: ProbeRequest, trained: dict) -> dict:
    """The probe's config: the command line's (`request`: paths, tracking, eval, seed) with the model, method, augment
    (hence image size) and data of the run that made the checkpoint. The command line's `data.<key>=` and
    `augment.<key>=` overrides still apply on top of the run's; `data=<option>` probes the run's backbone,
    at the run's image size, on another dataset. Model and method always follow the checkpoint; the run's
    augment can be tuned key by key but not swapped (ValueError with one line). `trained`: the run's config."""
    overrides = [(o.split("=", 1)[0].lstrip("+~"), o.lstrip("+")) for o in request.argv if "=" in o]
    swapped_data = any(k == "data" for k, _ in overrides)
    for k, _ in overrides:
        top = k.split(".")[0]
        if top in ("method", "model") or k == "augment":
            raise ValueError(
                f"{k}: a probe of a run's checkpoint uses the run's {top} (override eval.* or data.* instead)"
            )
    taken = {s: trained[s] for s in RUN_SECTIONS if s in trained and not (s == "data" and swapped_data)}
    dotted = [o for k, o in overrides if "." in k and k.split(".")[0] in taken]
    merged = OmegaConf.merge(OmegaConf.create(taken), OmegaConf.from_dotlist(dotted))
    out = dict(request.config)
    out.update(cast(dict, OmegaConf.to_container(merged, resolve=True)))  # merged mappings: a mapping
    return out


def backbone_from(state: dict) -> torch.nn.Module:
    m = state["cfg"]["model"]
    net = build_backbone(m)
    net.load_state_dict(ck.backbone_state(state))
    return net


def random_backbone(model: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """A random-init twin of the model section's backbone."""
    torch.manual_seed(seed)
    return build_backbone(model)


def probe_solver(spec: ProbeSpec) -> str:
    """lbfgs or sgd: eval.probe.solver, or for auto, sgd when the train split (or train_size of it) has more than
    eval.probe.lbfgs_max samples."""
    p = spec.probe
    if p.solver != "auto":
        return p.solver
    n = int(read_manifest(spec.data.train)[0]["num_samples"])
    return "sgd" if min(n, p.train_size or n) > p.lbfgs_max else "lbfgs"


def check_probe_actors(spec: ProbeSpec) -> None:
    """Under the sgd solver, ConfigError (one line) when the cluster cannot place eval.probe's extraction actors
    (extract.check_actors); Ray is up."""
    p = spec.probe
    if (p.actors or p.actor_resources) and probe_solver(spec) == "sgd":  # hand-set alone: no manifest read otherwise
        check_actors(p.actors, p.actor_resources, "eval.probe.", spec.autoscale)


SOLVER_NAMES = {"lbfgs": "full-batch L-BFGS", "sgd": "SGD, MoCo's protocol, on features extracted by Ray Data"}


def probe_backbone_sgd(backbone: torch.nn.Module, spec: ProbeSpec) -> dict[str, float]:
    """The probe of a large set: both splits' features extracted by Ray Data to <paths.runs>/features/ (reused
    for the same weights and settings), then SGD (pipeline.eval.probe.sgd) on the device there is. Starts Ray
    if the caller has not. train_size and val_size take the first that many extracted samples of each split."""
    spec.start_ray()  # the job's Ray: a joined cluster, or a private local one
    data, p, model = spec.data, spec.probe, dict(spec.model)
    size, mean, std = eval_settings(spec.augment)
    state, targets = backbone.state_dict(), spec.targets
    feats = {}
    extraction = {"batch_size": p.batch_size, "actors": p.actors, "resources": p.actor_resources}
    for split, limit in (("train", p.train_size), ("val", p.val_size)):
        out, _ = split_features(data.model_dump(), model, state, spec.runs, split, size, mean, std, **extraction)
        feat, y = load_features(out)
        feats[split] = (feat[:limit], y[:limit]) if limit else (feat, y)
    if data.task == "classification":
        names = read_manifest(data.train)[0].get("class_names") or []
        out_dim = max(len(names), int(feats["train"][1].max()) + 1)
    else:
        out_dim = len(targets or [])
    device = pick_device("auto")
    schedule = SgdSchedule(**p.sgd.model_dump())
    head = fit_sgd(*feats["train"], data.task, out_dim, schedule, seed=spec.seed, device=device)
    return score(head, *feats["val"], data.task, list(targets or []), device=device)


def probe_backbone(backbone: torch.nn.Module, spec: ProbeSpec) -> dict[str, float]:
    if probe_solver(spec) == "sgd":
        return probe_backbone_sgd(backbone, spec)
    data, p = spec.data, spec.probe
    train = load_split(data.train, data.task, spec.targets, limit=p.train_size)
    test = load_split(data.val, data.task, spec.targets, limit=p.val_size)
    pre = eval_preprocess(*eval_settings(spec.augment))
    ftr, ktr = extract(backbone, train.encoded, pre, p.batch_size)
    fte, kte = extract(backbone, test.encoded, pre, p.batch_size)
    num_classes = len(train.names) or None
    return probe(
        ftr,
        torch.as_tensor(train.y[ktr]),
        fte,
        torch.as_tensor(test.y[kte]),
        data.task,
        test.names,
        p.steps,
        p.weight_decay,
        num_classes,
    )


# Seed offsets of the transformation draws; the same for both backbones (common random numbers).
FA_TRAIN_SEED, FA_TEST_SEED, INV_TRAIN_SEED, INV_TEST_SEED = 1, 2, 3, 4


def _transform_splits(spec: ProbeSpec, train_size, val_size):
    """Train and val splits for the transformed-feature paths (Spirograph: with all four factors loaded)."""
    data = spec.data
    targets = split_targets(data.task, spec.targets, spec.augment)
    return (
        load_split(data.train, data.task, targets, limit=train_size),
        load_split(data.val, data.task, targets, limit=val_size),
    )


def _probe_y(split, spec: ProbeSpec):
    """The probe's targets of a split loaded by _transform_splits: data.targets' columns, in their order."""
    targets = spec.targets
    if spec.data.task != "regression" or not targets:
        return split.y
    return split.y[:, [split.names.index(t) for t in targets]]


def probe_backbone_fa(backbone: torch.nn.Module, spec: ProbeSpec, m: int) -> dict[str, float]:
    """probe_backbone on feature-averaged representations (Eq. 14, 1.3/4.4): the probe is fitted on the
    m-averaged train features and scored on the m-averaged test features, both made with the training
    transformations (Spirograph: re-renders with fresh nuisance; images: the recipe's first view)."""
    p, aug, seed = spec.probe, spec.augment, spec.seed
    train, test = _transform_splits(spec, p.train_size, p.val_size)
    ftr, ktr = averaged_features(backbone, train, aug, m, seed=seed + FA_TRAIN_SEED, batch_size=p.batch_size)
    fte, kte = averaged_features(backbone, test, aug, m, seed=seed + FA_TEST_SEED, batch_size=p.batch_size)
    names = list(spec.targets or []) if spec.data.task == "regression" else test.names
    num_classes = len(train.names) or None
    return probe(
        ftr,
        torch.as_tensor(_probe_y(train, spec)[ktr]),
        fte,
        torch.as_tensor(_probe_y(test, spec)[kte]),
        spec.data.task,
        names,
        p.steps,
        p.weight_decay,
        num_classes,
    )


def invariance_metrics(backbone: torch.nn.Module, spec: ProbeSpec, inv: Invariance) -> dict[str, float]:
    """V (Eq. 7) and the alpha regression (4.2) of one backbone on `eval.invariance.samples` samples of each
    split with `eval.invariance.copies` copies: the regression is fitted on the train split's (sample, copy)
    rows and scored on the val split's, whose copies also give V. For image recipes beta is fixed per sample
    and only alpha varies across the copies, as Eq. 6 conditions on beta."""
    p, aug, seed = spec.probe, spec.augment, spec.seed
    train, test = _transform_splits(spec, inv.samples, inv.samples)
    kw = {"batch_size": p.batch_size, "fix_beta": True}
    ftr, atr = transformed_features(backbone, train, aug, inv.copies, seed=seed + INV_TRAIN_SEED, **kw)
    fte, ate = transformed_features(backbone, test, aug, inv.copies, seed=seed + INV_TEST_SEED, **kw)
    v = conditional_variance_of(fte, torch.Generator().manual_seed(seed))
    ref, _ = alpha_reference(aug)
    reg = alpha_regression(ftr, atr, fte, ate, ref, alpha_names(aug), p.steps, p.weight_decay)
    return {
        "conditional_variance": v,
        "alpha_mse": reg["mse"],
        "alpha_reference": reg["reference"],
        "alpha_reference_empirical": reg["reference_empirical"],
    }


def plot_comparison(results: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    import matplotlib  # matplotlib: its Agg backend chosen when a chart is drawn, not when this module loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in next(iter(results.values())) if k.startswith(("r2_", "top1"))]
    fig, ax = plt.subplots(figsize=(1.6 * len(keys) + 2, 3.2))
    width = 0.8 / len(results)
    for i, (name, res) in enumerate(results.items()):
        ax.bar([j + i * width for j in range(len(keys))], [res[k] for k in keys], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys)
    ax.set_ylabel("R² / top-1 (higher is better)")
    ax.set_title(title)
    ax.axhline(0, color="k", lw=0.5)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def probe_png(spec: ProbeSpec, name: str) -> Path:
    """Where a run's probe chart goes: <paths.runs>/probe/<run name>.png, one file per run."""
    return spec.runs / "probe" / f"{name}.png"


def compare_with_random(
    spec: ProbeSpec, ckpt: str | Path | dict, run_name: str | None = None, baseline: bool | None = None
) -> dict[str, dict[str, float]]:
    """Probe the checkpoint's backbone and a random twin; print a table, log metrics and a PNG to MLflow.

    `ckpt`: a checkpoint folder, a state.pt file or a loaded state. The chart is written to probe_png(spec,
    run_name) (run_name: the active MLflow run's name by default) and logged as probe/probe.png.

    `baseline=False` probes the pretrained backbone alone (a sweep's trials: the sweep probes the random twin once);
    None: eval.probe.baseline.

    Returns {"pretrained": ..., "random": ...}; with eval.feature_averaging.m > 0 also "pretrained_fa" and
    "random_fa" (metrics probe/<key>_<metric>); with eval.invariance.enabled also "invariance", a flat dict
    keyed by the logged metric names less probe/ (invariance_<backbone>_conditional_variance, ..._alpha_mse,
    invariance_alpha_reference)."""
    if isinstance(ckpt, dict):
        state = ckpt
    else:
        state = ck.load(ckpt) if Path(ckpt).is_dir() else torch.load(ckpt, map_location="cpu", weights_only=False)
    m, inv = spec.fa_m, spec.invariance
    backbones = {
        "pretrained": lambda: backbone_from(state),
        "random": lambda: random_backbone(state["cfg"]["model"], spec.seed),
    }
    if not (spec.probe.baseline if baseline is None else baseline):
        del backbones["random"]
    results, labels, invariance = {}, {}, {}
    for name, build in backbones.items():
        net = build()
        results[name], labels[name] = probe_backbone(net, spec), name
        if m > 0:
            results[f"{name}_fa"], labels[f"{name}_fa"] = probe_backbone_fa(net, spec, m), f"{name}, FA m={m}"
        if inv is not None:
            invariance[name] = invariance_metrics(net, spec, inv)
    shown = {labels[k]: v for k, v in results.items()}
    table = format_table(shown)
    size = eval_settings(spec.augment)[0]
    solver = probe_solver(spec)
    print(
        f"\nLinear probe on {spec.data.name} at {size} px (frozen features, {SOLVER_NAMES[solver]}):\n{table}\n",
        flush=True,
    )
    if inv is not None:
        inv_table, inv_metrics = _invariance_report(invariance, spec, inv)
        print(inv_table + "\n", flush=True)
        results["invariance"] = inv_metrics
    if mlflow.active_run():
        for name, res in results.items():
            if name != "invariance":
                mlflow.log_metrics({f"probe/{name}_{k}": v for k, v in res.items()})
        mlflow.set_tag("probe_solver", solver)
        if m > 0:
            mlflow.log_metric("probe/fa_m", m)
        mlflow.log_text(table, "probe/table.txt")
        if inv is not None:
            mlflow.log_metrics({f"probe/{k}": v for k, v in results["invariance"].items()})
            mlflow.log_text(inv_table, "probe/invariance.txt")
        run = mlflow.active_run()
        assert run is not None  # checked above
        active = run.info
        out = probe_png(spec, run_name or active.run_name or active.run_id)
        out.parent.mkdir(parents=True, exist_ok=True)
        plot_comparison(shown, out, f"linear probe: {spec.data.name} at {size} px")
        with tempfile.TemporaryDirectory() as d:  # the same artifact name in every run
            mlflow.log_artifact(str(shutil.copy(out, Path(d) / "probe.png")), "probe")
        print(f"probe chart {out}", flush=True)
    return results


def _invariance_report(
    invariance: dict[str, dict[str, float]], spec: ProbeSpec, inv: Invariance
) -> tuple[str, dict[str, float]]:
    """The printed invariance table and its metrics (invariance_<backbone>_<metric>, invariance_alpha_*)."""
    _, source = alpha_reference(spec.augment)
    first = next(iter(invariance.values()))
    ref, ref_emp = first["alpha_reference"], first["alpha_reference_empirical"]
    rows = {
        name: {"conditional_variance": r["conditional_variance"], "alpha_mse": r["alpha_mse"]}
        for name, r in invariance.items()
    }
    alpha = ", ".join(alpha_names(spec.augment))
    text = (
        f"Invariance on {spec.data.name} ({inv.samples} samples x {inv.copies} copies per split): "
        f"conditional variance V (Eq. 7), test MSE of a linear regression of alpha = ({alpha}) from z "
        f"(higher = more invariant)\n{format_table(rows)}\n"
        f"alpha reference Mean_i Var(alpha_i) = {ref:.4f} ({source}; empirical on the val copies "
        f"{ref_emp:.4f})"
    )
    metrics = {f"invariance_{name}_{k}": v for name, r in rows.items() for k, v in r.items()}
    metrics["invariance_alpha_reference"] = ref
    metrics["invariance_alpha_reference_empirical"] = ref_emp
    return text, metrics
