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


def test_a_restored_tuner_hands_the_callback_the_scheduler_tune_runs(tmp_path):
    """Tuner.restore rebuilds both from the one pickle Tune wrote when the sweep began (no Ray needed): a Ray that
    copied the scheduler apart would leave the callback restoring a scheduler nobody runs. Tune's private
    attributes, read here only to pin that."""
    from ray import tune

    def trainable(config):
        pass

    scheduler = _asha()
    tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(scheduler=scheduler),
        run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path), callbacks=[SchedulerState(scheduler)]),
    )
    restored = tune.Tuner.restore(str(tmp_path / "sweep"), trainable)._local_tuner
    callback = next(c for c in restored._run_config.callbacks if isinstance(c, SchedulerState))
    assert callback.scheduler is restored._tune_config.scheduler and callback.scheduler is not scheduler
