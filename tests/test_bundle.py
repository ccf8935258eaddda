"""The offline bundle (pipeline/bundle.py, infra/bundle/setup.sh): what the target has is read and left out, the
resolution's failures are understood, bad input is one `error:` line, and setup.sh puts a bundle on the path of
every process of the target's Python, refusing a Python or a target it was not made for."""

import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pipeline import bundle

ROOT = Path(__file__).resolve().parents[1]

FREEZE = """\
# a pip freeze
numpy==2.5.2
torch==2.11.0+cu130
typing_extensions==4.16.0
-e git+https://example.org/x.git@abc#egg=x
detectron2 @ file:///wheels/detectron2-0.6-cp311-cp311-linux_x86_64.whl
Pillow===13.0.0
"""
PIP_LIST = """\
Package            Version
------------------ -----------
nvidia-ml-py       13.615.71
scikit-image       0.26.0   /opt/editable
"""


def test_the_target_is_read_from_a_freeze_a_pip_list_or_names():
    assert bundle.read_target(FREEZE) == {
        "numpy": "2.5.2",
        "torch": "2.11.0+cu130",
        "typing-extensions": "4.16.0",
        "detectron2": None,
        "pillow": "13.0.0",
    }
    assert bundle.read_target(PIP_LIST) == {"nvidia-ml-py": "13.615.71", "scikit-image": "0.26.0"}
    assert bundle.read_target("grpcio\nPyYAML  # a comment\n\n") == {"grpcio": None, "pyyaml": None}
    with pytest.raises(bundle.BundleError, match="cannot read 'numpy >= 2'"):
        bundle.read_target("numpy >= 2\n")


def test_torch_is_never_carried_dali_only_when_asked_and_extras_are_added(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\ndependencies = ["torch==2.14.1", "Torchvision==0.29.1", "ray[train]==2.60.0", '
        '"nvidia-dali-cuda120==2.4.0; platform_system == \'Linux\'", "numpy"]\n'
        '[project.optional-dependencies]\ntest = ["pytest>=8"]\ndetectron2 = ["detectron2>=0.6"]\n'
    )
    assert bundle.project_requirements(pyproject, [], dali=False) == ["ray[train]==2.60.0", "numpy"]
    with_all = bundle.project_requirements(pyproject, ["test", "detectron2"], dali=True)
    assert with_all == [
        "ray[train]==2.60.0",
        "nvidia-dali-cuda120==2.4.0; platform_system == 'Linux'",
        "numpy",
        "pytest>=8",
    ]  # detectron2 is built per site against its torch, never carried
    with pytest.raises(bundle.BundleError, match="no such extra \\(it has test, detectron2\\)"):
        bundle.project_requirements(pyproject, ["tests"], dali=False)


def test_the_targets_pins_win_over_the_local_ones_and_local_labels_go():
    has = {"numpy": "2.5.2", "grpcio": None, "torch": "2.11.0+cu130"}
    local = {"numpy": "2.3.0", "ray": "2.60.0", "grpcio": "1.80.0", "torch": "2.14.1+cu130", "mlflow": "3.17.2+x"}
    assert bundle.constraints(has, local) == {
        "numpy": "2.5.2",  # the target's
        "ray": "2.60.0",  # the tested environment's
        "mlflow": "3.17.2",
        "torch": "2.11.0",  # a pin only: torch is never installed
    }  # grpcio: the target has it at a version it did not say, so no pin at all


def test_platform_flags_stop_at_the_glibc_given():
    args = bundle.platform_args("3.12", "2.28")
    platforms = {args[i + 1] for i, a in enumerate(args) if a == "--platform"}
    assert {"manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64"} <= platforms
    assert "manylinux_2_29_x86_64" not in platforms
    assert args[:7] == ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]


