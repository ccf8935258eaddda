"""Detection transfer on torchvision's Faster R-CNN with FPN: the pretrained ResNet as its bottom-up trunk,
fine-tuned with the heads, then COCO AP on the validation split (pycocotools).

For installs without detectron2 and for CPU tests; the same settings (conf/detect/) drive the detectron2 engine.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.ops import FrozenBatchNorm2d, MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from pipeline.detect.coco_data import CocoSplit, coco_ap, coco_results
from pipeline.detect.diverged import Diverged
from pipeline.eval.finetune import clip_each_
from pipeline.progress import bar as progress

STAGE_LAYER = {"res2": "layer1", "res3": "layer2", "res4": "layer3", "res5": "layer4"}  # detectron2's stage names


def stage_channels(backbone: nn.Module) -> dict[str, int]:
    """Output channels of each stage (res2..res5) of a torchvision ResNet."""
    out = {}
    for stage, layer in STAGE_LAYER.items():
        last = getattr(backbone, layer)[-1]
        conv = last.conv3 if hasattr(last, "conv3") else last.conv2
        out[stage] = conv.out_channels
    return out


def freeze_bn(module: nn.Module) -> nn.Module:
    """BatchNorm layers replaced by torchvision's FrozenBatchNorm2d with the same statistics and affine."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            frozen = FrozenBatchNorm2d(child.num_features, eps=child.eps)
            frozen.weight.copy_(child.weight.detach())
            frozen.bias.copy_(child.bias.detach())
            frozen.running_mean.copy_(child.running_mean)
            frozen.running_var.copy_(child.running_var)
            setattr(module, name, frozen)
        else:
            freeze_bn(child)
    return module


def build_detector(backbone: nn.Module, num_classes: int, d: dict, mean, std):
    """Faster R-CNN (FPN) over `backbone`'s stages d["in_features"], one anchor size per FPN level
    (d["anchor_sizes"]), images kept at d["min_size"]..d["max_size"], normalised with the backbone's mean/std
    (0-1 scale). `num_classes` excludes the background."""
    if d["norm"] == "frozen":
        freeze_bn(backbone)
    channels = stage_channels(backbone)
    names = [str(i) for i in range(len(d["in_features"]))]
    fpn = BackboneWithFPN(
        backbone,
        {STAGE_LAYER[f]: n for f, n in zip(d["in_features"], names)},
        [channels[f] for f in d["in_features"]],
        d["fpn_channels"],
        extra_blocks=LastLevelMaxPool(),
    )
    sizes = tuple((int(s),) for s in d["anchor_sizes"])
    anchors = AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * len(sizes))
    pool = MultiScaleRoIAlign(featmap_names=names, output_size=7, sampling_ratio=2)
    return FasterRCNN(
        fpn,
        num_classes=num_classes + 1,
        rpn_anchor_generator=anchors,
        box_roi_pool=pool,
        min_size=d["min_size"],
        max_size=d["max_size"],
        image_mean=list(mean),
        image_std=list(std),
        box_batch_size_per_image=d["roi_batch_per_image"],
    )


def lr_at(it: int, d: dict) -> float:
    """Linear warm-up over d["warmup"] iterations, then x0.1 at each of d["steps"] (detectron2's WarmupMultiStep)."""
    base = d["lr"] * (min(1.0, (it + 1) / d["warmup"]) if d["warmup"] else 1.0)
    return base * 0.1 ** sum(it >= s for s in d["steps"])


def _batches(ds, batch_size: int, seed: int):
    """Endless shuffled batches (lists of images, lists of targets), a new order each pass."""
    g = torch.Generator().manual_seed(seed)
    while True:
        for idx in torch.randperm(len(ds), generator=g).split(batch_size):
            if len(idx) == batch_size:
                images, targets = zip(*(ds[int(i)] for i in idx))
                yield list(images), list(targets)


def train(model, ds, d: dict, device: torch.device, log=None, label: str = "") -> dict[str, float]:
    """d["iterations"] SGD steps (momentum 0.9, d["weight_decay"], gradients clipped per parameter at
    d["clip_grad_norm"]) on batches of d["batch_size"]; `log(it, losses)` every d["log_every"]. Returns the last
    logged losses; Diverged at a non-finite loss."""
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=d["lr"], momentum=0.9, weight_decay=d["weight_decay"])
    batches, last = _batches(ds, d["batch_size"], d["seed"]), {}
    bar = progress(d["iterations"], "[detect]", label, "it")
    for it in range(d["iterations"]):
        images, targets = next(batches)
        images = [x.to(device, non_blocking=True) for x in images]
        targets = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets]
        for group in opt.param_groups:
            group["lr"] = lr_at(it, d)
        losses = model(images, targets)
        loss = sum(losses.values())
        value = float(loss.detach())
        if not math.isfinite(value):
            bar.close()
            raise Diverged(it + 1, f"loss {value}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_each_(params, d.get("clip_grad_norm"))
        opt.step()
        bar.update(1)
        if (it + 1) % d["log_every"] == 0 or it + 1 == d["iterations"]:
            last = {"loss": value, **{k: float(v.detach()) for k, v in losses.items()}}
            bar.set_postfix(loss=f"{value:.3f}")
            if log is not None:
                log(it + 1, last)
    bar.close()
    return last


@torch.no_grad()
def predict(model, ds, device: torch.device, batch_size: int = 8) -> list[dict]:
    """COCO-format detections of every image of `ds`."""
    model.to(device).eval()
    results = []
    for start in range(0, len(ds), batch_size):
        items = [ds[i] for i in range(start, min(start + batch_size, len(ds)))]
        outs = model([x.to(device) for x, _ in items])
        for (_, t), o in zip(items, outs):
            cats = torch.tensor([ds.category_of[int(label)] for label in o["labels"]], dtype=torch.int64)
            results += coco_results(t["image_id"], o["boxes"].cpu(), cats, o["scores"].cpu())
    return results


def transfer(
    backbone: nn.Module, data: dict, d: dict, mean, std, device: torch.device, log=None, label: str = ""
) -> dict:
    """Fine-tune a detector on `backbone` and evaluate it: {"AP", "AP50", "AP75", "minutes", "results"} (the detector
    is dropped here, so two transfers never hold two detectors)."""
    torch.manual_seed(d["seed"])
    train_ds = CocoSplit(data["train_json"], data["train_images"], flip=True, seed=d["seed"])
    val_ds = CocoSplit(data["val_json"], data["val_images"])
    model = build_detector(backbone, len(train_ds.categories), d, mean, std)
    t0 = time.monotonic()
    train(model, train_ds, d, device, log, label)
    results = predict(model, val_ds, device)
    del model
    return {**coco_ap(data["val_json"], results), "minutes": (time.monotonic() - t0) / 60, "results": results}
