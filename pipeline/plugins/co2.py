"""CO2 (Wei et al. 2021, docs/methods/co2.md): consistency between the query's and its positive key's similarity
distributions over the negatives, weight alpha, temperature tau_con. On MoCo the negatives are the queue; on
SimCLR the other views of the batch, gathered from every worker."""
from __future__ import annotations

from pipeline.losses import co2_consistency, co2_consistency_anchors
from pipeline.plugins.base import Plugin

# docs/methods/co2.md §1.6 (table of constants): (alpha, tau_con) per framework
DEFAULTS = {"mocov1": (10.0, 0.04), "mocov2": (0.3, 0.05), "simclr": (0.07, 1.0)}


class CO2(Plugin):
    name = "co2"
    frameworks = ("moco", "simclr")

    def __init__(self, pcfg: dict, cfg: dict):
        super().__init__()
        m = cfg["method"]
        alpha, tau = DEFAULTS.get(m["name"], DEFAULTS["simclr" if m["kind"] == "simclr" else "mocov2"])
        self.alpha = float(pcfg["alpha"] if pcfg.get("alpha") is not None else alpha)
        self.temperature = float(pcfg["temperature"] if pcfg.get("temperature") is not None else tau)
        self.divergence = pcfg.get("divergence", "symmetric")
        if self.divergence not in ("symmetric", "forward", "reverse"):
            raise ValueError(f"plugin.co2.divergence must be symmetric, forward or reverse, not {self.divergence!r}")

    def loss(self, method, images, params, ctx):
        if "queue" in ctx:  # MoCo: one term per (query, key) pair, averaged
            terms = [co2_consistency(q, k, ctx["queue"], self.temperature, divergence=self.divergence)
                     for q, k in ctx["pairs"]]
            value = sum(terms) / len(terms)
        else:               # SimCLR: in-batch negatives from every worker
            (z1, z2), (c1, c2) = ctx["z"], ctx["gathered"]
            value = co2_consistency_anchors(z1, z2, c1, c2, self.temperature, ctx["offset"],
                                            divergence=self.divergence)
        return {"co2_consistency": (value, self.alpha)}
