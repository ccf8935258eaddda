"""What a pretraining run leaves in MLflow and on disk besides its metrics: the views gallery, the training
curves, the checkpoint and the backbone model, the closing summary; and the report of a run that finished before.

On the jobs' light path (train/launch.py imports it before the config is checked): MLflow, torch and the modules that
load them are imported inside the functions that use them."""

from __future__ import annotations

import shlex
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from pipeline.eval.probe.spec import ProbeSpec
from pipeline.eval.results import format_table, probe_results
from pipeline.mlflow_ui import command_line, link, ui_base, ui_command
from pipeline.train.curves import write_curves
from pipeline.train.spec import PretrainSpec


def _log(msg: str) -> None:
    print(f"[pretrain] {msg}", flush=True)


def print_summary(spec: PretrainSpec, run_id: str, uri: str, ckpt_dir: Path, minutes: float) -> None:
    """What the job made and where, closing the console."""
    name, runs = spec.name, spec.runs
    made = [
        ("MLflow run", f"{run_id} in {uri}"),
        ("checkpoint", str(ckpt_dir)),
        ("training curves", str(curves_path(spec))),
        ("views gallery", str(spec.gallery_path)),
        ("probe chart", str(runs / "probe" / f"{name}.png")),
    ]
    width = max(len(k) for k, _ in made)
    print(f"\nDone: run {name}, {spec.train.epochs} epochs in {minutes:.1f} min.", flush=True)
    for what, where in made:
        if "://" in where or Path(where).exists() or what == "MLflow run":
            print(f"  {what:<{width}}  {where}", flush=True)
    if uri.startswith("sqlite:"):
        print(f"  browse it: make mlflow-ui ({shlex.join(ui_command(uri, 5000))})", flush=True)
    print(f"  run page   {run_link(uri, run_id)}", flush=True)


def describe_pretrain(spec: PretrainSpec, datasets: list, trial: str | None = None) -> str:
    """The run page's description of a pretraining run as it starts: the command, what trains on what, where
    its pictures are. Markdown."""
    t, tr, model = spec.train, spec.trainer, spec.model
    plugins = ", ".join(spec.config.get("plugin") or {}) or "none"
    lines = [
        f"Pretraining{f' (sweep trial {trial})' if trial else ''}: `{command_line()}`",
        "",
        f"- **method** {spec.method.name}, plug-ins: {plugins}; recipe {spec.augment['name']}",
        f"- **model** {model.backbone} (width {model.width}); {t.epochs} epochs, batch {t.batch_size}"
        f" on {tr.num_workers} worker(s){' with GPUs' if tr.use_gpu else ''}",
        f"- **data** {spec.data.name}: "
        + "; ".join(f"{d.name} ({d.profile['num_samples']} samples, digest {d.digest})" for d in datasets),
        "- **pictures** `gallery/` the views with their parameters, `curves/` loss and kNN, `probe/` the linear"
        " probe against a random-init backbone; `config.yaml` the whole config",
    ]
    return "\n".join(lines)


def run_link(tracking_uri: str, run_id: str) -> str:
    """The run's page in the UI's model-training view."""
    import mlflow  # not at load: see the module docstring

    exp_id = mlflow.MlflowClient(tracking_uri).get_run(run_id).info.experiment_id
    return link(ui_base(tracking_uri), exp_id, run_id)


def report_finished(spec: PretrainSpec, run) -> dict:
    """A FINISHED run found again: print what it made, run nothing and log nothing (except the probe, when it
    never ran and eval.probe.after_pretrain asks for it); returns what pretrain() returns."""
    from pipeline import tracking  # mlflow

    name, run_id = spec.name, run.info.run_id
    probe = probe_results(run.data.metrics)
    local = spec.checkpoint_dir
    if not probe and spec.probe is not None:
        probe = probe_finished(spec.probe, name, run, local)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime((run.info.end_time or run.info.start_time) / 1000))
    _log(f"run {name} finished before (MLflow run {run_id}, {when}): nothing to train; its results:")
    where = f"{local / 'state.pt'}, " if (local / "state.pt").exists() else ""
    print(f"  checkpoint  {where}MLflow runs:/{run_id}/checkpoint/state.pt", flush=True)
    print(f"  run page    {run_link(tracking.tracking_uri(spec.store), run_id)}", flush=True)
    if "train/minutes" in run.data.metrics:
        print(f"  trained in  {run.data.metrics['train/minutes']:.1f} min", flush=True)
    if probe:
        shown = {k: v for k, v in probe.items() if k != "invariance"}
        solver = {"sgd": "SGD"}.get(run.data.tags.get("probe_solver"), "L-BFGS")
        print(f"\nLinear probe on {spec.data.name} (frozen features, {solver}):\n{format_table(shown)}\n", flush=True)
    print(
        f"  train again under another name with run.name=<name>; probe again with "
        f"python jobs/linear_probe.py run={run_id}",
        flush=True,
    )
    return {
        "run_id": run_id,
        "checkpoint": str(local) if local.exists() else f"runs:/{run_id}/checkpoint",
        "probe": probe or None,
    }


