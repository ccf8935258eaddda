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

from pipeline.tools import console_script

# A pretraining job small enough for several at once on two cores (Spirograph generated in the job's root)
TINY = [
    "data.generate.n_train=256",
    "data.generate.n_val=128",
    "data.generate.maxcount=128",
    "model.width=8",
    "train.batch_size=32",
    "train.shuffle_buffer=64",
    "train.epochs=2",
    "eval.knn.every=0",
    "eval.probe.steps=10",
    "eval.probe.train_size=128",
    "eval.probe.val_size=64",
    "tracking.log_every=1",
    "gallery.at_pretrain=false",
]
ROOT = Path(__file__).resolve().parents[1]
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
RAY = console_script("ray")


def store(root: Path):
    """The MLflow store of the jobs run with paths.root=<root> (their default sqlite file)."""
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{root / 'runs' / 'mlflow.db'}")


_HANDED_OUT: set[int] = set()
# `ray start` failures worth another try on new ports: a slow start, or a port taken before Ray bound it
RETRIED = ("timed out during startup", "is trying to use a port number", "Address already in use")


def free_port() -> int:
    """A port free now and not handed out before in this process: the OS can give a port just closed again, and a
    node whose GCS and runtime-env agent got the same one fails to start."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _node_ip() -> str:
    import ray._private.services

    return ray._private.services.get_node_ip_address()


def fake_autoscaling_config(
    launcher: dict, head_cpus: float, worker_cpus: float = 1, max_workers: int = 2, idle_minutes: float = 0.1
) -> dict:
    """A cluster config for Ray's fake multi-node provider made from a launcher YAML's (infra/aws.yaml) node types:
    each worker type keeps its name and its min_workers, and at this machine's scale offers `worker_cpus` CPUs and
    one unit of a resource named after the type (a job asks for it with trainer.worker_resources={<type>: 1}), at
    most `max_workers` nodes; idle nodes go after `idle_minutes`."""
    head = launcher["head_node_type"]
    types = {
        "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
    }
    for name, spec in launcher["available_node_types"].items():
        if name == head:
            continue
        types[name] = {
            "resources": {"CPU": worker_cpus, name: 1, "object_store_memory": 100_000_000},
            "node_config": {},
            "min_workers": int(spec.get("min_workers", 0)),
            "max_workers": min(int(spec.get("max_workers", max_workers)), max_workers),
        }
    return {
        "cluster_name": f"{launcher['cluster_name']}-fake",
        "max_workers": max_workers * (len(types) - 1),
        "provider": {
            # the fake provider named as an external module: Ray 2.60's wheel lacks the defaults file its own
            # "fake_multinode" type reads (fake_multi_node/example.yaml), an external provider needs none
            "type": "external",
            "module": "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "launch_multiple": True,
            "head_node_id": "",  # filled in by SimCluster
        },
        "available_node_types": types,
        "head_node_type": "ray.head.default",
        "upscaling_speed": float(launcher.get("upscaling_speed", 1.0)),
        "idle_timeout_minutes": idle_minutes,
        **{k: [] for k in ("initialization_commands", "setup_commands", "head_setup_commands")},
        **{k: [] for k in ("worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")},
        **{k: [] for k in ("cluster_synced_files", "rsync_exclude", "rsync_filter")},
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "file_mounts_sync_continuously": False,
    }


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

    def __init__(
        self,
        head_cpus: float = 1,
        head_resources: dict | None = None,
        base_env: dict | None = None,
        autoscaling: dict | None = None,
    ):
        """`autoscaling`: a cluster config (fake_autoscaling_config) for Ray's fake multi-node provider, which then
        adds and removes worker nodes on this machine as a cloud's autoscaler would."""
        self.base_env = {k: v for k, v in (base_env or os.environ).items() if k not in (*AUTH_VARS, "RAY_ADDRESS")}
        # `ray start` gives a node 30 s to register with the GCS (a constant in ray/_private/node.py); two heads
        # starting at once beside the rest of the suite on two cores once took longer. Another try, on new ports.
        for attempt in range(3):
            self.dir = Path(tempfile.mkdtemp(prefix="sc", dir="/tmp"))  # Ray's socket paths stay under 107 characters
            self.token_path = self.dir / "token"
            self.token_path.touch(mode=0o600)
            self.token_path.write_text(secrets.token_hex(32))
            self.port, self.dashboard_port = free_port(), free_port()
            self.manager_ports: dict[str, int] = {}
            head_args, head_env = [], {}
            if autoscaling is not None:
                head_args, head_env = self._autoscaling_head(autoscaling)
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
                    *head_args,
                    env=head_env,
                )
                return
            except BaseException as e:
                self.shutdown()
                if attempt == 2 or not any(w in str(e) for w in RETRIED):
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

    def job(self, script: str, root: Path, *overrides: str) -> subprocess.Popen:
        """`python jobs/<script> paths.root=<root> trainer.address=<this cluster> <overrides>` from `root`, as a
        user's shell would run it; its stdout and stderr in one pipe."""
        cmd = [sys.executable, str(ROOT / "jobs" / script), f"paths.root={root}", f"trainer.address={self.address}"]
        return subprocess.Popen(
            [*cmd, *overrides],
            cwd=root,
            env=self.job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def _autoscaling_head(self, config: dict) -> tuple[list[str], dict]:
        """The head's extra arguments and environment for the fake multi-node provider (autoscaler v2): the head
        known to the provider by its fixed id, the provider pointed at this cluster's GCS port."""
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        ip = _node_ip()
        provider = {**config["provider"], "gcs_address": f"{ip}:{self.port}", "head_node_id": FAKE_HEAD_NODE_ID}
        config = {**config, "provider": provider}
        path = self.dir / "autoscaling.yaml"
        path.write_text(json.dumps(config))
        env = {
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_enable_autoscaler_v2": "1",
            "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
            "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID,
        }
        return [f"--autoscaling-config={path}"], env

    def status(self) -> dict:
        """The autoscaler's own view (autoscaler v2's cluster status): {"active": {node type: count}, "idle": {...},
        "pending": {node type: count}}; the head is left out."""
        code = (
            "import json\n"
            "from collections import Counter\n"
            "from ray.autoscaler.v2.sdk import get_cluster_status\n"
            f"s = get_cluster_status({self.address!r})\n"
            "count = lambda nodes: dict(Counter(n.ray_node_type_name for n in nodes))\n"
            "pending = Counter()\n"
            "for p in s.pending_launches: pending[p.ray_node_type_name] += p.count\n"
            "print(json.dumps({'active': count(s.active_nodes), 'idle': count(s.idle_nodes), 'pending': pending}))\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code], env=self.job_env(), capture_output=True, text=True, timeout=120
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        out = json.loads(r.stdout.strip().splitlines()[-1])
        for part in out.values():
            part.pop("ray.head.default", None)
        return out

    def _start(self, name: str, cpus: float, resources: dict | None, *args: str, env: dict | None = None) -> None:
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
        r = subprocess.run(cmd, env=self.job_env(**(env or {})), capture_output=True, text=True, timeout=180)
        self.manager_ports[name] = nm  # so that shutdown finds this node's raylet even where it failed to register
        if r.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")

    def add_node(self, name: str, cpus: float, resources: dict | None = None) -> None:
        self._start(name, cpus, resources, f"--address={self.address}")

    def _raylet(self, name: str) -> int | None:
        out = subprocess.run(
            ["pgrep", "-f", f"raylet.*--node_manager_port={self.manager_ports[name]}( |$)"],
            capture_output=True,
            text=True,
        ).stdout.split()
        return int(out[0]) if out else None

    def processes(self, name: str, needle: str) -> list[int]:
        """The processes of node `name` (its raylet's tree) whose command line holds `needle` (Ray sets a worker's
        to its actor class, e.g. RayTrainWorker)."""
        pid = self._raylet(name)
        found = []
        for p in _tree([pid]) if pid else []:
            try:
                cmdline = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmdline:
                found.append(p)
        return found

    def remove_node(self, name: str) -> None:
        """The node is gone at once, as a machine that dies: its raylet and every process under it, killed."""
        pid = self._raylet(name)
        if pid is not None:
            _kill(_tree([pid]))
        self.manager_ports.pop(name)

    def _ask(self, setup: str, expr: str):
        """`expr`, evaluated by a driver that joins this cluster (with its token), as JSON: Ray's view from outside
        the test process, which never joins a cluster itself."""
        code = f"import json, ray; {setup}; ray.init(address={self.address!r}); print(json.dumps({expr}))"
        r = subprocess.run(
            [sys.executable, "-c", code], env=self.job_env(), capture_output=True, text=True, timeout=120
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return json.loads(r.stdout.strip().splitlines()[-1])

    def nodes(self) -> dict[str, dict]:
        """Ray's own view, by our node names: {name: {"node_id", "alive", "resources"}}."""
        by_port = {n["NodeManagerPort"]: n for n in self._ask("pass", "ray.nodes()")}
        return {
            name: {"node_id": by_port[p]["NodeID"], "alive": by_port[p]["Alive"], "resources": by_port[p]["Resources"]}
            for name, p in self.manager_ports.items()
            if p in by_port
        }

    def actors(self, repr_contains: str, class_contains: str | None = None) -> list[dict]:
        """Ray's state API: every actor, alive or dead, whose repr names `repr_contains` (Ray Data's map actors
        are MapWorker(MapBatches(<callable class>))) or whose class name holds `class_contains` (an actor stopped
        before its start-up finished has no repr yet): [{"actor_id", "node_id", "state", "repr_name",
        "class_name"}]."""
        keys = ("actor_id", "node_id", "state", "repr_name", "class_name")
        found = self._ask(
            "from ray.util.state import list_actors",
            f"[{{k: getattr(a, k) for k in {keys!r}}} "
            f"for a in list_actors(address={self.address!r}, detail=True, limit=10000, raise_on_missing_output=False)]",
        )  # the address named: with another Ray on the machine, the state API cannot pick this one by itself
        return [
            a
            for a in found
            if repr_contains in (a["repr_name"] or "") or (class_contains and class_contains in (a["class_name"] or ""))
        ]

    def shutdown(self) -> None:
        """Every process of this cluster (those naming its temp dir or its nodes' ports, and theirs); no other Ray."""
        roots = subprocess.run(["pgrep", "-f", str(self.dir)], capture_output=True, text=True).stdout.split()
        # the head's Ray Client server names neither the temp dir nor a node's port, only the GCS's address
        roots += subprocess.run(
            ["pgrep", "-f", f"ray.util.client.server --address=[^ ]*:{self.port}( |$)"], capture_output=True, text=True
        ).stdout.split()
        pids = [int(p) for p in roots] + [p for n in list(self.manager_ports) if (p := self._raylet(n))]
        _kill(_tree(pids))
        time.sleep(0.5)
        shutil.rmtree(self.dir, ignore_errors=True)
