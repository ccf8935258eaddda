"""The papers' scale, as data (conf/paper_scale.yaml): for each seed paper, the pre-training setting behind each table
or figure its claims cite (conf/claims), with the numbers the paper states, verbatim quotes that state them and what
was assumed where it does not (tests/reproduce/test_paper_scale.py holds them to the seed text). The reproduction
report's scale card prints them beside ours. Pure: yaml only."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PAPER_SCALE = Path(__file__).resolve().parents[2] / "conf" / "paper_scale.yaml"
SEED_FILES = ("clsa-paper.txt", "co2-paper.txt", "cocor-paper.txt", "invariance-paper.txt", "jointcrop-paper.txt")
SOURCE = re.compile(r"(Table|Fig\.) \d+")  # as conf/claims names them
COUNTS = ("train_images", "image_size", "epochs", "batch_size", "steps")  # positive integers
REQUIRED = {"setting", "sources", "data", "backbone", "backbone_params_m", "params_source", "hardware", "quotes"}
REQUIRED |= set(COUNTS)
OPTIONAL = {"assumed", "note"}
ASSUMABLE = ("data", "train_images", "image_size", "epochs", "batch_size", "backbone")  # what `assumed` may name
PARAMS_SOURCES = ("architecture", "paper")


@dataclass(frozen=True)
class PaperScale:
    seed_file: str  # the paper: its file in shared/seeds/
    setting: str  # a name for the setting, e.g. "ImageNet-1K, MoCo v2 + CO2, 200 epochs"
    sources: tuple[str, ...]  # the "Table N" / "Fig. N" of conf/claims measured at it
    data: str
    train_images: int
    image_size: int  # the training crop, px
    epochs: int
    batch_size: int
    backbone: str
    backbone_params_m: float  # millions, without the classifier
    params_source: str  # "architecture" (a known fact of the architecture) or "paper"
    steps: int  # epochs * ceil(train_images / batch_size)
    hardware: str | None  # as the paper states it, or None
    quotes: tuple[str, ...]  # verbatim from the seed text (whitespace aside)
    assumed: dict[str, str]  # field -> why the value was taken where the paper does not state it
    note: str


def _count(entry: dict, key: str, what: str) -> int:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what}: {key} must be a positive integer, got {value!r}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return " ".join(value.split())


def _texts(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{what} must be a non-empty list, got {value!r}")
    return tuple(_text(v, f"{what} item") for v in value)


def _setting(seed_file: str, entry: Any, i: int) -> PaperScale:
    where = f"{seed_file} setting {i}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: a setting must be a mapping, got {entry!r:.80}")
    what = f"{seed_file} setting {entry.get('setting', i)!r}"
    missing, unknown = REQUIRED - set(entry), set(entry) - REQUIRED - OPTIONAL
    if missing or unknown:
        raise ValueError(f"{what}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    sources = _texts(entry["sources"], f"{what}: sources")
    if bad := [s for s in sources if not SOURCE.fullmatch(s)]:
        raise ValueError(f"{what}: sources {bad} are not 'Table N' or 'Fig. N'")
    train_images, image_size, epochs, batch_size, steps = (_count(entry, key, what) for key in COUNTS)
    if steps != (want := epochs * math.ceil(train_images / batch_size)):
        raise ValueError(f"{what}: steps {steps} != epochs × ceil(train_images / batch_size) = {want}")
    params = entry["backbone_params_m"]
    if isinstance(params, bool) or not isinstance(params, (int, float)) or params <= 0:
        raise ValueError(f"{what}: backbone_params_m must be a positive number, got {params!r}")
    if entry["params_source"] not in PARAMS_SOURCES:
        raise ValueError(f"{what}: params_source must be one of {list(PARAMS_SOURCES)}, got {entry['params_source']!r}")
    hardware = entry["hardware"]
    assumed = entry.get("assumed") or {}
    if not isinstance(assumed, dict):
        raise ValueError(f"{what}: assumed must map a field to why, got {assumed!r:.80}")
    if bad := sorted(set(assumed) - set(ASSUMABLE)):
        raise ValueError(f"{what}: assumed names unknown fields {bad} (one of {list(ASSUMABLE)})")
    note = entry.get("note")
    return PaperScale(
        seed_file=seed_file,
        setting=_text(entry["setting"], f"{what}: setting"),
        sources=sources,
        data=_text(entry["data"], f"{what}: data"),
        train_images=train_images,
        image_size=image_size,
        epochs=epochs,
        batch_size=batch_size,
        backbone=_text(entry["backbone"], f"{what}: backbone"),
        backbone_params_m=float(params),
        params_source=entry["params_source"],
        steps=steps,
        hardware=None if hardware is None else _text(hardware, f"{what}: hardware"),
        quotes=_texts(entry["quotes"], f"{what}: quotes"),
        assumed={k: _text(v, f"{what}: assumed.{k}") for k, v in assumed.items()},
        note="" if note is None else _text(note, f"{what}: note"),
    )


def load_paper_scale(path: Path = PAPER_SCALE) -> dict[str, list[PaperScale]]:
    """seed file -> its settings, checked: every seed file present, known keys only, `steps` as computed, no source
    in two settings of one paper."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{Path(path).name}: expected a mapping of seed file -> settings, got {data!r:.80}")
    missing, unknown = set(SEED_FILES) - set(data), set(data) - set(SEED_FILES)
    if missing or unknown:
        raise ValueError(f"{Path(path).name}: missing seed files {sorted(missing)}, unknown keys {sorted(unknown)}")
    out: dict[str, list[PaperScale]] = {}
    for seed_file in SEED_FILES:
        entries = data[seed_file]
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{seed_file}: expected a non-empty list of settings, got {entries!r:.80}")
        settings = [_setting(seed_file, entry, i) for i, entry in enumerate(entries)]
        sources = [s for setting in settings for s in setting.sources]
        if twice := sorted({s for s in sources if sources.count(s) > 1}):
            raise ValueError(f"{seed_file}: sources {twice} in more than one setting")
        if len({s.setting for s in settings}) < len(settings):
            raise ValueError(f"{seed_file}: two settings share a name")
        out[seed_file] = settings
    return out


def scale_for(seed_file: str, source: str, path: Path = PAPER_SCALE) -> PaperScale:
    """The setting of `seed_file` whose sources contain `source` (e.g. "Table 2")."""
    settings = load_paper_scale(path)
    if seed_file not in settings:
        raise ValueError(f"unknown seed file {seed_file!r} (one of {list(SEED_FILES)})")
    for setting in settings[seed_file]:
        if source in setting.sources:
            return setting
    raise ValueError(f"{seed_file}: no setting lists source {source!r}")
