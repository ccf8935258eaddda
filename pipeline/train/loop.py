"""The one training loop: every method, every dataset, 1 CPU worker or 64 GPU workers.

Runs inside each Ray Train worker. Data arrives as encoded bytes from this worker's Ray Data shard,
views are made in-process (DALI or torch executor), the method returns a loss, DDP averages gradients.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch
from ray.experimental.tqdm_ray import tqdm

from pipeline import checkpoint, dist
from pipeline.augment.view_makers import build_view_maker, eval_settings
from pipeline.build import build_method
from pipeline.cores import cores
from pipeline.data.reader import load_split
from pipeline.eval.features import eval_preprocess, extract
from pipeline.eval.knn import knn_metrics
from pipeline.mlflow_ui import metric_name, start_system_metrics
from pipeline.plan import RunPlan
from pipeline.progress import ProgressLines
from pipeline.sections import Debug
from pipeline.train.optim import build_optimizer
from pipeline.train.plugin_optim import PluginOptimizers
from pipeline.train.precision import resolve_precision
from pipeline.train.prefetch import Timing, made_ahead, views_threads
from pipeline.train.spec import PretrainSpec
from pipeline.train.step import Stepper, _Pending, compile_backbones, memory_format


class _KnnMonitor:
    """Rank 0's online kNN: a bank from the train split and a held-out query set, both un-augmented."""

    def __init__(self, spec: PretrainSpec):
        k, data = spec.knn, spec.data
        self.task, self.k, self.t = data.task, k.k, k.temperature
        targets = list(data.targets) if data.targets else None
        self.bank = load_split(data.train, self.task, targets, limit=k.bank_size)
        self.val = load_split(data.val, self.task, targets, limit=k.val_size)
        self.pre = eval_preprocess(*eval_settings(spec.augment))

    def __call__(self, backbone, device) -> dict[str, float]:
        fb, kb = extract(backbone, self.bank.encoded, self.pre, device=device)
        fv, kv = extract(backbone, self.val.encoded, self.pre, device=device)
        return knn_metrics(
            fb,
            torch.as_tensor(self.bank.y[kb]),
            fv,
            torch.as_tensor(self.val.y[kv]),
            self.task,
            self.k,
            self.t,
            self.val.names,
        )


def _progress_bar(epoch: int, epochs: int, images: int, label: str = "", tty: bool = True):
    """Rank 0's progress through one epoch (images, images/s and ETA). On a terminal, a bar drawn on the driver's
    console by Ray's tqdm_ray (a worker's own tqdm would print one line per refresh through Ray's log forwarding);
    where the driver's console is a file (ray job logs, CI, a redirect), where every redraw would be kept, a plain
    line now and then. A sweep's trials carry their label, so concurrent bars tell apart."""
    if not tty:
        return ProgressLines(_bar_text(epoch, epochs, label), images)
    return tqdm(total=images, desc=_bar_text(epoch, epochs, label), unit="img")


def _bar_text(epoch: int, epochs: int, label: str = "") -> str:
    return f"{label + ': ' if label else ''}epoch {epoch + 1}/{epochs}"


def _epoch_summary(metrics: dict, verbose: bool) -> str:
    """One line per epoch: loss, speed, skipped images and the kNN monitor; every timing too with verbose=true."""
    keep = lambda k: verbose or not k.startswith("time_")  # noqa: E731
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if keep(k))


def _file_named_loggers() -> list[str]:
    """Ray Train modules whose logger is named by their file path (so outside "ray.train"): the one that prints
    "Reporting training result N" for every rank and epoch."""
    try:
        import ray.train.v2._internal.execution.context as train_context  # Ray's private layout: may be missing
    except ImportError:  # a Ray without Train V2's layout: nothing to quiet
        return []
    return [train_context.__file__]


def _maybe_fail(debug: Debug, epoch: int) -> None:
    """Test hook: raise once at the start of `epoch` (marker file), to exercise resume and restarts."""
    fail, marker = debug.fail_at_epoch, debug.fail_marker
    if fail is not None and epoch == fail and marker and not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise RuntimeError(f"injected failure at epoch {epoch}")


