"""What pre-commit runs (.pre-commit-config.yaml), run by make test too, so CI holds the code to it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["pipeline", "jobs", "benchmarks", "tests"]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_finds_nothing():
    r = _run("ruff", "check", *CODE)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_code_is_ruff_formatted():
    r = _run("ruff", "format", "--check", *CODE)
    assert r.returncode == 0, "run `ruff format .`:\n" + r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_finds_nothing():
    # pyproject.toml [tool.mypy] names what it checks (pipeline/); a cold cache takes a minute or more
    r = _run("mypy", timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
