"""PASCAL VOC for the detection job: a VOCdevkit tree (VOC2007/, VOC2012/, each with Annotations/*.xml,
JPEGImages/ and ImageSets/Main/<split>.txt) read into COCO-format JSON, which both engines and pycocotools take,
and the VOC07 AP50 (11-point, difficult objects ignored) of detections by detectron2's own `voc_eval`.

Boxes follow detectron2's VOC loader: VOC's 1-based inclusive pixel corners become x0 = xmin - 1, y0 = ymin - 1,
x1 = xmax, y1 = ymax, and detections go back as x0 + 1, y0 + 1 for voc_eval. Difficult objects are trained on, as
detectron2's loader (and so MoCo's protocol) does; in the test JSON they are COCO crowd regions (iscrowd = 1):
neither a hit nor a miss in COCO AP, as the VOC metric ignores them."""

from __future__ import annotations

import hashlib
import json
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

VOC_CLASSES = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)


def parse_sets(sets: list[str]) -> list[tuple[str, str]]:
    """["2007_trainval", "2012_trainval"] -> [("2007", "trainval"), ...]; ValueError with one line otherwise."""
    out = []
    for s in sets:
        year, _, split = str(s).partition("_")
        if not (year.isdigit() and split):
            raise ValueError(f"{s!r}: expected <year>_<split>, e.g. 2007_trainval")
        out.append((year, split))
    return out


def missing(root: str | Path, sets: list[str]) -> str | None:
    """The first file a VOC set needs that is not there, or None."""
    for year, split in parse_sets(sets):
        f = Path(root) / f"VOC{year}" / "ImageSets" / "Main" / f"{split}.txt"
        if not f.exists():
            return str(f)
    return None


def _find(node: ET.Element, tag: str) -> ET.Element:
    """node's child `tag`, which the VOC annotation format requires."""
    child = node.find(tag)
    if child is None:
        raise ValueError(f"<{node.tag}> without <{tag}>")
    return child


def _text(node: ET.Element, tag: str) -> str:
    """The text of node's child `tag` (see _find)."""
    text = _find(node, tag).text
    if text is None:
        raise ValueError(f"<{node.tag}> with an empty <{tag}>")
    return text


def to_coco(root: str | Path, sets: list[str], classes: list[str], out: Path, test: bool = False) -> Path:
    """The listed VOC sets as one COCO-format JSON at `out` (rewritten only when the sets, classes or the id lists
    changed). Images keep their VOC name and year ("voc_id", "year") for the VOC metric; file names are relative
    to `root`. `test`: difficult objects become crowd regions (ignored by COCO AP); otherwise they are trained on."""
    root = Path(root)
    ids = {
        s: (root / f"VOC{y}" / "ImageSets" / "Main" / f"{p}.txt").read_text().split()
        for s, (y, p) in zip(sets, parse_sets(sets))
    }
    digest = hashlib.sha1(json.dumps([str(root), sets, classes, ids, test], sort_keys=True).encode()).hexdigest()[:12]
    if out.exists() and json.loads(out.read_text()).get("info", {}).get("digest") == digest:
        return out
    cat = {name: i + 1 for i, name in enumerate(classes)}
    images: list[dict] = []
    anns: list[dict] = []
    for s, (year, _) in zip(sets, parse_sets(sets)):
        for voc_id in ids[s]:
            tree = ET.parse(root / f"VOC{year}" / "Annotations" / f"{voc_id}.xml").getroot()
            size = _find(tree, "size")
            image_id = len(images) + 1
            images.append(
                {
                    "id": image_id,
                    "file_name": f"VOC{year}/JPEGImages/{voc_id}.jpg",
                    "voc_id": voc_id,
                    "year": year,
                    "width": int(_text(size, "width")),
                    "height": int(_text(size, "height")),
                }
            )
            for obj in tree.findall("object"):
                name = _text(obj, "name").strip()
                if name not in cat:
                    raise ValueError(f"{voc_id}.xml: class {name!r} is not in detect.data.classes")
                b = _find(obj, "bndbox")
                x0, y0 = float(_text(b, "xmin")) - 1, float(_text(b, "ymin")) - 1
                x1, y1 = float(_text(b, "xmax")), float(_text(b, "ymax"))
                hard = int(_text(obj, "difficult")) if obj.find("difficult") is not None else 0
                anns.append(
                    {
                        "id": len(anns) + 1,
                        "image_id": image_id,
                        "category_id": cat[name],
                        "bbox": [x0, y0, x1 - x0, y1 - y0],
                        "area": (x1 - x0) * (y1 - y0),
                        "iscrowd": hard if test else 0,
                        "difficult": hard,
                    }
                )
    out.parent.mkdir(parents=True, exist_ok=True)
    coco = {
        "info": {"digest": digest, "sets": sets},
        "images": images,
        "annotations": anns,
        "categories": [{"id": i, "name": n} for n, i in cat.items()],
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(coco))
    tmp.replace(out)
    return out


def voc07_ap50(coco_json: str | Path, root: str | Path, results: list[dict]) -> float:
    """Mean over classes of VOC07's 11-point AP at IoU 0.5, in percent, by detectron2's voc_eval on the split's
    own XML files (one VOC year). Needs detectron2."""
    from detectron2.evaluation.pascal_voc_evaluation import voc_eval

    coco = json.loads(Path(coco_json).read_text())
    years = {im["year"] for im in coco["images"]}
    if len(years) != 1:
        raise ValueError(f"the VOC metric scores one year's test set, not {sorted(years)}")
    year = years.pop()
    voc_id = {im["id"]: im["voc_id"] for im in coco["images"]}
    names = {c["id"]: c["name"] for c in coco["categories"]}
    aps = []
    with tempfile.TemporaryDirectory(prefix="voc-eval-") as d:
        (Path(d) / "ids.txt").write_text("\n".join(voc_id.values()) + "\n")
        lines: dict[int, list[str]] = {c: [] for c in names}
        for r in results:
            x, y, w, h = r["bbox"]
            lines[r["category_id"]].append(
                f"{voc_id[r['image_id']]} {r['score']:.6f} {x + 1:.2f} {y + 1:.2f} {x + w:.2f} {y + h:.2f}"
            )
        for c, name in names.items():
            (Path(d) / f"{name}.txt").write_text("\n".join(lines[c]) + ("\n" if lines[c] else ""))
            annopath = str(Path(root) / f"VOC{year}" / "Annotations" / "{}.xml")
            _, _, ap = voc_eval(
                str(Path(d) / "{}.txt"), annopath, str(Path(d) / "ids.txt"), name, 0.5, use_07_metric=True
            )
            aps.append(ap)
    return 100.0 * float(sum(aps) / len(aps))
