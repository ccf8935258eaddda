"""Issue #51 in jobs/reproductions.py: the primary claims' arms at more seeds than the rest (primary_seeds), and one
claim's scale ladder (pipeline/reproduce/ladder.py), its Ladder section built from the ledger with nothing trained;
the wall-clock limit a call runs under (stop_after_minutes, pipeline/reproduce/time_limit.py); bad values of these
keys answered in one line."""

from __future__ import annotations

import math
import re
import sys
import types

import pytest
from scipy import stats as st

from helpers import smoke_claims
from pipeline.config import compose_config
from pipeline.reproduce import job, ledger
from pipeline.reproduce.claim_specs import load_claims
from pipeline.reproduce.ladder import Rung, budget_scale, parse_ladder, rungs, trend
from pipeline.reproduce.runs import applicable
from pipeline.reproduce.suites import SUITES
from pipeline.reproduce.time_limit import STOPPED, TimeLimit, TimeUp, parse_limit
from pipeline.reproduce.verdict_table import judge_claim
from pipeline.train.prepare import run_name

TARGETS = ("m", "b", "sigma", "f_r")


def _scale(tmp_path) -> list[str]:
    return [f"paths.root={tmp_path}", "data.generate.n_train=64", "data.generate.n_val=32", "train.batch_size=32"]


def _record(kept, label, overrides, scale, mse, minutes=1.0):
    """A fabricated run of the smoke suite (Spirograph: the probe's MSEs, random init's far worse) in the ledger."""
    name = run_name(compose_config([*overrides, *scale]))
    pretrained = {**{f"mse_{t}": mse for t in TARGETS}, **{f"r2_{t}": 0.5 for t in TARGETS}}
    probe = {"pretrained": pretrained, "random": {**pretrained, **{f"mse_{t}": 1.0 for t in TARGETS}}}
    run = {"run_name": name, "label": label, "run_id": None, "minutes": minutes, "probe": probe}
    ledger.record(kept, {**run, "overrides": overrides, "scale": scale, "extra": [], "downstream": {}}, {})


def _no_training(monkeypatch):
    """run_one (train or read MLflow) and the Tune batch fail if called: everything must come from the ledger."""

    def boom(*args, **kwargs):
        raise AssertionError(f"trained: {args[:1]}")

    monkeypatch.setattr(job, "run_one", boom)
    monkeypatch.setitem(sys.modules, "pipeline.reproduce.parallel", types.SimpleNamespace(train_all=boom))


def test_primary_seeds_go_on_for_the_arms_a_primary_claim_compares_only(tmp_path):
    labels = ["MoCo v2", "MoCo v2 + CLSA", "MoCo v2 + CLSA* (multi-crop)"]
    plan = job.seed_plan(labels, 3, 5, {"MoCo v2", "MoCo v2 + CLSA"})
    assert plan == [(label, s) for s in range(3) for label in labels] + [
        ("MoCo v2", 3),
        ("MoCo v2 + CLSA", 3),
        ("MoCo v2", 4),
        ("MoCo v2 + CLSA", 4),
    ]
    every = [(label, s) for s in range(3) for label in labels]
    assert job.seed_plan(labels, 3, 0, {"MoCo v2"}) == every  # 0: off
    assert job.seed_plan(labels, 3, 3, {"MoCo v2"}) == every  # no more than seeds: off
    assert job.seed_plan(labels, 1, 8, {"MoCo v2"}) == [(label, 0) for label in labels]  # unseeded: off
    # the arms come from each suite's primary claims; a suite without claims adds none
    assert job.primary_arms(["smoke", "vit"], smoke_claims(tmp_path / "claims")) == {
        "smoke": {"SimCLR", "SimCLR, τ=0.2"},
        "vit": set(),
    }