class _Trainer:
    """One worker's state: the method, its optimiser and schedule, the views, the step counter."""

    def __init__(self, spec: PretrainSpec, plan: RunPlan, rank: int, world: int, device):
        self.spec, self.plan, self.rank, self.world, self.device = spec, plan, rank, world, device
        self.memory_format = memory_format(spec.train.channels_last, device)
        self.method = build_method(spec.config)
        for plugin in self.method.plugins:
            plugin.schedule(plan.steps_per_epoch)
        # Module.to takes a device and a memory_format together; torch's overloads type each alone
        self.method.to(device, memory_format=self.memory_format)  # type: ignore[call-overload]
        if spec.train.compile:
            compile_backbones(self.method)
        fixed_lr = self.method.fixed_lr_parameters()  # the method's own (SimSiam's predictor), before DDP wraps it
        # DDP when world > 1, syncing BatchNorm's buffers once a step (sync_buffers_) rather than at every forward
        self.method.online = ray.train.torch.prepare_model(
            self.method.online, parallel_strategy_kwargs=dist.ddp_options()
        )
        dist.register_grad_hook(self.method.online, spec.trainer.grad_compression)
        self.local_bs = plan.local_batch
        self.optimizer = build_optimizer(self.method.online, spec.optim, plan.lr, fixed_lr)
        self.plugin_optimizers = PluginOptimizers(self.method.plugins)
        self.total_steps = plan.total_steps
        self.precision = resolve_precision(spec.train.precision, device)
        self.stepper = Stepper(
            self.method,
            self.optimizer,
            self.plugin_optimizers,
            spec.optim,
            plan.lr,
            plan.total_steps,
            plan.warmup_steps,
            plan.steps_per_epoch,
            device,
            self.memory_format,
            self.precision,
        )
        self.step_s = 0.0  # where an epoch's time goes (seconds): the step's, and the data path's in self.timing
        self.timing = Timing()
        self.views_ahead = spec.train.views_ahead
        self.views_threads = views_threads(torch.get_num_threads(), self.views_ahead)
        self.views_of = build_view_maker(
            spec.augment,
            self.local_bs,
            num_threads=self.views_threads,
            seed=spec.seed + rank,
            device=device,
        )

    def restore(self, state: dict) -> int:
        """Load a checkpoint state; returns the epoch to start from."""
        checkpoint.load_method_state(self.method, dict(state["method"]))
        self.optimizer.load_state_dict(state["optimizer"])
        self.plugin_optimizers.load_state_dict(state.get("plugin_optimizers") or {})
        self.stepper.step = state["step"]
        self.method.set_progress(self.step / self.total_steps)
        return state["epoch"] + 1

    @property
    def step(self) -> int:
        return self.stepper.step

    def train_step(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict[str, float]:
        t0 = time.monotonic()
        out = self.stepper(images, params)
        self.step_s += time.monotonic() - t0
        return out

    def batches(self, shard, epoch: int):
        """Full batches of views for this epoch, in lockstep across ranks: a rank short of samples after
        dropping corrupt ones skips the step together with every other rank."""
        seed = self.spec.seed
        rng = np.random.default_rng([seed, self.rank, epoch])
        pending = _Pending(self.local_bs)
        raw_batches = shard.iter_batches(
            batch_size=self.local_bs,
            batch_format="numpy",
            drop_last=True,
            prefetch_batches=2,
            local_shuffle_buffer_size=self.spec.train.shuffle_buffer,
            local_shuffle_seed=seed * 1000 + epoch * self.world + self.rank,
        )
        views_ahead = made_ahead(
            raw_batches,
            lambda raw: self.views_of(raw, rng),
            self.views_ahead,
            self.timing,
            self.device,
            self.views_threads,
        )
        for views in views_ahead:
            pending.add(views.images, views.params)
            if dist.reduce_scalar(len(pending) >= self.local_bs, "min", self.device):
                yield pending.take()

    def save_and_report(self, metrics: dict, epoch: int, with_checkpoint: bool) -> None:
        if not with_checkpoint:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as d:
            ck = None
            if self.rank == 0:
                checkpoint.save(
                    d,
                    self.method,
                    self.optimizer,
                    epoch,
                    self.step,
                    self.spec.config,
                    self.plan.as_dict(),
                    plugin_optimizers=self.plugin_optimizers.state_dict(),
                )
                ck = ray.train.Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=ck)


