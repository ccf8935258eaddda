"""jobs/knn.py: weighted kNN of a pretraining run's frozen features (k=200, T=0.07 by default): both splits'
features extracted by Ray Data to disk (pipeline.eval.extract), the whole train split as the memory bank, the
whole validation split as queries; the same for a random-init twin; a child run of the pretraining run. Here: its
checks (its typed keys: pipeline.eval.job_settings); the run is pipeline.eval.knn_run."""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.eval.evaluation import Evaluation
from pipeline.eval.job_errors import KnnError
from pipeline.eval.job_settings import Knn
from pipeline.fields import check_model


def check(cfg: dict) -> None:
    try:
        check_model(Knn, cfg)
    except ConfigError as e:
        raise KnnError(str(e)) from None
    if not isinstance(cfg["data"], dict):
        raise KnnError(f"data={cfg['data']}: expected keys on top of the run's data (data.train=...)")


class KNN(Evaluation):
    """Weighted kNN on frozen features, beside a random-init twin: jobs/knn.py, a suite's `job: knn`."""

    name = "knn"

    config = "knn"

    def check(self, cfg: dict) -> None:
        check(cfg)

    def run(self, cfg: dict) -> dict:
        from pipeline.eval import knn_run  # the heavy part (torch, Ray, MLflow): kept off the bad-input path

        return knn_run.run(cfg)
