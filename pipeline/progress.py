"""Progress for long work that reads well on a terminal and in a file: a tqdm bar where the console is a terminal,
a plain line every so often where it is not (ray job logs, CI, a redirect), since a file keeps every redraw."""

from __future__ import annotations

import sys
import time


class ProgressLines:
    """A progress bar's interface (update, set_description, set_postfix, close) that prints one plain line every
    `every` seconds: done, rate and time left, e.g. `[train] epoch 1/3: 300/1000 img (30 %), 10 img/s, 70 s left`."""

    def __init__(
        self, text: str, total: int, every: float = 30.0, clock=time.monotonic, prefix: str = "[train]", unit="img"
    ):
        self.text, self.total, self.every, self.clock = text, total, every, clock
        self.prefix, self.unit, self.postfix = prefix, unit, ""
        self.done = 0
        self.start = self.last = clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every and self.done < self.total:
            rate = self.done / max(now - self.start, 1e-9)
            left = (self.total - self.done) / max(rate, 1e-9)
            shown = f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"
            print(
                f"{self.prefix} {self.text}: {self.done}/{self.total} {self.unit} "
                f"({100 * self.done / self.total:.0f} %), {shown} {self.unit}/s, {left:.0f} s left{self.postfix}",
                flush=True,
            )
            self.last = now

    def set_description(self, text: str) -> None:
        self.text = text

    def set_postfix(self, **values) -> None:
        self.postfix = "".join(f", {k} {v}" for k, v in values.items())

    def close(self) -> None:
        pass  # the caller's summary line follows


def bar(total: int, prefix: str, text: str, unit: str, every: float = 30.0):
    """This process's own progress: tqdm on a terminal (stderr, where tqdm draws), ProgressLines otherwise."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=f"{prefix} {text}", unit=unit, mininterval=2.0)
    return ProgressLines(text, total, every, prefix=prefix, unit=unit)
