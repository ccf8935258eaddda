"""A small labelled subset of the pretraining split (CoCor's upper-level data, docs/methods/cocor.md §1.7 and §7
item 7).

The paper uses 1 % of the pretraining set's labels and does not say how they are drawn; here the draw is seeded
and class-balanced: each class keeps round(fraction · its count) samples (at least one). Regression data
(Spirograph's factors) keeps a seeded uniform draw. Two passes over the shards: labels first, then the images
of the chosen samples only, so memory holds just the subset.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np
import torch

from pipeline.data.manifest import read_manifest
from pipeline.data.reader import Split, image_key, iter_samples, make_split, targets_of


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


def labelled_subset(
    root: str, task: str, targets: list[str] | None, fraction: float, seed: int, min_count: int = 8
) -> Split:
    return select(root, task, targets, fraction, seed, min_count)[0]


def sample_name(key: str) -> str:
    """A sample's name without the shard writer's ordinal prefix: `00000012_n01440764_10026` (an ImageFolder
    file, n01440764_10026.JPEG) is `n01440764_10026`; keys without a name (CIFAR's, Spirograph's) stay as they are."""
    head, _, rest = key.partition("_")
    return rest if head.isdigit() and rest else key


def select(
    root: str,
    task: str,
    targets: list[str] | None,
    fraction: float,
    seed: int,
    min_count: int = 1,
    names: list[str] | None = None,
) -> tuple[Split, list[str]]:
    """The subset and its samples' keys: a seeded draw of `fraction` (choose), or, with `names`, exactly the
    samples named there (file names as in ImageNet's 1percent.txt, extension optional, or shard keys).
    ValueError with one line for a name no sample has."""
    manifest, uris = read_manifest(root)
    keys, ys = [], []
    for s in iter_samples(uris):
        keys.append(s["__key__"])
        ys.append(targets_of(s, task, targets))
    if names is None:
        classes = np.asarray(ys, dtype=np.int64) if task == "classification" else None
        keep = set(choose(classes, len(ys), fraction, seed, min_count).tolist())
    else:
        short = [sample_name(k) for k in keys]
        twice = {n for n, c in Counter(short).items() if c > 1}  # the same file name in two class folders
        index = {**{n: i for i, n in enumerate(short)}, **{k: i for i, k in enumerate(keys)}}
        wanted = [n.rsplit("/", 1)[-1] for n in names]
        wanted = [n if n in index else n.rsplit(".", 1)[0] for n in wanted]
        missing = [n for n in wanted if n not in index]
        if missing:
            raise ValueError(
                f"{len(missing)} of the {len(wanted)} listed samples are not in {root} (first: {missing[0]!r})"
            )
        exact = set(keys)
        ambiguous = [n for n in wanted if n in twice and n not in exact]
        if ambiguous:
            raise ValueError(
                f"{ambiguous[0]!r} names more than one sample of {root}: list the shard keys "
                f"(as finetune/subset.txt does)"
            )
        keep = {index[n] for n in wanted}
    encoded, chosen, chosen_keys = [], [], []
    for i, s in enumerate(iter_samples(uris)):
        if i in keep:
            encoded.append(s[image_key(s)])
            chosen.append(ys[i])
            chosen_keys.append(keys[i])
    return make_split(encoded, chosen, task, targets, manifest), chosen_keys


class LabelledBatches:
    """Seeded random batches of a labelled subset (CoCor's upper-level data), each through `transform` (encoded
    images -> (images, indices of those kept)). Regression targets are standardised by the subset's own mean and
    deviation, so one step size suits every factor.

    With `ahead=True` the next batch is drawn and decoded on a thread of its own while the caller trains (into
    pinned memory with `pin=True`, for a copy to the GPU that need not wait): on an H100 the step waited on 64 JPEG
    decodes on the host each step (docs/gpu.md). One thread draws in turn, so the batches are the same ones, in the
    same order, either way."""

    def __init__(
        self,
        split: Split,
        transform: Callable,
        batch: int,
        generator: torch.Generator,
        task: str,
        ahead: bool = False,
        pin: bool = False,
    ):
        self.split, self.transform, self.batch, self.generator, self.task = split, transform, batch, generator, task
        if task == "regression":
            y = torch.as_tensor(split.y)
            self.y_mean, self.y_std = y.mean(0), y.std(0).clamp_min(1e-6)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="labelled") if ahead else None
        self._next: Future | None = None
        self._pin = ahead and pin

    def __len__(self) -> int:
        return len(self.split.encoded)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pool is None:
            return self._draw()
        pending, self._next = self._next or self._pool.submit(self._draw), None
        batch = pending.result()  # a draw that failed raises here, once
        self._next = self._pool.submit(self._draw)
        return batch

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randperm(len(self.split.encoded), generator=self.generator)[: self.batch].numpy()
        x, kept = self.transform([self.split.encoded[i] for i in idx])
        y = torch.as_tensor(self.split.y[idx[kept]])
        if self.task == "regression":
            y = (y - self.y_mean) / self.y_std
        if self._pin:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y
