"""Run by Python at start-up when this folder is on PYTHONPATH (see tests.helpers.probed). At exit, the process
appends the heavy packages it imported to $AUGSSL_IMPORTS_TO: a test can then check that a job answered before
loading them, which a wall-clock bound on a loaded machine cannot."""

import atexit
import os
import sys

HEAVY = ("torch", "ray", "mlflow", "nvidia.dali", "detectron2")
_record = os.environ.get("AUGSSL_IMPORTS_TO")


def _write() -> None:
    loaded = [name for name in HEAVY if name in sys.modules]
    with open(_record, "a") as f:  # a line a process: the job's children inherit the variable
        f.write(" ".join([str(os.getpid()), *loaded]) + "\n")


if _record:
    atexit.register(_write)
