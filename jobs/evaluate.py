"""The downstream evaluations a paper reports, one after another, each into a child run of the pretraining run.

  python jobs/evaluate.py run=<MLflow run id or checkpoint> +suite=paper          # the suite of the run's method
  python jobs/evaluate.py run=<...> +suite=standard size=paper +extra.detect.detect.data.root=/data/VOCdevkit
  python jobs/evaluate.py run=<...> +suite=co2 skip=[detection]

Suites (conf/suite/): paper picks by the run's plug-in (co2, clsa, cocor, invclr), JointCrop's with a joint sampler,
else standard (linear probe, kNN, 1 %/10 % fine-tuning, detection). Each step is the job of its name with the
suite's arguments for this size (cpu: the embedded detection set and schedules that finish here; paper: the
papers' protocols). A step that finished before prints its results and runs nothing, so rerunning an interrupted
suite resumes at its first unfinished step. The summary table goes to <paths.runs>/evaluate/.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import cli, fail  # noqa: E402


def main(argv: list[str]) -> int:
    cfg = cli(argv, __doc__, config_name="evaluate")
    from pipeline.eval.suite import SuiteError, check

    try:
        suite = check(cfg)
        # heavy (MLflow, the evaluations' runs): loaded once the suite has passed its checks
        from pipeline.cores import limit_torch_threads
        from pipeline.eval.suite_run import run

        limit_torch_threads()  # its steps run in this process: on a shared machine, its share of the cores
        run(suite)
    except SuiteError as e:
        fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
