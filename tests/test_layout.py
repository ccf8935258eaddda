"""The tests mirror the package: a test of pipeline/<package>/ lives in tests/<package>/ (benchmarks/ and jobs/ too);
what spans packages (the CLI, end-to-end runs, docs, lint, layering) stays at the top."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_every_test_folder_is_a_package_folder_of_the_project():
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    assert folders and all((ROOT / "pipeline" / f).is_dir() or (ROOT / f).is_dir() for f in folders), folders


def test_test_file_names_are_unique_across_folders():
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names))  # pytest imports them by basename (no __init__.py)
