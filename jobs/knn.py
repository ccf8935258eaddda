"""Weighted kNN classification of a pretraining run's frozen features (Wu et al. 2018; k=200, T=0.07): the whole
train split as the memory bank, the whole validation split as queries, beside a random-init backbone. Regression
data (Spirograph) reports R² per target.

  python jobs/knn.py run=<MLflow run id or checkpoint>
  python jobs/knn.py run=<...> k=20 temperature=0.1
  RAY_ADDRESS=... python jobs/knn.py run=<...> actors=8        # features extracted on the cluster's GPUs

Features are extracted by Ray Data (one backbone per actor, a GPU each where there are GPUs) and streamed to
<paths.runs>/features/, where the next kNN or SGD probe of the same weights and split finds them. Results go
into a child run of the pretraining run; rerunning a finished kNN prints its results.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.eval import EVALUATIONS  # noqa: E402


def main(argv: list[str]) -> int:
    return EVALUATIONS["knn"]().main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
