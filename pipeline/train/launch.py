"""The pretraining driver: validate, make the default data if missing, start or resume the MLflow run,
fit a Ray Train TorchTrainer, log the final checkpoint and backbone, run the linear probe."""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import ConfigError, config_hash, to_yaml
from pipeline.train.run_lock import RunBusy, run_lock


def _log(msg: str) -> None:
    print(f"[pretrain] {msg}", flush=True)


def resolve(cfg: dict) -> dict:
    """Check everything that can be checked before Ray starts, and derive the runtime values.

    Raises ConfigError with one line: pipeline.schema.validate checks the whole config first (nothing is
    made, no torch is imported until it passes), then the embedded Spirograph data is made when it is the
    chosen data and missing, and every shard is checked (prepare_data)."""
    from pipeline.schema import validate

    validate(cfg)
    m, tr, t = cfg["method"], cfg["trainer"], cfg["train"]
    workers = tr["num_workers"]
    local_bs = t["batch_size"] // workers
    if m["kind"] == "moco":  # validate checked that the per-worker batch splits into these groups
        splits = m.get("bn_splits", "auto")
        m["bn_splits"] = (1 if workers > 1 else 4) if splits == "auto" else int(splits)
    data = cfg["data"]
    n = int(prepare_data(cfg)["num_samples"])
    steps = (n // workers) // local_bs
    if steps < 1:
        raise ConfigError(f"train.batch_size={t['batch_size']}: more than the {n} training samples in "
                          f"data.train={data['train']}; use a batch of at most {n - n % workers}")
    name = cfg["run"]["name"] or f"{m['name']}-{data['name']}-{config_hash(cfg)}"
    cfg["run"]["name"] = name
    from pipeline.train.optim import scaled_lr  # torch: only once the checks passed, so bad input is answered fast

    cfg["runtime"] = {"lr": scaled_lr(cfg["optim"]["base_lr"], t["batch_size"]), "steps_per_epoch": steps,
                      "num_train_samples": n}
    return cfg


def _has_manifest(path: str) -> bool:
    return "://" not in path and (Path(path) / "manifest.json").exists()


def _local_manifest(path: str) -> dict | None:
    try:
        return json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def prepare_data(cfg: dict) -> dict:
    """Make the embedded Spirograph data if it is the chosen data and missing; check that Spirograph data is
    the data `data.generate` describes (_check_provenance); check every shard of both splits, refusing bad
    ones in one line or leaving them out with a warning naming them, as `data.on_bad_shard` says.

    Returns the train manifest (when shards were left out: `num_samples` without theirs, and `bad_shards`);
    ConfigError with one line naming the key when a split is missing, empty, other data or has bad shards."""
    from pipeline.data import shards
    from pipeline.schema import managed_data

    data = cfg["data"]
    if managed_data(cfg) and not (_has_manifest(data["train"]) and _has_manifest(data["val"])):
        for split in ("train", "val"):  # never let the generator rewrite a folder that holds other data
            manifest = _local_manifest(data[split])
            if manifest is not None:
                _check_provenance(cfg, split, manifest)
        _make_spirograph(cfg)
    policy = data.get("on_bad_shard", "fail")
    manifests = {}
    for split in ("train", "val"):
        try:
            manifest, uris, bad = shards.check_shards(data[split])
        except (FileNotFoundError, ValueError, OSError) as e:
            raise ConfigError(f"data.{split}={data[split]}: {str(e).splitlines()[0]}") from None
        _check_provenance(cfg, split, manifest)
        if bad:
            if policy == "fail":
                raise ConfigError(f"data.{split}={data[split]}: {len(bad)} bad shard(s) of {len(uris)}: "
                                  f"{shards.describe_bad(bad)}; remake them, or set data.on_bad_shard=skip to "
                                  f"go on without them")
            per_shard = dict(zip(uris, shards.shard_samples(manifest)))
            lost = sum(per_shard[u] for u, _ in bad)
            if lost >= manifest["num_samples"]:
                raise ConfigError(f"data.{split}={data[split]}: every shard is bad: {shards.describe_bad(bad)}")
            _log(f"data.{split}: skipping {len(bad)} bad shard(s) of {len(uris)} ({lost} samples; "
                 f"data.on_bad_shard=skip): {shards.describe_bad(bad, limit=20)}")
            manifest = {**manifest, "num_samples": manifest["num_samples"] - lost,
                        "bad_shards": [u for u, _ in bad]}
        manifests[split] = manifest
    return manifests["train"]


def _check_provenance(cfg: dict, split: str, manifest: dict) -> None:
    """Generated Spirograph data must be the data `data.generate` says (the run's params record it).

    Choice: the default folders are named by a hash of data.generate (conf/data/spirograph.yaml), so changed
    settings generate new data into a folder of their own and old data is never reused for them; a folder
    that holds other data anyway (one given by hand as data.train/data.val, or made by make_shards with
    other settings) is refused in one line naming the differing key, never silently used or overwritten.
    Data that is not generated Spirograph data (its manifest's source says otherwise) is not checked."""
    from pipeline.data.shards import spirograph_generate

    data = cfg["data"]
    source = manifest.get("source")
    if data["name"] != "spirograph" or not data.get("generate") or not isinstance(source, dict) \
            or source.get("kind") != "spirograph":
        return
    folder = data[split]
    made = spirograph_generate(manifest, split)
    if made is None:
        raise ConfigError(f"data.{split}={folder}: Spirograph data made by another version of the generator "
                          f"(source {json.dumps(source, sort_keys=True)}); remove it or point data.{split} elsewhere")
    g = data["generate"]
    for key in (f"n_{split}", "seed", "size", "maxcount"):
        if made.get(key) != g[key]:
            raise ConfigError(f"data.generate.{key}={g[key]}: the Spirograph data in {folder} was made with "
                              f"{key}={made.get(key)}; set data.generate.{key}={made.get(key)} to use it, or "
                              f"point data.train and data.val at another folder")


def _is_managed(cfg: dict) -> bool:
    """Spirograph is generated only into the managed data folder (pipeline.schema.managed_data)."""
    from pipeline.schema import managed_data

    return managed_data(cfg)


def _make_spirograph(cfg: dict) -> None:
    from pipeline.data.shards import make_spirograph_splits

    g = cfg["data"]["generate"]
    root = Path(cfg["data"]["train"]).parent
    _log(f"generating Spirograph shards in {root} ({g['n_train']} train / {g['n_val']} val)")
    make_spirograph_splits(root, g["n_train"], g["n_val"], g["seed"], g["size"], g["maxcount"])


def init_ray(cfg: dict, trials: int = 1) -> None:
    """Join the cluster (trainer.address, $RAY_ADDRESS) or start a private local one with room for `trials`
    concurrent Train runs (a sweep's)."""
    import ray

    if ray.is_initialized():
        return
    quiet = not cfg.get("verbose")
    if quiet:  # the token-auth notice ray.init logs before its own level applies (its logger has a level of its own)
        logging.getLogger("ray").setLevel(logging.ERROR)
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # Quiet unless verbose=true: Ray's start-up lines, its workers' INFO logs (Train's "Reporting training
    # result", Ray Data's execution plans) and Ray Data's progress bars; the job's own lines and bar stay.
    logs = {"logging_level": logging.ERROR if quiet else logging.INFO,
            "logging_config": ray.LoggingConfig(log_level="WARNING" if quiet else "INFO")}
    from pipeline.train.resources import cluster_address

    address = cluster_address(cfg["trainer"])
    if address:
        ray.init(address=address, **logs)
    else:
        # A local cluster of our own. Logical CPUs beyond the cores let Ray Data's read tasks schedule beside
        # the training workers (the workers' threads are capped separately), which otherwise starve on 2 cores.
        cores = os.cpu_count() or 1
        need = cfg["trainer"]["num_workers"] * cfg["trainer"]["cpus_per_worker"] * trials
        env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        # Train's preemption watcher polls for nodes being drained (spot instances); a private cluster has none,
        # and its actor logs an error-level line at every start. Train propagates this variable from the driver.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        if quiet:  # Ray's own deprecation notices and Ray Data's execution plans are not the user's to act on
            env.update(PYTHONWARNINGS="ignore::DeprecationWarning", RAY_DATA_LOG_LEVEL="ERROR")
        # address="local": a private cluster even when another one runs on this machine (tests, a demo).
        ray.init(address="local", num_cpus=max(cores, need) + 2, runtime_env={"env_vars": env}, **logs)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = not quiet


def quiet_logs(cfg: dict) -> None:
    """MLflow's store set-up lines and torch.export's notes while logging the model: for verbose=true only."""
    verbose = bool(cfg.get("verbose"))
    logging.getLogger("mlflow").setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("torch._export").setLevel(logging.INFO if verbose else logging.ERROR)


@dataclass(frozen=True)
class Trial:
    """A pretraining run as one trial of a sweep (pipeline.tune): its MLflow run is a child of the sweep's, its
    Train results go to Tune through `callbacks`, and it leaves out what every trial would repeat (the views
    gallery, the exported model, the random-init probe: the sweep logs those once)."""
    parent_run_id: str
    trial_id: str
    label: str                      # the trial's values in short, its MLflow run name
    callbacks: tuple = field(default=())


def build_trainer(cfg: dict, callbacks: tuple = ()):
    import ray.train
    from ray.train.torch import TorchTrainer

    from pipeline.data.reader import train_dataset
    from pipeline.train.loop import train_loop_per_worker

    # Train V2 routes workers' print() through its logger as well, which shows every line twice on the
    # console; plain prints are enough (the driver propagates this variable to the workers).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    tr = cfg["trainer"]
    resources = {"CPU": tr["cpus_per_worker"]}
    if tr["use_gpu"]:
        resources["GPU"] = tr["gpus_per_worker"]
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=cfg,
        scaling_config=ray.train.ScalingConfig(num_workers=tr["num_workers"], use_gpu=tr["use_gpu"],
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=cfg["run"]["name"], storage_path=tr["storage"],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            failure_config=ray.train.FailureConfig(max_failures=tr["max_failures"]),
            # Train's own "Reporting training result ..." lines: verbose=true only
            logging_config=ray.train.LoggingConfig(log_level="INFO" if cfg.get("verbose") else "WARNING"),
            callbacks=list(callbacks)),
        datasets={"train": train_dataset(cfg["data"]["train"], seed=cfg["seed"])},
    )


