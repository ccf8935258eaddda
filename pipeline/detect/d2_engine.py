"""Detection transfer on detectron2: its own DefaultTrainer, data loader, solver and COCOEvaluator, from the
backbone exported by pipeline.detect.export (or from random init), configured from conf/detect/."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
from detectron2.data import DatasetCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.engine import DefaultTrainer, HookBase, defaults, hooks, launch
from detectron2.evaluation import COCOEvaluator
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from pipeline.cores import cores
from pipeline.detect import d2_backbone  # noqa: F401  (registers the project's backbones)
from pipeline.detect.d2_config import model_config
from pipeline.detect.diverged import Diverged
from pipeline.detect.notices import quiet_torch_notices
from pipeline.progress import bar


def register(name: str, json_file: str, images: str) -> str:
    """A COCO-format split in detectron2's DatasetCatalog (once per process)."""
    if name not in DatasetCatalog.list():
        register_coco_instances(name, {}, str(json_file), str(images))
    return name


def fpn_names(in_features: list[str], cifar_stem: bool) -> list[str]:
    """detectron2's FPN level names for these stages (p<log2 stride>) and the max-pooled level above them."""
    first = 0 if cifar_stem else 2  # res2's stride: 1 behind the CIFAR stem, 4 behind the 7x7/2 stem + pool
    logs = [first + int(f[3:]) - 2 for f in in_features]
    return [f"p{i}" for i in logs] + [f"p{logs[-1] + 1}"]


def config(meta: dict, d: dict, data: dict, num_classes: int, device: str, out_dir: Path, weights: str, tag: str):
    """The detectron2 CfgNode of one transfer: the arch's model-zoo config, the backbone's layout and pixel
    statistics (meta), the preset's detector, input sizes and schedule (d), the registered splits."""
    cfg = model_config(meta, d["arch"], num_classes, base=d.get("detectron2_base"))
    cfg.MODEL.WEIGHTS = weights
    cfg.MODEL.DEVICE = device
    # BN synchronised across the training processes when there are several, as MoCo's protocol does over its 8 GPUs
    # (torch's SyncBN needs CUDA; detectron2's naiveSyncBN all-reduces the statistics on any backend); one
    # process: plain BN, which is what SyncBN is there
    workers = int(d.get("workers", 1))
    sync = ("SyncBN" if device == "cuda" else "naiveSyncBN") if workers > 1 else "BN"
    cfg.MODEL.RESNETS.NORM = "FrozenBN" if d["norm"] == "frozen" else sync
    cfg.MODEL.BACKBONE.FREEZE_AT = 0  # MoCo's transfer protocol fine-tunes every stage (the zoo freezes stem+res2)
    if d["arch"] == "fpn":
        levels = fpn_names(d["in_features"], meta["resnets"]["CIFAR_STEM"])
        cfg.MODEL.RESNETS.OUT_FEATURES = cfg.MODEL.FPN.IN_FEATURES = list(d["in_features"])
        cfg.MODEL.RPN.IN_FEATURES = levels
        cfg.MODEL.ROI_HEADS.IN_FEATURES = levels[:-1]
        cfg.MODEL.FPN.OUT_CHANNELS = d["fpn_channels"]
        cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[int(s)] for s in d["anchor_sizes"]]
    else:
        cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[int(s) for s in d["anchor_sizes"]]]
    cfg.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS = [[0.5, 1.0, 2.0]]
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = d["roi_batch_per_image"]
    cfg.DATASETS.TRAIN = (register(f"{tag}_train", data["train_json"], data["train_images"]),)
    cfg.DATASETS.TEST = (register(f"{tag}_val", data["val_json"], data["val_images"]),)
    cfg.DATALOADER.NUM_WORKERS = 0 if device == "cpu" else 4
    cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MAX_SIZE_TRAIN = (d["min_size"],), d["max_size"]
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = d["min_size"], d["max_size"]
    cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.BASE_LR = d["batch_size"], d["lr"]
    cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS = d["iterations"], tuple(d["steps"])
    cfg.SOLVER.WARMUP_ITERS, cfg.SOLVER.WEIGHT_DECAY = d["warmup"], d["weight_decay"]
    if d.get("clip_grad_norm"):  # each parameter's gradient norm, as tv_engine.clip_each_ does
        clip = cfg.SOLVER.CLIP_GRADIENTS
        clip.ENABLED, clip.CLIP_TYPE, clip.CLIP_VALUE, clip.NORM_TYPE = True, "norm", float(d["clip_grad_norm"]), 2.0
    cfg.SOLVER.CHECKPOINT_PERIOD = max(d["iterations"], 1)
    cfg.TEST.EVAL_PERIOD = 0
    cfg.SEED = d["seed"]
    cfg.OUTPUT_DIR = str(out_dir)
    return cfg


