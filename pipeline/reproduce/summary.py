"""The report's first section: every claim of every suite the report shows, in one table (the paper's number, ours as
the paired difference and its 95 % interval, the verdict, the command), judged on the runs the ledger holds at this
command's scale and seeds. Built from the ledger rather than from this command's runs, so the table covers the
suites earlier commands (on other machines) ran as well."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import count
from pathlib import Path

from pipeline.config import ConfigError, compose_config
from pipeline.reproduce import ledger
from pipeline.reproduce.claims import judge_suite
from pipeline.reproduce.runs import applicable
from pipeline.reproduce.suites import NO_BASELINE, SUITES
from pipeline.reproduce.tables import fmt
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


def claims_section(
    kept: Path,
    suites: Iterable[str],
    seeds: int,
    scale: list[str],
    extras: dict[str, list[str]],
    downstream: dict[str, list[str]],
    argv: Sequence[str],
) -> list[str]:
    """The claims table over `suites` (each whose every arm has two seeds or more recorded); [] where none has."""
    rest = " ".join(a for a in argv if not a.startswith(("suites=", "seeds=")))
    rows = []
    for suite in suites:
        if suite in NO_BASELINE or suite not in SUITES:
            continue
        try:
            arms = recorded_arms(kept, suite, seeds, scale, list(extras.get(suite) or []), downstream)
        except ConfigError as e:  # a suite of an older report whose runs no longer compose: left out, said so
            print(f"[reproductions] claims: {suite} left out: {e}", flush=True)
            continue
        every = min(len(runs) for runs in arms.values()) if len(arms) == len(SUITES[suite]) else 0
        if every < 2:
            continue
        # the seeds every arm has: the command that makes this row (its own seeds, not this command's)
        command = f"`python jobs/reproductions.py suites=[{suite}] seeds={every}{' ' + rest if rest else ''}`"
        for r in judge_suite(suite, arms):
            d = r.judged.diff
            ours = f"{fmt(d.mean)} [{fmt(d.low)}, {fmt(d.high)}]" if d.n >= 2 else fmt(d.mean)
            rows.append(
                f"| {r.variant} vs {r.baseline} | {r.metric.name} | {r.paper or '—'} | {ours} | {r.judged.words()} | "
                f"{command} |"
            )
    if not rows:
        return []
    return [
        "Every claim of the suites below, judged on the runs recorded beside this report (`reproductions_runs/`) at "
        "the scale its sections give: ours is the mean of the per-seed differences, variant − baseline, with its "
        "95 % paired Student-t interval. An inconclusive verdict counts the seeds whose difference lies on the "
        "paper's side (a description, not a test: a sign test cannot decide at fewer than 6 seeds) and the seeds a "
        "power estimate asks for. Each suite's section has the arms' own means, the runs and the forest plot.",
        "",
        "| claim | metric | paper | ours: difference (95 %) | verdict | command |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
    ]
