"""The import graph of `rl4agents`: layered, no cycle between packages.

Every import of an `rl4agents` module anywhere in the package (module level and inside
functions, read with `ast`, nothing imported) is an edge between two units: a subpackage
(`rl4agents.envs`, its subpackages included) or a top-level module (`rl4agents.memory`). Each
unit has a layer (`LAYERS`, the table of docs/architecture.md); a unit may import units of its
own layer or below, and the units form no cycle. No unit imports another from inside a
function either (a function-local import is how a cycle hides).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "rl4agents"

# Layer of every unit, lowest first (docs/architecture.md, "Import layers").
LAYERS = {
    # 0: types, text and helpers that know no component
    "rl4agents": 0,
    "rl4agents.types": 0,
    "rl4agents.text": 0,
    "rl4agents.checks": 0,
    "rl4agents.registry": 0,
    "rl4agents.config_utils": 0,
    "rl4agents.sharding": 0,
    "rl4agents.distributed": 0,
    "rl4agents.provenance": 0,
    "rl4agents.checkpoint": 0,
    # 1: components, each selected by name from its registry
    "rl4agents.envs": 1,
    "rl4agents.models": 1,
    "rl4agents.credit": 1,
    "rl4agents.losses": 1,
    # 2: rollouts (jitted, and of host environments)
    "rl4agents.rollout": 2,
    # 3: resolving a config, the train step, experiments, the driver; the memory estimate
    "rl4agents.train": 3,
    "rl4agents.memory": 3,
    # 4: studies over many runs, and reading their results back
    "rl4agents.sweep": 4,
    "rl4agents.results": 4,
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, known: set[str]) -> str:
    """The longest known module that `name` (a module or a module attribute) lies in."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: pathlib.Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported rl4agents module, line, inside a function) of every import in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "rl4agents":
                        out.append((_resolve(alias.name, known), child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    source = f"{base}.{child.module}" if child.module else base
                else:
                    source = child.module or ""
                if source.split(".")[0] != "rl4agents":
                    continue
                for alias in child.names:
                    target = f"{source}.{alias.name}"
                    name = target if target in known else _resolve(source, known)
                    out.append((name, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _edges():
    modules = _modules()
    known = set(modules)
    edges = []
    for module, path in modules.items():
        for target, line, in_function in _imports(module, path, known):
            edges.append((module, target, f"{path.relative_to(ROOT.parent)}:{line}", in_function))
    return edges


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in _modules()}
    missing = sorted(units - set(LAYERS))
    assert not missing, (
        f"units without a layer (add them to LAYERS and docs/architecture.md): {missing}"
    )


def test_no_lower_layer_imports_a_higher_one():
    bad = []
    for module, target, where, _ in _edges():
        a, b = _unit(module), _unit(target)
        if a != b and LAYERS.get(a, 99) < LAYERS.get(b, 99):
            bad.append(f"{where}: {a} (layer {LAYERS.get(a)}) imports {b} (layer {LAYERS.get(b)})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, target, _, _ in _edges():
        a, b = _unit(module), _unit(target)
        if a != b:
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                pytest.fail("import cycle between packages: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_no_function_local_imports_across_packages():
    local = [
        f"{where}: {target}"
        for module, target, where, inside in _edges()
        if inside and _unit(module) != _unit(target)
    ]
    assert not local, "import these at module level:\n" + "\n".join(local)


def test_the_graph_sees_imports():
    """The reader finds the imports it checks (a broken reader would pass everything)."""
    edges = {(m, t) for m, t, _, _ in _edges()}
    assert ("rl4agents.train.experiment", "rl4agents.train.resolve") in edges
    assert ("rl4agents.envs.frozen_lake", "rl4agents.envs.registry") in edges
    assert ("rl4agents.credit.registry", "rl4agents.registry") in edges
