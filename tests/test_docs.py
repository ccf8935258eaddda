"""The documentation as a reader meets it: a short README whose links resolve, and no pointer to a folder that is
not in the repository."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an sdist): every file below the root
        return [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]
    return [ROOT / f for f in out.stdout.split()]


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_markdown_links_resolve():
    broken = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if "://" not in target and not (md.parent / target).exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_no_file_points_at_the_specs_folder_outside_the_repository():
    offenders = [
        str(p.relative_to(ROOT))
        for p in _tracked()
        if p.suffix in (".py", ".md", ".yaml", ".txt", ".sh")
        and p.exists()
        and "specs/" in p.read_text(errors="ignore")
        and p.name != "test_docs.py"
    ]
    assert offenders == []


def test_no_run_store_is_committed():
    assert not [p for p in _tracked() if p.name == "mlflow.db" or "mlruns" in p.parts]


def test_readme_prints_the_framework_by_plugin_matrix_the_registries_give():
    from pipeline.build import plugin_matrix

    assert plugin_matrix() in (ROOT / "README.md").read_text()
