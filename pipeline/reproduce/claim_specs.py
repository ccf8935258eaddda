"""The papers' claims as data (conf/claims/<suite>.yaml), declared before the runs: which arm of a suite each claim
is about, on which metric and in which direction, with the paper's numbers, the table or figure that prints them
and a verbatim quote of it (tests/reproduce/test_paper_numbers.py holds them to the seed text). Pure: yaml and the
suites' arm labels only, no torch, Ray or MLflow."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.reproduce.suites import SUITES

CLAIMS_DIR = Path(__file__).resolve().parents[2] / "conf" / "claims"
# the metrics a claim may name, as pipeline/reproduce/claims.py's rows name them
METRICS = (
    "probe top-1",
    "probe MSE m",
    "probe MSE b",
    "probe MSE sigma",
    "probe MSE f_r",
    "probe mean MSE",
    "conditional variance V",
    "alpha regression MSE",
    "fine-tuning top-1",
    "fine-tuning top-5",
    "fine-tuning R²",
    "detection AP",
    "detection AP50",
)
# positive metrics where lower is better and the papers' changes are relative (an MSE 2 to 500 times the paper's at
# this scale): judged on log(variant / baseline), their `sesoi` a relative change in (0, 1)
LOG_METRICS = frozenset(m for m in METRICS if "MSE" in m or m == "conditional variance V")
SOURCE = re.compile(r"(Table|Fig\.) \d+")  # as the papers number them: "Table 4", "Fig. 6"
CLAIM_KEYS_REQUIRED = {"id", "variant", "baseline", "metric", "direction", "source", "paper", "quote", "gain"}
CLAIM_KEYS_REQUIRED |= {"sesoi", "sesoi_why", "differs"}
CLAIM_KEYS_OPTIONAL = {"primary", "why_primary", "note", "representation"}
# the variant's representation: the arm's own ("plain"), or the same arm's feature-averaged one (InvCLR's test-time
# averaging over M transformed copies), which compares an arm with itself
REPRESENTATIONS = ("plain", "averaged")
FILE_KEYS = {"paper", "claims", "not_tested"}


@dataclass(frozen=True)
class PaperNumbers:
    baseline: float | None  # None only for a figure-only claim (then `shape` says what the figure shows)
    variant: float | None
    units: str
    shape: str = ""


@dataclass(frozen=True)
class Claim:
    suite: str
    id: str
    variant: str  # arm labels exactly as in SUITES[suite]
    baseline: str
    metric: str  # one of METRICS
    direction: int  # +1: the paper claims the variant raises it; -1: lowers it
    source: str  # "Table N" / "Fig. N", as the paper numbers it
    paper: PaperNumbers
    quote: str  # verbatim from the seed text (whitespace aside), holding the numbers
    primary: bool
    why_primary: str
    gain: float | None  # the paper's gain in our metric's units, or None where the units do not carry over
    sesoi: float  # smallest effect of interest in our units (equivalence test)
    sesoi_why: str
    differs: str  # where our row's metric, dataset, backbone or protocol differs from the paper's
    representation: str  # the variant's: "plain", or "averaged" (the same arm's feature-averaged probe)
    note: str  # e.g. a reconstructed cell and what it was reconstructed from
    seed_file: str  # the paper: its file in shared/seeds/ and its title
    title: str


@dataclass(frozen=True)
class NotTested:
    """A claim the paper makes that the suite's arms cannot test, and why."""

    suite: str
    source: str
    quote: str
    why: str
    seed_file: str


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: {value!r} is not a number")
    return float(value)


def _text(entry: dict, key: str, what: str, required: bool = True) -> str:
    value = entry.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ValueError(f"{what}: `{key}` must be a non-empty string")
    return " ".join(value.split())


