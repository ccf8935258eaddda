"""The tracking server's login checked before a job starts: what the server answers becomes one line naming
tracking.uri, and the login sent is MLflow's own (its environment variables, else ~/.mlflow/credentials)."""

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.config import ConfigError
from pipeline.preflight import check_server
from pipeline.store import Store

LOGIN = ("alice", "correct horse battery")


class _Server(BaseHTTPRequestHandler):
    """An MLflow server in miniature: 401 without the right basic-auth login, `status` with it."""

    status = 200
    seen: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        expected = "Basic " + base64.b64encode(":".join(LOGIN).encode()).decode()
        self.seen.append((self.path, self.headers.get("Authorization")))
        code = self.status if self.headers.get("Authorization") == expected else 401
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials but the test's own
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Server.status, _Server.seen = 200, []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_no_login_and_a_wrong_login_are_each_one_line(server, monkeypatch):
    with pytest.raises(ConfigError) as e:
        check_server(server, "augssl")
    assert str(e.value) == (
        f"tracking.uri={server}: the MLflow server asks for a login and none is set (HTTP 401); set "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or put them in ~/.mlflow/credentials"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", LOGIN[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    with pytest.raises(ConfigError, match=r"the MLflow server refused the login \(HTTP 401\)"):
        check_server(server, "augssl")
    assert _Server.seen[0][0] == "/api/2.0/mlflow/experiments/get-by-name?experiment_name=augssl"


def test_the_login_from_the_environment_or_the_credentials_file_passes(server, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", LOGIN[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", LOGIN[1])
    check_server(server, "augssl")
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    (tmp_path / ".mlflow").mkdir()
    (tmp_path / ".mlflow" / "credentials").write_text(
        f"[mlflow]\nmlflow_tracking_username = {LOGIN[0]}\nmlflow_tracking_password = {LOGIN[1]}\n"
    )
    check_server(server, "augssl")  # what a cluster node has: the file its launcher's file_mounts put there
    assert len(_Server.seen) == 2


def test_a_server_that_fails_or_is_down_is_one_line(server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", LOGIN[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", LOGIN[1])
    _Server.status = 503
    with pytest.raises(ConfigError, match=r"^tracking.uri=\S+: the MLflow server answered HTTP 503$"):
        check_server(server, "augssl")
    with pytest.raises(ConfigError, match=r"^tracking.uri=http://127.0.0.1:9: the MLflow server cannot be reached"):
        check_server("http://127.0.0.1:9", "augssl")


def test_only_a_server_is_checked(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert Store("runs", "augssl", uri=None).server() is None
    assert Store("runs", "augssl", uri="sqlite:///x.db").server() is None
    assert Store("runs", "augssl", uri="https://mlflow.example:443").server() == "https://mlflow.example:443"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://head:5000")
    assert Store("runs", "augssl", uri=None).server() == "http://head:5000"
    assert Store("runs", "augssl", uri="sqlite:///x.db").server() is None  # tracking.uri comes first
    check_server("sqlite:///nothing-is-asked.db", "augssl")  # a local store: no request
