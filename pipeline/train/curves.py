"""Training curves as PNGs from a run's MLflow metric history: the panels pipeline.curve_panels lays out from what
the method and its plug-ins declare."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.curve_panels import Panel, panels


def write_curves(
    client, run_id: str, path: str | Path, terms: Sequence[str] = (), extra: Sequence[Panel] = ()
) -> Path | None:
    """The PNG of the run's curves at `path` (None when nothing was logged): the loss with `terms`, the kNN monitor,
    and the `extra` panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(client.get_run(run_id).data.metrics)
    groups = panels(keys, terms, extra)
    if not groups:
        return None
    own = {p.title: p for p in extra}
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.2 * len(groups)), squeeze=False)
    for ax, (title, ks) in zip(axes[:, 0], groups.items()):
        for k in ks:
            hist = sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)
            style, color = own[title].style(k) if title in own else ("-", None)
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
