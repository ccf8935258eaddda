"""The shared services a multi-node cluster needs, started on this machine for the tests: an S3-compatible object
store (moto's server on loopback) and an MLflow tracking server behind MLflow's basic-auth app, its artifacts on
that S3 (proxied: the clients need only the server's login, not S3 keys).

Nothing secret goes on a command line or into a committed file: the S3 keys and the endpoint are the environment
the processes inherit (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL: what boto3, pyarrow and Ray's
storage all read, as a cloud node's instance role would serve them), the server's admin password is made here per
server and handed to it in its environment, and clients log in with an MLflow credentials file
(`<home>/.mlflow/credentials`, mode 0600) that a node or a job finds in its HOME.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

from pipeline.tools import console_script
from sim_cluster import free_port

MLFLOW = console_script("mlflow")
BUCKET = "augssl"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class MotoS3:
    """moto's S3 server on loopback; `env` is what a process needs to use it through plain s3:// URIs."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {**S3_KEYS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_keys())

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def upload_tree(self, folder: Path, bucket: str, prefix: str) -> None:
        client = self.client()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")

    def stop(self) -> None:
        self.server.stop()


def _boto_keys() -> dict:
    return {
        "aws_access_key_id": S3_KEYS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_KEYS["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_KEYS["AWS_DEFAULT_REGION"],
    }


def write_credentials(home: Path, username: str, password: str) -> Path:
    """MLflow's client credentials file in `home` (mode 0600): what the launcher's file_mounts put on each node."""
    folder = home / ".mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "credentials"
    path.touch(mode=0o600)
    path.write_text(f"[mlflow]\nmlflow_tracking_username = {username}\nmlflow_tracking_password = {password}\n")
    return path


class MlflowServer:
    """`mlflow server --app-name basic-auth` on loopback, its runs in a SQLite file under `folder`, its artifacts
    under `artifacts` (s3://...) and served through it. `admin` / `password` is its one login."""

    def __init__(self, folder: Path, artifacts: str, s3_env: dict):
        folder.mkdir(parents=True, exist_ok=True)
        self.username = "admin"
        self.password = secrets.token_urlsafe(24)  # made here, for this server alone
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        config = folder / "basic_auth.ini"
        config.write_text(
            "[mlflow]\n"
            "default_permission = READ\n"
            f"database_uri = sqlite:///{folder / 'auth.db'}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            "auth_cache_ttl_seconds = 60\n"  # the per-request password hash is what a busy run's logging waits on
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))},
            **s3_env,
            "MLFLOW_AUTH_CONFIG_PATH": str(config),
            "MLFLOW_AUTH_ADMIN_USERNAME": self.username,
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        }
        self.log = folder / "server.log"
        cmd = [
            MLFLOW,
            "server",
            "--app-name=basic-auth",
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--backend-store-uri=sqlite:///{folder / 'mlflow.db'}",
            f"--artifacts-destination={artifacts}",
            "--workers=1",
        ]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        self._wait_up()

    def _wait_up(self, timeout: float = 120) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if requests.get(f"{self.uri}/health", timeout=2).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or too busy starting to answer
                pass
            time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def client(self):
        """An MlflowClient of this server; it logs in with what the calling process has set (its environment)."""
        import mlflow

        return mlflow.MlflowClient(self.uri)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def on_storage(server: MlflowServer, experiment: str) -> list[str]:
    """A job's overrides for the shared storage: the shards under s3://<BUCKET>/spirograph, Ray's checkpoints and
    Tune's state under s3://<BUCKET>/ray, MLflow on `server` (an experiment of its own)."""
    return [
        f"tracking.uri={server.uri}",
        f"tracking.experiment={experiment}",
        f"trainer.storage=s3://{BUCKET}/ray",
        f"data.train=s3://{BUCKET}/spirograph/train",
        f"data.val=s3://{BUCKET}/spirograph/val",
    ]


SLOW_DOWN = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"


class FlakyS3:
    """A proxy in front of an S3 server that fails some object reads the way a busy store does: the first
    `fails` GETs of each object key get `503 SlowDown` (S3's throttling answer) or, with `reset=True`, a
    connection closed without an answer. Everything else passes through. `failed` counts what it refused."""

    def __init__(self, target: str, fails: int = 1, reset: bool = False, keys: str = ""):
        import http.client
        import http.server
        import threading
        from collections import Counter
        from urllib.parse import urlsplit

        self.failed: Counter = Counter()
        seen: Counter = Counter()
        lock = threading.Lock()
        host, port = urlsplit(target).hostname, urlsplit(target).port
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _forward(self):
                path = self.path.split("?")[0]
                key = path.strip("/")
                is_object_read = self.command == "GET" and "/" in key and keys in key
                if is_object_read:
                    with lock:
                        seen[key] += 1
                        refuse = seen[key] <= fails
                        if refuse:
                            proxy.failed[key] += 1
                    if refuse:
                        if reset:
                            self.close_connection = True
                            self.connection.shutdown(2)
                            return
                        body = SLOW_DOWN
                        self.send_response(503)
                        self.send_header("Content-Type", "application/xml")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                n = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(n) if n else None
                conn = http.client.HTTPConnection(host, port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=data, headers=headers)
                answer = conn.getresponse()
                payload = answer.read()
                self.send_response(answer.status, answer.reason)
                for k, v in answer.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                # a HEAD answer says the object's length, not its (empty) body's
                self.send_header("Content-Length", answer.getheader("Content-Length", str(len(payload))))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
