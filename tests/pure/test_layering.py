"""Imports point downward only (ARCHITECTURE.md, Layers), read from the source without running it.

- No import cycle among phalanx's modules, counting what runs at import time: module-level
  imports (class bodies and `if`/`try` blocks included), the parent packages a submodule import
  runs, and the names `phalanx._lazy` tables bind at import (`_AT_ONCE`). Imports inside
  functions, `if TYPE_CHECKING:` blocks and lazy tables' `_ON_FIRST_USE` do not count here.
- The lower layers (env, config, data, checkpoint, rundir, track) import, anywhere in a module
  (function bodies and lazy tables included), nothing of the layers above them: not phalanx.train,
  not the command line (phalanx.cli, the command packages launch, submit, sweep, doctor, top, and
  phalanx.probe_data), not the package root `phalanx`, whose exports pull in everything.
- env and config sit at the bottom: besides their own package they import only the leaf modules
  phalanx.errors, phalanx._version and phalanx._lazy, which import nothing of phalanx.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import phalanx

SRC = Path(phalanx.__file__).parent
LOWER = tuple(
    f"phalanx.{name}" for name in ("env", "config", "data", "checkpoint", "rundir", "track")
)
ABOVE = tuple(
    f"phalanx.{name}"
    for name in ("train", "cli", "launch", "submit", "sweep", "doctor", "top", "probe_data")
)
BOTTOM = ("phalanx.env", "phalanx.config")
LEAVES = ("phalanx.errors", "phalanx._version", "phalanx._lazy")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in SRC.rglob("*.py")}


def _target(name: str) -> str:
    """The phalanx module an imported dotted name lives in (a module, or the one defining it)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")


def _lazy_table(node: ast.AST) -> tuple[str, list[str]] | None:
    """('_AT_ONCE' or '_ON_FIRST_USE', its modules) for an assignment of a phalanx._lazy table."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        name = ast.unparse(node.targets[0])
        if name in ("_AT_ONCE", "_ON_FIRST_USE") and isinstance(node.value, ast.Dict):
            return name, [ast.literal_eval(key) for key in node.value.keys if key is not None]
    return None


def _imports(node: ast.AST, at_import_time: bool) -> Iterator[str]:
    """Dotted phalanx names imported under `node`; only what runs at import time if asked."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            yield from (alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            yield from (f"{child.module}.{alias.name}" for alias in child.names)
        table = _lazy_table(child)
        if table is not None and (table[0] == "_AT_ONCE" or not at_import_time):
            yield from table[1]
        deferred = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if at_import_time and (deferred or _is_type_checking(child)):
            continue
        yield from _imports(child, at_import_time)


def imports_of(module: str, *, at_import_time: bool) -> set[str]:
    """The phalanx modules `module` imports (at import time only, or anywhere in its file)."""
    names = _imports(ast.parse(MODULES[module].read_text()), at_import_time)
    return {_target(name) for name in names if name.split(".")[0] == "phalanx"} - {module}


def _with_parent_packages(module: str, targets: set[str]) -> set[str]:
    # Importing phalanx.a.b runs phalanx/a/__init__.py first; the packages that contain
    # `module` itself are already being imported when it runs, so they add no edge.
    edges = set(targets)
    for target in targets:
        parts = target.split(".")
        edges.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return {t for t in edges if not (module == t or module.startswith(t + "."))}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (module -> modules it imports), or []."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_no_import_cycles() -> None:
    graph = {
        module: _with_parent_packages(module, imports_of(module, at_import_time=True))
        for module in MODULES
    }
    assert sum(map(len, graph.values())) > 200, "the graph lost its edges: check _imports"
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}}) == []


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_lower_layers_import_nothing_from_above() -> None:
    wrong = {}
    for module in MODULES:
        if any(_within(module, layer) for layer in LOWER):
            above = {
                target
                for target in imports_of(module, at_import_time=False)
                if target == "phalanx" or any(_within(target, upper) for upper in ABOVE)
            }
            if above:
                wrong[module] = sorted(above)
    assert not wrong, f"lower layers import from above them: {wrong}"


def test_env_and_config_sit_at_the_bottom() -> None:
    assert all(imports_of(leaf, at_import_time=False) == set() for leaf in LEAVES)
    for layer in BOTTOM:
        modules = [m for m in MODULES if _within(m, layer)]
        assert modules
        for module in modules:
            targets = imports_of(module, at_import_time=False)
            others = {t for t in targets if not _within(t, layer) and t not in LEAVES}
            assert not others, f"{module} imports {sorted(others)}"
