"""Linear probe on frozen features of a pretrained backbone.

Takes a checkpoint (a folder or state.pt written by jobs/pretrain.py, or an MLflow run id) and trains a
linear head with full-batch L-BFGS: top-1 for classification data, per-target MSE and R² for
Spirograph's (m, b, sigma, f_r). The same probe on a randomly initialised backbone is printed beside it.

Example:
  python jobs/linear_probe.py eval.probe.checkpoint=<run id or path> data=spirograph
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import cli, fail  # noqa: E402


def main(argv: list[str]) -> int:
    cfg = cli(argv, __doc__)
    ref = cfg["eval"]["probe"]["checkpoint"]
    if not ref:
        fail("eval.probe.checkpoint=<folder, state.pt or MLflow run id> is required")
    from pipeline import tracking
    from pipeline.eval.run_probe import compare_with_random, resolve_checkpoint

    try:
        path = resolve_checkpoint(str(ref), cfg)
    except FileNotFoundError as e:
        fail(str(e))
    import mlflow

    run_id = tracking.start_or_resume(cfg, f"probe:{path}:{cfg['data']['name']}", f"probe-{cfg['data']['name']}",
                                      job="linear_probe")
    mlflow.set_tag("checkpoint", str(path))
    compare_with_random(cfg, path)
    mlflow.end_run()
    print(f"mlflow run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
