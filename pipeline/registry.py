"""Registries: the names a config picks components by (`method.kind`, `plugin=[...]`), and where each one lives.

One mechanism for the project's own components and an installed package's: a name and the "module:Class" that
holds it. The project lists its own in each package's `__init__.py` (`METHODS`, `PLUGINS`, `DATASETS`,
`EVALUATIONS`: greppable, one line a component); a package declares its own under the registry's entry-point group
(`augssl.methods`, `augssl.plugins`; docs/extending.md), so a component from another package is used exactly as a
built-in is. Names are known without importing anything (the schema checks `method.kind` before torch is imported);
a class is imported the first time it is asked for.

    [project.entry-points."augssl.methods"]
    nnclr = "my_package.nnclr:NNCLR"
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    """A component that cannot be registered or loaded: one line naming it and the package that declared it."""


class Registry(Mapping[str, type[T]], Generic[T]):
    """name -> class, read-only; `names()` and `in` import nothing, `[name]` imports the class once. `builtin`: the
    project's own, name -> "module:Class"."""

    def __init__(self, group: str, builtin: dict[str, str]):
        self.group = group
        self._builtin = dict(sorted(builtin.items()))  # by name: the order error messages and listings show
        self._loaded: dict[str, type[T]] = {}
        self._paths: dict[str, str] | None = None

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
