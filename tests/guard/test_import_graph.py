"""guard/'s modules import each other without a circle.

The graph holds module-level imports, those under `if TYPE_CHECKING:` included (a type-only
circle still ties the modules together for a reader). Imports inside functions are left out:
they run late, on purpose (the run report's modules are imported only when a report is asked
for). `from guard.x import name` counts as an import of `guard.x.name` when that is a module,
else of `guard.x`.
"""

from __future__ import annotations

import ast
from pathlib import Path

GUARD = Path(__file__).resolve().parents[2] / "guard"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(GUARD.rglob("*.py")):
        parts = list(path.relative_to(GUARD.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run at import: the body, and the bodies of its ifs and trys."""
    nodes, stack = [], list(tree.body)
    while stack:
        node = stack.pop()
        nodes.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            stack.extend(s for h in getattr(node, "handlers", []) for s in h.body)
    return nodes


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _module_level(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
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


def test_the_graph_sees_the_guards_modules():
    graph = _graph()
    assert "guard.prepared" in graph["guard.engine"]
    assert "guard._window" in graph["guard.prepared"]  # the StepHooks protocol's window


def test_guard_imports_have_no_circle():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)