def test_a_rerun_trains_only_the_pairs_the_ledger_lacks_and_loads_no_ray_when_none(tmp_path, monkeypatch):
    scale, kept = _scale(tmp_path), tmp_path / "docs" / "reproductions_runs"
    (base, ov0), (_, ov1) = SUITES["smoke"]
    _record(kept, base, [*ov0, "seed=0"], scale, 0.1)
    jobs = [(base, [*ov0, "seed=0"], scale, [], False), (base, [*ov1, "seed=1"], scale, [], False)]
    trained = []
    monkeypatch.setitem(
        sys.modules, "pipeline.reproduce.parallel", types.SimpleNamespace(train_all=lambda j, *a: trained.extend(j))
    )
    assert job.train_missing(jobs, 2, kept, {}) == jobs[1:] and trained == jobs[1:]
    _no_training(monkeypatch)
    assert job.train_missing(jobs[:1], 2, kept, {}) == []  # all recorded: no Tune batch


CLAIM = """\
  - id: {id}
    variant: "{variant}"
    baseline: MoCo v2
    metric: probe top-1
    direction: 1
    source: Table 2
    paper: {{baseline: 0.6, variant: 0.7, units: "made-up top-1"}}
    quote: "made up"
    gain: null
    sesoi: 0.001
    sesoi_why: a made-up margin
    differs: a test of the seeds' bookkeeping
"""
CLSA_CLAIMS = (
    "paper: {file: made-up.txt, title: made up}\nclaims:\n"
    + CLAIM.format(id="clsa-made-up", variant="MoCo v2 + CLSA").replace(
        "    gain:", "    primary: true\n    why_primary: made up\n    gain:"
    )
    + CLAIM.format(id="clsa-star-made-up", variant="MoCo v2 + CLSA* (multi-crop)")
)


def test_a_primary_claim_is_judged_on_all_its_seeds_and_the_others_on_the_seeds_both_arms_have(tmp_path):
    """clsa's arms under made-up claims: MoCo v2 and CLSA at four seeds (primary_seeds), CLSA* at two; the primary
    claim judged on four, the exploratory one sharing the baseline on two, by a command of two seeds."""
    from pipeline.reproduce.summary import judged_claims

    root = tmp_path / "claims"
    root.mkdir()
    (root / "clsa.yaml").write_text(CLSA_CLAIMS)
    scale, kept = _scale(tmp_path), tmp_path / "runs"
    for i, (label, overrides) in enumerate(SUITES["clsa"]):
        for s in range(2 if i == 2 else 4):
            top1 = 0.6 + 0.01 * s + 0.02 * i + 0.001 * s * i
            name = run_name(compose_config([*overrides, f"seed={s}", *scale]))
            probe = {"pretrained": {"top1": top1}, "random": {"top1": 0.2}}
            run = {"run_name": name, "label": label, "run_id": None, "minutes": 1.0, "probe": probe}
            ledger.record(kept, {**run, "overrides": overrides, "scale": scale, "extra": []}, {})
    rows, commands, arms = judged_claims(kept, ["clsa"], 2, scale, {}, {}, ["seeds=2"], root)
    n = {r.claim.id: r.verdict.diff.n for r in rows}
    assert n == {"clsa-made-up": 4, "clsa-star-made-up": 2}
    assert {label: sorted(a) for label, a in arms["clsa"].items()} == {
        "MoCo v2": [0, 1, 2, 3],
        "MoCo v2 + CLSA": [0, 1, 2, 3],
        "MoCo v2 + CLSA* (multi-crop)": [0, 1],
    }


def _rung(claim, budget, minutes, logs, seeds=3):
    """A budget's rung whose variant's MSE is its baseline's times exp(logs[s]) at seed s."""
    arms = {claim.baseline: {}, claim.variant: {}}
    for s in range(seeds):
        base = 0.1 + 0.01 * s
        for label, mse in ((claim.baseline, base), (claim.variant, base * math.exp(logs[s]))):
            arms[label][s] = {
                "probe": {
                    "pretrained": {f"mse_{t}": mse for t in TARGETS},
                    "random": {f"mse_{t}": 1.0 for t in TARGETS},
                }
            }
    # steps proportional to the budget's epochs; the minutes as noisy as wall-clock time is (never the axis)
    epochs = int(budget.split("=")[1])
    return Rung(
        budget, 10 * epochs, minutes * 2 * seeds * (1.5 if epochs == 2 else 1), 2 * seeds, judge_claim(claim, arms)
    )


