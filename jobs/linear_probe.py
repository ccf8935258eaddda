"""Linear probe on frozen features of a pretrained backbone.

Takes a pretraining run (`run=`: an MLflow run id, or a folder or state.pt written by jobs/pretrain.py) and trains a
linear head with full-batch L-BFGS: top-1 for classification data, per-target MSE and R² for
Spirograph's (m, b, sigma, f_r). The same probe on a randomly initialised backbone is printed beside it.

The model, data and augment (hence the image size) are the run's own, read from its config; eval.* on the
command line sets the probe, data.<key>=... adjusts the run's data, data=<option> probes another dataset at
the run's image size. The results are logged into a child run of the pretraining run (found again when the
same probe is rerun); the chart goes to <paths.runs>/probe/<child run name>.png.

Example:
  python jobs/linear_probe.py run=<run id or path>
  python jobs/linear_probe.py run=<run id or path> eval.probe.steps=500 eval.feature_averaging.m=40

(`eval.probe.checkpoint=<...>` is the same as `run=<...>`: `run` on its own is this job's, `run.<key>` is still the
config's run section.)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import ConfigError, cli, fail  # noqa: E402


def main(argv: list[str]) -> int:
    runs = [a.split("=", 1)[1] for a in argv if a.startswith("run=")]
    argv = [a for a in argv if not a.startswith("run=")]
    cfg = cli(argv, __doc__)
    ref = runs[-1] if runs else cfg["eval"]["probe"]["checkpoint"]
    if not ref:
        fail("run=<MLflow run id, checkpoint folder or state.pt> is required")
    import hashlib
    import json

    from mlflow.tracking import MlflowClient

    from pipeline import tracking
    from pipeline.eval.run_probe import compare_with_random, config_for_run
    from pipeline.eval.source import load_source
    from pipeline.schema import validate

    tracking.setup(cfg)
    try:
        src = load_source(str(ref))
    except FileNotFoundError as e:
        fail(str(e))
    try:
        cfg = config_for_run(cfg, src.cfg, argv)
        validate(cfg)  # the run's sections with the command line's on top: one line, before anything is logged
    except (ValueError, ConfigError) as e:
        fail(str(e))
    state, parent, source = src.state, src.run_id, src.ref
    parent_run = MlflowClient().get_run(parent) if parent else None

    # One child run per (checkpoint, data, probe settings): rerunning the same probe updates it.
    probe_eval = {k: v for k, v in cfg["eval"].items() if k != "knn"}
    probe_eval["probe"] = {k: v for k, v in cfg["eval"]["probe"].items() if k != "checkpoint"}
    settings = {"source": source, "data": cfg["data"], "augment": cfg["augment"], "seed": cfg["seed"],
                "eval": probe_eval}
    key = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    from pipeline.augment.view_maker import eval_settings

    params = {"checkpoint": source, "data.name": cfg["data"]["name"], "data.train": cfg["data"]["train"],
              "data.val": cfg["data"]["val"], "image_size": eval_settings(cfg["augment"])[0],
              **tracking.flatten(probe_eval, "eval.")}
    if parent_run is not None:
        name = f"{parent_run.info.run_name}-probe-{key[:6]}"
        run_id = tracking.start_child(parent, f"probe:{parent}:{key}", name, job="linear_probe")
    else:
        name = f"probe-{cfg['data']['name']}-{key[:6]}"
        run_id = tracking.start_or_resume(cfg, f"probe:{key}", name, job="linear_probe")
    import mlflow

    from pipeline.eval.run_probe import probe_solver

    if probe_solver(cfg) == "sgd":  # its features are extracted by Ray Data on the cluster
        from pipeline.train.launch import init_ray

        init_ray(cfg)
    try:
        mlflow.log_params(params)
        compare_with_random(cfg, state, run_name=name)
    except BaseException as e:
        tracking.end_failed(e)
        raise
    mlflow.end_run()
    where = f" (a child of run {parent_run.info.run_name}, {parent})" if parent_run is not None else ""
    print(f"mlflow run {run_id}{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
