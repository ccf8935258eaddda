"""Evaluation registry: the downstream evaluations a suite's steps name (conf/suite/, `job: <name>`), each also a job
of its own. The project's own are listed below; an installed package adds its own under the `augssl.evaluations`
entry-point group, in the same form (pipeline.registry, docs/extending.md). Importing this package imports no
evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.eval.evaluation import Evaluation

# name -> "module:Class", the form an installed package's entry points take
EVALUATIONS: Registry[Evaluation] = Registry(
    "augssl.evaluations",
    {
        "detect": "pipeline.detect.job:DetectionTransfer",
        "finetune": "pipeline.eval.finetune_job:FineTuning",
        "knn": "pipeline.eval.knn_job:KNN",
        "linear_probe": "pipeline.eval.probe.job:LinearProbe",
    },
)
