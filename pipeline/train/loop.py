"""The one training loop: every method, every dataset, 1 CPU worker or 64 GPU workers.

Runs inside each Ray Train worker. Data arrives as encoded bytes from this worker's Ray Data shard,
views are made in-process (DALI or torch executor), the method returns a loss, DDP averages gradients.
"""
from __future__ import annotations

import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from pipeline import dist
from pipeline.augment.view_maker import build_view_maker
from pipeline.data.reader import load_split
from pipeline.eval.features import eval_preprocess, extract
from pipeline.eval.knn import knn_metrics
from pipeline.methods import build_method
from pipeline.train import checkpoint
from pipeline.train.optim import build_optimizer, lr_at, set_lr

class _Pending:
    """Views left over after corrupt samples were dropped, topped up from the next raw batch so every step
    still sees exactly `batch` samples (DDP collectives need equal shapes on every rank)."""

    def __init__(self, batch: int):
        self.batch = batch
        self.parts: list[list[torch.Tensor]] = []

    def add(self, images: list[torch.Tensor]) -> None:
        if images[0].shape[0]:
            self.parts.append(images)

    def __len__(self) -> int:
        return sum(p[0].shape[0] for p in self.parts)

    def take(self) -> list[torch.Tensor]:
        views = [torch.cat([p[v] for p in self.parts]) for v in range(len(self.parts[0]))]
        head, tail = [v[:self.batch] for v in views], [v[self.batch:] for v in views]
        self.parts = []
        self.add(tail)
        return head


class _KnnMonitor:
    """Rank 0's online kNN: a bank from the train split and a held-out query set, both un-augmented."""

    def __init__(self, cfg: dict):
        k, data = cfg["eval"]["knn"], cfg["data"]
        self.task, self.k, self.t = data["task"], k["k"], k["temperature"]
        targets = data.get("targets")
        self.bank = load_split(data["train"], self.task, targets, limit=k["bank_size"])
        self.val = load_split(data["val"], self.task, targets, limit=k["val_size"])
        aug = cfg["augment"]
        self.pre = eval_preprocess(aug["size"], aug["mean"], aug["std"])

    def __call__(self, backbone, device) -> dict[str, float]:
        fb, kb = extract(backbone, self.bank.encoded, self.pre, device=device)
        fv, kv = extract(backbone, self.val.encoded, self.pre, device=device)
        return knn_metrics(fb, torch.as_tensor(self.bank.y[kb]), fv, torch.as_tensor(self.val.y[kv]), self.task,
                           self.k, self.t, self.val.names)


def _maybe_fail(cfg: dict, epoch: int) -> None:
    """Test hook: raise once at the start of `epoch` (marker file), to exercise resume and restarts."""
    fail = cfg.get("debug", {}).get("fail_at_epoch")
    marker = cfg.get("debug", {}).get("fail_marker")
    if fail is not None and epoch == fail and marker and not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise RuntimeError(f"injected failure at epoch {epoch}")


