"""jobs/evaluate.py: a suite of downstream evaluations (conf/suite/) run one after another in this process, each
through its own job's checks and run (linear probe, kNN, fine-tuning, detection), each a child run of the
pretraining run. Resumable: a step that finished before prints its results and runs nothing, so rerunning an
interrupted suite continues at the first unfinished step. This module is the light part (the suites, their steps,
the checks, the summary); the run, which reads the pretraining run from MLflow, is pipeline.eval.suite_run's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pipeline.config import ConfigError, JobError, compose_config, config_options
from pipeline.eval import EVALUATIONS
from pipeline.registry import RegistryError
from pipeline.store import Store


class SuiteError(Exception):
    """Bad input, or a step that failed: one line for the user."""


def suites() -> list[str]:
    return config_options("suite")


@dataclass(frozen=True)
class SuiteRun:
    """jobs/evaluate.py's settings, typed once `check` has passed."""

    source: str  # run: the pretraining run, an MLflow run id or a checkpoint
    suite: Mapping[str, Any]  # +suite=<name> composed: its name, and its steps (none for `paper`, picked by the run)
    size: str  # cpu or paper
    extra: Mapping[str, Mapping[str, Any]]  # extra.<job>: settings for every step of that job
    skip: tuple[str, ...]
    paths: Mapping[str, str]  # paths.*, handed to every step
    store: Store  # tracking.* and paths.runs, handed to every step
    verbose: bool = False


def check(cfg: dict) -> SuiteRun:
    """The suite's command line, checked and typed: SuiteError with one line."""
    try:
        EVALUATIONS.paths()  # an installed package's evaluation that takes a built-in's name: one line
    except RegistryError as e:
        raise SuiteError(str(e)) from None
    s = cfg.get("suite")
    if not isinstance(s, dict):
        raise SuiteError(f"pick the evaluations with +suite=<name>: one of {', '.join(suites())}")
    if cfg["size"] not in ("cpu", "paper"):
        raise SuiteError(f"size={cfg['size']}: expected one of cpu, paper")
    extra = cfg["extra"]
    if not isinstance(extra, dict) or any(k not in EVALUATIONS or not isinstance(v, dict) for k, v in extra.items()):
        raise SuiteError(
            f"extra={extra}: expected settings under {', '.join(f'extra.{j}' for j in EVALUATIONS)}, "
            f"e.g. +extra.detect.device=cuda"
        )
    if not isinstance(cfg["skip"], list):
        raise SuiteError(f"skip={cfg['skip']}: expected a list of step names, e.g. skip=[detection]")
    return SuiteRun(
        source=str(cfg["run"]),
        suite=s,
        size=cfg["size"],
        extra=extra,
        skip=tuple(cfg["skip"]),
        paths=dict(cfg["paths"]),
        store=Store.of(cfg),
        verbose=bool(cfg.get("verbose")),
    )


def pick(name: str, plugins: Iterable[str], augment: Mapping[str, Any]) -> str:
    """The suite `paper` stands for, given the run's plug-ins and recipe: the plug-in's paper (the suite of the
    plug-in's name, conf/suite/<name>.yaml, for the first of its plug-ins that has one), JointCrop's with a joint
    sampler on, else standard."""
    if name != "paper":
        return name
    named = [p for p in plugins if p in suites()]
    if named:
        return named[0]
    joint = augment.get("joint") or {}
    if any(isinstance(v, dict) and v.get("beta") is not None for v in joint.values()):
        return "jointcrop"
    return "standard"


def steps(run: SuiteRun, suite: dict) -> list[tuple[str, str, list[str]]]:
    """(step name, job, its command line) in order: the run, the paths and store, the step's arguments, those of
    this size, then extra.<job>. SuiteError naming a skip that matches no step."""
    names = [s["name"] for s in suite["steps"]]
    unknown = [n for n in run.skip if n not in names]
    if unknown:
        raise SuiteError(
            f"skip={list(run.skip)}: {unknown[0]!r} is no step of suite {suite['name']} ({', '.join(names)})"
        )
    common = [
        *(f"paths.{k}={v}" for k, v in run.paths.items()),
        f"verbose={str(run.verbose).lower()}",
        f"tracking.uri={_value(run.store.uri)}",
        f"tracking.experiment={_value(run.store.experiment)}",
    ]
    out = []
    for s in suite["steps"]:
        if s["name"] in run.skip:
            continue
        if s["job"] not in EVALUATIONS:
            raise SuiteError(
                f"suite {suite['name']}, step {s['name']!r}: job {s['job']!r} is none of {', '.join(EVALUATIONS)}"
            )
        argv = [
            f"run={run.source}",
            *common,
            *s.get("args", []),
            *s.get(run.size, []),
            *overrides(run.extra.get(s["job"]) or {}),
        ]
        out.append((s["name"], s["job"], argv))
    return out


def overrides(settings: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Nested settings as the job's command line: {"detect": {"iterations": 2}} -> ["detect.iterations=2"]."""
    out = []
    for k, v in settings.items():
        if isinstance(v, dict):
            out += overrides(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={_value(v)}")
    return out


def _value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def load_suite(name: str) -> dict:
    """conf/suite/<name>.yaml, composed."""
    return compose_config([f"+suite={name}"], "evaluate_suite")["suite"]


def run_step(job: str, argv: list[str], dry: bool = False) -> dict:
    """One evaluation through its own checks and run, in this process; SuiteError with its one line. `dry`: the
    checks only."""
    try:
        evaluation = EVALUATIONS[job]()
        typed = evaluation.job(evaluation.compose(argv))
        return {} if dry else evaluation.run(typed)
    except (JobError, ConfigError, RegistryError) as e:
        raise SuiteError(str(e)) from None


HEADLINE = ("top1", "top5", "r2", "mse", "knn_top1", "knn_r2", "AP", "AP50")


def summary(suite: dict, done: list[dict]) -> str:
    """A markdown table: a row per step, the headline metrics of the pretrained backbone and of random init."""
    lines = [
        f"## {suite['name']}: {suite.get('paper', '')}",
        "",
        "| step | metric | pretrained | random init | minutes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for d in done:
        res = d["results"] or {}
        pre, rnd = res.get("pretrained") or {}, res.get("random") or {}
        keys = [k for k in HEADLINE if k in pre] or list(pre)[:1]
        for k in keys:
            r = f"{rnd[k]:.4g}" if k in rnd else "-"
            lines.append(f"| {d['step']} | {k} | {pre[k]:.4g} | {r} | {d['minutes']:.1f} |")
    return "\n".join(lines)
