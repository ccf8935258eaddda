"""The cores this machine lends the project's jobs, which size torch's threads wherever a setting leaves them to
the machine: all of them (os.cpu_count), or AUGSSL_CORES where the machine is shared. Threads beyond the cores a
process really gets cost far more than they give: OpenMP's threads spin while they wait for each other, and a
2-thread job beside one busy process on 2 cores trained 20 times slower for 4 times the CPU (docs/testing.md).
`make test` runs two pytest workers on two cores, so each says 1 (tests/conftest.py)."""

from __future__ import annotations

import os

VARIABLE = "AUGSSL_CORES"


def cores() -> int:
    """AUGSSL_CORES if set (an integer >= 1, else ValueError: pipeline.config.compose_config says it in one line
    before a job starts anything), else every core of this machine."""
    value = os.environ.get(VARIABLE, "").strip()
    if not value:
        return os.cpu_count() or 1
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ValueError(f"{VARIABLE}={value}: expected an integer >= 1 (the cores this machine lends the jobs)")
    return int(value)


def limit_torch_threads(processes: int = 1) -> None:
    """Where AUGSSL_CORES is set, this process's torch threads: its share of those cores among `processes` on the
    node. Unset, torch's own default (a thread per physical core) stands."""
    if os.environ.get(VARIABLE, "").strip():
        import torch

        torch.set_num_threads(max(1, cores() // processes))
