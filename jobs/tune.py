"""Ray Tune sweeps over the seed papers' constants, each trial a pretraining run of the same loop.

A sweep is a preset in conf/sweep/ (`+sweep=<name>`): the base overrides, `sweep.space` (config keys to
{grid|choice|uniform|loguniform: [...]}), the metric that ranks the trials and its mode, the scheduler (ASHA
stops weak trials early on a per-epoch metric; FIFO runs every trial to the end), num_samples and
max_concurrent_trials. `sweep.size` picks its scale: cpu (finishes on a 2-core machine) or paper.

One MLflow run per sweep (the space, the table of trials, the plot, the best config), one child run per trial.
Rerunning an interrupted sweep's command resumes it; rerunning a finished one prints its results.

Examples:
  python jobs/tune.py +sweep=smoke
  python jobs/tune.py +sweep=invclr_lambda
  python jobs/tune.py +sweep=co2_alpha_tau sweep.size=paper trainer.use_gpu=true
  ray job submit --working-dir . -- python jobs/tune.py +sweep=smoke paths.root=$PWD
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import cli  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if any(a in ("-h", "--help") for a in argv):
        cli(argv, __doc__)
    from pipeline.tune.sweep_job import main  # noqa: E402

    sys.exit(main(argv))
