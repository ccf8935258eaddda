"""CLSA (Wang & Qi 2021, docs/methods/clsa.md): strong views go through the query encoder; the weak query's distribution
over [positive key, queue] is the (detached) target of each strong query's (DDM, Eq. 6), weight beta, summed over
the strong views as the paper does (CLSA*). The strong views are every view after the first two (augment=clsa or
clsa_multi).

On MoCo v3 (no queue) the support is every worker's keys of the batch (the in-batch negatives MoCo v3 itself uses).
On BYOL (the paper's Table 8 gives a result but not the attachment, §6 item 16) there is no queue: the support is the
batch's target projections (the code's batch-keys form) and the temperature, where the method has none, is
plugin.clsa.batch_temperature. Any method that leaves pairs and an embedding composes the same way."""

from __future__ import annotations

from pipeline.augment.view_makers import image_recipe
from pipeline.fields import Bool, Choice, Num, Section
from pipeline.losses.clsa import ddm, strong_infonce
from pipeline.plugins.base import Plugin, PluginRun
from pipeline.run_shape import RunShape


class CLSA(Plugin):
    name = "clsa"
    loss_terms = ("clsa_ddm", "clsa_infonce")
    # the strong views go through the method's embed; the support is the queue (MoCo), every worker's keys (MoCo v3)
    # or the batch's keys (BYOL, whose temperature is the plug-in's own)
    needs = (
        frozenset({"pairs", "embed", "queue", "temperature"}),
        frozenset({"pairs", "embed", "key_bank", "temperature"}),
        frozenset({"pairs", "embed"}),
    )

    class Settings(Section):
        beta: Num(ge=0) = 1.0  # the weight of L_D
        batch_keys: Bool() = False  # true: the official code's support (every key of the batch + the queue)
        # infonce: Table 5's "CLSA with contrastive loss", the strong views' plain InfoNCE in place of DDM (not in
        # conf/plugin/clsa.yaml, so that the DDM runs keep their names: +plugin.clsa.loss=infonce)
        loss: Choice("ddm", "infonce") = "ddm"
        temperature: Num(gt=0, null=True) = None  # null: the method's tau, or batch_temperature where it has none
        batch_temperature: Num(gt=0) = 0.2  # a method without a tau (BYOL): over the batch's target projections

    @classmethod
    def check(cls, s: Section, shape: RunShape) -> None:
        aug = shape.augment
        if aug.get("kind", "views") != "views" or not any(v.strong_ops for v in image_recipe(aug).views[2:]):
            raise ValueError("plugin clsa needs strong views after the two weak ones: augment=clsa or clsa_multi")

    def __init__(self, s: Settings, run: PluginRun):
        super().__init__()
        self.beta = float(s.beta)
        self.batch_keys = bool(s.batch_keys)
        self.infonce = s.loss == "infonce"
        self.temperature = s.temperature  # null: the method's tau
        self.batch_temperature = float(s.batch_temperature)

    def loss(self, method, images, params, ctx):
        q_weak, k = ctx.pairs[0]
        t = float(next(v for v in (self.temperature, ctx.temperature, self.batch_temperature) if v is not None))
        offset = 0  # where this worker's own keys start in k
        if ctx.queue is not None:  # MoCo v1/v2: [own key, queue] (the paper), or [the batch's keys, queue] (code)
            queue, batch_keys = ctx.queue, self.batch_keys
        else:  # MoCo v3: every worker's keys; BYOL: the batch's target projections
            k, offset = (ctx.key_bank[0], ctx.offset) if ctx.key_bank else (k, 0)
            queue, batch_keys = k.new_zeros(0, k.shape[1]), True
        if self.infonce:
            terms = [
                strong_infonce(ctx.embed(x), k, queue, t, batch_keys=batch_keys, offset=offset) for x in images[2:]
            ]
            return {"clsa_infonce": (sum(terms), self.beta)}
        terms = [ddm(q_weak, ctx.embed(x), k, queue, t, batch_keys=batch_keys) for x in images[2:]]
        return {"clsa_ddm": (sum(terms), self.beta)}