def train_loop_per_worker(config: dict) -> None:
    """One Train worker: `config` is {"spec": the run's PretrainSpec, "plan": its RunPlan} (launch.build_trainer)."""
    spec, plan = config["spec"], config["plan"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = _set_up_worker(spec, ctx)
    tr = _Trainer(spec, plan, rank, world, device)
    if not spec.verbose:
        _quiet_loggers()
    state = checkpoint.state_to_resume(ray.train.get_checkpoint(), os.path.join(spec.trainer.storage, spec.name))
    label = plan.trial or ""  # a sweep's trial: the sweep prints one line per epoch for it
    if rank == 0 and (spec.verbose or not label):
        print(_worker_line(tr, world, device), flush=True)
    start_epoch = tr.restore(state) if state else 0
    if state and rank == 0:
        print(
            f"[train] resumed from the checkpoint of epoch {start_epoch}/{spec.train.epochs} (step {tr.step})",
            flush=True,
        )

    # where Ray placed the workers, rank by rank: the run's `worker_nodes` tag (multi-node runs show their spread)
    placed = dist.gather_objects(ray.get_runtime_context().get_node_id())
    monitor = _system_metrics(spec, plan, ctx, placed)
    logger, knn = _rank0_monitors(spec, plan, placed) if rank == 0 else (None, None)
    shard = ray.train.get_dataset_shard("train")
    try:
        _epochs(spec, tr, shard, start_epoch, logger, knn, label)
        if logger:
            logger.close()  # what the store has not yet taken, waiting up to tracking.outage_s for it
    finally:
        if monitor:
            monitor.finish()


def _set_up_worker(spec: PretrainSpec, ctx) -> torch.device:
    """Threads, the initialisation seed (identical on every rank), cuDNN and the node layout MoCo reads."""
    threads = spec.trainer.torch_threads or cores() // ctx.get_local_world_size()
    torch.set_num_threads(max(1, threads))
    torch.manual_seed(spec.seed)
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed view sizes: autotuned convolutions pay off from step 2
    dist.set_node_rank(ctx.get_node_rank())  # MoCo's key_bn=auto and shuffle_node read the node layout
    dist.count_bytes(spec.trainer.count_bytes)
    return device


def _quiet_loggers() -> None:
    """Train's per-report and Data's per-epoch INFO lines from inside this worker; urllib3's "Retrying ..." while
    a tracking server is away and MLflow's SQLite store's tracebacks (the step logger says it once, in the job's
    words)."""
    for name in ("ray.train", "ray.data", *_file_named_loggers()):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def _worker_line(tr: _Trainer, world: int, device: torch.device) -> str:
    views = getattr(tr.views_of, "executor", tr.views_of)
    return (
        f"[train] {world} worker(s), rank 0 on {device}: views by {type(views).__name__} on "
        f"{getattr(views, 'device', 'cpu')}, precision {tr.precision}, "
        f"{'channels_last' if tr.memory_format == torch.channels_last else 'contiguous'}"
        f"{', compiled' if tr.spec.train.compile else ''}"
    )


def _rank0_monitors(spec: PretrainSpec, plan: RunPlan, placed: list[str]):
    """Rank 0's step logger (MLflow, loaded only here: the other ranks log nothing) and its kNN monitor."""
    from pipeline.step_logger import StepLogger

    run_id, uri = plan.mlflow_run_id, plan.tracking_uri
    assert run_id and uri, "the driver opens the MLflow run before training starts (RunPlan.opened)"
    logger = StepLogger(
        uri,
        run_id,
        flush_every_s=float(spec.tracking.flush_every_s),
        outage_s=float(spec.tracking.outage_s),
    )
    logger.tag("worker_nodes", ",".join(placed))
    return logger, (_KnnMonitor(spec) if spec.knn.every else None)


def comm_metrics(traffic: dist.Traffic, steps: int, device) -> dict[str, float]:
    """Bytes per step and rank, averaged over the ranks (an all-to-all's share differs from rank to rank): sent and
    received in all, and sent per collective (comm_<op>_bytes)."""
    steps, world = max(1, steps), dist.world_size()
    out = {
        "comm_sent_bytes": sum(traffic.sent.values()),
        "comm_received_bytes": sum(traffic.received.values()),
        **{
            f"comm_{op}_bytes": traffic.sent[op] for op in dist.COUNTED_OPS
        },  # every op: the same reductions on each rank
    }
    with dist.uncounted():  # these reductions are the report's, not a step's
        mean = {k: dist.reduce_scalar(v, "sum", device) / world / steps for k, v in out.items()}
    return {k: v for k, v in mean.items() if v or k in ("comm_sent_bytes", "comm_received_bytes")}


def _system_metrics(spec: PretrainSpec, plan: RunPlan, ctx, placed: list[str]):
    """System metrics where the training runs: from local rank 0 of each training node (the driver may sit on a
    CPU-only head). A run on several nodes names each node in the metrics (system/node<k>/...); a resumed run
    continues its steps."""
    if ctx.get_local_rank() != 0:
        return None
    node_id = f"node{ctx.get_node_rank()}" if len(set(placed)) > 1 else None
    run_id, uri = plan.mlflow_run_id, plan.tracking_uri
    assert run_id and uri, "the driver opens the MLflow run before training starts (RunPlan.opened)"
    return start_system_metrics(run_id, uri, node_id, True, spec.tracking.system_metrics, spec.verbose)


def _epochs(spec: PretrainSpec, tr: _Trainer, shard, start_epoch: int, logger, knn, label: str) -> None:
    """The epochs from `start_epoch` on: train, log (rank 0), report and checkpoint."""
    rank, world = tr.rank, tr.world
    epochs, log_every, verbose = spec.train.epochs, spec.tracking.log_every, spec.verbose
    for epoch in range(start_epoch, epochs):
        _maybe_fail(spec.debug, epoch)
        tr.method.train()
        skipped_before, losses = tr.views_of.skipped, []
        tr.timing, tr.step_s = Timing(), 0.0
        t0 = t_log = time.monotonic()
        steps_since_log = 0
        bar = (
            _progress_bar(epoch, epochs, tr.plan.images_per_epoch, label, tr.plan.console_is_tty) if rank == 0 else None
        )
        for images, params in tr.batches(shard, epoch):
            out = tr.train_step(images, params)
            losses.append(out["loss"])
            steps_since_log += 1
            if bar:
                bar.update(tr.local_bs * world)
            if logger and tr.step % log_every == 0:
                now = time.monotonic()
                out["images_per_s"] = steps_since_log * tr.local_bs * world / (now - t_log)
                t_log, steps_since_log = now, 0
                logger.log({metric_name(k): v for k, v in out.items()}, tr.step)
                if bar:
                    bar.set_description(f"{_bar_text(epoch, epochs, label)} loss {out['loss']:.3f}")
                if verbose:
                    print(
                        f"[train] epoch {epoch + 1}/{epochs} step {tr.step}/{tr.total_steps} loss {out['loss']:.4f} "
                        f"lr {out['lr']:.4f} {out['images_per_s']:.1f} img/s",
                        flush=True,
                    )
        if bar:
            bar.close()

        traffic = dist.take_traffic()  # before the epoch's own reductions below
        skipped = dist.reduce_scalar(tr.views_of.skipped - skipped_before, "sum", tr.device)
        metrics = {
            "epoch": epoch,
            "step": tr.step,
            "epoch_loss": float(np.mean(losses)) if losses else float("nan"),
            "epoch_images_per_s": len(losses) * tr.local_bs * world / max(1e-9, time.monotonic() - t0),
            "skipped_images": skipped,
            "time_step_s": tr.step_s,
            **{f"time_{k}": v for k, v in tr.timing.as_dict().items()},
            **(comm_metrics(traffic, len(losses), tr.device) if spec.trainer.count_bytes else {}),
        }
        if skipped and rank == 0:
            warnings.warn(f"epoch {epoch + 1}/{epochs}: skipped {int(skipped)} undecodable images")
        if knn and (epoch + 1) % spec.knn.every == 0:
            t_knn = time.monotonic()
            metrics.update(knn(tr.method.backbone, tr.device))
            metrics["time_knn_s"] = time.monotonic() - t_knn
        if logger:
            shown = {k: v for k, v in metrics.items() if k not in ("epoch", "step")}
            # the step axis is optimisation steps; the epoch is a metric of its own (1-based: epochs done)
            logger.log({"train/epoch": epoch + 1, **{metric_name(k): v for k, v in shown.items()}}, tr.step)
            logger.flush()
            if verbose or not label:
                print(f"[train] epoch {epoch + 1}/{epochs} done: " + _epoch_summary(shown, verbose), flush=True)
        last = epoch + 1 == epochs
        tr.save_and_report(metrics, epoch, last or (epoch + 1) % spec.train.checkpoint_every == 0)
