"""The report's first section: the scale card and every declared claim of every suite the report shows, in one
table (the paper's numbers and how ours differ, ours as the paired difference and its 95 % interval, the health gate,
the adjusted verdict, the command), judged on the runs the ledger holds at this command's scale and seeds. Built from
the ledger rather than from this command's runs, so the table covers the suites earlier commands (on other machines)
ran as well."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import count
from pathlib import Path

from pipeline.config import ConfigError, compose_config
from pipeline.reproduce import ledger
from pipeline.reproduce.claim_specs import CLAIMS_DIR, load_claims
from pipeline.reproduce.runs import applicable
from pipeline.reproduce.suites import NO_BASELINE, SUITES
from pipeline.reproduce.verdict_table import ClaimRow, adjusted, judge_claim, table
from pipeline.train.prepare import run_name


def recorded_arms(
    kept: Path, suite: str, seeds: int, scale: list[str], extra: list[str], downstream: dict[str, list[str]]
) -> dict[str, dict[int, dict]]:
    """The suite's arms as the ledger holds them at this scale: label -> {seed: results}, the seeds found: seeds
    0..`seeds`-1 and on past them while any arm has the next (a suite an earlier command ran at more seeds keeps
    them)."""
    arms: dict[str, dict[int, dict]] = {}
    for s in count():
        found = False
        for label, overrides in SUITES[suite]:
            pinned = [*overrides, f"seed={s}"]
            entry = ledger.find(
                kept, run_name(compose_config([*pinned, *scale, *applicable(pinned, scale, extra)])), downstream, False
            )
            if entry is not None:
                arms.setdefault(label, {})[s] = ledger.as_result(kept, entry)
                found = True
        if s + 1 >= seeds and not found:
            return arms
    raise AssertionError("unreachable")  # count() does not end


def judged_claims(
    kept: Path,
    suites: Iterable[str],
    seeds: int,
    scale: list[str],
    extras: dict[str, list[str]],
    downstream: dict[str, list[str]],
    argv: Sequence[str],
    claims_root: Path = CLAIMS_DIR,
) -> tuple[list[ClaimRow], dict[str, str], dict[str, dict[str, dict[int, dict]]]]:
    """Every declared claim (conf/claims, or `claims_root`) of `suites` judged on the runs the ledger holds, with
    the report's adjustment (verdict_table.adjusted); the command that makes each suite's rows; the arms read."""
    rest = " ".join(a for a in argv if not a.startswith(("suites=", "seeds=")))
    rows, commands, arms_of = [], {}, {}
    for suite in suites:
        if suite in NO_BASELINE or suite not in SUITES:
            continue
        claims = load_claims(suite, claims_root)
        if not claims:
            continue
        try:
            arms = recorded_arms(kept, suite, seeds, scale, list(extras.get(suite) or []), downstream)
        except ConfigError as e:  # a suite of an older report whose runs no longer compose: left out, said so
            print(f"[reproductions] claims: {suite} left out: {e}", flush=True)
            continue
        judged = [r for c in claims if (r := judge_claim(c, arms)) is not None and r.verdict.diff.n >= 2]
        if not judged:
            continue
        # the seeds every arm has: the command that makes these rows (its own seeds, not this command's)
        every = min(len(runs) for runs in arms.values())
        commands[suite] = f"`python jobs/reproductions.py suites=[{suite}] seeds={every}{' ' + rest if rest else ''}`"
        rows += judged
        arms_of[suite] = arms
    return adjusted(rows), commands, arms_of


INTRO = (
    "The claims each paper makes that a suite's arms can test, declared before the runs in `conf/claims/` (the "
    "paper's table or figure, metric, direction and numbers, held to the papers' text by "
    "`tests/reproduce/test_paper_numbers.py`), judged on the runs recorded beside this report "
    "(`reproductions_runs/`; every per-seed value in `{csv}`). Ours is the mean per-seed difference, variant − "
    "baseline (of log values for MSE and V, whose papers' changes are ratios), with its 95 % paired Student-t "
    "interval. Each paper's one **primary** claim forms a family adjusted with Holm; every other row is "
    "**exploratory**, with its Benjamini–Hochberg q (pipeline/verdicts.py says why these two and not Dunnett or a "
    "mixed model). A decided verdict stands only where its adjusted p < 0.05. Verdicts: reproduced (the interval "
    "excludes 0 on the paper's side; \"smaller than the paper's gain\" where it also excludes the paper's gain), "
    "contradicted, equivalent (TOST within the claim's smallest effect of interest), excludes the paper's gain "
    "(the interval lies short of it, without excluding 0), inconclusive (also where the differences have no "
    "spread), and unhealthy: an arm with a seed that does not beat random init or diverged, never judged. "
    "\"Seeds the paper's gain needs\": a paired t test's seeds for 80 % power at the paper's own effect in our "
    "units and the spread pooled over the suite's rows of that metric (not the observed effect)."
)


def claims_section(
    rows: Sequence[ClaimRow], commands: dict[str, str], card_lines: Sequence[str], csv_name: str
) -> list[str]:
    """The report's first section: the scale card, then every judged claim, primary first; [] where none is."""
    if not rows:
        return []
    return [INTRO.format(csv=csv_name), "", *card_lines, "", *table(rows, commands)]
