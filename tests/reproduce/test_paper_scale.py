"""The papers' scale (conf/paper_scale.yaml) against the claims that cite it (conf/claims), against a table written
here by hand from the papers, and against the seed text: every quote occurs in its paper, every number the yaml does
not mark assumed is stated by one of its setting's quotes, and every “…” phrase of an assumption's reason is the
paper's. The loader refuses bad files in one line."""

import dataclasses
import math
import re
from pathlib import Path

import pytest
import yaml

from pipeline.reproduce.claim_specs import all_claims
from pipeline.reproduce.paper_scale import SEED_FILES, PaperScale, load_paper_scale, scale_for

SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"  # beside the repository
IN1K, IN1K_IMAGES = "ImageNet-1K", 1_281_167

# (seed file, setting, data, train_images, image_size, epochs, batch_size, backbone): read off the papers by hand
# (shared/seeds/*.txt; dataset sizes and crop sizes the papers leave out are the datasets' own), not from the yaml
EXPECTED = {
    # CO2 §4.1 and App. A: ImageNet-1K train split, ResNet-50, 200 epochs, batch 256 on 4 GPUs (Tables 1, 2, 3)
    ("co2-paper.txt", "ImageNet-1K, MoCo v2 + CO2, 200 epochs", IN1K, IN1K_IMAGES, 224, 200, 256, "ResNet-50"),
    # CO2 §3.5 and Table 4: ResNet-18 on ImageNet-100, SimCLR at batch 128; no epochs or crop stated (200, 224)
    ("co2-paper.txt", "ImageNet-100, SimCLR + CO2, ResNet-18", "ImageNet-100", 126_689, 224, 200, 128, "ResNet-18"),
    # CLSA Table 2's caption and §4.1: ImageNet, ResNet-50, 224 px, 200 epochs, batch 256; Table 4 names no epochs
    ("clsa-paper.txt", "ImageNet-1K, MoCo v2 + CLSA, 200 epochs", IN1K, IN1K_IMAGES, 224, 200, 256, "ResNet-50"),
    (
        "clsa-paper.txt",
        "ImageNet-1K, MoCo v2 + CLSA, checkpoint transferred to VOC and COCO",
        IN1K,
        IN1K_IMAGES,
        224,
        200,
        256,
        "ResNet-50",
    ),
    # CoCor Table 7's caption and §5.1: ImageNet-100, ResNet-50, 200 epochs, batch 256; Table 3 names no data set
    # (its MoCo and SimSiam rows alike)
    (
        "cocor-paper.txt",
        "ImageNet-100, MoCo v2 or SimSiam + CoCor, 200 epochs",
        "ImageNet-100",
        126_689,
        224,
        200,
        256,
        "ResNet-50",
    ),
    (
        "cocor-paper.txt",
        "ImageNet-100 (assumed), MoCo or SimSiam + CoCor, 200 epochs, transferred to VOC",
        "ImageNet-100",
        126_689,
        224,
        200,
        256,
        "ResNet-50",
    ),
    # InvCLR App. E and Table 4: 100,000 images of 32 × 32, ResNet18, batch 512, 50 epochs
    (
        "invariance-paper.txt",
        "Spirograph, SimCLR + gradient penalty, 50 epochs",
        "Spirograph",
        100_000,
        32,
        50,
        512,
        "ResNet-18",
    ),
    # JointCrop §4.1 and Table 1: ResNet-50 on ImageNet-1K (MoCo v3 at 4096 × 100 epochs; MoCo v2 256 × 200 for
    # Table 3's detection); ResNet-18 on Tiny-ImageNet, 500 epochs at batch 512 (Tables 2, 5)
    (
        "jointcrop-paper.txt",
        "ImageNet-1K, MoCo v3 + JointCrop, 100 epochs",
        IN1K,
        IN1K_IMAGES,
        224,
        100,
        4096,
        "ResNet-50",
    ),
    (
        "jointcrop-paper.txt",
        "Tiny-ImageNet, MoCo v2 + JointCrop, 500 epochs",
        "Tiny-ImageNet",
        100_000,
        64,
        500,
        512,
        "ResNet-18",
    ),
    (
        "jointcrop-paper.txt",
        "ImageNet-1K, MoCo v2 + JointCrop, 200 epochs, transferred to VOC",
        IN1K,
        IN1K_IMAGES,
        224,
        200,
        256,
        "ResNet-50",
    ),
}
ARCHITECTURE = {"ResNet-50": 23.5, "ResNet-18": 11.2, "ViT-S/16": 21.7, "ViT-B/16": 85.8}  # M params, no classifier
# the names a paper may print for a data set or backbone
NAMES = {
    "ImageNet-1K": ("ImageNet-1K", "ImageNet"),
    "ImageNet-100": ("ImageNet-100", "IN-100"),
    "Tiny-ImageNet": ("Tiny-ImageNet", "Tiny-IN"),
    "Spirograph": ("Spirograph",),
    "ResNet-50": ("ResNet-50", "ResNet50", "R50"),
    "ResNet-18": ("ResNet-18", "ResNet18", "R18"),
}