def pretrain(cfg: dict, trial: Trial | None = None) -> dict:
    """Run (or resume) one pretraining job end to end; returns {"run_id", "checkpoint", "probe"}.

    The run is the config's hash (or run.name). One process at a time holds it (run_lock, before Ray or
    MLflow is touched); a run MLflow has as FINISHED is not trained again: its results are printed (probed
    first if it never was and eval.probe.after_pretrain asks for it). A FAILED, KILLED or interrupted one
    resumes from its last checkpoint into the same MLflow run. Any error after the MLflow run opened ends it
    FAILED (KILLED on Ctrl-C or SIGTERM) with the error recorded (tracking.end_failed). As a sweep's `trial`,
    its MLflow run is a child of the sweep's run."""
    import mlflow

    from pipeline import tracking

    if "runtime" not in cfg:
        cfg = resolve(cfg)
    quiet_logs(cfg)
    name = cfg["run"]["name"]
    with run_lock(cfg):
        found = tracking.find_run(tracking.setup(cfg), name)
        if found is not None and found.info.status == "FINISHED":
            return _finished(cfg, found)
        if found is not None:  # FAILED, KILLED, or RUNNING: left so by a job killed outright (we hold the lock)
            why = found.data.tags.get("error") or ("its job ended without a status (killed?)"
                                                    if found.info.status == "RUNNING" else "")
            status = found.info.status + (f": {why}" if why else "")
            _log(f"resuming run {name} (MLflow run {found.info.run_id}, {status})")
        init_ray(cfg)
        from pipeline.train.resources import check_resources

        check_resources(cfg["trainer"], log=_log)  # before any MLflow run: a job that cannot start leaves none
        if trial is None:
            run_id = tracking.start_or_resume(cfg, name, name, job="pretrain")
        else:
            run_id = tracking.start_child(trial.parent_run_id, name, trial.label, job="tune-trial",
                                          tags={"tune_trial_id": trial.trial_id})
        try:
            out = _train_and_log(cfg, run_id, trial)
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                # Ctrl-C: Ray Train aborts the run gracefully; checkpoints already reported stay usable
                _log("interrupted: the last reported checkpoint stays usable; rerun the same command to resume")
            status = tracking.end_failed(e)
            _log(f"MLflow run {run_id} ended {status}: {tracking.error_line(e)}")
            raise
        mlflow.end_run()
    return out


