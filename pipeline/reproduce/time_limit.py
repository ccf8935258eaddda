"""A reproduction's wall-clock limit (the `stop_after_minutes` key). A seeded reproduction of every suite trains for
longer than one sitting of most machines (a CI job's hours, a spot node's lease, a night); with a limit, the command
starts no training once the limit is reached and stops before the report, saying how many runs are left. The same
command then goes on where it stopped: the ledger keeps every finished run, and a run stopped midway resumes from its
last checkpoint. A large reproduction thus runs as a series of bounded calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


class TimeUp(Exception):
    """The limit was reached before every run had trained: nothing is lost, the same command goes on."""


def parse_limit(value: object) -> float | None:
    """The key's minutes, or None for no limit; ValueError (one line) for anything else."""
    ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool) and value > 0)
    if not ok:
        raise ValueError(f"stop_after_minutes={value!r:.60}: expected null or a number of minutes > 0")
    return None if value is None else float(value)


@dataclass
class TimeLimit:
    minutes: float | None  # None: no limit
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()

    def left_s(self) -> float | None:
        """Seconds left (0 once reached), or None without a limit."""
        if self.minutes is None:
            return None
        return max(0.0, self.minutes * 60 - (self.clock() - self.start))

    def reached(self) -> bool:
        return self.left_s() == 0.0

    def check(self, what: str) -> None:
        """Raise TimeUp where the limit is reached, before `what` starts training."""
        if self.reached():
            raise TimeUp(f"stop_after_minutes={self.minutes:g} reached before {what}")
