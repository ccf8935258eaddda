"""The report's scale card: for each paper setting the judged claims were measured at (conf/paper_scale.yaml), ours
beside it (data, images, crop, epochs, batch, steps, backbone and its parameters, compute), the verdicts per paper,
and what a verdict at this scale does and does not say about the papers' own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.config import compose_config
from pipeline.reproduce.paper_scale import PaperScale, scale_for
from pipeline.reproduce.suites import SUITES
from pipeline.reproduce.verdict_table import ClaimRow, counts


@dataclass(frozen=True)
class OurScale:
    data: str
    train_images: int
    image_size: int
    epochs: int
    batch_size: int
    steps: int
    backbone: str  # as the config builds it ("resnet18, width 16, CIFAR stem")
    params_m: float
    wall_minutes: float  # the suite's recorded runs' wall-clock minutes, all seeds and arms (a lower bound)


def backbone_params(model: Mapping) -> int:
    """The backbone's parameters, built as the runs build it (the classifier is Identity)."""
    from pipeline.models.backbones import build_backbone  # torch: only when a card is written

    return sum(p.numel() for p in build_backbone(dict(model)).parameters())


def our_scale(suite: str, scale: Sequence[str], arms: Mapping[str, Mapping[int, Mapping]]) -> OurScale:
    """The suite's baseline arm as `scale` configures it, and the minutes its recorded runs took."""
    cfg = compose_config([*SUITES[suite][0][1], *scale])
    data, train, model = cfg["data"], cfg["train"], cfg["model"]
    images = int((data.get("generate") or {}).get("n_train") or 0)
    per_epoch = images // train["batch_size"]  # full batches (pipeline/train/prepare.py drops the last)
    stem = ", CIFAR stem" if model.get("cifar_stem") and not str(model["backbone"]).startswith("vit") else ""
    recorded = (float(run.get("minutes") or 0.0) for runs in arms.values() for run in runs.values())
    minutes = sum(m for m in recorded if m == m)  # a nan (no time recorded) counts as none
    return OurScale(
        data=data["name"],
        train_images=images,
        image_size=int(data["image_size"]),
        epochs=int(train["epochs"]),
        batch_size=int(train["batch_size"]),
        steps=int(train["epochs"]) * per_epoch,
        backbone=f"{model['backbone']}, width {model['width']}{stem}",
        params_m=backbone_params(model) / 1e6,
        wall_minutes=minutes,
    )


def _n(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def card(rows: Sequence[ClaimRow], ours: Mapping[str, OurScale], machine: str) -> list[str]:
    """The card's lines: a row per paper setting behind the judged claims, ours below it; then the verdicts."""
    lines = [
        "| paper: setting (claims) | data | train images | crop px | epochs | batch | steps | backbone (params) | "
        "compute |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    settings: dict[tuple[str, str], tuple[PaperScale, set[str], set[str]]] = {}
    unset: set[str] = set()  # claims of another claims_dir (the tests' smoke claims) that paper_scale.yaml lacks
    for r in rows:
        try:
            s = scale_for(r.claim.seed_file, r.claim.source)
        except ValueError:
            unset.add(f"{r.claim.seed_file.removesuffix('-paper.txt')} {r.claim.source}")
            continue
        _, sources, suites = settings.setdefault((s.seed_file, s.setting), (s, set(), set()))
        sources.add(r.claim.source)
        suites.add(r.claim.suite)
    for _, (paper, sources, suites) in sorted(settings.items()):
        lines.append(
            f"| {paper.seed_file.removesuffix('-paper.txt')}: {paper.setting} ({', '.join(sorted(sources))}) | "
            f"{paper.data} | {paper.train_images:,} | {paper.image_size} | {paper.epochs} | {paper.batch_size} | "
            f"{paper.steps:,} | {paper.backbone} ({paper.backbone_params_m:.1f} M) | {paper.hardware or '—'} |"
        )
        for suite in sorted(suites):
            o = ours[suite]
            ratio = paper.steps * paper.batch_size / max(1, o.steps * o.batch_size)
            lines.append(
                f"| ours: suite `{suite}` | {o.data} | {o.train_images:,} | {o.image_size} | {o.epochs} | "
                f"{o.batch_size} | {o.steps:,} (the paper sees {_n(ratio)}× the images) | {o.backbone} "
                f"({o.params_m:.2f} M) | at least {o.wall_minutes:,.0f} wall-clock minutes over every arm and seed "
                f"(a run resumed from its checkpoint records its last part only), {machine} |"
            )
    if unset:
        lines += ["", f"No paper setting in conf/paper_scale.yaml for: {', '.join(sorted(unset))}."]
    lines += ["", "| paper | " + " | ".join(VERDICT_ORDER) + " |", "| --- |" + " --- |" * len(VERDICT_ORDER)]
    for paper_file, per in sorted(counts(rows).items()):
        cells = " | ".join(str(per.get(v, 0)) for v in VERDICT_ORDER)
        lines.append(f"| {paper_file.removesuffix('-paper.txt')} | {cells} |")
    return lines


VERDICT_ORDER = (
    "reproduced",
    "reproduced, smaller than the paper's gain",
    "contradicted",
    "equivalent",
    "excludes the paper's gain",
    "inconclusive",
    "unhealthy",
)

# what a verdict here says: one plain sentence, printed under the card
MEANING = (
    "A verdict here is about these runs: a method's change at a few hundred steps of a small network on 32 px "
    "images, against the papers' hundreds of thousands of steps of a ResNet-50 on ImageNet; it cannot confirm or "
    "refute a paper's ImageNet number, only say whether the change it describes shows at this scale, and an "
    '"unhealthy" arm (a seed that does not beat random init, or diverged) is not evidence either way.'
)
