"""A PNG of detections on a few validation images: ground truth in green, detections (score >= a threshold) in
red with their class and score, one row per backbone (pretrained, random init)."""

from __future__ import annotations

from pathlib import Path


def predictions_png(ds, rows: dict[str, list[dict]], path: Path, n: int = 6, min_score: float = 0.5) -> Path:
    """`rows`: label -> COCO-format detections over `ds` (a CocoSplit); the first `n` images of `ds`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    names = {c["id"]: c["name"] for c in ds.categories}
    n = min(n, len(ds))
    fig, axes = plt.subplots(len(rows), n, figsize=(2.4 * n, 2.7 * len(rows)), squeeze=False)
    for r, (label, results) in enumerate(rows.items()):
        by_image: dict[int, list[dict]] = {}
        for det in results:
            by_image.setdefault(det["image_id"], []).append(det)
        for i in range(n):
            x, target = ds[i]
            ax = axes[r][i]
            ax.imshow(x.permute(1, 2, 0).numpy())
            for x0, y0, x1, y1 in target["boxes"].tolist():
                ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, color="lime", lw=1.2))
            for det in by_image.get(target["image_id"], []):
                if det["score"] < min_score:
                    continue
                bx, by, bw, bh = det["bbox"]
                ax.add_patch(Rectangle((bx, by), bw, bh, fill=False, color="red", lw=1.2))
                ax.text(
                    bx,
                    by - 1,
                    f"{names.get(det['category_id'], det['category_id'])} {det['score']:.2f}",
                    color="red",
                    fontsize=9,
                    va="bottom",
                )
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_ylabel(label, fontsize=11)
    fig.suptitle(f"ground truth (green), detections with score >= {min_score} (red)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
