"""docs/performance.md's text from a run's measurements: the step table (project against bare, cost against the
baseline), the view executor's table and the end-to-end one, each ratio against its target."""

from __future__ import annotations

import math
import shlex

from .data import SRC_H, SRC_W
from .rows import BASELINE, COST_TARGET, E2E_TARGET, EXECUTOR_RECIPES, EXECUTOR_TARGET, PROJECT_TARGET


def _fmt(x: float, spec: str = ".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else (" met" if ok else " NOT met")


def report(meta: dict, s: dict, steps: dict, executor: dict | None, e2e: dict | None) -> str:
    lines = [
        "# Performance",
        "",
        "Written by `benchmarks/gpu`; every ratio below comes from the one run described here. "
        "Rerun the command to refresh it.",
        "",
        f"- command: `{meta['command']}`",
        f"- device: {meta['device']}",
        f"- torch {meta['torch']}, torchvision {meta['torchvision']}, python {meta['python']}",
        f"- date: {meta['date']}",
        f"- step settings: {s['backbone']} width {s['width']}, {s['size']} px, batch {s['batch']}, "
        f"{meta['precision']} autocast, channels_last {meta['channels_last']}, cudnn.benchmark "
        f"{meta['cudnn_benchmark']}, torch CPU threads {meta['threads']}; {s['warmup']} warm-up steps, then "
        f"{s['rounds']} rounds of {s['iters']} timed steps per loop (bare and project in turn, best round "
        f"kept); MoCo: bn_splits 1, queue {s['queue']}; the ViT rows: "
        f"{'vit_tiny' if s['quick'] else 'ViT-S/16'}, their papers' recipes (AdamW, DINO's 2 + 6 crops)",
        "",
        "## Training step: the project's against a bare tuned loop",
        "",
        "images/s = samples per second (each sample is all of the row's views). project/bare: target >= "
        f"{PROJECT_TARGET}. Cost = the row's step time / its baseline framework's (project loop; the bare "
        "loop's in brackets).",
        "",
        "| row | framework | views | bare img/s | project img/s | project/bare | target | cost vs baseline "
        "| cost target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row, r in steps.items():
        ratio = r["project"] / r["bare"] if r["bare"] and not r["error"] else math.nan
        base = BASELINE.get(row)
        cost, cost_t = "–", "–"
        if base and base in steps and not r["error"] and not steps[base]["error"]:
            c = steps[base]["project"] / r["project"]
            cb = steps[base]["bare"] / r["bare"]
            target = COST_TARGET.get(row)
            cost = f"{c:.3f}x vs {base} ({cb:.3f}x)"
            cost_t = f"<= {target}x{_verdict(c <= target)}" if target else "–"
        elif base:
            cost = f"– ({base} not measured)"
            cost_t = f"<= {COST_TARGET[row]}x" if row in COST_TARGET else "–"
        framework = base if base else row
        status = f">= {PROJECT_TARGET}x{_verdict(ratio >= PROJECT_TARGET if not math.isnan(ratio) else None)}"
        if r["error"]:
            status = f"failed: {r['error'][:120]}"
        lines.append(
            f"| {row} | {framework} | {r['views']} | {_fmt(r['bare'])} | {_fmt(r['project'])} | "
            f"{_fmt(ratio, '.3f')} | {status} | {cost} | {cost_t} |"
        )
    differ = [row for row, r in steps.items() if r["same_params"] is False]
    unchecked = [row for row, r in steps.items() if r["same_params"] is None]
    lines += [
        "",
        (
            "Trainable parameters (tensors and elements per optimiser group): identical in both loops of every "
            "measured row."
            if not differ
            else f"Trainable parameters DIFFER between the loops of: {', '.join(differ)}."
        )
        + (f" Not checked: {', '.join(unchecked)}." if unchecked else ""),
    ]
    lines += ["", "## View executor (batched)", ""]
    if executor is None:
        lines.append("Not run (--skip-executor).")
    elif "unavailable" in executor:
        lines.append(f"batched executor: not available ({executor['unavailable']}).")
    else:
        lines += [
            f"{meta['exec_images']} JPEGs of {SRC_W}x{SRC_H} ({meta['jpeg_source']}), batches of "
            f"{min(s['batch'], meta['exec_images'])}, {s['size']} px; parameters drawn inside the timed region. "
            "Step consumes = the project step's images/s for that recipe's row; target >= 2x for mocov2, 1.5x else.",
            "",
            "| recipe | views | images/s | views/s | step consumes img/s | executor/step | target |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in executor.items():
            step = steps.get(EXECUTOR_RECIPES[name], {}).get("project", math.nan)
            ratio = r["images_s"] / step if step and not math.isnan(step) else math.nan
            ok = None if math.isnan(ratio) else ratio >= EXECUTOR_TARGET[name]
            lines.append(
                f"| {name} | {r['views']} | {_fmt(r['images_s'])} | {_fmt(r['views_s'])} | {_fmt(step)} | "
                f"{_fmt(ratio, '.2f')} | >= {EXECUTOR_TARGET[name]}x{_verdict(ok)} |"
            )
    lines += ["", "## End to end: jobs/pretrain.py from JPEG shards", ""]
    if e2e is None:
        lines.append("Not run: add `--e2e`.")
    elif "skipped" in e2e:
        lines.append(f"Not run: {e2e['skipped']}.")
    elif "error" in e2e:
        lines += [f"Failed: {e2e['error']}", "", f"`{shlex.join(e2e['command'])}`"]
    else:
        step = e2e.get("step", steps.get("mocov2", {}).get("project", math.nan))  # the same run's mocov2 row
        ratio = e2e["images_s"] / step if step and not math.isnan(step) else math.nan
        e2e_verdict = _verdict(None if math.isnan(ratio) else ratio >= E2E_TARGET)
        lines += [
            f"`{shlex.join(e2e['command'])}`",
            "",
            f"{e2e['images']} training JPEGs ({SRC_W}x{SRC_H}), epoch_images_per_s per epoch: "
            + ", ".join(f"{v:.1f}" for v in e2e["per_epoch"])
            + f" (wall {e2e['wall_s']:.0f} s with start-up).",
            "",
            "| path | images/s |",
            "| --- | --- |",
            f"| jobs/pretrain.py, last epoch | {_fmt(e2e['images_s'])} |",
            f"| project step on pre-made tensors (mocov2 row) | {_fmt(step)} |",
            f"| end to end / step | {_fmt(ratio, '.3f')} (target >= {E2E_TARGET}x{e2e_verdict}) |",
        ]
    return "\n".join(lines) + "\n"
