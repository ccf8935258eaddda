"""Every run the committed ledger holds is found under the name today's config gives it: a change to a config's
layout that renames runs (a plug-in's new metadata key, a table moved from code to yaml) would make the report's
next rebuild train them all again. Such a change migrates the ledger in the same commit."""

import json
from pathlib import Path

from pipeline.config import compose_config
from pipeline.reproduce.ladder import budget_extra, budget_scale
from pipeline.reproduce.runs import applicable
from pipeline.reproduce.suites import SUITES
from pipeline.train.prepare import run_name

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "reproductions_runs"


def test_every_ledger_entry_is_found_under_its_current_name():
    defaults = compose_config([], config_name="reproductions")
    scale = list(defaults["scale"])
    suites_of = {}
    for suite, arms in SUITES.items():
        for label, overrides in arms:
            suites_of.setdefault((label, tuple(overrides)), suite)
    entries = sorted(LEDGER.glob("*.json"))
    assert len(entries) >= 76
    lost = []
    for path in entries:
        entry = json.loads(path.read_text())
        pinned = list(entry["overrides"])
        arm = tuple(o for o in pinned if not o.startswith("seed="))
        label, budget = entry["label"].split(", seed ")[0], []
        if (label, arm) not in suites_of:  # a ladder's run: "<arm>, <the budget's overrides>, seed <s>"
            label, _, said = label.rpartition(", ")
            budget = said.split(" ")
        suite = suites_of[(label, arm)]
        extra = budget_extra(defaults["extra"].get(suite) or [], budget)
        at = budget_scale(scale, budget)
        extra = applicable(pinned, at, extra)
        name = run_name(compose_config([*pinned, *at, *extra]))
        if name != path.stem or entry["run_name"] != name:
            lost.append(f"{path.stem} ({entry['label']}) is now {name}")
        # the entry alone says how to train it again (`python jobs/pretrain.py <overrides> <scale> <extra>`): its
        # recorded scale and extra are the ones that name it, and its label names its seed
        if (entry.get("scale"), entry["extra"]) != (at, extra):
            said = f"scale {entry.get('scale')} and extra {entry['extra']}"
            lost.append(f"{path.stem}: recorded {said}, where {at} and {extra} name it")
        seed = [o.split("=", 1)[1] for o in pinned if o.startswith("seed=")]
        if seed and not entry["label"].endswith(f", seed {seed[0]}"):
            lost.append(f"{path.stem}: its label {entry['label']!r} does not name seed {seed[0]}")
    assert not lost, lost