def _ends_said(lo: list[float], hi: list[float], word: str) -> str:
    """The trend sentence's end, computed here from scipy: Welch's t on the two ends' per-seed log ratios."""
    t = st.ttest_ind(hi, lo, equal_var=False)
    ci = t.confidence_interval(0.95)
    change = sum(hi) / len(hi) - sum(lo) / len(lo)
    assert (t.pvalue < 0.05) == (word == "beyond")
    return (
        f"the difference changes by {change:.4g} [{ci.low:.4g}, {ci.high:.4g}] from the smallest budget to the "
        f"largest (Welch's t on the per-seed differences, {len(lo)} and {len(hi)} seeds: p = {t.pvalue:.2g}), "
        f"{word} the seeds' noise."
    )


def test_the_gap_opens_or_closes_as_the_numbers_say(tmp_path):
    (claim,) = load_claims("smoke", smoke_claims(tmp_path / "claims"))  # MSE: lower is better, log ratios
    opens = [
        _rung(claim, "train.epochs=1", 1.0, [-0.010, -0.012, -0.011]),
        _rung(claim, "train.epochs=2", 2.0, [-0.10, -0.11, -0.09]),
        _rung(claim, "train.epochs=4", 4.0, [-0.30, -0.31, -0.29]),
    ]
    said = trend(opens, claim.direction)
    assert said.startswith("The gap opens with the budget: |difference| 0.011 at train.epochs=1 and 0.3 at ")
    assert "per doubling of steps per run), on the paper's side of 0 at the largest budget; " in said
    assert said.endswith(_ends_said([-0.010, -0.012, -0.011], [-0.30, -0.31, -0.29], "beyond"))
    # over log2 of 10, 20 and 40 steps per run, printed to three digits
    slope = float(re.search(r"least-squares slope ([-+0-9.e]+) per doubling", said)[1])
    assert slope == pytest.approx(st.linregress([0, 1, 2], [0.011, 0.1, 0.3]).slope, abs=1e-3)
    closes = [
        _rung(claim, "train.epochs=1", 1.0, [-0.3, 0.1, -0.5]),
        _rung(claim, "train.epochs=4", 4.0, [0.05, -0.02, 0.03]),
    ]
    said = trend(closes, claim.direction)
    assert said.startswith("The gap closes with the budget: |difference| 0.2333 at train.epochs=1 and 0.02 at ")
    assert "(it changes sign)" in said and "against the paper's direction at the largest budget" in said
    assert said.endswith(_ends_said([-0.3, 0.1, -0.5], [0.05, -0.02, 0.03], "within"))
    flat = [_rung(claim, "train.epochs=1", 1.0, [-0.1] * 3), _rung(claim, "train.epochs=4", 4.0, [0.0] * 3)]
    assert trend(flat, claim.direction).endswith("so the change cannot be told from noise.")
    assert trend(closes[:1], claim.direction).startswith("Fewer than two budgets")


