"""Detection transfer of a pretraining run's backbone: fine-tune a Faster R-CNN on it, report COCO AP.

  python jobs/detect.py run=<MLflow run id or checkpoint>                        # torchvision, embedded shapes set
  python jobs/detect.py run=<...> engine=detectron2                              # detectron2's own trainer
  python jobs/detect.py run=<...> detect=coco detect.data.root=/data/coco engine=detectron2 device=cuda

The backbone, its architecture and its pixel statistics come from the run. conf/detect/ holds the data, detector
and schedule (`detect=<preset>`, any `detect.<key>=` on top). With baseline=true (the default) the same transfer
also runs from a random-init backbone, the comparison the papers draw. Results (AP, AP50, AP75 per backbone,
a PNG of detections on validation images) go into a child run of the pretraining run; rerunning a finished
transfer prints its results and trains nothing.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.eval import EVALUATIONS  # noqa: E402


def main(argv: list[str]) -> int:
    return EVALUATIONS["detect"]().main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
