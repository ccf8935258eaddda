"""Imports go one way: from the jobs' layers (tune, train, eval, detect) down to the pieces (build, then methods
and plug-ins, then models, augment, data), never up; plug-ins see the methods only through their StepContext."""

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
TOP = {"tune", "train", "eval", "detect"}
FORBIDDEN = {  # package -> the pipeline packages it must not import
    "data": TOP | {"build", "methods", "plugins", "models", "augment"},
    "augment": TOP | {"build", "methods", "plugins", "models"},
    "models": TOP | {"build", "methods", "plugins", "augment", "data"},
    "methods": TOP | {"build", "plugins", "augment", "data"},
    "plugins": TOP | {"build"},
    "build": TOP,
    "eval": {"tune", "train"},
    "train": {"tune"},
}


def _imports(path: Path) -> set[str]:
    """Every pipeline module `path` imports, at any depth (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative: inside its own package
            pkg = path.relative_to(PIPELINE).parts[0]
            out |= {f"pipeline.{pkg}.{node.module or ''}".rstrip(".")}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("pipeline.")}


def test_no_module_imports_a_layer_above_it():
    bad = []
    for path in sorted(PIPELINE.rglob("*.py")):
        parts = path.relative_to(PIPELINE).parts
        pkg = parts[0].removesuffix(".py")
        for module in _imports(path):
            target = module.split(".")[1]
            if target in FORBIDDEN.get(pkg, ()):
                bad.append(f"{path.relative_to(PIPELINE.parent)} imports {module}")
            if pkg == "plugins" and target == "methods" and not module.startswith("pipeline.methods.context"):
                bad.append(f"{path.relative_to(PIPELINE.parent)} imports {module} (plug-ins read the StepContext)")
    assert not bad, "\n".join(bad)


def test_the_samplers_do_not_import_each_other_at_load_time():
    joint = _imports(PIPELINE / "augment" / "joint.py")
    assert not any(m.startswith("pipeline.augment.params") for m in joint), joint
