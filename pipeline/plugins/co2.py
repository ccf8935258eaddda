"""CO2 (Wei et al. 2021, docs/methods/co2.md): consistency between the query's and its positive key's similarity
distributions over the negatives, weight alpha, temperature tau_con. On MoCo v1/v2 the negatives are the queue; on
MoCo v3 every worker's keys of the batch but the query's own; on SimCLR the other views of the batch, gathered from
every worker."""

from __future__ import annotations

from pipeline.fields import Choice, Num, Section
from pipeline.losses.co2 import co2_consistency, co2_consistency_anchors, co2_consistency_bank
from pipeline.plugins.base import Plugin, PluginRun


class CO2(Plugin):
    name = "co2"
    loss_terms = ("co2_consistency",)
    needs = (frozenset({"pairs", "queue"}), frozenset({"pairs", "key_bank"}), frozenset({"projections", "gathered"}))

    class Settings(Section):
        # the paper's constants per framework: conf/plugin/co2.yaml's per_method table
        alpha: Num(ge=0)
        temperature: Num(gt=0)  # tau_con
        divergence: Choice("symmetric", "forward", "reverse") = "symmetric"  # forward | reverse: Table 4's ablations

    def __init__(self, s: Settings, run: PluginRun):
        super().__init__()
        self.alpha = float(s.alpha)
        self.temperature = float(s.temperature)
        self.divergence = s.divergence

    def loss(self, method, images, params, ctx):
        if ctx.queue is not None:  # MoCo v1/v2: one term per (query, key) pair, averaged
            terms = [
                co2_consistency(q, k, ctx.queue, self.temperature, divergence=self.divergence) for q, k in ctx.pairs
            ]
            value = sum(terms) / len(terms)
        elif ctx.key_bank:  # MoCo v3: the other keys of the batch, from every worker
            terms = [
                co2_consistency_bank(q, k, bank, ctx.offset, self.temperature, divergence=self.divergence)
                for (q, k), bank in zip(ctx.pairs, ctx.key_bank)
            ]
            value = sum(terms) / len(terms)
        else:  # SimCLR: in-batch negatives from every worker
            (z1, z2), (c1, c2) = ctx.projections, ctx.gathered
            value = co2_consistency_anchors(z1, z2, c1, c2, self.temperature, ctx.offset, divergence=self.divergence)
        return {"co2_consistency": (value, self.alpha)}
