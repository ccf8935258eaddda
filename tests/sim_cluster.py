"""A Ray cluster of several nodes on this one machine, for the multi-node tests: a head and worker nodes, each
its own raylet (`ray start`) with its own CPUs, custom resources and ports, under a temp dir of its own.

Locked down like every cluster the project starts: token authentication on (RAY_AUTH_MODE=token), with a token
made for this cluster alone in a 0600 file (RAY_AUTH_TOKEN_PATH), never in an environment value or on a command
line, so it reaches no log. `job_env()` is what a job joining the cluster needs; `remove_node` kills a worker
node's raylet and everything under it, as a lost machine would.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _tree(pids: list[int]) -> list[int]:
    seen: list[int] = []
    while pids:
        p = pids.pop()
        if p not in seen:
            seen.append(p)
            pids += _children(p)
    return seen


def _kill(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class SimCluster:
    """`SimCluster(head_cpus=2)`, then `add_node("a", cpus=1, resources={"single": 1})` per worker node."""

    def __init__(self, head_cpus: float = 1, head_resources: dict | None = None, base_env: dict | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="sc", dir="/tmp"))  # Ray's socket paths stay under 107 characters
        self.token_path = self.dir / "token"
        self.token_path.touch(mode=0o600)
        self.token_path.write_text(secrets.token_hex(32))
        self.base_env = {k: v for k, v in (base_env or os.environ).items() if k not in (*AUTH_VARS, "RAY_ADDRESS")}
        self.port, self.dashboard_port = free_port(), free_port()
        self.manager_ports: dict[str, int] = {}
        try:
            self._start(
                "head",
                head_cpus,
                head_resources,
                "--head",
                f"--port={self.port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={free_port()}",
                f"--temp-dir={self.dir / 'ray'}",
            )
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def job_env(self, **extra: str) -> dict:
        """A job's environment joining this cluster: the auth mode and the token's file (the address goes in
        trainer.address or RAY_ADDRESS)."""
        return {**self.base_env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path), **extra}

    def _start(self, name: str, cpus: float, resources: dict | None, *args: str) -> None:
        nm = free_port()
        cmd = [
            RAY,
            "start",
            f"--num-cpus={cpus}",
            f"--resources={json.dumps(resources or {})}",
            f"--node-manager-port={nm}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            "--object-store-memory=100000000",
            "--disable-usage-stats",
            *args,
        ]
        r = subprocess.run(cmd, env=self.job_env(), capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        self.manager_ports[name] = nm

    def add_node(self, name: str, cpus: float, resources: dict | None = None) -> None:
        self._start(name, cpus, resources, f"--address={self.address}")

    def _raylet(self, name: str) -> int | None:
        out = subprocess.run(
            ["pgrep", "-f", f"raylet.*--node_manager_port={self.manager_ports[name]}( |$)"],
            capture_output=True,
            text=True,
        ).stdout.split()
        return int(out[0]) if out else None

    def remove_node(self, name: str) -> None:
        """The node is gone at once, as a machine that dies: its raylet and every process under it, killed."""
        pid = self._raylet(name)
        if pid is not None:
            _kill(_tree([pid]))
        self.manager_ports.pop(name)

    def nodes(self) -> dict[str, dict]:
        """Ray's own view, by our node names: {name: {"node_id", "alive", "resources"}}."""
        code = "import json, ray; ray.init(address=%r); print(json.dumps(ray.nodes()))" % self.address
        r = subprocess.run(
            [sys.executable, "-c", code], env=self.job_env(), capture_output=True, text=True, timeout=120
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        by_port = {n["NodeManagerPort"]: n for n in json.loads(r.stdout.strip().splitlines()[-1])}
        return {
            name: {"node_id": by_port[p]["NodeID"], "alive": by_port[p]["Alive"], "resources": by_port[p]["Resources"]}
            for name, p in self.manager_ports.items()
            if p in by_port
        }

    def shutdown(self) -> None:
        """Every process of this cluster (those naming its temp dir or its nodes' ports, and theirs); no other Ray."""
        roots = subprocess.run(["pgrep", "-f", str(self.dir)], capture_output=True, text=True).stdout.split()
        pids = [int(p) for p in roots] + [p for n in list(self.manager_ports) if (p := self._raylet(n))]
        _kill(_tree(pids))
        time.sleep(0.5)
        shutil.rmtree(self.dir, ignore_errors=True)
