"""Training curves as PNGs from a run's MLflow metric history: the loss and its terms, the kNN monitor, and
CoCor's per-length targets beside the similarities they constrain."""

from __future__ import annotations

import re
from pathlib import Path

LOSS_TERMS = tuple(f"train/{k}" for k in ("loss", "co2_consistency", "clsa_ddm", "invclr_penalty", "cocor_consistency"))
PER_LENGTH = re.compile(r"train/cocor_(?:target|sim)_l(\d+)")  # CoCor's per-composite-length target and similarity


def panels(keys: list[str]) -> dict[str, list[str]]:
    """Which logged metrics go in which panel (panels with nothing logged are left out)."""
    out = {
        "training loss and its terms": [k for k in LOSS_TERMS if k in keys],
        "kNN monitor": sorted(k for k in keys if k.startswith("knn/") and k != "knn/time_s"),
        "CoCor: target g(v) (solid) and latent similarity (dashed) per composite length": sorted(
            k for k in keys if PER_LENGTH.fullmatch(k)
        ),
    }
    return {title: ks for title, ks in out.items() if ks}


def write_curves(client, run_id: str, path: str | Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(client.get_run(run_id).data.metrics)
    groups = panels(keys)
    if not groups:
        return None
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.2 * len(groups)), squeeze=False)
    for ax, (title, ks) in zip(axes[:, 0], groups.items()):
        for k in ks:
            hist = sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)
            style = "--" if k.startswith("train/cocor_sim_") else "-"
            length = PER_LENGTH.fullmatch(k)
            color = f"C{int(length.group(1)) % 10}" if length else None  # a length's target and sim share a colour
            ax.plot([m.step for m in hist], [m.value for m in hist], style, color=color, label=k, lw=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
