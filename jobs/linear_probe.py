"""Linear probe on frozen features of a pretrained backbone.

Takes a pretraining run (`run=`: an MLflow run id, or a folder or state.pt written by jobs/pretrain.py) and trains a
linear head on its frozen features: full-batch L-BFGS on features held in memory for small sets, MoCo's SGD
protocol on features extracted by Ray Data for large ones (eval.probe.solver=auto|lbfgs|sgd); top-1 for
classification data, per-target MSE and R² for Spirograph's (m, b, sigma, f_r). The same probe on a randomly
initialised backbone is printed beside it.

The model, data and augment (hence the image size) are the run's own, read from its config; eval.* on the
command line sets the probe, data.<key>=... adjusts the run's data, data=<option> probes another dataset at
the run's image size. The results are logged into a child run of the pretraining run (a rerun of a finished
probe with the same settings prints its results); the chart goes to <paths.runs>/probe/<child run name>.png.

Example:
  python jobs/linear_probe.py run=<run id or path>
  python jobs/linear_probe.py run=<run id or path> eval.probe.steps=500 eval.feature_averaging.m=40

(`eval.probe.checkpoint=<...>` is the same as `run=<...>`: `run` on its own is this job's, `run.<key>` is still the
config's run section.)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.eval import EVALUATIONS  # noqa: E402


def main(argv: list[str]) -> int:
    return EVALUATIONS["linear_probe"]().main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
