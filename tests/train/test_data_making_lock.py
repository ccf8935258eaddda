"""Two jobs that start together make the embedded data once: the second waits for the first's lock, then finds
the data made (two writers of the same shards' temporary files crashed one of them)."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from pipeline.config import compose_config


def _prepare(root: str, q) -> None:
    from pipeline.train import prepare

    made = []
    real = prepare._make_embedded
    # a second's wait before making: without the lock, both processes would be inside at once
    prepare._make_embedded = lambda data: (made.append(1), time.sleep(1.0), real(data))  # type: ignore[assignment]
    cfg = compose_config([f"paths.root={root}", "data.generate.n_train=64", "data.generate.n_val=16"])
    try:
        n = prepare.prepare_data(cfg["data"], cfg["paths"]["data"])["num_samples"]
        q.put(("ok", n, len(made)))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put(("error", repr(e), len(made)))


def test_two_jobs_make_the_embedded_data_once(tmp_path: Path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_prepare, args=(str(tmp_path), q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(r[0] == "ok" and r[1] == 64 for r in results), results
    assert sorted(r[2] for r in results) == [0, 1]  # one made it, the other found it made