def test_what_pip_found_no_wheel_for_is_read_from_both_of_its_messages():
    not_found = (
        "ERROR: Could not find a version that satisfies the requirement antlr4-python3-runtime==4.9.* (from "
        "hydra-core) (from versions: 4.11.0, 4.13.2)\nERROR: No matching distribution found for antlr4-python3-runtime"
    )
    conflict = (
        "The conflict is caused by:\n    hydra-core 1.3.8 depends on antlr4-python3-runtime==4.9.*\n    The user "
        "requested (constraint) antlr4-python3-runtime==4.9.3\n\nAdditionally, some packages in these conflicts have "
        "no matching distributions available for your environment:\n    antlr4-python3-runtime\n    Foo_Bar\n\n"
        "To fix this you could try to:\n1. loosen the range"
    )
    assert bundle.unavailable(not_found) == {"antlr4-python3-runtime": "antlr4-python3-runtime==4.9.*"}
    assert bundle.unavailable(conflict) == {
        "antlr4-python3-runtime": "antlr4-python3-runtime==4.9.*",
        "foo-bar": "Foo_Bar",
    }
    assert bundle.unavailable("ERROR: ResolutionImpossible") == {}


@pytest.mark.parametrize(
    "args, says",
    [
        (["--python", "3"], "error: --python 3: give the target's Python as major.minor"),
        (["--glibc", "228"], "error: --glibc 228: give a glibc version as 2.N"),
        (["--has", "/nonexistent/freeze.txt"], "error: --has /nonexistent/freeze.txt: no such file"),
        (["--extras", "nosuch"], "error: --extras nosuch: pyproject.toml has no such extra"),
    ],
)
def test_bad_input_is_one_error_line_before_pip_runs(tmp_path, args, says):
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.bundle", *args, "--out", str(tmp_path / "b")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith(says) and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "b" / "pip.log").exists()  # refused before any resolution


# ----------------------------------------------------------------------------- setup.sh on a target
def _target(tmp_path: Path) -> Path:
    """A bare interpreter standing in for a node: a venv of this Python with nothing in it."""
    venv = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def _fake_bundle(folder: Path, manifest: dict, files: dict[str, str]) -> None:
    """A bundle as pipeline.bundle writes one: site.tar.xz of `files`, its manifest, setup.sh."""
    site = folder / "staging"
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    folder.mkdir(exist_ok=True)
    with tarfile.open(folder / "site.tar.xz", "w:xz") as tar:
        for p in sorted(site.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(site)))
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    full = {
        "python": here,
        "expects": {},
        "left_out": {},
        "carried": {"toy": "1"},
        "unpacked_bytes": 1,
        "archive_sha256": bundle.sha256(folder / "site.tar.xz"),
    }
    full.update(manifest)
    (folder / "manifest.json").write_text(json.dumps(full))
    (folder / "setup.sh").write_text((ROOT / "infra" / "bundle" / "setup.sh").read_text())