def test_the_ladder_section_comes_from_a_ledger_holding_every_budget_with_nothing_trained(tmp_path, monkeypatch):
    """The smoke suite's made-up claim at three budgets, two seeds each, all recorded; the command (seeds=2, the
    scale at 2 epochs: the middle budget's runs are the suite's own; primary_seeds=3) trains nothing, judges the
    primary claim on three seeds and writes the Ladder section:
    a row per budget with its steps, wall-clock minutes, the paired difference (log ratio) and verdict, the plot, and
    the sentence computed from them."""
    scale, out = [*_scale(tmp_path), "train.epochs=2"], tmp_path / "docs" / "reproductions.md"
    kept = ledger.folder_for(out)
    gaps = {1: [-0.02, -0.03], 2: [-0.2, -0.25], 4: [-0.5, -0.6]}  # log ratio per seed, by epochs
    (base, ov0), (variant, ov1) = SUITES["smoke"]
    for epochs, logs in gaps.items():
        at = budget_scale(scale, [f"train.epochs={epochs}"])
        for s in range(2):
            mse = 0.1 + 0.01 * s
            _record(kept, base, [*ov0, f"seed={s}"], at, mse, minutes=0.5 * epochs)
            _record(kept, variant, [*ov1, f"seed={s}"], at, mse * math.exp(logs[s]), minutes=0.5 * epochs + 0.1)
    # primary_seeds=3: the smoke claim is primary, so both its arms go on to seed 2 (recorded too)
    _record(kept, base, [*ov0, "seed=2"], scale, 0.12, minutes=1.0)
    _record(kept, variant, [*ov1, "seed=2"], scale, 0.12 * math.exp(-0.22), minutes=1.1)
    _no_training(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["reproductions.py", "suites=[smoke]", "seeds=2"])
    ladder = "{claim:smoke-tau,budgets:[['train.epochs=1'],['train.epochs=2'],['train.epochs=4']],seeds:2}"
    argv = ["suites=[smoke]", "seeds=2", "concurrent=2", "sweeps=[]", "downstream=null", f"out={out}"]
    argv += [f"claims_dir={smoke_claims(tmp_path / 'claims')}", "primary_seeds=3", f"ladder={ladder}"]
    argv += ["scale=[" + ",".join(f"'{o}'" for o in scale) + "]"]
    assert job.main(argv) == 0
    text = out.read_text()
    section = text.split("## Ladder\n", 1)[1]
    assert text.index("## smoke") < text.index("## Ladder") and "## Claims" in text
    (claim,) = [ln for ln in text.splitlines() if ln.startswith("| `smoke-tau`: SimCLR, τ=0.2 vs SimCLR | primary |")]
    assert "| ok | reproduced, smaller than the paper's gain (3 seeds; " in claim, claim  # on all three seeds
    assert "Scale ladder of `smoke-tau` (SimCLR, τ=0.2 vs SimCLR, probe MSE m, log ratio)" in section
    assert "seeds 0..1, trained without downstream steps, but for `train.epochs=2`: the scale's own budget" in section
    # each budget judged alone: the two small ones' intervals exclude the paper's halving (log 0.5), the largest's not
    verdicts = {1: "excludes the paper's gain", 2: "excludes the paper's gain", 4: "inconclusive"}
    for epochs, logs in gaps.items():
        ci = st.ttest_1samp(logs, 0).confidence_interval(0.95)
        cpu = 4 * 0.5 * epochs + 0.2  # two runs of each arm
        steps = epochs * 2  # 64 images in batches of 32
        row = f"| `train.epochs={epochs}` | {steps} | {cpu:.1f} (4; {cpu / 4:.2f}) | "
        row += f"{sum(logs) / 2:.4g} [{ci.low:.4g}, {ci.high:.4g}] | {verdicts[epochs]} (2 seeds; "
        assert row in section, section
    (said,) = [ln for ln in section.splitlines() if ln.startswith("The gap ")]
    assert said.startswith("The gap opens with the budget: |difference| 0.025 at train.epochs=1 and 0.55 at ")
    assert said.endswith(_ends_said(gaps[1], gaps[4], "within")), said
    assert "![smoke-tau: the difference against compute](img/reproductions-ladder-smoke-tau.png)" in section
    assert (out.parent / "img" / "reproductions-ladder-smoke-tau.png").stat().st_size > 10_000
    # a command that did not run the ladder (here: one that wrote only the sweeps) keeps the section as it was
    from pipeline.reproduce.report import write_report

    write_report({}, [], out, [])
    assert out.read_text().split("## Ladder\n", 1)[1] == section


