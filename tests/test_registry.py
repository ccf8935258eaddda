"""The registries: the project's own components listed by name and "module:Class" (the form an installed package's
entry points take), each loading as its name says; every component class the packages define listed; nothing
imported until a class is asked for."""

import ast
import sys
from pathlib import Path

import pytest

from pipeline.data import DATASETS
from pipeline.eval import EVALUATIONS
from pipeline.methods import METHODS
from pipeline.plugins import PLUGINS
from pipeline.registry import Registry, RegistryError

ROOT = Path(__file__).resolve().parents[1]


def test_a_listed_component_loads_on_first_use_only(tmp_path, monkeypatch):
    (tmp_path / "fakemethods").mkdir()
    (tmp_path / "fakemethods" / "__init__.py").write_text("")
    (tmp_path / "fakemethods" / "one.py").write_text("class Alpha:\n    kind = 'alpha'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("augssl.test_nothing_here", {"alpha": "fakemethods.one:Alpha", "gone": "fakemethods.one:Gone"})
    assert reg.names() == ["alpha", "gone"] and "alpha" in reg and "beta" not in reg
    assert "fakemethods.one" not in sys.modules  # names without imports
    assert reg["alpha"].kind == "alpha"
    with pytest.raises(RegistryError, match=r"^augssl.test_nothing_here 'gone': cannot load fakemethods.one:Gone"):
        reg["gone"]


def _component_classes(folder: Path, attribute: str) -> set[str]:
    """Every top-level class in the folder's modules that sets `attribute` to a string: what a registry must list."""
    found = set()
    for path in folder.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
                    value = getattr(stmt, "value", None)
                    if isinstance(target, ast.Name) and target.id == attribute and isinstance(value, ast.Constant):
                        found.add(f"{path.relative_to(ROOT).with_suffix('').as_posix().replace('/', '.')}:{node.name}")
    return found


def test_every_component_class_is_listed():
    """A class that declares its name but is missing from its package's list would be silently unusable."""
    listed = {p for r in (METHODS, PLUGINS, DATASETS, EVALUATIONS) for p in r.paths().values()}
    folders = [
        ("pipeline/methods", "kind"),
        ("pipeline/plugins", "name"),
        ("pipeline/data", "name"),
        ("pipeline/eval", "name"),
        ("pipeline/eval/probe", "name"),
        ("pipeline/detect", "name"),
    ]
    declared = set().union(*(_component_classes(ROOT / f, a) for f, a in folders))
    # settings and other classes set `name` too: a declared class that no registry lists must not be a component
    from importlib import import_module

    from pipeline.data.generated import GeneratedDataset
    from pipeline.eval.evaluation import Evaluation
    from pipeline.methods.base import Method
    from pipeline.plugins.base import Plugin

    for path in sorted(declared - listed):
        module, _, name = path.partition(":")
        cls = getattr(import_module(module), name)
        assert not (isinstance(cls, type) and issubclass(cls, (Method, Plugin, GeneratedDataset, Evaluation))), path


def test_the_projects_own_components_are_found_and_load_as_their_names_say():
    expected = (
        (METHODS, "kind", {"barlowtwins", "byol", "dino", "moco", "mocov3", "simclr", "simsiam", "supcon", "vicreg"}),
        (PLUGINS, "name", {"clsa", "co2", "cocor", "invclr"}),
        (DATASETS, "name", {"photos", "spirograph"}),
        (EVALUATIONS, "name", {"linear_probe", "knn", "finetune", "detect"}),
    )
    for registry, attribute, names in expected:
        own = {n for n, path in registry.paths().items() if path.startswith("pipeline.")}
        assert own == names, registry.group
        for name in names:
            assert getattr(registry[name], attribute) == name
