"""Views for the next batches made while the current step runs: one producer thread, a bounded queue.

The step (autograd, DDP's collectives) stays on the training thread; the producer only reads raw batches and turns
them into views. It runs `make` on the items in order with the same generator the serial loop would use, so the
views are the same ones, just earlier. DALI, the torch executor's ops and the Spirograph renderer all release the
GIL while they work, so on a CPU the views fill the cores the step leaves idle. On a GPU the producer makes its
views with a CUDA stream of its own as the current stream (the batched executor's kernels run there; DALI runs its
kernels on its own stream, only its copy out on this one) and the consumer's stream waits for them (an event).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")
_DONE = object()
# The producer thread's niceness above the step's: where the cores are busy (a 2-core CPU), the step keeps them
# and the views take what it leaves idle; with idle cores (a GPU node) it changes nothing. On this CPU it turned
# a 0.95x overlap into 1.06x (docs/measured.md).
PRODUCER_NICE = 10


def _lower_priority(by: int) -> None:
    """Raise this OS thread's nice value by `by` (Linux schedules threads one by one; elsewhere nothing)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except (AttributeError, OSError):  # no setpriority (Windows), or not allowed: run at the step's priority
        pass


@dataclass
class Timing:
    """Where a loader's seconds went. `data_s` and `views_s` are the producer's (hidden behind the step when it runs
    ahead); `wait_s` is what the consumer waited for views: the part of the data path the step did not hide."""

    data_s: float = 0.0
    views_s: float = 0.0
    wait_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, key: str, seconds: float) -> None:
        with self._lock:
            setattr(self, key, getattr(self, key) + seconds)

    def as_dict(self) -> dict[str, float]:
        return {"data_s": self.data_s, "views_s": self.views_s, "wait_s": self.wait_s}


def _tensors(obj) -> Iterator[torch.Tensor]:
    """Every tensor in a view batch (Views' images and parameters, lists, dicts)."""
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif hasattr(obj, "__dict__"):
        yield from _tensors(vars(obj))


def made_ahead(
    source: Iterable,
    make: Callable[..., T],
    depth: int,
    timing: Timing | None = None,
    device: torch.device | None = None,
    threads: int | None = None,
) -> Iterator[T]:
    """`make(item)` for each item of `source`, in order. depth 0: in series on the caller's thread (what the loop
    did before); depth k >= 1: a producer thread keeps up to k results ready, its torch ops on `threads` intra-op
    threads (None: the caller's count). A producer's exception is raised in the consumer at the item where it
    happened; closing the generator early stops the producer."""
    timing = timing if timing is not None else Timing()
    if depth <= 0:
        yield from _in_series(source, make, timing)
        return
    yield from _ahead(source, make, depth, timing, device, threads)


def _in_series(source: Iterable, make: Callable, timing: Timing) -> Iterator:
    t = time.monotonic()
    for item in source:
        t_made = time.monotonic()
        out = make(item)
        done = time.monotonic()
        timing.add("data_s", t_made - t)
        timing.add("views_s", done - t_made)
        timing.add("wait_s", done - t)  # in series the step waits for all of it
        yield out
        t = time.monotonic()


def _ahead(
    source: Iterable, make: Callable, depth: int, timing: Timing, device: torch.device | None, threads: int | None
) -> Iterator:
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    threads = threads or torch.get_num_threads()  # intra-op threads are per OS thread: set the producer's own
    cuda = device is not None and torch.device(device).type == "cuda"
    stream = torch.cuda.Stream(device=device) if cuda else None

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            torch.set_num_threads(threads)
            _lower_priority(PRODUCER_NICE)
            it = iter(source)
            while not stop.is_set():
                t = time.monotonic()
                try:
                    item = next(it)
                except StopIteration:
                    break
                t_made = time.monotonic()
                if stream is not None:
                    with torch.cuda.stream(stream):
                        out = make(item)
                        event = torch.cuda.Event()
                        event.record(stream)
                    event.synchronize()  # off the step's thread: views_s is the kernels' time, not their launch's
                else:
                    out, event = make(item), None
                timing.add("data_s", t_made - t)
                timing.add("views_s", time.monotonic() - t_made)
                if not put((out, event, None)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            put((None, None, e))
            return
        put((_DONE, None, None))

    producer = threading.Thread(target=produce, name="views-ahead", daemon=True)
    producer.start()
    try:
        while True:
            t = time.monotonic()
            out, event, error = ready.get()
            timing.add("wait_s", time.monotonic() - t)
            if error is not None:
                raise error
            if out is _DONE:
                return
            if event is not None:  # the step's stream waits for the views' kernels; their memory is the step's now
                current = torch.cuda.current_stream(device)
                current.wait_event(event)
                for tensor in _tensors(out):
                    if tensor.is_cuda:
                        tensor.record_stream(current)
            yield out
    finally:
        stop.set()
        producer.join(timeout=5)
        if producer.is_alive():  # inside next(source), e.g. waiting on Ray Data: it stops at its next put
            log.warning("the views producer is still reading its source; it stops at the next batch")


def views_threads(threads: int, depth: int) -> int:
    """Threads for making views beside a step on `threads` threads. Made ahead, the views get half of them: the
    producer's work shares the cores with the step's, and two full thread teams on the same cores slow the step more
    than the overlap gains (docs/measured.md, benchmarks/epoch_rate.py). In series, all of them."""
    return max(1, threads // 2) if depth > 0 else max(1, threads)
