"""An evaluation from a package: how evenly a run's frozen validation features spread over the sphere, as Wang &
Isola's uniformity (lower is more uniform), beside a random-init backbone (`job: spread` in a suite, or
`EVALUATIONS["spread"]().main(argv, doc)`). A child run of the pretraining run, found again by its settings."""

from __future__ import annotations

import torch

from augssl_barlow.uniformity import uniformity
from pipeline.config import JobError
from pipeline.eval.evaluation import Evaluation
from pipeline.fields import Int, Num, Section, check_model


class Spread(Evaluation):
    config = "spread"  # conf/spread.yaml in this package

    class Settings(Section):
        t: Num(gt=0)
        n: Int(2)
        seed: Int(0)

    def check(self, cfg: dict) -> None:
        try:
            check_model(self.Settings, {k: cfg[k] for k in ("t", "n", "seed")})
        except ValueError as e:
            raise JobError(str(e)) from None

    def run(self, cfg: dict) -> dict:
        import mlflow
        import torch.nn.functional as F

        from pipeline import tracking
        from pipeline.augment.view_maker import eval_settings
        from pipeline.data.reader import load_split
        from pipeline.eval import downstream
        from pipeline.eval.features import eval_preprocess, extract
        from pipeline.eval.run_probe import backbone_from, random_backbone
        from pipeline.eval.source import load_source
        from pipeline.store import Store

        store = Store.of(cfg)
        tracking.setup(store)
        try:
            src = load_source(str(cfg["run"]))
        except (FileNotFoundError, ValueError) as e:
            raise JobError(str(e)) from None
        settings = {"source": src.ref, "t": cfg["t"], "n": cfg["n"], "seed": cfg["seed"]}
        ev = downstream.find(store, src, "spread", settings)
        if ev.finished and ev.found is not None:
            m = ev.found.data.metrics
            return {label: {"uniformity": m[f"spread/{label}_uniformity"]} for label in ("pretrained", "random")}
        data = src.cfg["data"]
        split = load_split(data["val"], data["task"], data.get("targets"), limit=cfg["n"])
        preprocess = eval_preprocess(*eval_settings(src.cfg["augment"]))
        results = {}
        with downstream.child_run(store, src, ev, "spread"):
            for label in ("pretrained", "random"):
                pretrained = label == "pretrained"
                net = backbone_from(src.state) if pretrained else random_backbone(src.cfg["model"], cfg["seed"])
                feats, _ = extract(net, split.encoded, preprocess)
                u = float(uniformity(F.normalize(feats.to(torch.float64), dim=1), cfg["t"]))
                results[label] = {"uniformity": u}
                mlflow.log_metric(f"spread/{label}_uniformity", u)
        print(f"[spread] {results}", flush=True)
        return results
