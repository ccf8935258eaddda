"""Evaluation registry: the downstream evaluations a suite's steps name (conf/suite/, `job: <name>`), each also a job of
its own. The project's own are the classes in pipeline/eval and pipeline/detect that set `name`; an installed package
adds its own under the `augssl.evaluations` entry-point group (pipeline.registry, docs/extending.md). Importing this
package imports no evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry, declared

if TYPE_CHECKING:
    from pipeline.eval.evaluation import Evaluation

EVALUATIONS: Registry[Evaluation] = Registry(
    "augssl.evaluations", declared(("pipeline.eval", "pipeline.eval.probe", "pipeline.detect"), "name", "Evaluation")
)
