"""linter/, rules/ and guard/ import each other without a circle; rules/ imports neither side,
and the linter and the guard never import each other.

Every import counts, those inside functions included: the linter defers most imports to the
function that needs them (start-up time), and a circle through a deferred import is still a
circle (runner -> text -> notebooks -> runner was one). Imports under `if TYPE_CHECKING:` are
left out: they never run, and the model's topic modules annotate the facade they are handed
(`model: Model`) while the facade imports them. Importing a submodule is not counted as an
import of its package's `__init__`. `from a.b import name` is an import of `a.b.name` when that
is a module, else of `a.b`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("linter", "rules", "guard")


def _modules(packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(tree: ast.Module):
    """Every import statement that can run: anywhere but under `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = _modules(packages)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else known(base)
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, or None (depth-first, white/grey/black)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_deferred_imports_and_skips_type_only_ones():
    graph = _graph()
    assert "linter.text" in graph["linter.runner"]  # inside lint_job
    assert "linter.notebooks" in graph["linter.text"]  # inside lint_text
    assert "linter.typer_app" in graph["linter.cli"]  # inside main, where its parser gives up
    assert "linter.notebooks" not in graph["linter.checking"]  # CellIndex, for annotations
    assert "rules._base" in graph["rules"]
    assert "guard.run_report" in graph["guard._install"]  # inside _write_report
    assert "guard.engine" not in graph["guard.prepared"]  # it asks for StepHooks, not the engine
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_linter_rules_and_guard_imports_have_no_circle():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_rules_import_neither_side_and_the_two_sides_never_each_other():
    graph = _graph(("linter", "rules", "guard"))
    side = {name: name.partition(".")[0] for name in graph}
    crossing = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if side[target] != side[name] and (side[name] == "rules" or side[target] != "rules")
    )
    assert crossing == []
