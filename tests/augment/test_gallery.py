"""The gallery as a person reads it: 9 pt text at the PNG's own size, full op names, rounded magnitudes, images
from several shards and classes."""

import numpy as np
from PIL import Image

from helpers import natural
from pipeline.augment.gallery import FONT_PT, describe, gallery_figure, sample_batch
from pipeline.augment.strong import OP_ID, OPS


def test_strong_ops_print_full_names_and_rounded_magnitudes():
    ops = ["ShearX", "Solarize", "Posterize", "Color", "AutoContrast", "TranslateY"]
    p = {
        "strong_op": np.array([[OP_ID[o] for o in ops]]),
        "strong_on": np.ones((1, 6), dtype=np.uint8),
        "strong_mag": np.array([[-0.2345678, 137.53125, 5.0, 0.123456789, 0.0, 0.3]], dtype=np.float32),
    }
    lines = describe(p, 0).splitlines()
    assert lines == ["ShearX -0.23", "Solarize 138", "Posterize 5", "Color 0.12", "AutoContrast", "TranslateY +0.3"]
    # every op name of the pool prints in full
    all_ops = {
        "strong_op": np.arange(len(OPS))[None],
        "strong_on": np.ones((1, len(OPS)), dtype=np.uint8),
        "strong_mag": np.full((1, len(OPS)), 0.5, dtype=np.float32),
    }
    assert [ln.split()[0] for ln in describe(all_ops, 0).splitlines()] == list(OPS)


def test_every_text_in_the_grid_is_at_least_9_pt():
    import torch

    from pipeline.augment.executors import Views

    views = Views(
        images=[torch.rand(2, 3, 16, 16)] * 2,
        params=[{"crop": torch.tensor([[0, 0, 8, 8], [1, 1, 9, 9]]), "flip": torch.tensor([0, 1])}] * 2,
        kept=np.arange(2),
    )
    aug = {"kind": "spirograph", "size": 16, "mean": [0.5] * 3, "std": [0.5] * 3}
    fig = gallery_figure([torch.rand(3, 16, 16)] * 2, views, aug, ["global", "local"], title="t")
    sizes = [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_text") and a.get_text())]
    assert sizes and min(sizes) >= FONT_PT >= 9


def test_gallery_images_come_from_several_shards_and_classes(tmp_path):
    from pipeline.data.shards import write_split

    # class-ordered shards (what an unshuffled ImageFolder writer makes): shard k holds class k only
    samples = [{"__key__": f"{c}_{i}", "png": _png(c * 10 + i), "cls": c} for c in range(4) for i in range(10)]
    write_split(iter(samples), tmp_path / "s", maxcount=10, class_names=list("abcd"), source="test", progress=False)
    batch = sample_batch(str(tmp_path / "s"), 4)
    classes = {int(c.decode() if isinstance(c, bytes) else c) for c in batch["cls"]}
    assert len(batch["png"]) == 4 and classes == {0, 1, 2, 3}
    batch = sample_batch(str(tmp_path / "s"), 6)  # more images than shards: still every class, no repeats
    assert len(batch["png"]) == 6 and len(set(batch["png"].tolist())) == 6


def _png(seed: int) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(natural(20, 24, seed)).save(buf, format="PNG")
    return buf.getvalue()
