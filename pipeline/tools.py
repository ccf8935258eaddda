"""The command-line tools installed with this interpreter's packages (ray, mlflow)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def console_script(name: str) -> str:
    """`name`'s console script: beside this interpreter in a venv, else the first on PATH (an offline bundle puts
    its scripts in its own bin/ there: docs/cluster.md, "Air-gapped nodes"); the venv's path when neither exists,
    so the error names where it was looked for."""
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return str(beside)
    return shutil.which(name) or str(beside)
