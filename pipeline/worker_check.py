"""Before a job trains: the Ray workers can load every component the driver found in an outside package.

The driver resolves `method.kind` and `plugin=[...]` from its own environment; a package installed only there (or on
the driver's PYTHONPATH, which a cluster's nodes do not share) would otherwise fail inside the first Train worker with
a traceback. One task per alive node, placed on that node and asking for no CPU, loads each outside component the
way the workers will (registry lookup, then import); a node that cannot is named in one line, with the package and
where it must be installed, before any MLflow run is opened.
"""

from __future__ import annotations

from typing import Any, Iterable

from pipeline.config import ConfigError


def outside_components(kind: str | None, plugins: Iterable[str] = ()) -> list[tuple[str, str, str]]:
    """(registry group, name, package) of the run's method (`method.kind`) and plug-ins that come from an
    installed package."""
    from pipeline.methods import METHODS
    from pipeline.plugins import PLUGINS

    found = []
    for registry, names in ((METHODS, [kind] if kind else []), (PLUGINS, list(plugins))):
        for name in names:
            package = registry.origin(name)
            if package is not None:
                found.append((registry.group, name, package))
    return found


def cannot_load(components: list[tuple[str, str, str]]) -> list[str]:
    """What this process cannot load of `components`: "group name (why)" each. Runs on a worker node."""
    from importlib.metadata import entry_points

    from pipeline.methods import METHODS
    from pipeline.plugins import PLUGINS

    registries: dict[str, Any] = {METHODS.group: METHODS, PLUGINS.group: PLUGINS}
    missing = []
    for group, name, _ in components:
        registry = registries[group]
        if name not in registry:
            known = {ep.name for ep in entry_points(group=group)}
            missing.append(f"{group} {name!r} (not registered here; entry points seen: {sorted(known) or 'none'})")
            continue
        try:
            registry[name]
        except Exception as e:  # RegistryError: declared, but its module does not import
            missing.append(f"{group} {name!r} ({e})")
    return missing


def check_workers_see(kind: str | None, plugins: Iterable[str] = ()) -> None:
    """ConfigError in one line when a Ray node cannot load an outside component the driver resolved; nothing to do
    when the run uses the project's own components only. Ray must be initialised."""
    components = outside_components(kind, plugins)
    if components:
        refuse_missing(node_reports(components), components)


def node_reports(components: list[tuple[str, str, str]]) -> dict[str, list[str]]:
    """cannot_load(components) on every alive node, by node address (one task each, pinned there, no CPU asked)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(cannot_load)
    refs = {
        n["NodeManagerAddress"]: task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(components)
        for n in ray.nodes()
        if n.get("Alive")
    }
    return {address: ray.get(ref, timeout=120) for address, ref in refs.items()}


def refuse_missing(reports: dict[str, list[str]], components: list[tuple[str, str, str]]) -> None:
    """The first node that cannot load a component, as one ConfigError line naming the package and where to put it."""
    for address, missing in reports.items():
        if missing:
            packages = sorted({p for _, _, p in components})
            raise ConfigError(
                f"the Ray workers on {address} cannot load {'; '.join(missing)}: the driver found it in package "
                f"{', '.join(packages)}; install it on every node (pip install), or pass it with the job "
                "(ray job submit --runtime-env-json '{\"py_modules\": [...]}' or a PYTHONPATH set where the workers "
                "start: docs/cluster.md)"
            )
