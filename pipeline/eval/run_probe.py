"""Linear probe of a pretrained backbone, and the same probe on a randomly initialised twin."""
from __future__ import annotations

from pathlib import Path

import torch

from pipeline.augment.view_maker import eval_settings
from pipeline.data.reader import load_split
from pipeline.eval.features import eval_preprocess, extract
from pipeline.eval.linear_probe import probe
from pipeline.models.backbones import build_backbone
from pipeline.train import checkpoint as ck


def resolve_checkpoint(ref: str, cfg: dict) -> Path:
    """A checkpoint folder, a state.pt file, or an MLflow run id (its logged checkpoint artifact)."""
    p = Path(ref)
    if p.is_dir() and (p / ck.STATE_FILE).exists():
        return p / ck.STATE_FILE
    if p.is_file():
        return p
    import mlflow

    from pipeline import tracking

    mlflow.set_tracking_uri(tracking.tracking_uri(cfg))
    try:
        local = mlflow.artifacts.download_artifacts(run_id=ref, artifact_path=f"checkpoint/{ck.STATE_FILE}")
    except Exception as e:  # noqa: BLE001 - MLflow raises several types for an unknown id
        raise FileNotFoundError(f"checkpoint {ref!r} is neither a path nor an MLflow run with a checkpoint "
                                f"({type(e).__name__})") from None
    return Path(local)


def backbone_from(state: dict) -> torch.nn.Module:
    m = state["cfg"]["model"]
    net = build_backbone(m["backbone"], m.get("cifar_stem", False), m.get("width", 64))
    net.load_state_dict(ck.backbone_state(state))
    return net


def random_backbone(model_cfg: dict, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_backbone(model_cfg["backbone"], model_cfg.get("cifar_stem", False), model_cfg.get("width", 64))


def probe_backbone(backbone: torch.nn.Module, cfg: dict) -> dict[str, float]:
    data, p, aug = cfg["data"], cfg["eval"]["probe"], cfg["augment"]
    targets = data.get("targets")
    train = load_split(data["train"], data["task"], targets, limit=p["train_size"])
    test = load_split(data["val"], data["task"], targets, limit=p["val_size"])
    pre = eval_preprocess(*eval_settings(aug))
    ftr, ktr = extract(backbone, train.encoded, pre, p["batch_size"])
    fte, kte = extract(backbone, test.encoded, pre, p["batch_size"])
    num_classes = len(train.names) or None
    return probe(ftr, torch.as_tensor(train.y[ktr]), fte, torch.as_tensor(test.y[kte]), data["task"], test.names,
                 p["steps"], p["weight_decay"], num_classes)


def format_table(results: dict[str, dict[str, float]]) -> str:
    """Rows: metrics; columns: backbones (e.g. pretrained, random)."""
    cols = list(results)
    keys = list(next(iter(results.values())))
    w = max(len(k) for k in keys) + 2
    lines = ["metric".ljust(w) + "".join(c.rjust(12) for c in cols)]
    for k in keys:
        lines.append(k.ljust(w) + "".join(f"{results[c][k]:12.4f}" for c in cols))
    return "\n".join(lines)


def plot_comparison(results: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    import matplotlib

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


def compare_with_random(cfg: dict, ckpt: str | Path) -> dict[str, dict[str, float]]:
    """Probe the checkpoint's backbone and a random twin; print a table, log metrics and a PNG to MLflow."""
    import mlflow

    state = ck.load(ckpt) if Path(ckpt).is_dir() else torch.load(ckpt, map_location="cpu", weights_only=False)
    results = {"pretrained": probe_backbone(backbone_from(state), cfg),
               "random": probe_backbone(random_backbone(state["cfg"]["model"], cfg["seed"]), cfg)}
    table = format_table(results)
    print(f"\nLinear probe on {cfg['data']['name']} (frozen features, L-BFGS):\n{table}\n", flush=True)
    if mlflow.active_run():
        for name, res in results.items():
            mlflow.log_metrics({f"probe_{name}_{k}": v for k, v in res.items()})
        mlflow.log_text(table, "probe/table.txt")
        out = Path(cfg["paths"]["runs"]) / "probe.png"
        mlflow.log_artifact(str(plot_comparison(results, out, f"linear probe: {cfg['data']['name']}")), "probe")
    return results
