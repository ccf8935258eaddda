"""Per-step metrics from the rank-0 training worker, sent to the store by a thread of their own.

The step never waits for the store: `log` and `tag` only append to a buffer, and the sender thread writes it every
`flush_every_s` (or when `flush` asks). A store that does not answer (a tracking server restarting, a network
partition, a locked or full SQLite file) keeps everything in the buffer, nothing dropped, and is said once in the
job's own words; its return is said once, with how long it was away and how much was sent. Before each write to an
HTTP server the sender asks its /health with a short timeout, and the worker's MLflow requests do not retry (the
sender does, every flush), so an outage costs no MLflow retry loop, whose urllib3 warnings would fill the console
and whose backoff would hold a write for minutes. `close` sends what is left, waiting up to `outage_s` for the store;
past that it raises StoreUnreachable (one line; the run's checkpoints are Ray Train's and a rerun resumes).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

BATCH = 900  # MLflow caps a log_batch at 1,000 metrics


class StoreUnreachable(RuntimeError):
    """The tracking store did not come back within tracking.outage_s at the end of training."""


def _health(uri: str, timeout: float = 3.0) -> str | None:
    """None when an HTTP tracking server answers its /health, else why not; non-HTTP stores: None (a write tells)."""
    if not uri.startswith(("http://", "https://")):
        return None
    import requests

    try:
        r = requests.get(f"{uri.rstrip('/')}/health", timeout=timeout)
    except requests.RequestException as e:
        return type(e).__name__
    return None if r.status_code == 200 else f"HTTP {r.status_code}"


def _reason(e: BaseException) -> str:
    """A store error in a few words: the line of its message that names the database's own error (SQLAlchemy
    wraps it in advice about autoflush), else its first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error)" in ln or "full" in ln or "locked" in ln]
    return f"{type(e).__name__}: {(named or lines or [''])[0][:160]}"


class StepLogger:
    def __init__(
        self,
        uri: str,
        run_id: str,
        flush_every_s: float = 5.0,
        outage_s: float = 600.0,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
    ):
        self.uri, self.run_id = uri, run_id
        if uri.startswith(("http://", "https://")):
            # this process's MLflow requests fail fast rather than retry for minutes inside a write (a server that
            # went away mid-request): the sender retries at its own pace, every flush, and says so once
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        self.client = MlflowClient(uri)
        self.flush_every_s, self.outage_s, self.say = flush_every_s, outage_s, say
        self._metrics: list[Metric] = []
        self._tags: list[RunTag] = []
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one write at a time: the sender thread's, or log()'s at flush_every_s=0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.down_since: float | None = None
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="step-logger", daemon=True)
        self._thread.start()

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        with self._lock:
            self._metrics += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if self.flush_every_s == 0:  # tracking.flush_every_s=0: written at every log, in the step (a store away still
            self._send()  # only keeps them)

    def tag(self, key: str, value: str) -> None:
        with self._lock:
            self._tags.append(RunTag(key, value))

    def flush(self) -> None:
        """Ask the sender to write now; returns at once (close() is the one that waits)."""
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._metrics) + len(self._tags)

    def close(self) -> None:
        """Stop the sender and write what is left, waiting up to outage_s for the store."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        deadline = time.monotonic() + self.outage_s
        while not self._send():
            if time.monotonic() > deadline:
                raise StoreUnreachable(
                    f"the tracking store at {self.uri} has not answered for {self._away():.0f} s (tracking.outage_s="
                    f"{self.outage_s:g}); {self.pending} metrics not written. The checkpoints are kept: rerun the "
                    "same command to resume"
                )
            time.sleep(min(5.0, max(0.5, self.flush_every_s)))

    def _away(self) -> float:
        return 0.0 if self.down_since is None else time.monotonic() - self.down_since

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_every_s if self.flush_every_s > 0 else 1.0)
            self._wake.clear()
            if not self._stop.is_set():
                self._send()

    def _send(self) -> bool:
        """Write the buffer; False (buffer kept) when the store does not answer."""
        with self._sending:
            return self._send_locked()

    def _send_locked(self) -> bool:
        with self._lock:
            metrics, tags = list(self._metrics), list(self._tags)
        if not metrics and not tags:
            return True
        why = _health(self.uri)
        if why is None:
            try:
                for i in range(0, max(len(metrics), 1), BATCH):
                    self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH], tags=tags if i == 0 else [])
            except Exception as e:  # noqa: BLE001 - the store's failure, whatever its type, is an outage to wait out
                why = _reason(e)
                # a partial write is possible; resending a metric at the same step and time is harmless
        if why is not None:
            if self.down_since is None:
                self.down_since = time.monotonic()
                self.say(
                    f"[tracking] the store at {self.uri} does not answer ({why}): training goes on, metrics are kept "
                    "and written when it is back"
                )
            return False
        with self._lock:
            del self._metrics[: len(metrics)]
            del self._tags[: len(tags)]
        self.sent += len(metrics)
        if self.down_since is not None:
            self.say(
                f"[tracking] the store at {self.uri} is back after {self._away():.0f} s; {len(metrics)} metrics written"
            )
            self.down_since = None
        return True