def _settings() -> list[PaperScale]:
    return [s for settings in load_paper_scale().values() for s in settings]


def test_every_claimed_source_has_exactly_one_setting_and_every_setting_a_claim():
    scale = load_paper_scale()
    cited = {(c.seed_file, c.source) for claims in all_claims().values() for c in claims}
    assert cited
    for seed_file, source in sorted(cited):
        matches = [s for s in scale[seed_file] if source in s.sources]
        assert len(matches) == 1, (seed_file, source, [s.setting for s in matches])
        assert scale_for(seed_file, source) == matches[0]
    listed = {(s.seed_file, source) for s in _settings() for source in s.sources}
    assert listed == cited, (sorted(listed - cited), sorted(cited - listed))


def test_the_settings_are_the_papers_read_by_hand():
    got = {
        (s.seed_file, s.setting, s.data, s.train_images, s.image_size, s.epochs, s.batch_size, s.backbone)
        for s in _settings()
    }
    assert got == EXPECTED, (sorted(got - EXPECTED, key=str), sorted(EXPECTED - got, key=str))


def test_steps_and_parameters_are_computed_not_copied():
    for s in _settings():
        assert s.steps == s.epochs * math.ceil(s.train_images / s.batch_size), s.setting
        if s.params_source == "architecture":
            assert s.backbone_params_m == ARCHITECTURE[s.backbone], s.setting
    assert scale_for("co2-paper.txt", "Table 1").steps == 200 * 5005  # 1,281,167 / 256 = 5004.6 → 5005 an epoch


# --- the seed text -----------------------------------------------------------------------------------------------


def _norm(text: str) -> str:
    return " ".join(text.split())


def _numbers(text: str) -> list[float]:
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)  # 100,000 -> 100000
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]


def _states_number(quotes: tuple[str, ...], number: float) -> bool:
    return any(math.isclose(x, number) for q in quotes for x in _numbers(q))


def _states_name(quotes: tuple[str, ...], name: str) -> bool:
    """`name` or one of its aliases as a whole name: "ImageNet" is not in "Tiny-ImageNet" or "ImageNet-100"."""
    aliases = NAMES.get(name, (name,))
    return any(re.search(rf"(?<![\w-]){re.escape(a)}(?!\w|-\d)", q) for a in aliases for q in quotes)


