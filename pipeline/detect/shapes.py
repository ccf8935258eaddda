"""The embedded detection set: circles, squares and triangles on a dark, noisy canvas, boxes in COCO JSON.

Small enough to train a detector on a CPU in minutes, so detection runs offline and in CI. Objects are drawn as
outlines or filled in a random colour, at random sizes and places, overlapping at most a little (IoU <= 0.2).
Written as <out>/<split>/images/*.png with <out>/<split>/annotations.json (COCO: images, annotations with
bbox [x, y, w, h] in pixels, area, iscrowd, categories 1..3) and <out>/manifest.json (the settings and counts:
a folder made with other settings is never reused).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle")
DEFAULTS = {
    "n_train": 240,
    "n_val": 60,
    "size": 128,
    "min_objects": 1,
    "max_objects": 4,
    "min_side": 20,
    "max_side": 48,
    "seed": 0,
}


def settings_digest(settings: dict) -> str:
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


def _iou(a, b) -> float:
    ix = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def draw_image(rng: np.random.Generator, s: dict) -> tuple[Image.Image, list[dict]]:
    """One image and its objects ({"category_id", "bbox"}): a box is its shape's square (an outline's stroke may
    spill over it by a pixel)."""
    size = s["size"]
    base = rng.uniform(0, 60, size=3)
    noise = rng.normal(0, 8, size=(size, size, 3))
    canvas = np.clip(base + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(canvas)
    draw = ImageDraw.Draw(img)
    objects: list[dict] = []
    for _ in range(int(rng.integers(s["min_objects"], s["max_objects"] + 1))):
        for _try in range(20):  # a place that overlaps the others at most a little
            side = float(rng.uniform(s["min_side"], s["max_side"]))
            x, y = rng.uniform(0, size - side, size=2)
            box = [float(x), float(y), side, side]
            if all(_iou(box, o["bbox"]) <= 0.2 for o in objects):
                break
        else:
            continue
        cls = int(rng.integers(len(CLASSES)))
        colour = tuple(int(c) for c in rng.uniform(120, 255, size=3))
        filled, width = bool(rng.random() < 0.5), int(rng.integers(2, 4))
        x0, y0, x1, y1 = x, y, x + side, y + side
        kw = {"fill": colour} if filled else {"outline": colour, "width": width}
        if CLASSES[cls] == "circle":
            draw.ellipse([x0, y0, x1, y1], **kw)
        elif CLASSES[cls] == "square":
            draw.rectangle([x0, y0, x1, y1], **kw)
        else:
            pts = [(x0 + side / 2, y0), (x1, y1), (x0, y1)]
            if filled:
                draw.polygon(pts, fill=colour)
            else:
                draw.line([*pts, pts[0]], fill=colour, width=width, joint="curve")
        objects.append({"category_id": cls + 1, "bbox": box})
    return img, objects


def coco_dict(images: list[dict], annotations: list[dict]) -> dict:
    return {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(CLASSES)],
    }


def write_split(out: Path, n: int, s: dict, seed: int) -> dict:
    """`n` images under out/images and their COCO annotations.json; returns the counts."""
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    images: list[dict] = []
    anns: list[dict] = []
    for i in range(n):
        img, objects = draw_image(rng, s)
        name = f"{i:06d}.png"
        img.save(out / "images" / name)
        images.append({"id": i + 1, "file_name": name, "width": s["size"], "height": s["size"]})
        for o in objects:
            x, y, w, h = (round(v, 2) for v in o["bbox"])
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i + 1,
                    "category_id": o["category_id"],
                    "bbox": [x, y, w, h],
                    "area": round(w * h, 2),
                    "iscrowd": 0,
                }
            )
    tmp = out / "annotations.json.partial"
    tmp.write_text(json.dumps(coco_dict(images, anns)))
    tmp.replace(out / "annotations.json")  # last: a split with annotations.json is complete
    return {"images": n, "objects": len(anns)}


def make_shapes(root: Path, settings: dict | None = None) -> Path:
    """The set for `settings` (DEFAULTS overridden) under root/shapes-<digest>/, made once; returns its folder."""
    s = {**DEFAULTS, **(settings or {})}
    unknown = set(s) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown shapes settings {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    if not (1 <= s["min_objects"] <= s["max_objects"]) or not (4 <= s["min_side"] <= s["max_side"] < s["size"]):
        raise ValueError(
            f"shapes settings out of range: objects {s['min_objects']}..{s['max_objects']}, sides "
            f"{s['min_side']}..{s['max_side']} px on a {s['size']} px image"
        )
    out = Path(root) / f"shapes-{settings_digest(s)}"
    manifest = out / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("settings") == s:
        return out
    counts = {
        "train": write_split(out / "train", s["n_train"], s, s["seed"]),
        "val": write_split(out / "val", s["n_val"], s, s["seed"] + 1),
    }
    manifest.write_text(
        json.dumps({"kind": "shapes-detection", "classes": list(CLASSES), "settings": s, "counts": counts}, indent=2)
    )
    return out