def probe_finished(probe: ProbeSpec, name: str, run, local: Path) -> dict:
    """The probe of a finished run that was trained without one, logged into that run. The run stays FINISHED
    even if the probe fails (its error recorded): the training is done, and the next rerun probes again."""
    import mlflow  # not at load: see the module docstring
    import torch

    from pipeline import tracking  # mlflow
    from pipeline.eval.probe.compare import compare_with_random  # torch
    from pipeline.eval.source import download_state  # torch

    run_id = run.info.run_id
    _log(f"run {name} finished without a probe: probing its checkpoint")
    if "error" in run.data.tags:  # a failed probe's, from before
        mlflow.MlflowClient().delete_tag(run_id, "error")
    mlflow.start_run(run_id=run_id)
    try:
        if (local / "state.pt").exists():
            state = torch.load(local / "state.pt", map_location="cpu", weights_only=False)
        else:
            with tempfile.TemporaryDirectory() as d:
                state = download_state(run_id, d)
        results = compare_with_random(probe, state, run_name=name)
    except BaseException as e:
        tracking.end_failed(e, status="FINISHED")
        raise
    mlflow.end_run()
    return results


def log_gallery(spec: PretrainSpec) -> None:
    """The recipe's views of a few training images, annotated with their parameters, as a PNG in MLflow."""
    import mlflow  # not at load: see the module docstring

    from pipeline.augment.gallery import write_gallery  # torch

    path = spec.gallery_path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gallery(spec.config, str(path), n_images=spec.gallery.n_images, seed=spec.seed)
    mlflow.log_artifact(str(path), artifact_path="gallery")
    _log(f"views gallery {path}")


def curves_path(spec: PretrainSpec) -> Path:
    return spec.runs / "curves" / f"{spec.name}.png"


def log_curves(spec: PretrainSpec, run_id: str, uri: str) -> None:
    """The loss with the terms its method and plug-ins declare, the kNN monitor and the plug-ins' own panels, from the
    run's metric history, as a PNG in MLflow."""
    import mlflow  # not at load: see the module docstring

    from pipeline.build import drawn_curves  # torch

    terms, extra = drawn_curves(spec.method.kind, spec.config.get("plugin") or {})
    client = mlflow.MlflowClient(uri)
    path = write_curves(client, run_id, curves_path(spec), terms, extra)
    if path:
        mlflow.log_artifact(str(path), artifact_path="curves")
        _log(f"training curves {path}")


def log_checkpoint(checkpoint, spec: PretrainSpec, model: bool = True) -> Path:
    """Log state.pt as an artifact and (`model`) the backbone as an mlflow.pytorch model; return a local copy."""
    import mlflow  # not at load: see the module docstring
    import mlflow.pytorch
    import torch

    from pipeline import checkpoint as ck  # torch
    from pipeline.augment.view_makers import eval_settings  # torch
    from pipeline.build import build_method  # torch

    local = spec.checkpoint_dir
    local.mkdir(parents=True, exist_ok=True)
    with checkpoint.as_directory() as d:
        state = ck.load(d)
    torch.save(state, local / ck.STATE_FILE)
    mlflow.log_artifact(str(local / ck.STATE_FILE), artifact_path="checkpoint")
    if not model:
        return local
    method = build_method(spec.config)
    method.backbone.load_state_dict(ck.backbone_state(state))
    size = eval_settings(spec.augment)[0]
    example = torch.zeros(1, 3, size, size).numpy()
    mlflow.pytorch.log_model(
        method.backbone.eval(), name="backbone", input_example=example, pip_requirements=model_requirements()
    )
    return local


def model_requirements() -> list[str]:
    """What loading the logged backbone needs, pinned to what trained it. Named here: MLflow would otherwise infer
    them by loading the model in a subprocess, about 5 s of every run for the same answer."""
    return [f"{name}=={version(name)}" for name in ("torch", "torchvision", "numpy", "cloudpickle")]