def _claim(suite: str, entry: Any, seed_file: str, title: str, where: str) -> Claim:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: a claim must be a mapping, got {entry!r}")
    what = f"{where}: claim {entry.get('id', '?')!r}"
    missing = CLAIM_KEYS_REQUIRED - set(entry)
    unknown = set(entry) - CLAIM_KEYS_REQUIRED - CLAIM_KEYS_OPTIONAL
    if missing or unknown:
        raise ValueError(f"{what}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    arms = [label for label, _ in SUITES[suite]]
    for key in ("variant", "baseline"):
        if entry[key] not in arms:
            raise ValueError(f"{what}: {key} {entry[key]!r} is not an arm of suite {suite!r} ({arms})")
    representation = entry.get("representation", "plain")
    if representation not in REPRESENTATIONS:
        raise ValueError(f"{what}: representation {representation!r} is not one of {list(REPRESENTATIONS)}")
    if (entry["variant"] == entry["baseline"]) != (representation == "averaged"):
        raise ValueError(
            f"{what}: variant and baseline are the same arm exactly when the variant is its averaged representation"
        )
    if entry["metric"] not in METRICS:
        raise ValueError(f"{what}: unknown metric {entry['metric']!r} (one of {list(METRICS)})")
    if isinstance(entry["direction"], bool) or entry["direction"] not in (1, -1):
        raise ValueError(f"{what}: direction must be +1 or -1, got {entry['direction']!r}")
    source = _text(entry, "source", what)
    if not SOURCE.fullmatch(source):
        raise ValueError(f"{what}: source {source!r} is not 'Table N' or 'Fig. N'")
    numbers = entry["paper"]
    if not isinstance(numbers, dict) or {"baseline", "variant", "units"} - set(numbers):
        raise ValueError(f"{what}: `paper` must map baseline, variant and units")
    if unknown := set(numbers) - {"baseline", "variant", "units", "shape"}:
        raise ValueError(f"{what}: `paper` has unknown keys {sorted(unknown)}")
    paper = PaperNumbers(
        _number(numbers["baseline"], f"{what}: paper.baseline"),
        _number(numbers["variant"], f"{what}: paper.variant"),
        _text(numbers, "units", f"{what}: paper"),
        _text(numbers, "shape", f"{what}: paper", required=False),
    )
    if (paper.baseline is None or paper.variant is None) and not (source.startswith("Fig.") and paper.shape):
        raise ValueError(f"{what}: null paper numbers only for a figure-only claim (source 'Fig. N' and a `shape`)")
    primary = entry.get("primary", False)
    if not isinstance(primary, bool):
        raise ValueError(f"{what}: primary must be true or false")
    sesoi = _number(entry["sesoi"], f"{what}: sesoi")
    if sesoi is None or sesoi <= 0 or (entry["metric"] in LOG_METRICS and sesoi >= 1):
        raise ValueError(f"{what}: sesoi must be a positive number (a relative change below 1 for MSE and V)")
    gain = _number(entry["gain"], f"{what}: gain")
    if gain is not None and gain * entry["direction"] <= 0:
        raise ValueError(f"{what}: gain {gain} does not lie on the claim's side (direction {entry['direction']})")
    return Claim(
        suite=suite,
        id=_text(entry, "id", what),
        variant=entry["variant"],
        baseline=entry["baseline"],
        metric=entry["metric"],
        direction=entry["direction"],
        source=source,
        paper=paper,
        quote=_text(entry, "quote", what),
        primary=primary,
        why_primary=_text(entry, "why_primary", what, required=primary),
        gain=gain,
        sesoi=sesoi,
        sesoi_why=_text(entry, "sesoi_why", what),
        differs=_text(entry, "differs", what),
        representation=representation,
        note=_text(entry, "note", what, required=False),
        seed_file=seed_file,
        title=title,
    )


def _read(path: Path) -> tuple[list[Claim], list[NotTested]]:
    suite = path.stem
    if suite not in SUITES:
        raise ValueError(f"{path.name}: {suite!r} is not a suite of SUITES ({sorted(SUITES)})")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or set(data) - FILE_KEYS or not {"paper", "claims"} <= set(data):
        raise ValueError(f"{path.name}: expected the keys paper, claims (and not_tested), got {data!r:.80}")
    paper = data["paper"]
    if not isinstance(paper, dict) or set(paper) != {"file", "title"}:
        raise ValueError(f"{path.name}: `paper` must map file (the seed file's name) and title")
    seed_file, title = _text(paper, "file", path.name), _text(paper, "title", path.name)
    if not isinstance(data["claims"], list) or not data["claims"]:
        raise ValueError(f"{path.name}: `claims` must be a non-empty list")
    claims = [_claim(suite, entry, seed_file, title, path.name) for entry in data["claims"]]
    untested = []
    for entry in data.get("not_tested") or []:
        if not isinstance(entry, dict) or set(entry) != {"source", "quote", "why"}:
            raise ValueError(f"{path.name}: a not_tested entry maps source, quote and why, got {entry!r:.80}")
        source = _text(entry, "source", f"{path.name}: not_tested")
        if not SOURCE.fullmatch(source):
            raise ValueError(f"{path.name}: not_tested source {source!r} is not 'Table N' or 'Fig. N'")
        quote, why = _text(entry, "quote", path.name), _text(entry, "why", path.name)
        untested.append(NotTested(suite, source, quote, why, seed_file))
    return claims, untested


def _read_all(root: Path) -> dict[str, tuple[list[Claim], list[NotTested]]]:
    """Every suite's file under `root`, checked together: ids unique across files, one (variant, baseline, metric)
    per claim, exactly one primary claim per paper (a paper's claims may span suites, as JointCrop's do)."""
    read = {path.stem: _read(path) for path in sorted(root.glob("*.yaml"))}
    claims = [c for cs, _ in read.values() for c in cs]
    if ids := [i for i, n in Counter(c.id for c in claims).items() if n > 1]:
        raise ValueError(f"duplicate claim ids: {ids}")
    rows = Counter((c.suite, c.variant, c.baseline, c.metric, c.representation) for c in claims)
    if same := [r for r, n in rows.items() if n > 1]:
        raise ValueError(f"more than one claim for the same suite, arms and metric: {same}")
    titles: dict[str, set[str]] = {}
    for c in claims:
        titles.setdefault(c.seed_file, set()).add(c.title)
    if clash := {f: sorted(t) for f, t in titles.items() if len(t) > 1}:
        raise ValueError(f"one paper, several titles: {clash}")
    for seed_file in titles:
        primaries = [c.id for c in claims if c.seed_file == seed_file and c.primary]
        if len(primaries) != 1:
            raise ValueError(f"{seed_file}: {len(primaries)} primary claims {primaries}, expected exactly one")
    return read


def load_claims(suite: str, root: Path = CLAIMS_DIR) -> list[Claim]:
    """The suite's claims (none for a suite without a file, such as vit or smoke), after checking every file under
    `root` (the one-primary-per-paper rule spans files)."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} (one of {sorted(SUITES)})")
    read = _read_all(root)
    return read[suite][0] if suite in read else []


def load_not_tested(suite: str, root: Path = CLAIMS_DIR) -> list[NotTested]:
    """The claims the paper makes that the suite's arms cannot test, each with why."""
    read = _read_all(root)
    return read[suite][1] if suite in read else []


def all_claims(root: Path = CLAIMS_DIR) -> dict[str, list[Claim]]:
    """suite -> its claims, for every suite with a file under `root`."""
    return {suite: claims for suite, (claims, _) in _read_all(root).items()}
