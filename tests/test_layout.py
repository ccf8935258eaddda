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


def _modules() -> list[Path]:
    return sorted((ROOT / "pipeline").rglob("*.py"))


def test_no_pipeline_module_is_a_grab_bag_of_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_nothing_reads_or_writes_a_runtime_entry_in_the_config():
    # what a run derives from its config lives in the frozen RunPlan (pipeline/plan.py), never back in the dict
    assert not [str(p) for p in _modules() if 'cfg["runtime"]' in p.read_text()]


def test_untyped_config_signatures_only_shrink():
    # issue #30 takes `cfg: dict` out of the core: the job edges only (docs/design.md lists them), at most 15; the
    # bound only goes down
    count = sum("cfg: dict" in line for p in _modules() for line in p.read_text().splitlines())  # grep -c's count
    assert count <= 15, count


def test_no_module_of_the_gpu_benchmark_is_over_400_lines():
    # benchmarks/gpu/ is laid out as its parts (issue #50): rows, data, bare loops, measurement, report, command line
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "benchmarks" / "gpu").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long