def problems(s: PaperScale, text: str) -> list[str]:
    """What in setting `s` the paper's text does not bear out."""
    out = [f"quote not in the paper: {q!r}" for q in s.quotes if _norm(q) not in _norm(text)]
    for field in ("train_images", "image_size", "epochs", "batch_size"):
        if field not in s.assumed and not _states_number(s.quotes, getattr(s, field)):
            out.append(f"{field} {getattr(s, field)} is in no quote and not assumed")
    for field in ("data", "backbone"):
        if field not in s.assumed and not _states_name(s.quotes, getattr(s, field)):
            out.append(f"{field} {getattr(s, field)!r} is in no quote and not assumed")
    if s.params_source == "paper" and not _states_number(s.quotes, s.backbone_params_m):
        out.append(f"backbone_params_m {s.backbone_params_m} is in no quote")
    if s.hardware is not None and not any(_norm(s.hardware) in _norm(q) for q in s.quotes):
        out.append(f"hardware {s.hardware!r} is in no quote")
    for field, why in s.assumed.items():
        out += [
            f"assumed.{field} quotes {q!r}, not the paper's"
            for q in re.findall(r"“([^”]*)”", why)
            if _norm(q) not in _norm(text)
        ]
    return out


needs_seeds = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the papers' text is not at {SEEDS}")


@needs_seeds
def test_every_setting_is_borne_out_by_its_paper():
    found = {s.setting: problems(s, (SEEDS / s.seed_file).read_text()) for s in _settings()}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


@needs_seeds
@pytest.mark.parametrize(
    "seed_file, source, change, match",
    [
        ("co2-paper.txt", "Table 1", {"epochs": 800}, "epochs 800 is in no quote"),  # a number no quote states
        ("jointcrop-paper.txt", "Table 1", {"batch_size": 256}, "batch_size 256"),  # another row's number
        (
            "invariance-paper.txt",
            "Table 8",
            {"train_images": 20_000},
            None,
        ),  # a limit: a quote states it (the test split)
        ("invariance-paper.txt", "Table 8", {"image_size": 64}, "image_size 64"),
        ("jointcrop-paper.txt", "Table 2", {"assumed": {"train_images": "dataset fact"}}, "image_size 64"),
        ("clsa-paper.txt", "Table 4", {"assumed": {"epochs": "as in “Table 4 at 800 epochs”"}}, "not the paper's"),
        ("jointcrop-paper.txt", "Table 2", {"data": "ImageNet-1K"}, "data 'ImageNet-1K'"),  # not inside Tiny-ImageNet
        ("co2-paper.txt", "Table 1", {"backbone": "ResNet-18"}, "backbone 'ResNet-18'"),
        ("co2-paper.txt", "Table 1", {"hardware": "8 V100 GPUs"}, "hardware '8 V100 GPUs'"),
        ("co2-paper.txt", "Table 1", {"params_source": "paper"}, "backbone_params_m 23.5"),
        ("co2-paper.txt", "Table 1", {"quotes": ("The batch size is 512 on 4 GPUs.",)}, "quote not in the paper"),
    ],
)
def test_the_check_against_the_paper_can_fail(seed_file, source, change, match):
    wrong = dataclasses.replace(scale_for(seed_file, source), **change)
    found = problems(wrong, (SEEDS / seed_file).read_text())
    if match is None:
        assert found == []
    else:
        assert any(match in p for p in found), found


def test_the_name_and_number_checks_can_fail():
    assert _states_number(("We synthesized 100,000 training images",), 100_000)
    assert not _states_number(("We synthesized 100,000 training images",), 100)
    assert _states_name(("with a ResNet50-C4 backbone",), "ResNet-50")
    assert not _states_name(("on Tiny-ImageNet and ImageNet-100",), "ImageNet-1K")
    assert _states_name(("linear evaluation on ImageNet with",), "ImageNet-1K")


# --- the loader's checks -----------------------------------------------------------------------------------------


def _good() -> dict:
    setting = {
        "setting": "ImageNet-1K, 200 epochs",
        "sources": ["Table 1"],
        "data": "ImageNet-1K",
        "train_images": 1281167,
        "image_size": 224,
        "epochs": 200,
        "batch_size": 256,
        "backbone": "ResNet-50",
        "backbone_params_m": 23.5,
        "params_source": "architecture",
        "steps": 1001000,
        "hardware": None,
        "quotes": ["200 epochs, batch 256"],
        "assumed": {"train_images": "a dataset fact"},
    }
    return {f: [dict(setting)] for f in SEED_FILES}


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "paper_scale.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def test_a_good_file_loads(tmp_path):
    scale = load_paper_scale(_write(tmp_path, _good()))
    assert sorted(scale) == sorted(SEED_FILES)
    s = scale_for("co2-paper.txt", "Table 1", _write(tmp_path, _good()))
    assert s.steps == 1001000 and s.hardware is None and s.assumed == {"train_images": "a dataset fact"}