def _train_and_log(cfg: dict, run_id: str, trial: Trial | None = None) -> dict:
    """The job's body inside its open MLflow run: params, gallery, fit, curves, checkpoint and backbone, probe."""
    import mlflow

    from pipeline import tracking

    cfg["runtime"].update(mlflow_run_id=run_id, tracking_uri=tracking.tracking_uri(cfg),
                          trial=trial.label if trial else None)
    _log(f"run {cfg['run']['name']}  mlflow run {run_id}  store {cfg['runtime']['tracking_uri']}")
    if not mlflow.get_run(run_id).data.params:
        mlflow.log_params(tracking.flatten({k: v for k, v in cfg.items() if k != "runtime"}))
        mlflow.log_text(to_yaml(cfg), "config.yaml")
        if cfg["gallery"]["at_pretrain"] and trial is None:
            log_gallery(cfg)

    t0 = time.monotonic()
    result = build_trainer(cfg, trial.callbacks if trial else ()).fit()
    if result.checkpoint is None:
        raise RuntimeError("training produced no checkpoint")
    minutes = (time.monotonic() - t0) / 60
    _log(f"training finished in {minutes:.1f} min; checkpoint {result.checkpoint.path}")
    mlflow.log_metric("train_minutes", minutes)
    _log_curves(cfg, run_id)
    ckpt_dir = _log_checkpoint(result.checkpoint, cfg, model=trial is None)
    out = {"run_id": run_id, "checkpoint": str(ckpt_dir), "probe": None}
    if cfg["eval"]["probe"]["after_pretrain"]:
        from pipeline.eval.run_probe import compare_with_random

        out["probe"] = compare_with_random(cfg, ckpt_dir, run_name=cfg["run"]["name"], baseline=trial is None)
    if trial is None:
        _summary(cfg, run_id, ckpt_dir, minutes)
    return out


