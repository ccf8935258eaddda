"""What the training-curves PNG draws (pipeline.train.curves): the loss with the terms the method and its plug-ins
declare (`loss_terms`), the kNN monitor, and the panels a plug-in declares of its own (`panels`: CoCor's per-length
targets beside the similarities they constrain). Imports no torch: a method or plug-in names its curves here, and
the generic curve-drawing code names no method or plug-in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Panel:
    """A panel of its own: the metrics `train/<name>` whose name fully matches `pattern`; a name matching `dashed` is
    drawn dashed, and the pattern's first group, where it has one, picks the colour (so a target and the similarity
    it constrains share one)."""

    title: str
    pattern: str
    dashed: str = ""

    def keys(self, logged: Sequence[str]) -> list[str]:
        return sorted(k for k in logged if k.startswith("train/") and re.fullmatch(self.pattern, k[6:]))

    def style(self, key: str) -> tuple[str, str | None]:
        """(line style, colour) of one of its metrics."""
        name = key[6:]
        found = re.fullmatch(self.pattern, name)
        group = found.group(1) if found and found.groups() else None
        colour = f"C{int(group) % 10}" if group and group.isdigit() else None
        return ("--" if self.dashed and re.match(self.dashed, name) else "-"), colour


def panels(logged: Sequence[str], terms: Sequence[str] = (), extra: Sequence[Panel] = ()) -> dict[str, list[str]]:
    """Which logged metrics go in which panel (panels with nothing logged are left out): the loss and `terms`, the
    kNN monitor, then each of `extra`."""
    out = {
        "training loss and its terms": [k for k in ("train/loss", *(f"train/{t}" for t in terms)) if k in logged],
        "kNN monitor": sorted(k for k in logged if k.startswith("knn/") and k != "knn/time_s"),
        **{p.title: p.keys(logged) for p in extra},
    }
    return {title: ks for title, ks in out.items() if ks}
