"""A small labelled subset of the pretraining split (CoCor's upper-level data, docs/methods/cocor.md §1.7 and §7 item 7).

The paper uses 1 % of the pretraining set's labels and does not say how they are drawn; here the draw is seeded
and class-balanced: each class keeps round(fraction · its count) samples (at least one). Regression data
(Spirograph's factors) keeps a seeded uniform draw. Two passes over the shards: labels first, then the images
of the chosen samples only, so memory holds just the subset.
"""
from __future__ import annotations

import numpy as np

from pipeline.data.reader import Split, image_key, iter_samples, make_split, targets_of
from pipeline.data.shards import read_manifest


def choose(labels: np.ndarray | None, n: int, fraction: float, seed: int, min_count: int = 1) -> np.ndarray:
    """Sorted indices of the subset: per class when `labels` are classes, else uniform over n."""
    if not 0 < fraction <= 1:
        raise ValueError(f"labelled fraction must be in (0, 1], not {fraction}")
    rng = np.random.default_rng(seed)
    if labels is None:
        k = min(n, max(min_count, int(round(fraction * n))))
        return np.sort(rng.choice(n, size=k, replace=False))
    picked = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        k = min(len(members), max(1, int(round(fraction * len(members)))))
        picked.append(rng.choice(members, size=k, replace=False))
    return np.sort(np.concatenate(picked))


def labelled_subset(root: str, task: str, targets: list[str] | None, fraction: float, seed: int,
                    min_count: int = 8) -> Split:
    manifest, uris = read_manifest(root)
    ys = [targets_of(s, task, targets) for s in iter_samples(uris)]
    classes = np.asarray(ys, dtype=np.int64) if task == "classification" else None
    keep = set(choose(classes, len(ys), fraction, seed, min_count).tolist())
    encoded, chosen = [], []
    for i, s in enumerate(iter_samples(uris)):
        if i in keep:
            encoded.append(s[image_key(s)])
            chosen.append(ys[i])
    return make_split(encoded, chosen, task, targets, manifest)
