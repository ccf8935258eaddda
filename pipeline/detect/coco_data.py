"""A COCO-format detection split (annotations JSON + image folder) as torch samples, and COCO AP of detections
by pycocotools' COCOeval (the evaluator COCO's own results are computed with)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image


class CocoSplit(torch.utils.data.Dataset):
    """Images as float RGB tensors in [0, 1] with {"boxes" (x0, y0, x1, y1), "labels", "image_id"}; crowd boxes
    left out; `flip`: a random horizontal flip per sample (training). Labels are 1..K in category-id order
    (COCO's ids run to 90 for 80 classes, and 0 is a detector's background); `category_of` maps them back."""

    def __init__(self, annotations: str | Path, images: str | Path, flip: bool = False, seed: int = 0):
        self.annotations, self.root, self.flip = Path(annotations), Path(images), flip
        coco = json.loads(self.annotations.read_text())
        self.images = sorted(coco["images"], key=lambda im: im["id"])
        self.categories = sorted(coco["categories"], key=lambda c: c["id"])
        self.label_of = {c["id"]: i + 1 for i, c in enumerate(self.categories)}
        self.category_of = {label: cat for cat, label in self.label_of.items()}
        self.by_image: dict[int, list] = {im["id"]: [] for im in self.images}
        for a in coco["annotations"]:
            if not a.get("iscrowd", 0) and a["bbox"][2] > 0 and a["bbox"][3] > 0:
                self.by_image.setdefault(a["image_id"], []).append(a)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        im = self.images[i]
        x = torch.from_numpy(np.asarray(Image.open(self.root / im["file_name"]).convert("RGB")).copy())
        x = x.permute(2, 0, 1).float() / 255.0
        anns = self.by_image[im["id"]]
        boxes = torch.tensor(
            [[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]] for a in anns],
            dtype=torch.float32,
        ).reshape(-1, 4)
        labels = torch.tensor([self.label_of[a["category_id"]] for a in anns], dtype=torch.int64)
        if self.flip and self.rng.random() < 0.5:
            x = x.flip(-1)
            w = x.shape[-1]
            boxes = torch.stack([w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]], dim=1)
        return x, {"boxes": boxes, "labels": labels, "image_id": im["id"]}


def coco_results(image_id: int, boxes: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor) -> list[dict]:
    """One image's detections (x0, y0, x1, y1) in COCO's results format (bbox as x, y, w, h)."""
    out = []
    for (x0, y0, x1, y1), c, s in zip(boxes.tolist(), labels.tolist(), scores.tolist()):
        out.append(
            {"image_id": int(image_id), "category_id": int(c), "bbox": [x0, y0, x1 - x0, y1 - y0], "score": float(s)}
        )
    return out


def coco_ap(annotations: str | Path, results: list[dict]) -> dict[str, float]:
    """COCO box AP (IoU .50:.95), AP50 and AP75 in percent, as COCO and the papers report them; 0 when there
    are no detections at all."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not results:
        return {"AP": 0.0, "AP50": 0.0, "AP75": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and the summary table
        gt = COCO(str(annotations))
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {"AP": 100 * float(ev.stats[0]), "AP50": 100 * float(ev.stats[1]), "AP75": 100 * float(ev.stats[2])}
