"""The views producer (pipeline/train/prefetch.py): the same views as in series, made while the step runs."""

import os
import threading
import time

import numpy as np
import pytest
import torch

from pipeline.augment.view_makers import build_view_maker
from pipeline.train.prefetch import Timing, made_ahead
from tests.helpers import encode, natural

AUG = {
    "kind": "views",
    "executor": "torch",
    "device": "cpu",
    "mean": [0.5] * 3,
    "std": [0.25] * 3,
    "view": {"size": 16, "scale": [0.2, 1.0], "jitter": [0.4, 0.4, 0.4, 0.1], "p_jitter": 0.8, "p_flip": 0.5},
    "views": [{"name": "view", "count": 2}],
}


def _raw_batches(n: int, batch: int = 6):
    return [
        {"png": np.array([encode(natural(24, 24, b * batch + i)) for i in range(batch)], dtype=object)}
        for b in range(n)
    ]


@pytest.mark.parametrize("depth", [1, 3])
def test_views_made_ahead_are_the_views_made_in_series(depth):
    """One producer thread draws from the same generator in the same order: every image and parameter equal."""
    raw = _raw_batches(4)

    def views(d):
        maker, rng = build_view_maker(AUG, 6, seed=0), np.random.default_rng(7)
        return list(made_ahead(raw, lambda b: maker(b, rng), d))

    serial, ahead = views(0), views(depth)
    assert len(serial) == len(ahead) == 4
    for s, a in zip(serial, ahead):
        assert all(torch.equal(x, y) for x, y in zip(s.images, a.images))
        assert [sorted(p) for p in s.params] == [sorted(p) for p in a.params]
        assert all(torch.equal(p[k], q[k]) for p, q in zip(s.params, a.params) for k in p)
    # and the draws differ from batch to batch (the generator advanced), so equality above is not trivial
    assert not torch.equal(serial[0].params[0]["crop"], serial[1].params[0]["crop"])


def _timed(depth: int, items: int = 6, make_s: float = 0.08, step_s: float = 0.08) -> tuple[float, Timing]:
    """A consumer whose 'step' and a producer whose 'views' each take a fixed time (sleeps release the GIL as
    DALI's and torch's kernels do)."""

    def make(i):
        time.sleep(make_s)
        return i

    timing = Timing()
    t = time.monotonic()
    for _ in made_ahead(range(items), make, depth, timing):
        time.sleep(step_s)
    return time.monotonic() - t, timing


def test_views_overlap_the_step_and_the_wait_is_what_is_left():
    serial, t_serial = _timed(0)
    ahead, t_ahead = _timed(2)
    # in series: items x (make + step) = 0.96 s; ahead: make + items x step = 0.56 s
    assert serial > 0.9 and ahead < 0.75 * serial, (serial, ahead)
    assert t_serial.views_s == pytest.approx(0.48, abs=0.1) and t_ahead.views_s == pytest.approx(0.48, abs=0.1)
    # ahead, the step waits only for the first batch's views; in series it waits for all of them
    assert t_ahead.wait_s < 0.2 and t_serial.wait_s == pytest.approx(t_serial.views_s, abs=0.05)


def test_the_producer_runs_at_most_depth_ahead_and_stops_when_the_loop_does():
    made = []

    def make(i):
        made.append(i)
        return i

    gen = made_ahead(range(100), make, 2)
    assert next(gen) == 0
    time.sleep(0.3)  # time for the producer to fill its queue
    # one handed out, two queued, one made and waiting for room
    assert len(made) <= 4, made
    gen.close()
    assert not any(t.name == "views-ahead" and t.is_alive() for t in threading.enumerate())
    assert len(made) <= 4


def test_an_error_making_views_reaches_the_loop_after_the_batches_before_it():
    def make(i):
        if i == 3:
            raise ValueError("corrupt shard")
        return i

    got = []
    with pytest.raises(ValueError, match="corrupt shard"):
        for x in made_ahead(range(10), make, 2):
            got.append(x)
    assert got == [0, 1, 2]
    assert not any(t.name == "views-ahead" and t.is_alive() for t in threading.enumerate())


def test_the_producer_uses_the_intra_op_threads_it_is_given():
    """Threads given: the producer sets its own count (intra-op threads are per OS thread), the loop's stays."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen = list(made_ahead(range(2), lambda i: torch.get_num_threads(), 1, threads=1))
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priorities on this OS")
def test_the_producer_yields_the_cores_to_the_step():
    """Its thread runs PRODUCER_NICE nicer than the loop's (capped at 19), so a busy CPU runs the step first."""
    from pipeline.train.prefetch import PRODUCER_NICE

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = list(made_ahead(range(2), lambda i: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), 1))
    assert seen == [min(19, mine + PRODUCER_NICE)] * 2
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the loop's own is untouched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_views_made_ahead_on_a_side_stream_are_the_views_made_in_series_on_cuda():
    """On CUDA the producer makes its views on a stream of its own and the step's stream waits on its event. Here the
    views' stream is slowed (a sleep kernel before a last in-place op): a consumer that read them before that stream
    finished would see them half made."""
    aug = {**AUG, "executor": "batched", "device": "auto"}
    raw = _raw_batches(4)
    cuda = torch.device("cuda")

    def views(depth):
        maker, rng = build_view_maker(aug, 6, seed=0, device=cuda), np.random.default_rng(7)

        def slow_make(b):
            v = maker(b, rng)
            torch.cuda._sleep(50_000_000)  # ~tens of ms on the current (the producer's) stream
            for x in v.images:
                x.mul_(2.0)
            return v

        return [[x.clone() for x in v.images] for v in made_ahead(raw, slow_make, depth, device=cuda)]

    serial, ahead = views(0), views(2)
    torch.cuda.synchronize()
    assert all(x.is_cuda for batch in ahead for x in batch)
    for s, a in zip(serial, ahead, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(s, a, strict=True))