class _Progress(HookBase):
    """Progress over the iterations (pipeline.progress: a bar on a terminal, plain lines in a file), and the losses
    to `log(iteration, losses)` every `every` steps."""

    def __init__(self, total: int, label: str, every: int, log=None):
        self.bar = bar(total, "[detect]", label, "it")
        self.every, self.log = every, log

    def after_step(self):
        it = self.trainer.iter + 1
        self.bar.update(1)
        if it % self.every == 0 or it == self.trainer.max_iter:
            latest = self.trainer.storage.latest()
            losses = {k: float(v[0]) for k, v in latest.items() if k.startswith("loss") or k == "total_loss"}
            if not all(math.isfinite(v) for v in losses.values()):
                raise FloatingPointError(f"detection loss is not finite at iteration {it}: {losses}")
            self.bar.set_postfix(loss=f"{losses.get('total_loss', float('nan')):.3f}")
            if self.log is not None:
                self.log(
                    it,
                    {
                        "loss": losses.get("total_loss", float("nan")),
                        **{k: v for k, v in losses.items() if k != "total_loss"},
                    },
                )

    def after_train(self):
        self.bar.close()


class Trainer(DefaultTrainer):
    def build_hooks(self):
        """DefaultTrainer's hooks less its EvalHook, which evaluates again after the last iteration: transfer()
        evaluates once, with pycocotools' printing captured."""
        return [h for h in super().build_hooks() if not isinstance(h, hooks.EvalHook)]

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        # distributed: each process scores its share of the images, the main one gathers them
        return COCOEvaluator(
            dataset_name, tasks=("bbox",), distributed=True, output_dir=output_folder or cfg.OUTPUT_DIR
        )


