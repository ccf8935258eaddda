"""jobs/knn.py: weighted kNN of a pretraining run's frozen features (k=200, T=0.07 by default): both splits'
features extracted by Ray Data to disk (pipeline.eval.extract), the whole train split as the memory bank, the
whole validation split as queries; the same for a random-init twin; a child run of the pretraining run. Here: its
typed keys (pipeline.eval.job_settings); the run is pipeline.eval.knn_run."""

from __future__ import annotations

from pipeline.eval.evaluation import Evaluation, Job
from pipeline.eval.job_errors import KnnError
from pipeline.eval.job_settings import Knn


class KNN(Evaluation[Knn]):
    """Weighted kNN on frozen features, beside a random-init twin: jobs/knn.py, a suite's `job: knn`."""

    name = "knn"

    config = "knn"
    Settings = Knn
    Error = KnnError

    def run(self, job: Job[Knn]) -> dict:
        from pipeline.eval import knn_run  # the heavy part (torch, Ray, MLflow): kept off the bad-input path

        return knn_run.run(job)
