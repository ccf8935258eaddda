"""ASHA's rungs survive a restored sweep (pipeline/tune/scheduler_state.py): Tune pickles the callback's state with
the experiment and hands it back on a restore, before it re-adds the trials; the sweep killed and resumed end to end
is tests/tune/test_tune.py's smoke sweep."""

import pickle
from types import SimpleNamespace

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from pipeline.tune.scheduler_state import SchedulerState


def _asha() -> ASHAScheduler:
    return ASHAScheduler(time_attr="epoch", metric="knn_r2", mode="max", max_t=2, grace_period=1, reduction_factor=2)


def _judged(scheduler: ASHAScheduler, trial: str, value: float) -> str:
    t = SimpleNamespace(trial_id=trial)
    scheduler.on_trial_add(None, t)
    return scheduler.on_trial_result(None, t, {"epoch": 1, "knn_r2": value})


def test_a_restored_asha_stops_the_trial_its_saved_rung_would_have_stopped():
    first = _asha()
    saved = SchedulerState(first)
    assert _judged(first, "00000", 0.5) == TrialScheduler.CONTINUE  # alone at the rung
    state = pickle.loads(pickle.dumps(saved.get_state()))  # as Tune saves it with the experiment

    restored = _asha()  # what Tuner.restore rebuilds: the scheduler as first pickled
    SchedulerState(restored).set_state(state)
    assert _judged(restored, "00001", 0.1) == TrialScheduler.STOP
    assert _judged(_asha(), "00001", 0.1) == TrialScheduler.CONTINUE  # what a restore without it decided


def test_the_tuners_pickle_keeps_the_callback_on_the_scheduler_tune_runs():
    scheduler = _asha()
    tuner = pickle.loads(pickle.dumps({"tune_config": scheduler, "callbacks": [SchedulerState(scheduler)]}))
    assert tuner["callbacks"][0].scheduler is tuner["tune_config"]
