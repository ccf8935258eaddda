"""Self-supervised pretraining on Ray Train.

Streams WebDataset shards through Ray Data into each training worker, makes the views (DALI, or torch
where DALI is missing), trains the chosen method with DDP, checkpoints every epoch, tracks everything in
MLflow, then runs a linear probe against a random-init baseline.

A run is named by a hash of its config (or run.name). Rerunning the same command resumes a failed or
interrupted run (MLflow FAILED / KILLED, the error recorded on the run) and only prints the results of a
finished one. One job per run at a time: a second one started while it runs stops with one error line
(the lock is <paths.runs>/locks/<run name>.lock; it dies with its job).

With no arguments: generates the Spirograph shards if missing and pretrains MoCo v2 in about 10 minutes
on a 2-core CPU machine.

Examples:
  python jobs/pretrain.py
  python jobs/pretrain.py method=simclr train.epochs=50
  python jobs/pretrain.py data=imagenet model.backbone=resnet50 model.cifar_stem=false model.width=64 \
      trainer.num_workers=64 trainer.use_gpu=true
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.train.pretrain_job import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], __doc__))