def _summary(cfg: dict, run_id: str, ckpt_dir: Path, minutes: float) -> None:
    """What the job made and where, closing the console."""
    name, runs = cfg["run"]["name"], Path(cfg["paths"]["runs"])
    made = [("MLflow run", f"{run_id} in {cfg['runtime']['tracking_uri']}"), ("checkpoint", str(ckpt_dir)),
            ("training curves", str(runs / "curves" / f"{name}.png")), ("views gallery", str(gallery_path(cfg))),
            ("probe chart", str(runs / "probe" / f"{name}.png"))]
    width = max(len(k) for k, _ in made)
    print(f"\nDone: run {name}, {cfg['train']['epochs']} epochs in {minutes:.1f} min.", flush=True)
    for what, where in made:
        if "://" in where or Path(where).exists() or what == "MLflow run":
            print(f"  {what:<{width}}  {where}", flush=True)
    uri = cfg["runtime"]["tracking_uri"]
    if uri.startswith("sqlite:"):
        print(f"  browse it: .venv/bin/mlflow ui --backend-store-uri {uri} --port 5000", flush=True)


def _finished(cfg: dict, run) -> dict:
    """A FINISHED run found again: print what it made, run nothing and log nothing (except the probe, when it
    never ran and eval.probe.after_pretrain asks for it); returns what pretrain() returns."""
    from pipeline.eval.run_probe import format_table, probe_results

    name, run_id = cfg["run"]["name"], run.info.run_id
    probe = probe_results(run.data.metrics)
    local = Path(cfg["paths"]["runs"]) / "checkpoints" / name
    if not probe and cfg["eval"]["probe"]["after_pretrain"]:
        probe = _probe_finished(cfg, run, local)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime((run.info.end_time or run.info.start_time) / 1000))
    _log(f"run {name} finished before (MLflow run {run_id}, {when}): nothing to train; its results:")
    where = f"{local / 'state.pt'}, " if (local / "state.pt").exists() else ""
    print(f"  checkpoint  {where}MLflow runs:/{run_id}/checkpoint/state.pt", flush=True)
    if "train_minutes" in run.data.metrics:
        print(f"  trained in  {run.data.metrics['train_minutes']:.1f} min", flush=True)
    if probe:
        shown = {k: v for k, v in probe.items() if k != "invariance"}
        solver = {"sgd": "SGD"}.get(run.data.tags.get("probe_solver"), "L-BFGS")
        print(f"\nLinear probe on {cfg['data']['name']} (frozen features, {solver}):\n{format_table(shown)}\n",
              flush=True)
    print(f"  train again under another name with run.name=<name>; probe again with "
          f"python jobs/linear_probe.py run={run_id}", flush=True)
    return {"run_id": run_id, "checkpoint": str(local) if local.exists() else f"runs:/{run_id}/checkpoint",
            "probe": probe or None}


