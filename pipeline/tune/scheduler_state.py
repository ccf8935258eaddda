"""The scheduler's state kept with the Tune experiment. Tune saves and restores a sweep's trials, and its callbacks'
states, but builds the scheduler afresh from the Tuner's first pickle: a restored ASHA would judge the next trial
against empty rungs and let through one it would have stopped. This callback hands Tune the scheduler's state with
each save of the experiment (ASHA's own `save` pickles the same attributes) and puts it back on a restore, before
Tune re-adds the trials."""

from __future__ import annotations

from ray import tune
from ray.tune.schedulers import TrialScheduler


class SchedulerState(tune.Callback):
    def __init__(self, scheduler: TrialScheduler):
        self.scheduler = scheduler  # the Tuner's pickle holds both, so a restored callback holds the restored scheduler

    def get_state(self) -> dict:
        return {"scheduler": dict(vars(self.scheduler))}

    def set_state(self, state: dict) -> None:
        vars(self.scheduler).update(state["scheduler"])
