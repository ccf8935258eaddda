"""Imports go one way: from a job's body (reproduce) to the jobs' layers (tune, train, eval, detect), down to the
pieces (build, then methods and plug-ins, then losses, models, augment, data), never up; plug-ins see the methods
only through their StepContext. The losses are pure functions of tensors: they import no other pipeline package."""

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
TOP = {"tune", "train", "eval", "detect"}
JOBS = {"reproduce"}  # a job's body (jobs/reproductions.py's), above the jobs' layers: none of them imports it
FORBIDDEN = {  # package -> the pipeline packages it must not import
    "data": TOP | JOBS | {"build", "methods", "plugins", "models", "augment"},
    "augment": TOP | JOBS | {"build", "methods", "plugins", "models"},
    "models": TOP | JOBS | {"build", "methods", "plugins", "augment", "data"},
    "methods": TOP | JOBS | {"build", "plugins", "augment", "data"},
    "plugins": TOP | JOBS | {"build"},
    "losses": TOP | JOBS | {"build", "methods", "plugins", "models", "augment", "data"},
    "build": TOP | JOBS,
    "eval": {"tune", "train"} | JOBS,
    "train": {"tune"} | JOBS,
    "tune": JOBS,
    "detect": JOBS,
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


def test_the_losses_import_no_other_pipeline_module():
    bad = [
        f"{path.relative_to(PIPELINE.parent)} imports {module}"
        for path in sorted((PIPELINE / "losses").rglob("*.py"))
        for module in _imports(path)
        if not module.startswith("pipeline.losses.")
    ]
    assert not bad, "\n".join(bad)


def test_the_samplers_do_not_import_each_other_at_load_time():
    joint = _imports(PIPELINE / "augment" / "joint.py")
    assert not any(m.startswith("pipeline.augment.params") for m in joint), joint


def _module(path: Path) -> str:
    parts = path.relative_to(PIPELINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """pipeline module -> the pipeline modules it imports, at any depth (function-level imports included).
    `from a.b import c` counts as importing a.b.c where that is a module, else a.b; a module's own packages are
    left out (Python loads them before it anyway)."""
    modules = {_module(p): p for p in PIPELINE.rglob("*.py")}

    def owner(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package `level` steps up
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = {
            owner(t)
            for t in targets
            if t.split(".")[0] == "pipeline" and owner(t) != name and not name.startswith(owner(t) + ".")
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules that import each other (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for group in groups:  # walk inside the group from its first module until a module repeats
        path = [min(group)]
        while True:
            nxt = min(w for w in graph[path[-1]] if w in group)
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
                break
            path.append(nxt)
    return cycles


def test_the_import_graph_sees_function_level_imports_and_finds_circles():
    graph = _import_graph()
    assert "pipeline.data.manifest" in graph["pipeline.train.prepare"]  # imported inside prepare_data
    assert "pipeline.data.spirograph" in graph["pipeline.data.spirograph_shards"]  # from pipeline.data import ...
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_circle_among_pipeline_modules():
    """A module that imports a module that imports it back, at load or inside a function, is a tangle: each needs
    the other loaded first. What both need belongs in a lower module of its own."""
    cycles = _cycles(_import_graph())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
