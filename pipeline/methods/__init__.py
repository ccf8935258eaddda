"""Method registry: `method.kind` in the config picks the class (pipeline.build makes it). The project's own are the
classes in this package that set `kind` (read from their source by pipeline.registry.declared); an installed
package adds its own under the `augssl.methods` entry-point group (docs/extending.md). Importing this package
imports no method, nor torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry, declared

if TYPE_CHECKING:
    from pipeline.methods.base import Method

METHODS: Registry[Method] = Registry("augssl.methods", declared(("pipeline.methods",), "kind", "Method"))