@pytest.mark.parametrize(
    "args,needle",
    [
        (["primary_seeds=-1"], "error: primary_seeds=-1: expected an integer >= 0"),
        (["primary_seeds=true"], "error: primary_seeds=True: expected an integer >= 0"),
        (["ladder.claim=nope"], "error: ladder.claim='nope': unknown claim id; known: ["),
        (["ladder.claim=co2-det-ap50"], "error: ladder.claim=co2-det-ap50: a downstream metric; the ladder probes"),
        (["ledger=false"], "error: seeds=2 with ledger=false: the seeded claims are judged on the runs the ledger"),
        (["ladder.budgets=['train.epochs=6']"], "error: ladder.budgets=['train.epochs=6']: expected a non-empty list"),
        (["ladder.budgets=[[epochs]]"], "error: ladder.budgets=[['epochs']]: expected a non-empty list of lists"),
        (["ladder.budgets=[]"], "error: ladder.budgets=[]: expected a non-empty list of lists of key=value"),
        (["ladder.seeds=1"], "error: ladder.seeds=1: expected an integer >= 2"),
        (["ladder=5"], "error: ladder=5: expected null or a mapping of claim, budgets and seeds"),
    ],
)
def test_bad_primary_seeds_or_ladder_fail_in_one_line_before_anything_runs(args, needle, monkeypatch, capsys):
    _no_training(monkeypatch)
    with pytest.raises(SystemExit) as e:
        job.main(["suites=[]", "sweeps=[]", "seeds=2", *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(needle) and len(err.splitlines()) == 1, err


def test_parse_ladder_reads_the_shipped_default():
    cfg = compose_config([], "reproductions")
    ladder = parse_ladder(cfg["ladder"], {"co2": load_claims("co2")})
    assert ladder is not None and ladder.claim.id == "co2-linear" and ladder.claim.primary and ladder.seeds >= 2
    assert ("train.epochs=12",) in ladder.budgets and "train.epochs=12" in cfg["scale"]  # the scale's runs reused
    assert budget_scale(cfg["scale"], ["train.epochs=12"]) == cfg["scale"]
    assert parse_ladder(None, {}) is None


def test_a_budget_wins_over_the_suites_extra_overrides_of_the_same_key():
    from pipeline.reproduce.ladder import Ladder, ladder_runs

    (claim,) = [c for c in load_claims("co2") if c.id == "co2-linear"]
    ladder = Ladder(claim, (("train.epochs=6",), ("train.epochs=24",)), 2)
    extra = ["train.epochs=3", "eval.knn.every=0", "plugin.co2.alpha=2"]  # the last: the variant's only
    runs = ladder_runs(ladder, SUITES["co2"], ["train.epochs=12", "seed=0"], extra)
    assert {r.budget for r in runs} == {0, 1} and len(runs) == 2 * 2 * 2
    for r in runs:
        assert r.extra == ["eval.knn.every=0", "plugin.co2.alpha=2"]  # the budget's key left out
        keys = applicable(r.overrides, r.scale, r.extra)
        epochs = compose_config([*r.overrides, *r.scale, *keys])["train"]["epochs"]
        assert epochs == (6, 24)[r.budget]
    # each rung's steps from the baseline's config, with the plug-in's key (which it cannot take) left out
    base = compose_config([*SUITES["co2"][0][1]])
    per_epoch = base["data"]["generate"]["n_train"] // base["train"]["batch_size"]
    got = [r.steps for r in rungs(ladder, runs, [{"minutes": 1.0} for _ in runs], SUITES["co2"])]
    assert got == [6 * per_epoch, 24 * per_epoch]


def test_only_a_budget_changing_neither_the_scale_nor_the_suites_extra_is_called_the_suites_own_runs():
    from pipeline.reproduce.ladder import Ladder, _downstream

    (claim,) = [c for c in load_claims("co2") if c.id == "co2-linear"]
    ladder = Ladder(claim, (("train.epochs=6",), ("train.epochs=12",), ("eval.knn.every=2",)), 2)
    scale = ["train.epochs=12", "eval.knn.every=4"]
    said = _downstream(ladder, scale, ["plugin.co2.alpha=2"])
    assert said.startswith("trained without downstream steps, but for `train.epochs=12`: the scale's own budget")
    # a suite whose extra sets the budget's key: the budget's runs drop it, so they are not the suite's runs
    assert _downstream(ladder, scale, ["train.epochs=3"]) == "trained without downstream steps"


@pytest.mark.parametrize("value", [0, -5, True, "'6h'", "inf"])
def test_a_bad_time_limit_fails_in_one_line_before_anything_runs(value, monkeypatch, capsys):
    _no_training(monkeypatch)
    with pytest.raises(SystemExit) as e:
        job.main(["suites=[]", "sweeps=[]", "seeds=2", f"stop_after_minutes={value}"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: stop_after_minutes=") and len(err.splitlines()) == 1, err
    assert "expected null or a number of minutes > 0" in err
    with pytest.raises(SystemExit):  # the next call goes on from the ledger: a limit without one is refused
        job.main(["suites=[]", "sweeps=[]", "stop_after_minutes=60", "ledger=false"])
    assert "with ledger=false: the next call goes on from the ledger's runs" in capsys.readouterr().err


def test_the_time_limit_counts_wall_clock_minutes_from_the_command_start():
    now = [100.0]
    limit = TimeLimit(1.5, clock=lambda: now[0])
    assert limit.left_s() == 90.0 and not limit.reached()
    limit.check("a run")  # time left: nothing raised
    now[0] += 89.5
    assert limit.left_s() == 0.5
    now[0] += 1.0
    assert limit.left_s() == 0.0 and limit.reached()
    with pytest.raises(TimeUp, match=r"stop_after_minutes=1.5 reached before a run"):
        limit.check("a run")
    assert TimeLimit(None).left_s() is None and not TimeLimit(None).reached()
    assert parse_limit(None) is None and parse_limit(360) == 360.0 and parse_limit(0.5) == 0.5


def _seed0_recorded(tmp_path):
    """The smoke suite's two arms at seed 0 in the ledger; seed 1 not yet."""
    scale, kept = _scale(tmp_path), tmp_path / "docs" / "reproductions_runs"
    (base, ov0), (variant, ov1) = SUITES["smoke"]
    _record(kept, base, [*ov0, "seed=0"], scale, 0.1)
    _record(kept, variant, [*ov1, "seed=0"], scale, 0.08)
    return scale, kept


def _argv(tmp_path, scale, out, *more):
    argv = ["suites=[smoke]", "seeds=2", "sweeps=[]", "downstream=null", f"out={out}", "primary_seeds=0", *more]
    argv += [f"claims_dir={smoke_claims(tmp_path / 'claims')}", "scale=[" + ",".join(f"'{o}'" for o in scale) + "]"]
    return argv


def test_a_reached_limit_stops_before_the_next_run_and_the_report(tmp_path, monkeypatch, capsys):
    """One process (concurrent=1): seed 0 is read from the ledger; the limit, reached by then, stops the command
    before seed 1's first run trains and before the report, saying how many runs are left; it exits 75 (EX_TEMPFAIL:
    not failed, not done). Without the limit the same command goes on to train seed 1."""
    scale, kept = _seed0_recorded(tmp_path)
    out = kept.parent / "reproductions.md"
    _no_training(monkeypatch)
    argv = _argv(tmp_path, scale, out, "ladder=null")
    assert job.main([*argv, "stop_after_minutes=1e-9"]) == STOPPED == 75
    said = capsys.readouterr().out
    assert "[reproductions] 2 run(s) not yet in the ledger; no training starts after 1e-09 minutes" in said
    assert "stop_after_minutes=1e-09 reached before SimCLR, seed 1: 2 run(s) not yet in the ledger; the report" in said
    assert said.count("; reusing its results") == 2 and not out.exists()
    with pytest.raises(AssertionError, match="trained: .'SimCLR, seed 1',"):  # no limit: seed 1 trains
        job.main(argv)


def test_a_limit_reached_stops_before_tune_the_ladder_or_a_sweep_and_counts_what_is_left(tmp_path, monkeypatch, capsys):
    """The limit (reached at once) where each part of the command would start: the Tune batch (concurrent=2), the
    ladder's first run (the suite's runs all recorded; the ladder's four counted), a sweep (the sweeps named)."""
    scale, kept = _seed0_recorded(tmp_path)
    out = kept.parent / "reproductions.md"
    _no_training(monkeypatch)
    argv = _argv(tmp_path, scale, out, "stop_after_minutes=1e-9")
    assert job.main([*argv, "concurrent=2", "ladder=null"]) == STOPPED
    said = capsys.readouterr().out
    assert "reached before 2 run(s) as Tune trials: 2 run(s) not yet in the ledger; the report" in said
    (base, ov0), (variant, ov1) = SUITES["smoke"]
    _record(kept, base, [*ov0, "seed=1"], scale, 0.1)
    _record(kept, variant, [*ov1, "seed=1"], scale, 0.08)
    assert job.main([*argv, "ladder={claim:smoke-tau,budgets:[['train.epochs=1']],seeds:2}"]) == STOPPED
    said = capsys.readouterr().out
    assert "reached before SimCLR, train.epochs=1, seed 0: 4 run(s) not yet in the ledger; the report" in said
    monkeypatch.setattr(job, "run_sweep_for_report", lambda *a: pytest.fail("a sweep ran past the limit"))
    sweeps = ["suites=[]", "sweeps=[temperature,clsa_beta]", f"out={out}", "stop_after_minutes=1e-9"]
    assert job.main(sweeps) == STOPPED and not out.exists()
    said = capsys.readouterr().out
    assert "reached before sweep temperature: 0 run(s) not yet in the ledger and the sweeps ['temperature', " in said


def test_tune_trials_get_the_time_left_and_a_limit_reached_with_runs_unrecorded_stops(tmp_path, monkeypatch):
    scale, kept = _seed0_recorded(tmp_path)
    (base, ov0), (variant, ov1) = SUITES["smoke"]
    jobs = [(label, [*ov, f"seed={s}"], scale, [], False) for s in (0, 1) for label, ov in SUITES["smoke"]]
    now, given = [0.0], []

    def train_all(todo, concurrent, kept_, downstream, budget):  # Tune ran to its budget: one run recorded of two
        given.append((len(todo), budget))
        now[0] += 600
        _record(kept, base, [*ov0, "seed=1"], scale, 0.1)

    monkeypatch.setitem(sys.modules, "pipeline.reproduce.parallel", types.SimpleNamespace(train_all=train_all))
    with pytest.raises(TimeUp, match=r"stop_after_minutes=10 reached with 1 Tune trial\(s\) unfinished"):
        job.train_missing(jobs, 2, kept, {}, TimeLimit(10, clock=lambda: now[0]))
    assert given == [(2, 600.0)]  # seed 1's two runs, and the whole 10 minutes
    job.train_missing(jobs, 2, kept, {}, TimeLimit(None))  # no limit: no time budget for Tune
    assert given[1] == (1, None)

    # every run recorded when Tune ends at its budget: nothing left, so the command goes on to the report
    def all_recorded(*args):
        now[0] += 600
        _record(kept, variant, [*ov1, "seed=1"], scale, 0.08)

    monkeypatch.setattr(sys.modules["pipeline.reproduce.parallel"], "train_all", all_recorded)
    limit = TimeLimit(10, clock=lambda: now[0])
    assert job.train_missing(jobs, 2, kept, {}, limit) == jobs[3:] and limit.reached()
    with pytest.raises(TimeUp, match="reached before 1 run"):  # spent before Tune starts: no trial at all
        job.train_missing(jobs[:1] + [(variant, [*ov1, "seed=2"], scale, [], False)], 2, kept, {}, TimeLimit(1e-9))


def test_train_all_hands_the_time_left_to_tune_as_its_time_budget(tmp_path, monkeypatch):
    """parallel.train_all's Tuner gets stop_after_minutes' seconds left as TuneConfig.time_budget_s (Tune then stops
    every trial); without a limit, none. Ray itself is not started: the Tuner is a stand-in that keeps its config."""
    from pipeline.reproduce import parallel

    kept: list = []

    class Tuner:
        def __init__(self, trainable, param_space, tune_config, run_config):
            kept.append(tune_config)

        def fit(self):
            return []

    monkeypatch.setattr(parallel, "resolve", lambda cfg: cfg["run"].__setitem__("name", run_name(cfg)))
    monkeypatch.setattr(parallel, "finished_run", lambda store, name: None)
    monkeypatch.setattr(parallel, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr(parallel.ray.tune, "with_parameters", lambda f, **k: f)
    monkeypatch.setattr(parallel.ray.tune, "with_resources", lambda f, r: f)
    monkeypatch.setattr(parallel.ray.tune, "Tuner", Tuner)
    (label, overrides), _ = SUITES["smoke"]
    jobs = [(label, [*overrides, "seed=0"], _scale(tmp_path), [], False)]
    parallel.train_all(jobs, 2, None, {}, 600.0)
    parallel.train_all(jobs, 2, None, {})
    assert [c.time_budget_s for c in kept] == [600.0, None]
    assert all(isinstance(c, parallel.ray.tune.TuneConfig) and c.max_concurrent_trials == 2 for c in kept)