def _edit(**change):
    def apply(data):
        data["co2-paper.txt"][0].update(change)

    return apply


def _drop(key):
    return lambda data: data["co2-paper.txt"][0].pop(key)


@pytest.mark.parametrize(
    "edit, match",
    [
        (_drop("epochs"), r"missing keys \['epochs'\]"),
        (_drop("quotes"), r"missing keys \['quotes'\]"),
        (_edit(gpus=8), r"unknown keys \['gpus'\]"),
        (_edit(steps=1001001), r"steps 1001001 != epochs × ceil\(train_images / batch_size\) = 1001000"),
        (_edit(batch_size=512), r"steps 1001000 != .* = 500600"),
        (_edit(epochs=0), "epochs must be a positive integer"),
        (_edit(epochs="200"), "epochs must be a positive integer"),
        (_edit(train_images=True), "train_images must be a positive integer"),
        (_edit(sources=["Tab. 1"]), r"sources \['Tab. 1'\] are not 'Table N' or 'Fig. N'"),
        (_edit(sources=[]), "sources must be a non-empty list"),
        (_edit(quotes=[]), "quotes must be a non-empty list"),
        (_edit(quotes=[" "]), "quotes item must be a non-empty string"),
        (_edit(params_source="guess"), "params_source must be one of"),
        (_edit(backbone_params_m=0), "backbone_params_m must be a positive number"),
        (_edit(assumed={"hardware": "a guess"}), r"assumed names unknown fields \['hardware'\]"),
        (_edit(assumed={"epochs": ""}), "assumed.epochs must be a non-empty string"),
        (_edit(hardware=""), "hardware must be a non-empty string"),
        (lambda d: d.pop("co2-paper.txt"), r"missing seed files \['co2-paper.txt'\]"),
        (lambda d: d.update({"simclr-paper.txt": d["co2-paper.txt"]}), r"unknown keys \['simclr-paper.txt'\]"),
        (lambda d: d.update({"co2-paper.txt": []}), "co2-paper.txt: expected a non-empty list of settings"),
        (
            lambda d: d["co2-paper.txt"].append(dict(d["co2-paper.txt"][0], setting="b")),
            r"sources \['Table 1'\] in more",
        ),
        (lambda d: d["co2-paper.txt"].append(dict(d["co2-paper.txt"][0], sources=["Fig. 2"])), "share a name"),
        (lambda d: d["co2-paper.txt"].append("Table 2"), "a setting must be a mapping"),
    ],
)
def test_the_loader_refuses_a_bad_file_in_one_line(tmp_path, edit, match):
    data = _good()
    edit(data)
    with pytest.raises(ValueError, match=match) as caught:
        load_paper_scale(_write(tmp_path, data))
    assert "\n" not in str(caught.value)


def test_the_loader_refuses_a_file_that_is_not_a_mapping(tmp_path):
    with pytest.raises(ValueError, match="expected a mapping of seed file -> settings"):
        load_paper_scale(_write(tmp_path, [_good()]))


def test_scale_for_refuses_an_unlisted_source_or_paper(tmp_path):
    path = _write(tmp_path, _good())
    with pytest.raises(ValueError, match=r"co2-paper.txt: no setting lists source 'Table 4'$"):
        scale_for("co2-paper.txt", "Table 4", path)
    with pytest.raises(ValueError, match="unknown seed file 'moco-paper.txt'"):
        scale_for("moco-paper.txt", "Table 1", path)
    with pytest.raises(ValueError, match="no setting lists source 'Table 6'"):
        scale_for("jointcrop-paper.txt", "Table 6")  # the real file: Table 6 is cited by no claim