def transfer(
    meta: dict,
    weights: str,
    data: dict,
    d: dict,
    device: str,
    out_dir: Path,
    tag: str,
    log: tuple[str, str, str] | None = None,
    label: str = "",
    verbose: bool = False,
) -> dict:
    """Train detectron2 from `weights` ("" = random init) and evaluate: {"AP", "AP50", "AP75", "results"}.

    `d["workers"]` training processes through detectron2's own `launch` (one per GPU; gloo processes on a CPU),
    DDP with BN synchronised across them; the batch of d["batch_size"] images is split over them. `log`: (MLflow
    tracking URI, run id, metric-name prefix) the main process logs the losses to."""
    workers = int(d.get("workers", 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "transfer.json"
    stale = [summary, out_dir / "coco_instances_results.json", *out_dir.glob("diverged.*.json")]
    for path in stale:  # an earlier attempt's: never scored again
        path.unlink(missing_ok=True)
    # spawned processes import detectron2 (torch's jit notice) before any filter of theirs applies: theirs by env
    notices = (
        ("FutureWarning", "torch.jit._script"),
        ("UserWarning", "torch.functional"),
        ("FutureWarning", "detectron2.engine.defaults"),
    )
    quiet = (
        {} if verbose or workers == 1 else {"PYTHONWARNINGS": ",".join(f"ignore::{cat}:{mod}" for cat, mod in notices)}
    )
    saved = {k: os.environ.get(k) for k in quiet}
    os.environ.update(quiet)
    try:
        launch(
            _train_and_test,
            workers,
            dist_url="auto",  # one machine: a free local port
            args=(meta, weights, data, d, device, out_dir, tag, log, label, verbose),
        )
    except Exception:
        # a training process that diverged left its note (from a spawned process, only the note comes back whole)
        notes = sorted(out_dir.glob("diverged.*.json"))
        if not notes:
            raise
        note = json.loads(notes[0].read_text())
        raise Diverged(note["iteration"], note["what"]) from None
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    res = json.loads(summary.read_text())
    results_file = out_dir / "coco_instances_results.json"
    res["results"] = json.loads(results_file.read_text()) if results_file.exists() else []
    return res


def _train_and_test(
    meta: dict, weights: str, data: dict, d: dict, device: str, out_dir: Path, tag: str, log, label: str, verbose: bool
) -> None:
    """One training process (of d["workers"]): train, evaluate; the main one writes out_dir/transfer.json."""
    main = comm.is_main_process()
    if not verbose and comm.get_world_size() > 1:  # a spawned process: the job's warning filters are not inherited
        quiet_torch_notices()
    if device == "cpu":  # a thread per core in each of the processes would put workers x cores threads on them
        torch.set_num_threads(max(1, min(torch.get_num_threads(), cores() // comm.get_world_size())))
    if device == "cpu" and comm.get_world_size() > 1:
        # DefaultTrainer wraps the model in DDP with the local rank as a CUDA device id, which DDP refuses for a CPU
        # model; device_ids=None is DDP's CPU form. Patched in this spawned training process only.
        ddp = defaults.create_ddp_model
        defaults.create_ddp_model = lambda model, **kw: ddp(model, device_ids=None, **kw)
    if verbose:
        setup_logger()  # detectron2's own console log: config, iterations, the evaluator's tables
    else:
        # DefaultTrainer installs that console log when INFO is off for "detectron2"; INFO on with no handler
        # of its own lets only warnings reach the console (Python's last-resort handler)
        logging.getLogger("detectron2").setLevel(logging.INFO)
    num_classes = len(json.loads(Path(data["train_json"]).read_text())["categories"])
    cfg = config(meta, d, data, num_classes, device, out_dir, weights, tag)
    trainer = Trainer(cfg)
    _load(trainer, weights, verbose, say=main)
    if main:
        trainer.register_hooks([_Progress(cfg.SOLVER.MAX_ITER, label, d["log_every"], _logger(log))])
    _train(trainer, out_dir, verbose)
    with contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO()):
        res = Trainer.test(cfg, trainer.model)  # pycocotools prints its progress and summary to stdout
    if main:
        box = res.get("bbox", {})
        (out_dir / "transfer.json").write_text(
            json.dumps(
                {"AP": _finite(box.get("AP")), "AP50": _finite(box.get("AP50")), "AP75": _finite(box.get("AP75"))}
            )
        )
    if comm.get_world_size() > 1:
        # every process waits for the others, then tears the group down: a process that exits with its gloo group
        # alive can abort in the group's destructor ("terminate called without an active exception", SIGABRT)
        comm.synchronize()
        dist.destroy_process_group()


def _train(trainer, out_dir: Path, verbose: bool) -> None:
    """trainer.train(); where it diverges (detectron2's FloatingPointError: a non-finite loss, or "Predicted boxes
    or scores contain Inf/NaN"), a note diverged.<rank>.json for transfer() and no traceback on the console (the
    job says it in one line) unless verbose."""
    train_log = logging.getLogger("detectron2.engine.train_loop")
    quiet, propagate = logging.NullHandler(), train_log.propagate
    if not verbose:  # it logs the exception with its traceback before raising it
        train_log.addHandler(quiet)
        train_log.propagate = False
    try:
        trainer.train()
    except FloatingPointError as e:
        what = "non-finite loss" if "Loss became" in str(e) or "not finite" in str(e) else "non-finite boxes or scores"
        (out_dir / f"diverged.{comm.get_rank()}.json").write_text(
            json.dumps({"iteration": trainer.iter + 1, "what": what})
        )
        raise
    finally:
        train_log.removeHandler(quiet)
        train_log.propagate = propagate


def _logger(log: tuple[str, str, str] | None):
    """log(iteration, losses) into the MLflow run `log` names (a client of its own: this may be a spawned process)."""
    if log is None:
        return None
    uri, run_id, prefix = log
    client = MlflowClient(uri)

    def write(it: int, losses: dict) -> None:
        now = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(f"{prefix}{k}", v, now, it) for k, v in losses.items()])

    return write


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


TRUNK = re.compile(r"(bottom_up\.|backbone\.|roi_heads\.)(stem|res[2-5])\b")


def _load(trainer, weights: str, verbose: bool, say: bool = True) -> None:
    """Load `weights` through detectron2's checkpointer and read its report: a trunk weight it did not find or a
    shape it skipped is an error (training would start partly from scratch without saying so); the new FPN and
    heads it lists as not found are expected, so outside verbose mode the report becomes one line."""
    logs = [logging.getLogger(n) for n in ("fvcore.common.checkpoint", "detectron2.checkpoint.c2_model_loading")]
    lines, propagate = _Lines(), [lg.propagate for lg in logs]
    for lg in logs:
        lg.addHandler(lines)
        lg.propagate = verbose
    try:
        trainer.resume_or_load(resume=False)
    finally:
        for lg, p in zip(logs, propagate):
            lg.removeHandler(lines)
            lg.propagate = p
    if not weights:
        return
    report = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in lines.lines)
    missing = report.split("not found in the checkpoint:")[-1] if "not found in the checkpoint" in report else ""
    if TRUNK.search(missing) or "will not be loaded" in report:
        raise RuntimeError(f"detectron2 did not load every backbone weight of {weights}: {missing.strip()[:500]}")
    if not verbose and say:  # one line, from the main process
        print("[detect] detectron2 loaded every backbone weight; the FPN and heads start from scratch", flush=True)


def _finite(x) -> float:
    """detectron2 reports NaN AP for a class set with no detections at all: 0 here, as pycocotools' -1 is."""
    return float(x) if x is not None and math.isfinite(float(x)) else 0.0