def _source(folder: Path, python: Path, then: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUGSSL_PYTHON", "VIRTUAL_ENV")}
    clean.update(PYTHON=str(python), PATH="/usr/bin:/bin", **env)
    return subprocess.run(
        ["bash", "-c", f"source {folder}/setup.sh || exit $?; {then}"],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


TOY = {"toy/__init__.py": "WHERE = __file__\n", "bin/toy": "#!/work/builder/.venv/bin/python\nprint('toy script')\n"}


def test_setup_puts_the_bundle_on_every_process_path_once(tmp_path):
    python = _target(tmp_path)
    b = tmp_path / "project" / ".bundle"
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "pyproject.toml").write_text('[project]\nname = "augssl"\n')
    _fake_bundle(b, {}, TOY)
    # a child that inherits nothing from this shell (as a Ray worker started by a raylet may not): the .pth carries it
    child = f"env -u PYTHONPATH {python} -c 'import toy, sys; print(toy.WHERE); print(sys.path[1:3])'"
    then = f"{child}; echo PY=$AUGSSL_PYTHON; head -1 $(command -v toy); command -v python"
    done = _source(b, python, then, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "unpacking" in done.stderr and "augssl bundle: Python" in done.stderr
    out = done.stdout.splitlines()
    assert out[0] == str(b / "site" / "toy" / "__init__.py")
    assert out[1] == str(
        [str(b / "site"), str(tmp_path / "project")]
    )  # the bundle, then the project, first (after -c's '')
    assert out[2] == f"PY={python}"
    assert out[3] == f"#!{python}"  # console scripts run this node's interpreter
    assert out[4] == str(python)  # and so does `python` in this shell
    again = _source(b, python, "true", cwd=tmp_path)
    assert again.returncode == 0 and "unpacking" not in again.stderr  # unpacked once
    _fake_bundle(b, {}, {**TOY, "toy/__init__.py": "WHERE = 'v2'\n"})  # a new bundle replaces the old one
    newer = _source(b, python, f"{python} -c 'import toy; print(toy.WHERE)'", cwd=tmp_path)
    assert "unpacking" in newer.stderr and newer.stdout.strip() == "v2"


@pytest.mark.parametrize(
    "manifest, says",
    [
        ({"python": "3.99"}, "error: this bundle is for Python 3.99 and"),
        ({"expects": {"torch": ">=2.11,<2.15"}}, "has no torch: install the node's own CUDA build of it first"),
        ({"left_out": {"pyyaml": "6.0.2", "numpy": "2.5.2"}}, "lacks numpy, pyyaml, which the bundle left out"),
    ],
)
def test_setup_refuses_a_target_the_bundle_was_not_made_for(tmp_path, manifest, says):
    python = _target(tmp_path)
    _fake_bundle(tmp_path / "b", manifest, TOY)
    done = _source(tmp_path / "b", python, "echo sourced", cwd=tmp_path)
    assert done.returncode == 2 and "sourced" not in done.stdout
    assert done.stderr.startswith("error: ") and says in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "b" / "site").exists()  # nothing unpacked, nothing written


def test_setup_will_not_unpack_over_a_folder_that_is_not_a_bundle(tmp_path):
    python = _target(tmp_path)
    _fake_bundle(tmp_path / "b", {}, TOY)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    done = _source(tmp_path / "b", python, "true", cwd=tmp_path, AUGSSL_SITE=str(tmp_path / "mine"))
    assert done.returncode == 2 and "is not empty and holds no bundle" in done.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_a_real_bundle_from_the_index_with_an_sdist_only_dependency(tmp_path):
    """omegaconf 2.3.0 needs antlr4-python3-runtime 4.9, published only as an sdist: built here into a wheel, carried,
    and importable on a bare target after setup.sh; PyYAML, which the target 'has', is left out."""
    if not _index_reachable():
        pytest.skip("no package index reachable (a node with no network): a bundle is built where one is")
    out = tmp_path / "b"
    (tmp_path / "freeze.txt").write_text("PyYAML==6.0.2\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.bundle",
            "--requirement",
            "omegaconf==2.3.0",
            "--no-local-pins",
            "--has",
            str(tmp_path / "freeze.txt"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["carried"] == {"omegaconf": "2.3.0", "antlr4-python3-runtime": "4.9.3"}
    assert manifest["left_out"] == {"pyyaml": "6.0.2"} and manifest["expects"] == {}
    assert "built antlr4_python3_runtime-4.9.3-py3-none-any.whl here" in (out / "pip.log").read_text()
    python = _target(tmp_path)
    refused = _source(out, python, "true", cwd=tmp_path)  # the bare node lacks the PyYAML the bundle assumed
    assert refused.returncode == 2 and "lacks pyyaml" in refused.stderr
    manifest["left_out"] = {}
    (out / "manifest.json").write_text(json.dumps(manifest))
    probe = "import antlr4, importlib.metadata as m; print(m.version('omegaconf')); import omegaconf"
    ok = _source(out, python, f'{python} -c "{probe}"', cwd=tmp_path)
    assert ok.stdout.strip() == "2.3.0", ok.stderr  # carried and found through the bundle
    assert "No module named 'yaml'" in ok.stderr  # and PyYAML, the target's own, really was left out


def test_make_bundle_passes_its_settings_through_and_refuses_bad_ones(tmp_path):
    """`make bundle PY=... HAS=... BUNDLE=...` as the README shows it, from a shell without .venv on PATH: the
    settings reach the command, whose refusal is the one `error:` line (make adds its own trailer)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "AUGSSL_PYTHON")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    out = tmp_path / "b"
    for settings, says in (
        (["PY=3"], "error: --python 3: give the target's Python as major.minor"),
        (["PY=3.12", f"HAS={tmp_path}/none.txt"], f"error: --has {tmp_path}/none.txt: no such file"),
    ):
        done = subprocess.run(
            ["make", "-s", "bundle", *settings, f"BUNDLE={out}"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode != 0
        ours = [ln for ln in done.stderr.splitlines() if not ln.startswith("make")]
        assert ours == [ours[0]] and ours[0].startswith(says), done.stderr
        assert not (out / "pip.log").exists()
