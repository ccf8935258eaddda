"""Reproductions at a scale that runs on this 2-core CPU; writes docs/reproductions.md.

Each suite pretrains a baseline and the seed method on the same data and budget (Spirograph for InvCLR, Photos for
the image-recipe seeds; the ResNet-18 layout with CIFAR stem at `model.width`, `data.generate.n_train` images,
`train.epochs` epochs), probes both with the linear probe (and, for InvCLR, feature averaging and the invariance
metrics), and tabulates the result next to the paper's, with the MLflow run ids.

  python jobs/reproductions.py                                   # every suite at the default scale
  python jobs/reproductions.py suites=[invclr] sweeps=[] 'scale=["train.epochs=2","model.width=8"]'   # a quick look
  python jobs/reproductions.py suites=[] sweeps=[invclr_lambda]                 # one sweep's section only

Suites: invclr (SimCLR vs SimCLR + gradient penalty: V, alpha regression against 0.0806, per-target MSE
with and without feature averaging; the paper's Tables 8 and 9), co2 (MoCo v2 vs MoCo v2 + CO2),
clsa (MoCo v2 vs MoCo v2 + CLSA: CLSA needs strong image views), cocor (MoCo v2 vs MoCo v2 + CoCor with fixed
and with learned targets; the learned targets per length over training go in as a PNG); co2, clsa and cocor on
Photos, where image recipes can learn; vit and jointcrop (MoCo v3, DINO) on Photos too. co2_simclr (SimCLR vs
SimCLR + CO2, CO2's ResNet-18 Table 4) and cocor_simsiam (SimSiam vs SimSiam + CoCor with learned targets) on Photos,
the papers' claims nearest this scale (not in the default suites: suites=[co2_simclr,cocor_simsiam]).

Downstream (`downstream.finetune`, `downstream.detect`, each a list of the job's arguments; `downstream=null` for none):
each run's 10 % fine-tuning and shapes detection as child runs, random init beside the suite's first run, the
papers' semi-supervised and detection numbers beside ours (compared by direction).

Sweeps (`sweeps=[...]`, each `python jobs/tune.py +sweep=<name>` at its own CPU size, `sweep_args` added to each):
the paper's optimum beside ours, the sweep's table and plot, and whether the best trial beats a random-init
backbone under the same probe. A finished sweep is read back, not run again.

A run whose exact configuration already finished in the MLflow store (same run name: the config hash) is not
trained again: its logged probe results are read back, so an interrupted reproduction resumes where it stopped.
`stop_after_minutes=360` bounds one call: no training starts after 6 hours, and the same command goes on from there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.reproduce.job import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], __doc__))
