"""The rank-0 step logger: the step never waits for the store, an outage keeps every metric and is said once, its
end once; close() waits for a store that comes back and fails in one line past tracking.outage_s. Against a real
SQLite MLflow store whose writes are made to fail (and to hang) for a while; tests/test_tracking_outage.py stops a
real tracking server under a training job."""

from __future__ import annotations

import time

import mlflow
import pytest

from pipeline.step_logger import StepLogger, StoreUnreachable


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("t")
    run = client.create_run(exp)
    return uri, client, run.info.run_id


class Outage:
    """Makes the logger's client fail (or hang) until `end()`."""

    def __init__(self, logger: StepLogger, hang_s: float = 0.0):
        self.real, self.hang_s, self.on = logger.client.log_batch, hang_s, True
        self.calls = 0
        logger.client.log_batch = self.log_batch  # type: ignore[method-assign]

    def log_batch(self, *a, **kw):
        self.calls += 1
        if self.on:
            time.sleep(self.hang_s)
            raise ConnectionError("Connection refused")
        return self.real(*a, **kw)

    def end(self) -> None:
        self.on = False


def test_an_outage_keeps_every_metric_and_is_said_once_each_way(store):
    uri, client, run_id = store
    said: list[str] = []
    logger = StepLogger(uri, run_id, flush_every_s=0.05, outage_s=30, say=said.append)
    outage = Outage(logger, hang_s=0.3)  # each failed write hangs a while: the step must not feel it
    slowest = 0.0
    for step in range(1, 41):
        t0 = time.monotonic()
        logger.log({"train/loss": 1.0 / step}, step)
        slowest = max(slowest, time.monotonic() - t0)
        if step % 10 == 0:
            logger.flush()
        time.sleep(0.02)
    assert outage.calls >= 2 and slowest < 0.05  # log() only appends, whatever the store does
    assert len(said) == 1 and "does not answer (ConnectionError" in said[0] and "metrics are kept" in said[0]
    outage.end()
    logger.tag("worker_nodes", "n1")
    logger.close()
    assert len(said) == 2 and said[1].startswith(f"[tracking] the store at {uri} is back after")
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 41))  # nothing dropped, nothing twice
    assert client.get_run(run_id).data.tags["worker_nodes"] == "n1"


def test_close_fails_in_one_line_when_the_store_stays_away(store):
    uri, _, run_id = store
    said: list[str] = []
    logger = StepLogger(uri, run_id, flush_every_s=0.05, outage_s=0.5, say=said.append)
    Outage(logger)
    logger.log({"train/loss": 1.0}, 1)
    with pytest.raises(StoreUnreachable) as e:
        logger.close()
    assert (
        "\n" not in str(e.value)
        and "tracking.outage_s=0.5" in str(e.value)
        and "rerun the same command" in str(e.value)
    )
    assert len(said) == 1


def test_flush_every_0_writes_at_every_log(store):
    uri, client, run_id = store
    logger = StepLogger(uri, run_id, flush_every_s=0)
    logger.log({"train/loss": 0.5}, 7)
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [7]  # before close
    logger.close()
    assert not logger._thread.is_alive()  # the sender stopped with close()