def train_loop_per_worker(cfg: dict) -> None:
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    rt = cfg["runtime"]
    torch.set_num_threads(cfg["trainer"]["torch_threads"] or max(1, (os.cpu_count() or 1) // ctx.get_local_world_size()))
    torch.manual_seed(cfg["seed"])  # identical initialisation on every rank

    method = build_method(cfg)
    device = ray.train.torch.get_device()
    method.to(device)
    method.online = ray.train.torch.prepare_model(method.online)
    local_bs = cfg["train"]["batch_size"] // world
    optimizer = build_optimizer(method.online, cfg["optim"], rt["lr"])
    steps_per_epoch, epochs = rt["steps_per_epoch"], cfg["train"]["epochs"]
    total_steps, warmup = steps_per_epoch * epochs, steps_per_epoch * cfg["optim"]["warmup_epochs"]

    start_epoch, step = 0, 0
    ckpt = ray.train.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            state = checkpoint.load(d)
        checkpoint.load_method_state(method, state["method"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, step = state["epoch"] + 1, state["step"]
        if rank == 0:
            print(f"[train] resumed from epoch {state['epoch']} (step {step})", flush=True)

    views_of = build_view_maker(cfg["augment"], local_bs, num_threads=max(1, torch.get_num_threads()),
                                seed=cfg["seed"] + rank)
    logger = None
    knn = None
    if rank == 0:
        from pipeline.tracking import StepLogger

        logger = StepLogger(rt["tracking_uri"], rt["mlflow_run_id"])
        if cfg["eval"]["knn"]["every"]:
            knn = _KnnMonitor(cfg)
    shard = ray.train.get_dataset_shard("train")

    for epoch in range(start_epoch, epochs):
        _maybe_fail(cfg, epoch)
        rng = np.random.default_rng([cfg["seed"], rank, epoch])
        pending = _Pending(local_bs)
        skipped_before = views_of.skipped
        losses, t0, seen, t_log, n_log = [], time.monotonic(), 0, time.monotonic(), 0
        method.train()
        batches = shard.iter_batches(batch_size=local_bs, batch_format="numpy", drop_last=True,
                                     prefetch_batches=2, local_shuffle_buffer_size=cfg["train"]["shuffle_buffer"],
                                     local_shuffle_seed=cfg["seed"] * 1000 + epoch * world + rank)
        for raw in batches:
            views = views_of(raw, rng)
            pending.add(views.images)
            ready = torch.tensor(float(len(pending) >= local_bs))
            if dist.is_dist():
                torch.distributed.all_reduce(ready, op=torch.distributed.ReduceOp.MIN)
            if not ready.item():
                continue
            images = [v.to(device, non_blocking=True) for v in pending.take()]
            lr = lr_at(step, total_steps, warmup, rt["lr"])
            set_lr(optimizer, lr)
            out = method.training_step(images)
            optimizer.zero_grad(set_to_none=True)
            out["loss"].backward()
            optimizer.step()
            method.after_step(min(1.0, (step + 1) / total_steps))
            step += 1
            seen += local_bs
            n_log += local_bs
            losses.append(out["loss"].item())
            if logger and step % cfg["tracking"]["log_every"] == 0:
                now = time.monotonic()
                logger.log({"loss": losses[-1], "lr": lr, "images_per_s": n_log * world / (now - t_log),
                            **{k: float(v) for k, v in out.items() if k != "loss"}}, step)
                print(f"[train] epoch {epoch + 1}/{epochs} step {step}/{total_steps} loss {losses[-1]:.4f} "
                      f"lr {lr:.4f} {n_log * world / (now - t_log):.1f} img/s", flush=True)
                t_log, n_log = now, 0

        skipped = torch.tensor(float(views_of.skipped - skipped_before))
        if dist.is_dist():
            torch.distributed.all_reduce(skipped)
        metrics = {"epoch": epoch, "step": step, "epoch_loss": float(np.mean(losses)) if losses else float("nan"),
                   "epoch_images_per_s": seen * world / max(1e-9, time.monotonic() - t0),
                   "skipped_images": float(skipped)}
        if skipped.item() and rank == 0:
            warnings.warn(f"epoch {epoch}: skipped {int(skipped.item())} undecodable images")
        if knn and (epoch + 1) % cfg["eval"]["knn"]["every"] == 0:
            metrics.update(knn(method.backbone, device))
        if logger:
            logger.log({k: v for k, v in metrics.items() if k not in ("epoch", "step")}, step)
            logger.flush()
            print(f"[train] epoch {epoch + 1}/{epochs} done: " +
                  " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k not in ("epoch", "step")), flush=True)

        last = epoch + 1 == epochs
        if last or (epoch + 1) % cfg["train"]["checkpoint_every"] == 0:
            with tempfile.TemporaryDirectory() as d:
                ck = None
                if rank == 0:
                    checkpoint.save(d, method, optimizer, epoch, step, cfg)
                    ck = ray.train.Checkpoint.from_directory(d)
                ray.train.report(metrics, checkpoint=ck)
        else:
            ray.train.report(metrics)