def _probe_finished(cfg: dict, run, local: Path) -> dict:
    """The probe of a finished run that was trained without one, logged into that run. The run stays FINISHED
    even if the probe fails (its error recorded): the training is done, and the next rerun probes again."""
    import tempfile

    import mlflow
    import torch

    from pipeline import tracking
    from pipeline.eval.run_probe import compare_with_random
    from pipeline.eval.source import download_state

    run_id = run.info.run_id
    _log(f"run {cfg['run']['name']} finished without a probe: probing its checkpoint")
    if "error" in run.data.tags:  # a failed probe's, from before
        mlflow.MlflowClient().delete_tag(run_id, "error")
    mlflow.start_run(run_id=run_id)
    try:
        if (local / "state.pt").exists():
            state = torch.load(local / "state.pt", map_location="cpu", weights_only=False)
        else:
            with tempfile.TemporaryDirectory() as d:
                state = download_state(run_id, d)
        results = compare_with_random(cfg, state, run_name=cfg["run"]["name"])
    except BaseException as e:
        tracking.end_failed(e, status="FINISHED")
        raise
    mlflow.end_run()
    return results


def gallery_path(cfg: dict) -> Path:
    out = cfg["gallery"]["out"]
    return Path(out) if out else Path(cfg["paths"]["runs"]) / "gallery" / f"{cfg['augment']['name']}-{cfg['data']['name']}.png"


def log_gallery(cfg: dict) -> None:
    """The recipe's views of a few training images, annotated with their parameters, as a PNG in MLflow."""
    import mlflow

    from pipeline.augment.gallery import write_gallery

    path = gallery_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gallery(cfg, str(path), n_images=cfg["gallery"]["n_images"], seed=cfg["seed"])
    mlflow.log_artifact(str(path), artifact_path="gallery")
    _log(f"views gallery {path}")


def _log_curves(cfg: dict, run_id: str) -> None:
    """Loss, kNN and (CoCor) per-length target curves from the run's metric history, as a PNG in MLflow."""
    import mlflow

    from pipeline.train.curves import write_curves

    client = mlflow.MlflowClient(cfg["runtime"]["tracking_uri"])
    path = write_curves(client, run_id, Path(cfg["paths"]["runs"]) / "curves" / f"{cfg['run']['name']}.png")
    if path:
        mlflow.log_artifact(str(path), artifact_path="curves")
        _log(f"training curves {path}")


def _log_checkpoint(checkpoint, cfg: dict, model: bool = True) -> Path:
    """Log state.pt as an artifact and (`model`) the backbone as an mlflow.pytorch model; return a local copy."""
    import mlflow
    import mlflow.pytorch
    import torch

    from pipeline.build import build_method
    from pipeline.train import checkpoint as ck

    local = Path(cfg["paths"]["runs"]) / "checkpoints" / cfg["run"]["name"]
    local.mkdir(parents=True, exist_ok=True)
    with checkpoint.as_directory() as d:
        state = ck.load(d)
    torch.save(state, local / ck.STATE_FILE)
    mlflow.log_artifact(str(local / ck.STATE_FILE), artifact_path="checkpoint")
    if not model:
        return local
    method = build_method(cfg)
    method.backbone.load_state_dict(ck.backbone_state(state))
    from pipeline.augment.view_maker import eval_settings

    size = eval_settings(cfg["augment"])[0]
    example = torch.zeros(1, 3, size, size).numpy()
    mlflow.pytorch.log_model(method.backbone.eval(), name="backbone", input_example=example)
    return local


def main(argv: list[str], description: str = "") -> int:
    from pipeline.config import cli, fail

    cfg = cli(argv, description or __doc__ or "")
    try:
        cfg = resolve(cfg)
        pretrain(cfg)
    except (ConfigError, RunBusy) as e:
        fail(str(e))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
