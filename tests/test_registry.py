"""The registries find the project's own components in their source: a class that derives from the kind's base
(directly or through another of the package's classes) and sets the registry attribute to a string, nothing else,
and without importing the package's modules."""

import sys
import textwrap

import pytest

from pipeline.data import DATASETS
from pipeline.eval import EVALUATIONS
from pipeline.methods import METHODS
from pipeline.plugins import PLUGINS
from pipeline.registry import Registry, RegistryError, declared


def _package(root, name, files: dict[str, str]):
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for stem, text in files.items():
        (folder / f"{stem}.py").write_text(textwrap.dedent(text))


def test_a_declared_subclass_is_registered_and_nothing_else(tmp_path, monkeypatch):
    _package(
        tmp_path,
        "fakemethods",
        {
            "base": """
                class Method:
                    kind: str  # annotated only: the base is not a component
            """,
            "middle": """
                from fakemethods.base import Method
                class Twoheaded(Method):
                    pass
            """,
            "one": """
                import this_module_does_not_exist  # never imported: the registry reads source
                from fakemethods import middle
                class Alpha(middle.Twoheaded):
                    kind = "alpha"
                class Beta(Method):
                    kind: str = "beta"
                class Settings:
                    kind = "not a method"  # no Method among its bases
                class Gamma(Method):
                    kind = 3  # not a string
                class Delta(Method[int]):
                    kind = "delta"  # a generic base, subscripted
            """,
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("augssl.test_nothing_here", declared(("fakemethods",), "kind", "Method"))
    assert reg.paths() == {
        "alpha": "fakemethods.one:Alpha",
        "beta": "fakemethods.one:Beta",
        "delta": "fakemethods.one:Delta",
    }
    assert "alpha" in reg and "not a method" not in reg
    assert "fakemethods.one" not in sys.modules


def test_a_name_declared_twice_is_refused_in_one_line(tmp_path, monkeypatch):
    _package(
        tmp_path,
        "twicemethods",
        {"a": "class A(Method):\n    kind = 'same'\n", "b": "class B(Method):\n    kind = 'same'\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("augssl.test_nothing_here", declared(("twicemethods",), "kind", "Method"))
    with pytest.raises(RegistryError, match=r"^'same' is declared twice: twicemethods.a:A and twicemethods.b:B$"):
        reg.names()


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
