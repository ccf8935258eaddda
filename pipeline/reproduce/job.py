"""jobs/reproductions.py: check the command line (suites, sweeps and their arguments, downstream steps; one line,
before MLflow or torch's work), run each suite's pretraining and downstream steps, then the sweeps, then write the
report."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from pipeline.config import ConfigError, cli, compose_config, fail
from pipeline.cores import limit_torch_threads
from pipeline.reproduce import ledger
from pipeline.reproduce.claim_specs import all_claims, load_claims
from pipeline.reproduce.downstream import run_downstream
from pipeline.reproduce.ladder import Ladder, ladder_runs, ladder_section, parse_ladder, rungs
from pipeline.reproduce.report import report_sections, write_report
from pipeline.reproduce.runs import applicable, recorded, run_one
from pipeline.reproduce.suites import PAPER_SWEEPS, SUITES
from pipeline.reproduce.sweeps import run_sweep_for_report
from pipeline.reproduce.time_limit import STOPPED, TimeLimit, TimeUp, parse_limit
from pipeline.train.prepare import run_name
from pipeline.tune.settings import check_sweep, compose_sweep
from pipeline.tune.space import parse_space


def main(argv: list[str], description: str = "") -> int:
    cfg = cli(argv, description or __doc__ or "", config_name="reproductions")
    unknown = sorted(set(cfg["suites"]) - set(SUITES))
    if unknown:
        fail(f"unknown suites {unknown}; known: {sorted(SUITES)}")
    unknown = sorted(set(cfg["sweeps"]) - set(PAPER_SWEEPS))
    if unknown:
        fail(f"unknown sweeps {unknown}; known: {sorted(PAPER_SWEEPS)}")
    seeds, concurrent = cfg["seeds"], cfg["concurrent"]
    for key, n in (("seeds", seeds), ("concurrent", concurrent)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            fail(f"{key}={n}: expected an integer >= 1")
    sweep_args = {}
    for name in cfg["sweeps"]:  # bad sweep_args fail now, not after the suites have trained
        try:
            sweep_args[name] = seeded_sweep_args(name, list(cfg["sweep_args"]), seeds)
            check_sweep(*compose_sweep([f"+sweep={name}", *sweep_args[name]]))
        except ConfigError as e:
            fail(f"sweep {name}: {e}")
    downstream = {job: list(args) for job, args in (cfg["downstream"] or {}).items()}
    if set(downstream) - {"finetune", "detect"}:
        fail(f"downstream: {sorted(downstream)}: expected finetune and/or detect")
    if any(a.startswith("baseline=") for args in downstream.values() for a in args):
        fail("downstream: baseline= is set here (random init beside each suite's first run)")
    if not isinstance(cfg["ledger"], bool):
        fail(f"ledger={cfg['ledger']}: expected true or false")
    if seeds > 1 and not cfg["ledger"]:  # the claims are judged on the ledger's runs
        fail(f"seeds={seeds} with ledger=false: the seeded claims are judged on the runs the ledger records")
    primary, ladder = _planned(cfg["primary_seeds"], cfg["ladder"], cfg["claims_dir"], list(cfg["suites"]), seeds)
    try:
        limit = TimeLimit(parse_limit(cfg["stop_after_minutes"]))
    except ValueError as e:
        fail(str(e))
    if limit.minutes is not None and not cfg["ledger"]:  # the next call goes on from the ledger
        fail(f"stop_after_minutes={limit.minutes:g} with ledger=false: the next call goes on from the ledger's runs")
    scale, results = list(cfg["scale"]), {}
    limit_torch_threads()  # concurrent=1 trains, probes and evaluates in this process
    # absolute: a Tune trial records its run from a working folder of Tune's
    kept = ledger.folder_for(Path(cfg["out"]).absolute()) if cfg["ledger"] else None
    plans = {
        suite: seed_plan([label for label, _ in SUITES[suite]], seeds, cfg["primary_seeds"], primary.get(suite, ()))
        for suite in cfg["suites"]
    }
    jobs = suite_jobs(plans, seeds, scale, dict(cfg["extra"]))
    if ladder is not None and not (seeds > 1 and ladder.claim.suite in cfg["suites"]):
        ladder = None
    if limit.minutes is not None:
        _log(
            f"{_left(jobs, ladder, scale, dict(cfg['extra']), kept, downstream)} run(s) not yet in the ledger; no "
            f"training starts after {limit.minutes:g} minutes (stop_after_minutes)"
        )
    sweeps: list[dict] = []
    try:
        if concurrent > 1:
            train_missing(jobs, concurrent, kept, downstream, limit)  # below, every run is found finished, read back
        for suite in cfg["suites"]:
            extra = list(cfg["extra"].get(suite) or [])
            seeded = run_seeds(suite, seeds, scale, extra, downstream, kept, plans[suite], limit)
            results[suite] = [arm[0] for arm in seeded.values()]  # seed 0: the per-run tables
        ladder_lines = None
        if ladder is not None:
            extra = list(cfg["extra"].get(ladder.claim.suite) or [])
            ladder_lines = run_ladder(ladder, scale, extra, concurrent, kept, Path(cfg["out"]), limit)
        for name in cfg["sweeps"]:  # a sweep, once started, runs to its end (a stopped one: Tune restores it)
            limit.check(f"sweep {name}")
            sweeps.append(run_sweep_for_report(name, sweep_args[name]))
    except TimeUp as e:  # the ledger keeps every finished run; on the same store a stopped one resumes
        left = _left(jobs, ladder, scale, dict(cfg["extra"]), kept, downstream)
        rest = list(cfg["sweeps"])[len(sweeps) :]
        _log(
            f"{e}: {left} run(s) not yet in the ledger{f' and the sweeps {rest}' if rest else ''}; the report is "
            f"written once all are done: run the same command again to go on (exit {STOPPED})"
        )
        return STOPPED
    out, claims, judged = Path(cfg["out"]), [], None
    if seeds > 1 and kept is not None:  # every suite the report shows, this command's and those kept from before
        claims, judged = _claims(
            list(cfg["suites"]), dict(cfg["extra"]), cfg["claims_dir"], out, kept, seeds, scale, downstream, argv
        )
    write_report(results, scale, out, sweeps, downstream, judged, claims, seeds, ladder_lines)
    return 0


def _log(msg: str) -> None:
    print(f"[reproductions] {msg}", flush=True)


def suite_jobs(
    plans: dict[str, list[tuple[str, int]]], seeds: int, scale: list[str], extra: dict
) -> list[tuple[str, list[str], list[str], list[str], bool]]:
    """Every run the suites' `plans` ask for as (label, overrides, scale, extra, whether it carries the suite's
    random-init baseline), seed by seed across the suites (a stable sort keeps each seed's suites and arms in order)."""
    ordered = sorted(((su, la, s) for su, plan in plans.items() for la, s in plan), key=lambda j: j[2])
    return [
        (
            f"{label}, seed {s}" if seeds > 1 else label,
            [*dict(SUITES[suite])[label], *pinned(s, seeds)],
            scale,
            list(extra.get(suite) or []),
            s == 0 and label == SUITES[suite][0][0],
        )
        for suite, label, s in ordered
    ]


def _left(jobs: list, ladder: Ladder | None, scale: list[str], extra: dict, kept: Path | None, downstream: dict) -> int:
    """How many of the suites' `jobs` and the ladder's runs the ledger `kept` does not hold complete, by run name
    (a run two suites share counts once; one finished in MLflow but without its downstream steps counts)."""
    runs = [(*j[:4], downstream, j[4]) for j in jobs]
    if ladder is not None:
        named = ladder_named(ladder, scale, list(extra.get(ladder.claim.suite) or []))
        runs += [(name, r.overrides, r.scale, r.extra, {}, False) for name, r in named]
    missing = set()
    for label, overrides, at, more, down, baseline in runs:
        try:
            name = run_name(compose_config([*overrides, *at, *applicable(overrides, at, more)]))
        except ConfigError as e:
            fail(f"{label}: {e}")
        if ledger.find(kept, name, down, baseline) is None:
            missing.add(name)
    return len(missing)


def claims_root(claims: str) -> Path:
    """The `claims_dir` key's folder (relative: to the project's root). Not `claims`: Hydra reads that name as the
    config group conf/claims/ and refuses to set it from the command line."""
    root = Path(claims)
    return root if root.is_absolute() else Path(__file__).resolve().parents[2] / root


def _planned(
    primary_seeds: object, ladder: object, claims_dir: str, suites: list[str], seeds: int
) -> tuple[dict[str, set[str]], Ladder | None]:
    """The `primary_seeds` and `ladder` keys checked (one line, before anything runs): each of this command's
    suites' arms a primary claim uses (where primary_seeds adds seeds), and the ladder."""
    n = primary_seeds
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        fail(f"primary_seeds={n}: expected an integer >= 0 (0, or at most seeds: off)")
    root = claims_root(claims_dir)
    try:
        claims = all_claims(root) if ladder is not None else {}
        primary = primary_arms(suites, root) if seeds > 1 and n > seeds else {}
    except ValueError as e:
        fail(f"claims_dir={claims_dir}: {e}")
    try:
        return primary, parse_ladder(ladder, claims)
    except ValueError as e:
        fail(str(e))


def primary_arms(suites: Sequence[str], root: Path) -> dict[str, set[str]]:
    """suite -> the arms its primary claims (conf/claims, `primary: true`) compare."""
    return {
        suite: {label for c in load_claims(suite, root) if c.primary for label in (c.variant, c.baseline)}
        for suite in suites
    }


def seed_plan(labels: Sequence[str], seeds: int, primary_seeds: int, primary: Collection[str]) -> list[tuple[str, int]]:
    """The (arm, seed) pairs a suite's command runs, seed by seed, a seed's arms in the suite's order: every arm at
    seeds 0..seeds-1, then, where the command is seeded (seeds >= 2), the arms in `primary` (those a primary claim
    compares) on to primary_seeds-1 (none where primary_seeds <= seeds)."""
    upto = primary_seeds if seeds > 1 and primary_seeds > seeds else seeds
    return [(label, s) for s in range(upto) for label in labels if s < seeds or label in primary]


def train_missing(
    jobs: list[tuple[str, list[str], list[str], list[str], bool]],
    concurrent: int,
    kept: Path | None,
    downstream: dict,
    limit: TimeLimit | None = None,
) -> list[tuple[str, list[str], list[str], list[str], bool]]:
    """The jobs (parallel.train_all's) not recorded complete in the ledger `kept`, trained `concurrent` at a time as
    Ray Tune trials; Ray loads only where one is left. Returns them. Under a `limit`, Tune stops every trial when it
    is reached (on the same store each resumes from its checkpoint next time), and TimeUp is raised where a job is
    left unrecorded."""
    limit = limit or TimeLimit(None)
    todo = [j for j in jobs if recorded(*j[:4], kept, downstream, j[4], say=False) is None]
    if todo:
        limit.check(f"{len(todo)} run(s) as Tune trials")
        from pipeline.reproduce.parallel import train_all  # Ray: loaded when runs are trained, not when checked

        left_s = limit.left_s()
        train_all(todo, concurrent, kept, downstream, None if left_s is None else max(1.0, left_s))  # 0: no budget
        left = [j for j in todo if recorded(*j[:4], kept, downstream, j[4], say=False) is None]
        if left and limit.reached():
            raise TimeUp(f"stop_after_minutes={limit.minutes:g} reached with {len(left)} Tune trial(s) unfinished")
    return todo


def ladder_named(ladder: Ladder, scale: list[str], extra: list[str]) -> list:
    """The ladder's runs (ladder.ladder_runs), each with its label: arm, budget and seed."""
    runs = ladder_runs(ladder, SUITES[ladder.claim.suite], scale, extra)
    return [(f"{r.label}, {' '.join(ladder.budgets[r.budget])}, seed {r.seed}", r) for r in runs]


def run_ladder(
    ladder: Ladder,
    scale: list[str],
    extra: list[str],
    concurrent: int,
    kept: Path | None,
    out: Path,
    limit: TimeLimit | None = None,
) -> list[str]:
    """The ladder's runs (no downstream steps), each read from the ledger or trained through run_one and recorded
    there; returns the report's Ladder section. TimeUp before a run would start training past the `limit`."""
    limit = limit or TimeLimit(None)
    named = ladder_named(ladder, scale, extra)
    runs = [r for _, r in named]
    if concurrent > 1:
        jobs = [(name, r.overrides, r.scale, r.extra, False) for name, r in named]
        train_missing(jobs, concurrent, kept, {}, limit)
    results = []
    for name, r in named:
        got = recorded(name, r.overrides, r.scale, r.extra, kept)
        if got is None:
            limit.check(name)
            got = run_one(name, r.overrides, r.scale, r.extra, kept)
            ledger.record(kept, got, {})
        results.append(got)
    return ladder_section(ladder, rungs(ladder, runs, results, SUITES[ladder.claim.suite]), scale, out, extra)


def _claims(
    suites: list[str],
    extra: dict,
    claims_dir: str,
    out: Path,
    kept: Path,
    seeds: int,
    scale: list[str],
    downstream: dict,
    argv: list[str],
):
    """The Claims section (scale card, table) over every suite the report shows, the per-seed CSV beside the report,
    and each of this command's suites' judged rows for its own section."""
    # scipy, statsmodels and torch (the card counts the backbones' parameters): for a seeded report only
    from pipeline.reproduce.scale_card import MEANING, card, our_scale
    from pipeline.reproduce.summary import claims_section, judged_claims
    from pipeline.reproduce.verdict_table import write_csv

    before = report_sections(out.read_text()) if out.exists() else {}
    shown = [s for s in SUITES if s in suites or s in before]
    rows, commands, arms_of = judged_claims(kept, shown, seeds, scale, extra, downstream, argv, claims_root(claims_dir))
    ours = {s: our_scale(s, scale, arms) for s, arms in arms_of.items()}
    csv_path = out.with_name(out.stem + "_claims.csv")
    write_csv(rows, csv_path)
    card_lines = [*card(rows, ours, "2-core CPU machines"), "", MEANING]
    judged = {s: [r for r in rows if r.claim.suite == s] for s in suites}
    return claims_section(rows, commands, card_lines, csv_path.name), judged


def seeded_sweep_args(name: str, args: list[str], seeds: int) -> list[str]:
    """The sweep's arguments, with sweep.seeds=`seeds` where seeds >= 2, the arguments do not set it, the sweep's
    searched keys are all grids and it draws one sample of each (a drawn value would differ from seed to seed: such
    a sweep runs unseeded, and says so). An ASHA sweep runs FIFO when seeded (ASHA would stop the weak seeds)."""
    if seeds < 2 or any(a.lstrip("+").startswith("sweep.seeds=") for a in args):
        return args
    sweep = compose_sweep([f"+sweep={name}", *args])[0]["sweep"]
    drawn = [d.key for d in parse_space(sweep["space"]) if d.kind != "grid"]
    why = f"{drawn[0]} is drawn at random" if drawn else None
    why = why or (f"sweep.num_samples={sweep['num_samples']}" if sweep["num_samples"] != 1 else None)
    if why:
        print(f"[reproductions] sweep {name}: unseeded ({why}, not one grid)", flush=True)
        return args
    if sweep["scheduler"] != "fifo":
        print(f"[reproductions] sweep {name}: seeded, so FIFO instead of {sweep['scheduler']}", flush=True)
        args = [*args, "sweep.scheduler=fifo"]
    return [*args, f"sweep.seeds={seeds}"]


def run_seeds(
    suite: str,
    seeds: int,
    scale: list[str],
    extra: list[str],
    downstream: dict,
    kept: Path | None = None,
    plan: Sequence[tuple[str, int]] | None = None,
    limit: TimeLimit | None = None,
) -> dict[str, dict]:
    """The suite's (arm, seed) pairs of `plan` (seed_plan's; by default every arm at seeds 0..seeds-1), seed=s: the
    same data order and initialisation for every arm, a seed's arms together so that an interrupted run leaves whole
    pairs; returns label -> {seed: results}. One seed is the suite as it always ran (no seed= added: the same runs,
    reused). Each run done is recorded in the ledger folder `kept` (pipeline.reproduce.ledger), and a run recorded
    there is read from it. Under a `limit`, TimeUp where it is reached before a run would start training: a run under
    way finishes; a seed's arms that finished before it wait in MLflow (read back, their downstream steps run and
    recorded, by the next call on the same store)."""
    limit = limit or TimeLimit(None)
    arms: dict[str, dict] = {label: {} for label, _ in SUITES[suite]}
    plan = seed_plan(list(arms), seeds, 0, ()) if plan is None else plan
    first, overrides = SUITES[suite][0][0], dict(SUITES[suite])
    for s in sorted({s for _, s in plan}):
        labels = [label for label, seed in plan if seed == s]
        every = [
            (
                f"{label}, seed {s}" if seeds > 1 else label,
                [*overrides[label], *pinned(s, seeds)],
                scale,
                extra,
                kept,
                downstream,
                s == 0 and label == first,
            )
            for label in labels
        ]
        runs = []
        for args in every:
            got = recorded(*args)
            if got is None:
                limit.check(args[0])
            runs.append(got or run_one(*args))
        run_downstream(runs, downstream, random_baseline=s == 0, done=lambda r: ledger.record(kept, r, downstream))
        for label, r in zip(labels, runs):
            arms[label][s] = r
    return arms


def pinned(seed: int, seeds: int) -> list[str]:
    """The seed's override: none for a single seed (the suite's runs as they always were, reused)."""
    return [f"seed={seed}"] if seeds > 1 else []
