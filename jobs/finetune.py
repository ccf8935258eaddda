"""Semi-supervised fine-tuning of a pretraining run's backbone: the whole network and a new linear head trained on
a labelled fraction of the run's train split, scored on its validation split (top-1/top-5; MSE and R² for
regression targets).

  python jobs/finetune.py run=<MLflow run id or checkpoint> label_fraction=0.01
  python jobs/finetune.py run=<...> label_fraction=0.1 epochs=30
  python jobs/finetune.py run=<...> subset=/data/imagenet/1percent.txt device=cuda

The backbone, its architecture, the data and the image size come from the run. The subset is class-balanced and
drawn with `seed` (its sample keys are logged), or read from a file such as ImageNet's standard 1 %/10 % lists.
With baseline=true (the default) a random-init backbone is fine-tuned the same way beside it. Results go into a
child run of the pretraining run; rerunning a finished fine-tuning prints its results, an interrupted one
resumes from its last epoch.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.eval import EVALUATIONS  # noqa: E402


def main(argv: list[str]) -> int:
    return EVALUATIONS["finetune"]().main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
