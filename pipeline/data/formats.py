"""Shard formats shared by the writer, the readers and the config schema (no heavy imports): image member
extensions, what to do with a bad shard, and the Spirograph generator's layout its manifests record."""

from __future__ import annotations

# Member extensions that hold an image, in the order a reader looks for one among a sample's members. The
# writer stores .jpeg files as "jpg" and .tiff files as "tif"; readers accept both spellings, since shards
# written by other tools use them.
IMAGE_EXTS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm")

# data.on_bad_shard: refuse in one line naming the shard, or leave it out, counted and named in a warning
ON_BAD_SHARD: tuple[str, ...] = ("fail", "skip")

# The Spirograph generator's layout, recorded in its manifests' `source` (pipeline.data.spirograph_shards writes it,
# pipeline.data.manifest reads it back without importing torch): chunk c of a split (samples c*chunk ...) is drawn
# with seed + c, and the validation split's seed is the train seed + SPIROGRAPH_VAL_SEED_OFFSET.
SPIROGRAPH_CHUNK = 1000
SPIROGRAPH_VAL_SEED_OFFSET = 10**6

# The extension the writer gives each alternative spelling.
_CANONICAL = {"jpeg": "jpg", "tiff": "tif"}

# Image file suffix (lower case) -> the member extension the writer stores it under.
FILE_EXT: dict[str, str] = {f".{ext}": _CANONICAL.get(ext, ext) for ext in IMAGE_EXTS}


def image_key(columns) -> str:
    """The image member's extension among a sample's (or batch's) columns."""
    for ext in IMAGE_EXTS:
        if ext in columns:
            return ext
    raise KeyError(f"no image member among {sorted(columns)}")
