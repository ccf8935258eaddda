"""One command under a time cap, its output streamed: shared by make gpu-check's steps and benchmarks/gpu's
end-to-end run. On a lent GPU every second counts, so a step that overruns is stopped whole (its process group) and
what it printed, each line stamped with the seconds since the start, shows where the time went."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to `proc`'s process group, SIGKILL 10 s later if anything of it is left."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_capped(name: str, cmd: list[str], cap: float, log: Path, cwd: Path | None = None, indent: str = "") -> dict:
    """`cmd` in a new process group, its output streamed to the console (after `indent`) and to `log`, each line
    stamped `[+SECONDS]`; the whole group is stopped once `cap` seconds have passed. Returns rc, seconds, cap,
    capped, command and the output's text."""
    print(f"{indent}== {name}: {shlex.join(cmd)}   (cap {cap:.0f} s)", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    capped = threading.Event()

    def on_cap():
        capped.set()
        stop_group(proc)

    timer = threading.Timer(cap, on_cap)
    timer.start()
    lines = []
    with log.open("w") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        assert proc.stdout is not None
        for line in proc.stdout:
            stamped = f"[+{time.perf_counter() - t0:5.0f}s] {line}"
            sys.stdout.write(indent + stamped)
            sys.stdout.flush()
            f.write(stamped)
            lines.append(line)
    rc = proc.wait()
    timer.cancel()
    seconds = time.perf_counter() - t0
    with log.open("a") as f:
        f.write(f"\n[{name}: exit {rc} after {seconds:.0f} s{', stopped at its cap' if capped.is_set() else ''}]\n")
    return {"rc": rc, "seconds": seconds, "cap": cap, "capped": capped.is_set(), "command": cmd, "text": "".join(lines)}
