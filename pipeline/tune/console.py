"""The sweep's console: one line per trial event (started, each epoch, done, stopped early, failed) on the
driver, in place of Tune's status tables (those come with verbose=true)."""

from __future__ import annotations

from ray import tune

from pipeline.tune.space import short
from pipeline.tune.trial import TRAINED, trial_number


def say(msg: str) -> None:
    print(f"[tune] {msg}", flush=True)


class Console(tune.Callback):
    def __init__(self, epochs: int, metric: str, stop_metric: str | None):
        self.epochs, self.metric, self.stop_metric = epochs, metric, stop_metric

    def on_trial_start(self, iteration, trials, trial, **info):
        say(f"trial {trial_number(trial.trial_id)} started: {short(trial.config)}")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("final"):
            value = result.get(self.metric)
            score = f"{self.metric}={value:.4g}" if value is not None else "scored"
            say(f"trial {trial_number(trial.trial_id)} done: {score}")
            return
        shown = dict.fromkeys(k for k in (self.stop_metric, "knn_r2", "knn_top1", "epoch_loss") if k and k in result)
        values = " ".join(f"{k}={result[k]:.4g}" for k in shown)
        say(f"trial {trial_number(trial.trial_id)} epoch {result.get(TRAINED)}/{self.epochs}: {values}")

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        if not last.get("final"):
            say(
                f"trial {trial_number(trial.trial_id)} stopped early by the scheduler after epoch "
                f"{last.get(TRAINED, 0)}/{self.epochs}"
            )

    def on_trial_error(self, iteration, trials, trial, **info):
        say(f"trial {trial_number(trial.trial_id)} failed; its error: {trial.error_file or trial.path}")
