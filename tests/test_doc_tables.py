"""Doc tables that restate code, held to it: the executor `auto` picks (docs/design.md), the key encoder's BN mode
`auto` picks (docs/cluster.md, pipeline/methods/key_bn.py's docstring), and each plug-in's paper frameworks
(docs/design.md against conf/plugin/*.yaml `defined_on`)."""

import re
from pathlib import Path

import pytest
import yaml

from pipeline.config import compose_config

ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "docs" / "design.md").read_text()


def _rows(text: str, header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header row starts with `header`, as cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _recipe(size: int):
    from pipeline.augment.recipe import image_recipe

    cfg = compose_config(["method=mocov2", "data=photos", f"augment.size={size}"])
    return image_recipe(cfg["augment"])


def test_the_executor_table_says_what_auto_kind_picks():
    import torch

    from pipeline.augment.executors import CPU_BATCHED_MAX_SIZE, auto_kind

    rows = {r[0]: r[1].strip("`") for r in _rows(DESIGN, "| where the views are made | `auto` picks |")}
    assert set(rows) == {
        "a GPU (the worker's CUDA device)",
        f"a CPU, views ≤ {CPU_BATCHED_MAX_SIZE} px (every shipped CPU run: Photos 32 px, Spirograph, tests)",
        "a CPU, larger views",
    }, rows
    gpu, small, large = rows.values()
    cpu = torch.device("cpu")
    assert auto_kind(_recipe(CPU_BATCHED_MAX_SIZE), torch_device=cpu) == small
    assert auto_kind(_recipe(CPU_BATCHED_MAX_SIZE + 1), torch_device=cpu) == large
    # on a CUDA worker whatever the size (the device is only named: nothing runs)
    assert auto_kind(_recipe(224), torch_device=torch.device("cuda")) == gpu


@pytest.mark.parametrize(
    "doc",
    [ROOT / "docs" / "cluster.md", ROOT / "pipeline" / "methods" / "key_bn.py"],
    ids=["cluster.md", "key_bn.py"],
)
def test_the_key_bn_auto_rule_as_written_is_what_resolve_does(doc):
    from pipeline.methods.key_bn import resolve

    text = " ".join(doc.read_text().split())
    rule = re.search(r"`auto`[^.]*? on one worker[^.]*", text).group(0)  # the sentence that states the rule
    said = {
        "one worker": re.search(r"`?(\w+)`? on one worker", rule),
        "one node": re.search(r"`?(\w+)`? on one node", rule),
        "several nodes": re.search(r"`?(\w+)`? on several nodes", rule),
    }
    assert all(said.values()), said
    assert resolve("auto", [0]) == said["one worker"].group(1)
    assert resolve("auto", [0, 0, 0, 0]) == said["one node"].group(1)
    assert resolve("auto", [0, 0, 1, 1]) == said["several nodes"].group(1)
    assert resolve("auto", [0, 1]) == said["one node"].group(1)  # one worker a node: no node to shuffle within


# the frameworks' names as the docs write them -> method kinds
KINDS = {
    "MoCo v1/v2/v3": {"moco", "mocov3"},
    "MoCo": {"moco"},
    "MoCo v3": {"mocov3"},
    "SimCLR": {"simclr"},
    "BYOL": {"byol"},
    "SimSiam": {"simsiam"},
    "SupCon": {"supcon"},
}


def test_the_plug_in_table_names_each_plug_ins_defined_on():
    rows = _rows(DESIGN, "| plug-in | its paper's frameworks (`defined_on`) |")
    documented = {r[0].strip("`"): set().union(*(KINDS[n.strip()] for n in r[1].split(","))) for r in rows}
    yamls = sorted((ROOT / "conf" / "plugin").glob("*.yaml"))
    declared = {p.stem: set(yaml.safe_load(p.read_text())["defined_on"]) for p in yamls}
    assert documented == declared
