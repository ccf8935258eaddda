"""Registries: the names a config picks components by (`method.kind`, `plugin=[...]`), and where each one lives.

A registry finds the project's own components in their packages' source: every top-level class that gives its
registry attribute a string (`kind = "simclr"` for a method, `name = "co2"` for a plug-in, a dataset or an
evaluation) is registered under it as "module:Class", read with `ast`, so adding one is its module and its config,
no list to edit. It adds those an installed package declares under its entry-point group (`augssl.methods`,
`augssl.plugins`; docs/extending.md), so a component from another package is used exactly as a built-in is. Names
are known without importing anything (the schema checks `method.kind` before torch is imported); a class is
imported the first time it is asked for.

    [project.entry-points."augssl.methods"]
    nnclr = "my_package.nnclr:NNCLR"
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    """A component that cannot be registered or loaded: one line naming it and the package that declared it."""


def _declared_name(node: ast.ClassDef, attribute: str) -> str | None:
    for stmt in node.body:
        targets = (
            stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        )
        value = getattr(stmt, "value", None)
        if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    return None


def _base_names(node: ast.ClassDef) -> set[str]:
    """The names of a class's bases: `Base`, `module.Base`, and a generic's `Base[...]`."""
    bases = [b.value if isinstance(b, ast.Subscript) else b for b in node.bases]
    return {b.id if isinstance(b, ast.Name) else b.attr for b in bases if isinstance(b, (ast.Name, ast.Attribute))}


def declared(packages: tuple[str, ...], attribute: str, base: str) -> Callable[[], dict[str, str]]:
    """The project's own components of one kind, by name: name -> "module:Class" for every top-level class in the
    packages' modules that derives from `base` (directly or through a class of these packages) and assigns a string to
    `attribute` in its body, read from source: nothing is imported but the packages' parents. Base classes only
    annotate the attribute, so they are not found."""

    def scan() -> dict[str, str]:
        classes: list[tuple[ast.ClassDef, str]] = []
        for package in packages:
            spec = find_spec(package)
            for folder in (spec.submodule_search_locations if spec else None) or []:
                for path in sorted(Path(folder).glob("*.py")):
                    tree = ast.parse(path.read_text(), str(path))
                    where = f"{package}.{path.stem}"
                    classes += [(n, f"{where}:{n.name}") for n in tree.body if isinstance(n, ast.ClassDef)]
        kin, grew = {base}, True
        while grew:  # the classes that derive from base, through any number of the packages' own classes
            more = {n.name for n, _ in classes if _base_names(n) & kin} - kin
            kin, grew = kin | more, bool(more)
        found: dict[str, str] = {}
        for node, where in classes:
            name = _declared_name(node, attribute) if _base_names(node) & kin else None
            if name is None:
                continue
            if name in found:
                raise RegistryError(f"{name!r} is declared twice: {found[name]} and {where}")
            found[name] = where
        return dict(sorted(found.items()))  # by name: the order error messages and listings show

    return scan


class Registry(Mapping[str, type[T]], Generic[T]):
    """name -> class, read-only; `names()` and `in` import nothing, `[name]` imports the class once. `builtin` is
    the project's own, as a mapping or as `declared(...)`, which reads them from source when first asked."""

    def __init__(self, group: str, builtin: dict[str, str] | Callable[[], dict[str, str]]):
        self.group = group
        self._builtin_source = builtin
        self._loaded: dict[str, type[T]] = {}
        self._paths: dict[str, str] | None = None

    @property
    def _builtin(self) -> dict[str, str]:
        source = self._builtin_source
        if callable(source):
            self._builtin_source = source = source()
        return dict(source)

    def paths(self) -> dict[str, str]:
        """Every name with its "module:Class" path: the built-ins first, then the installed packages'. A package
        may not take a built-in's name (a config naming it would silently change meaning). The entry points are
        read once per process (a package installed later is seen by the next job)."""
        if self._paths is None:
            self._paths = self._read_paths()
        return self._paths

    def _read_paths(self) -> dict[str, str]:
        paths = dict(self._builtin)
        for ep in entry_points(group=self.group):
            if ep.name in self._builtin and ep.value != self._builtin[ep.name]:
                dist = ep.dist.name if ep.dist else "an installed package"
                raise RegistryError(
                    f"{dist} registers {self.group} {ep.name!r} ({ep.value}), the name of the project's own "
                    f"{self._builtin[ep.name]}; give it another name"
                )
            paths[ep.name] = ep.value
        return paths

    def names(self) -> list[str]:
        return list(self.paths())

    def origin(self, name: str) -> str | None:
        """The installed package (distribution) that declares `name`, or None for the project's own."""
        if name in self._builtin:
            return None
        for ep in entry_points(group=self.group, name=name):
            return ep.dist.name if ep.dist else ep.value.partition(":")[0].split(".")[0]
        return None

    def __getitem__(self, name: str) -> type[T]:
        if name not in self._loaded:
            path = self.paths()[name]  # KeyError for an unknown name, as a dict
            module, _, attr = path.partition(":")
            try:
                self._loaded[name] = getattr(import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise RegistryError(f"{self.group} {name!r}: cannot load {path}: {e}") from e
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.paths()

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths())

    def __len__(self) -> int:
        return len(self.paths())
