"""A reproduction's wall-clock limit (the `stop_after_minutes` key). A seeded reproduction of every suite trains for
longer than one sitting of most machines (a CI job's hours, a spot node's lease, a night); with a limit, the command
starts no run or sweep once the limit is reached (one under way finishes; Tune trials are stopped at it), stops
before the report, says what is left, and exits STOPPED. The same command then goes on where it stopped: the ledger
keeps every finished run, on any machine; a run stopped midway resumes from its last checkpoint where the store and
checkpoints (paths.root) are kept between calls, and starts again where they are not. A large reproduction thus runs
as a series of bounded calls."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STOPPED = 75  # sysexits.h's EX_TEMPFAIL: not failed, not done; run the same command again


class TimeUp(Exception):
    """The limit was reached before every run had trained: the same command goes on."""


def parse_limit(value: object) -> float | None:
    """The key's minutes, or None for no limit; ValueError (one line) for anything else."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    raise ValueError(f"stop_after_minutes={value!r:.60}: expected null or a number of minutes > 0")


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
