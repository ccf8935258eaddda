"""An evaluation from a package: how evenly a run's frozen validation features spread over the sphere, as Wang &
Isola's uniformity (lower is more uniform), beside a random-init backbone (`job: spread` in a suite, or
`EVALUATIONS["spread"]().main(argv, doc)`). A child run of the pretraining run, found again by its settings."""

from __future__ import annotations

import torch

from augssl_barlow.uniformity import uniformity
from pipeline.config import JobError
from pipeline.eval.evaluation import Evaluation, Job
from pipeline.fields import Int, Num, Section


class SpreadSettings(Section):
    """Its own keys (conf/spread.yaml); `run`, `paths.*`, `tracking.*` and `verbose` are every evaluation's (Job)."""

    t: Num(gt=0)
    n: Int(2)
    seed: Int(0)


class Spread(Evaluation[SpreadSettings]):
    config = "spread"  # conf/spread.yaml in this package
    Settings = SpreadSettings

    def run(self, job: Job[SpreadSettings]) -> dict:
        import mlflow
        import torch.nn.functional as F

        from pipeline import tracking
        from pipeline.augment.view_makers import eval_settings
        from pipeline.data.reader import load_split
        from pipeline.eval import downstream
        from pipeline.eval.features import eval_preprocess, extract
        from pipeline.eval.probe.compare import backbone_from, random_backbone
        from pipeline.eval.source import load_source

        s, store = job.own, job.store
        tracking.setup(store)
        try:
            src = load_source(job.source)
        except (FileNotFoundError, ValueError) as e:
            raise JobError(str(e)) from None
        settings = {"source": src.ref, "t": s.t, "n": s.n, "seed": s.seed}
        ev = downstream.find(store, src, "spread", settings)
        if ev.finished and ev.found is not None:
            m = ev.found.data.metrics
            return {label: {"uniformity": m[f"spread/{label}_uniformity"]} for label in ("pretrained", "random")}
        data = src.cfg["data"]
        split = load_split(data["val"], data["task"], data.get("targets"), limit=s.n)
        preprocess = eval_preprocess(*eval_settings(src.cfg["augment"]))
        results = {}
        with downstream.child_run(store, src, ev, "spread"):
            for label in ("pretrained", "random"):
                pretrained = label == "pretrained"
                net = backbone_from(src.state) if pretrained else random_backbone(src.cfg["model"], s.seed)
                feats, _ = extract(net, split.encoded, preprocess)
                u = float(uniformity(F.normalize(feats.to(torch.float64), dim=1), s.t))
                results[label] = {"uniformity": u}
                mlflow.log_metric(f"spread/{label}_uniformity", u)
        print(f"[spread] {results}", flush=True)
        return results
