"""The pretraining driver: validate, make the default data if missing, start or resume the MLflow run,
fit a Ray Train TorchTrainer, log the final checkpoint and backbone, run the linear probe."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pipeline.config import ConfigError, config_hash, to_yaml
from pipeline.methods import METHODS
from pipeline.train.optim import scaled_lr


def _log(msg: str) -> None:
    print(f"[pretrain] {msg}", flush=True)


def resolve(cfg: dict) -> dict:
    """Check everything that can be checked before Ray starts, and derive the runtime values.

    Raises ConfigError with one line; creates the embedded Spirograph data when it is the chosen data."""

    m, tr, t = cfg["method"], cfg["trainer"], cfg["train"]
    if m["kind"] not in METHODS:
        raise ConfigError(f"unknown method kind {m['kind']!r}; known: {sorted(METHODS)}")
    check_augment(cfg["augment"])
    from pipeline.plugins import check_plugins

    try:
        check_plugins(cfg)
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"plugin: {e}") from None
    if t["precision"] not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"train.precision must be auto, bf16 or fp32, not {t['precision']!r}")
    if t.get("channels_last", "auto") not in ("auto", True, False):
        raise ConfigError(f"train.channels_last must be auto, true or false, not {t['channels_last']!r}")
    if t.get("compile") and float(((cfg.get("plugin") or {}).get("invclr") or {}).get("lam", 0) or 0) > 0:
        raise ConfigError("train.compile=true cannot run InvCLR's gradient penalty (torch.compile has no double "
                          "backward): drop train.compile or set plugin.invclr.lam=0")
    workers = int(tr["num_workers"])
    if workers < 1:
        raise ConfigError("trainer.num_workers must be >= 1")
    if t["batch_size"] % workers:
        raise ConfigError(f"train.batch_size={t['batch_size']} does not split evenly over {workers} workers")
    local_bs = t["batch_size"] // workers
    if m["kind"] == "moco":
        splits = m.get("bn_splits", "auto")
        splits = (1 if workers > 1 else 4) if splits == "auto" else int(splits)
        if local_bs % splits:
            raise ConfigError(f"per-worker batch {local_bs} does not split into method.bn_splits={splits} groups")
        m["bn_splits"] = splits
    data = cfg["data"]
    n = int(prepare_data(cfg)["num_samples"])
    steps = (n // workers) // local_bs
    if steps < 1:
        raise ConfigError(f"{n} training samples are fewer than one global batch of {t['batch_size']}")
    name = cfg["run"]["name"] or f"{m['name']}-{data['name']}-{config_hash(cfg)}"
    cfg["run"]["name"] = name
    cfg["runtime"] = {"lr": scaled_lr(cfg["optim"]["base_lr"], t["batch_size"]), "steps_per_epoch": steps,
                      "num_train_samples": n}
    return cfg


def check_augment(aug: dict) -> None:
    from pipeline.augment.view_maker import image_recipe

    if aug["executor"] not in ("auto", "dali", "torch", "gpu"):
        raise ConfigError(f"augment.executor must be auto, dali, torch or gpu, not {aug['executor']!r}")
    kind = aug.get("kind", "views")
    if kind not in ("views", "spirograph"):
        raise ConfigError(f"augment.kind must be views or spirograph, not {kind!r}")
    if kind == "views":
        try:
            image_recipe(aug)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"augment: {e}") from None


def _has_manifest(path: str) -> bool:
    return "://" not in path and (Path(path) / "manifest.json").exists()


def prepare_data(cfg: dict) -> dict:
    """Generate the embedded Spirograph data if it is the chosen, missing data; check both splits' manifests.
    Returns the train manifest; ConfigError with one line when a split is missing or empty."""
    from pipeline.data.shards import read_manifest

    data = cfg["data"]
    if data["name"] == "spirograph" and _is_managed(cfg) and not _has_manifest(data["train"]):
        _make_spirograph(cfg)
    try:
        train_manifest, _ = read_manifest(data["train"])
        read_manifest(data["val"])
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    return train_manifest


def _is_managed(cfg: dict) -> bool:
    """Spirograph is generated only into the managed data folder (train/ and val/ side by side there);
    a missing path given by the user is an error, not a place to write."""
    train, val, root = Path(cfg["data"]["train"]), Path(cfg["data"]["val"]), Path(cfg["paths"]["data"])
    return train.parent == val.parent and root in train.parents and train.name == "train" and val.name == "val"


def _make_spirograph(cfg: dict) -> None:
    from pipeline.data.shards import make_spirograph_splits

    g = cfg["data"]["generate"]
    root = Path(cfg["data"]["train"]).parent
    _log(f"generating Spirograph shards in {root} ({g['n_train']} train / {g['n_val']} val)")
    make_spirograph_splits(root, g["n_train"], g["n_val"], g["seed"], g["size"], g["maxcount"])


def init_ray(cfg: dict) -> None:
    import ray

    if ray.is_initialized():
        return
    address = cfg["trainer"].get("address") or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return
    # A local cluster of our own. Logical CPUs beyond the cores let Ray Data's read tasks schedule beside
    # the training workers (the workers' threads are capped separately), which otherwise starve on 2 cores.
    cores = os.cpu_count() or 1
    need = cfg["trainer"]["num_workers"] * cfg["trainer"]["cpus_per_worker"]
    # address="local": a private cluster even when another one runs on this machine (tests, a demo).
    ray.init(address="local", num_cpus=max(cores, need) + 2,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}})


def build_trainer(cfg: dict):
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
            failure_config=ray.train.FailureConfig(max_failures=tr["max_failures"])),
        datasets={"train": train_dataset(cfg["data"]["train"], seed=cfg["seed"])},
    )


def pretrain(cfg: dict) -> dict:
    """Run (or resume) one pretraining job end to end; returns {"run_id", "checkpoint", "probe"}."""
    import mlflow

    from pipeline import tracking

    if "runtime" not in cfg:
        cfg = resolve(cfg)
    init_ray(cfg)
    from pipeline.train.resources import check_resources

    check_resources(cfg["trainer"], log=_log)  # before any MLflow run: a job that cannot start leaves none
    run_id = tracking.start_or_resume(cfg, cfg["run"]["name"], cfg["run"]["name"], job="pretrain")
    cfg["runtime"].update(mlflow_run_id=run_id, tracking_uri=tracking.tracking_uri(cfg))
    _log(f"run {cfg['run']['name']}  mlflow run {run_id}  store {cfg['runtime']['tracking_uri']}")
    if not mlflow.get_run(run_id).data.params:
        mlflow.log_params(tracking.flatten({k: v for k, v in cfg.items() if k != "runtime"}))
        mlflow.log_text(to_yaml(cfg), "config.yaml")
        if cfg["gallery"]["at_pretrain"]:
            _log_gallery(cfg)

    t0 = time.monotonic()
    try:
        result = build_trainer(cfg).fit()
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C: Ray Train aborts the run gracefully and the driver exits; checkpoints already reported stay
        _log("interrupted: the last reported checkpoint stays usable; rerun the same command to resume")
        mlflow.end_run(status="KILLED")
        raise
    except Exception:
        mlflow.end_run(status="FAILED")
        raise
    if result.checkpoint is None:
        raise RuntimeError("training produced no checkpoint")
    minutes = (time.monotonic() - t0) / 60
    _log(f"training finished in {minutes:.1f} min; checkpoint {result.checkpoint.path}")
    mlflow.log_metric("train_minutes", minutes)
    _log_curves(cfg, run_id)
    ckpt_dir = _log_checkpoint(result.checkpoint, cfg)
    out = {"run_id": run_id, "checkpoint": str(ckpt_dir), "probe": None}
    if cfg["eval"]["probe"]["after_pretrain"]:
        from pipeline.eval.run_probe import compare_with_random

        out["probe"] = compare_with_random(cfg, ckpt_dir)
    mlflow.end_run()
    return out


def gallery_path(cfg: dict) -> Path:
    out = cfg["gallery"]["out"]
    return Path(out) if out else Path(cfg["paths"]["runs"]) / "gallery" / f"{cfg['augment']['name']}-{cfg['data']['name']}.png"


def _log_gallery(cfg: dict) -> None:
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


def _log_checkpoint(checkpoint, cfg: dict) -> Path:
    """Log state.pt as an artifact and the backbone as an mlflow.pytorch model; return a local copy."""
    import mlflow
    import mlflow.pytorch
    import torch

    from pipeline.methods import build_method
    from pipeline.train import checkpoint as ck

    local = Path(cfg["paths"]["runs"]) / "checkpoints" / cfg["run"]["name"]
    local.mkdir(parents=True, exist_ok=True)
    with checkpoint.as_directory() as d:
        state = ck.load(d)
    torch.save(state, local / ck.STATE_FILE)
    mlflow.log_artifact(str(local / ck.STATE_FILE), artifact_path="checkpoint")
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
    except ConfigError as e:
        fail(str(e))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
