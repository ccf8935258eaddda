"""jobs/reproductions.py: check the command line (suites, sweeps and their arguments, downstream steps; one line,
before MLflow or torch's work), run each suite's pretraining and downstream steps, then the sweeps, then write the
report."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import ConfigError, cli, fail
from pipeline.reproduce import ledger
from pipeline.reproduce.downstream import run_downstream
from pipeline.reproduce.report import report_sections, write_report
from pipeline.reproduce.runs import run_one
from pipeline.reproduce.suites import PAPER_SWEEPS, SUITES
from pipeline.reproduce.sweeps import run_sweep_for_report
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
    scale, results, seeded = list(cfg["scale"]), {}, {}
    # absolute: a Tune trial records its run from a working folder of Tune's
    kept = ledger.folder_for(Path(cfg["out"]).absolute()) if cfg["ledger"] else None
    if concurrent > 1:
        # Ray loads when runs are trained, not when the command line is checked
        from pipeline.reproduce.parallel import train_all

        jobs = [
            (
                f"{label}, seed {s}" if seeds > 1 else label,
                [*ov, *pinned(s, seeds)],
                scale,
                list(cfg["extra"].get(suite) or []),
                s == 0 and i == 0,
            )
            for s in range(seeds)
            for suite in cfg["suites"]
            for i, (label, ov) in enumerate(SUITES[suite])
        ]
        train_all(jobs, concurrent, kept, downstream)  # below, every run is found finished and read back
    for suite in cfg["suites"]:
        extra = list(cfg["extra"].get(suite) or [])
        seeded[suite] = run_seeds(suite, seeds, scale, extra, downstream, kept)
        results[suite] = [arm[0] for arm in seeded[suite].values()]  # seed 0: the per-run tables
    sweeps = [run_sweep_for_report(name, sweep_args[name]) for name in cfg["sweeps"]]
    out, claims, judged = Path(cfg["out"]), [], None
    if seeds > 1 and kept is not None:  # every suite the report shows, this command's and those kept from before
        claims, judged = _claims(
            list(cfg["suites"]), dict(cfg["extra"]), cfg["claims"], out, kept, seeds, scale, downstream, argv
        )
    write_report(results, scale, out, sweeps, downstream, judged, claims, seeds)
    return 0


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
    root = Path(claims_dir)
    root = root if root.is_absolute() else Path(__file__).resolve().parents[2] / root
    rows, commands, arms_of = judged_claims(kept, shown, seeds, scale, extra, downstream, argv, root)
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
    suite: str, seeds: int, scale: list[str], extra: list[str], downstream: dict, kept: Path | None = None
) -> dict[str, dict]:
    """Every arm of the suite at seeds 0..seeds-1 (seed=s: the same data order and initialisation for every arm),
    a seed's arms together so that an interrupted run leaves whole pairs; returns label -> {seed: results}. One
    seed is the suite as it always ran (no seed= added: the same runs, reused). Each run done is recorded in the
    ledger folder `kept` (pipeline.reproduce.ledger), and a run recorded there is read from it."""
    arms: dict[str, dict] = {label: {} for label, _ in SUITES[suite]}
    for s in range(seeds):
        runs = [
            run_one(label, [*ov, *pinned(s, seeds)], scale, extra, kept, downstream, baseline=s == 0 and i == 0)
            for i, (label, ov) in enumerate(SUITES[suite])
        ]
        run_downstream(runs, downstream, random_baseline=s == 0, done=lambda r: ledger.record(kept, r, downstream))
        for (label, _), r in zip(SUITES[suite], runs):
            arms[label][s] = r
    return arms


def pinned(seed: int, seeds: int) -> list[str]:
    """The seed's override: none for a single seed (the suite's runs as they always were, reused)."""
    return [f"seed={seed}"] if seeds > 1 else []
