"""The Photos dataset: its sampling law (balanced classes, crop sides within SCALES, each split from its own strip),
determinism and resumable generation, and generation on first use through the same checks as Spirograph."""

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.config import ConfigError, compose_config
from pipeline.data import photos
from pipeline.data.manifest import read_manifest
from pipeline.train.prepare import resolve


def _decode(sample) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(sample["png"])))


def test_classes_are_balanced_and_named_by_the_photographs():
    labels = [s["cls"] for s in photos.iter_photos(70, 0, "train", 16)]
    assert np.bincount(labels).tolist() == [5] * len(photos.CLASS_NAMES) == [5] * 14
    assert all(p.dtype == np.uint8 and p.ndim == 3 and p.shape[2] == 3 for p in photos.photographs())


def test_samples_are_deterministic_and_any_start_resumes_the_same_sequence():
    full = list(photos.iter_photos(12, 3, "val", 16))
    again = list(photos.iter_photos(12, 3, "val", 16))
    tail = list(photos.iter_photos(12, 3, "val", 16, start=7))
    assert [s["png"] for s in full] == [s["png"] for s in again]
    assert [s["png"] for s in full[7:]] == [s["png"] for s in tail] and tail[0]["__key__"] == "00000007"
    assert _decode(full[0]).shape == (16, 16, 3)


@pytest.mark.parametrize("split", ["train", "val"])
def test_each_split_crops_its_own_strip_at_the_drawn_scale(split):
    """A photograph whose pixels encode their column: every crop's columns lie in the split's strip, and its side
    (the range of columns it spans) lies within SCALES of the shorter side."""
    h, w = 200, 1000
    cols = np.broadcast_to((np.arange(w) * 255 // (w - 1)).astype(np.uint8)[None, :, None], (h, w, 3)).copy()
    rng = np.random.default_rng(0)
    lo, hi = photos.REGIONS[split]
    for _ in range(50):
        # no flip and no resize blur on the edge columns: read the crop's columns before resizing
        got = photos.crop(cols, split, 64, rng)
        first, last = int(got[:, 2, 0].mean()), int(got[:, -3, 0].mean())
        left, right = min(first, last), max(first, last)
        assert lo * 255 - 2 <= left and right <= hi * 255 + 2
        span = (right - left) / 255 * (w - 1)
        assert photos.SCALES[0] * h * 0.8 <= span <= photos.SCALES[1] * h * 1.05


def test_near_flat_crops_are_drawn_again():
    img = np.zeros((100, 100, 3), np.uint8)
    img[:, 60:] = np.random.default_rng(0).integers(0, 255, (100, 40, 3), dtype=np.uint8)  # texture on the right
    rng = np.random.default_rng(1)
    crops = [photos.crop(img, "train", 16, rng) for _ in range(20)]  # the train strip is x < 70
    assert all(c.std() > 0 for c in crops)


def test_generated_on_first_use_into_its_own_folder_and_refused_when_the_settings_differ(tmp_path):
    def cfg(n_train, *extra):
        return compose_config(
            [
                f"paths.root={tmp_path}",
                "data=photos",
                f"data.generate.n_train={n_train}",
                "data.generate.n_val=28",
                "data.generate.maxcount=50",
                "train.batch_size=28",
                *extra,
            ]
        )

    out = cfg(56)
    plan = resolve(out)
    train = Path(out["data"]["train"])
    assert train.parent.name.startswith("photos-") and train.parent.parent == tmp_path / "data"
    manifest, _ = read_manifest(str(train))
    assert manifest["num_samples"] == 56 and manifest["class_names"] == photos.CLASS_NAMES
    assert manifest["generate"] == {"n_train": 56, "seed": 0, "size": 32, "maxcount": 50}
    assert plan.num_train_samples == 56
    old = train.parent
    with pytest.raises(ConfigError, match=r"^data.generate.n_train=84: the Photos data in .* was made with n_train=56"):
        resolve(cfg(84, f"data.train={old}/train", f"data.val={old}/val"))
