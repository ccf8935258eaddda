"""CLSA (Wang & Qi 2021, specs/clsa.md): strong views go through the query encoder; the weak query's distribution
over [positive key, queue] is the (detached) target of each strong query's (DDM, Eq. 6), weight beta, summed over
the strong views as the paper does (CLSA*). The strong views are every view after the first two (augment=clsa or
clsa_multi)."""
from __future__ import annotations

from pipeline.losses import ddm
from pipeline.plugins.base import Plugin


class CLSA(Plugin):
    name = "clsa"
    frameworks = ("moco",)

    def __init__(self, pcfg: dict, cfg: dict):
        super().__init__()
        self.beta = float(pcfg.get("beta", 1.0))
        self.batch_keys = bool(pcfg.get("batch_keys", False))

    def loss(self, method, images, params, ctx):
        (q_weak, k), queue = ctx["pairs"][0], ctx["queue"]
        terms = [ddm(q_weak, method.query(x), k, queue, method.temperature, batch_keys=self.batch_keys)
                 for x in images[2:]]
        return {"clsa_ddm": (sum(terms), self.beta)}
