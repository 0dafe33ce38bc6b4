"""The house stays one-way: no import circle among hp_agent's modules, no import from a
lower layer up, and the env side loads no torch.

Imports are read from the source with ``ast``: module-level and function-level ones alike
(a function-level import is a circle postponed, not avoided); those under ``if
TYPE_CHECKING:`` are left out, as they never run. Importing ``a.b.c`` runs the packages
``a`` and ``a.b`` too, so each import also counts as an import of its parent packages.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hp_agent"

# Modules below the learning stack: they may not import what is above them.
LOWER = ("hp_agent.envs", "hp_agent.verifiers", "hp_agent.trajectory", "hp_agent.credit", "hp_agent.kernels",
         "hp_agent.files", "hp_agent.run_folder", "hp_agent.errors", "hp_agent.paths", "hp_agent.constraint")
UPPER = ("hp_agent.policies", "hp_agent.trainer", "hp_agent.learner", "hp_agent.reports", "hp_agent.rollout",
         "hp_agent.hindsight", "hp_agent.sft", "hp_agent.evaluation", "hp_agent.cli")
# (importer prefix, imported prefixes it must not import)
FORBIDDEN = [(lower, UPPER) for lower in LOWER] + [
    ("hp_agent.policies", ("hp_agent.trainer", "hp_agent.learner", "hp_agent.reports", "hp_agent.rollout",
                           "hp_agent.sft", "hp_agent.evaluation", "hp_agent.cli")),
]


def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _with_parents(name: str, modules: dict[str, Path]) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(modules)


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the module an attribute ``name`` lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """hp_agent module -> the hp_agent modules importing it runs."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            for name in names:
                owner = _owner(name, modules) if name.startswith("hp_agent") else None
                if owner is not None:
                    targets |= _with_parents(owner, modules)
        graph[module] = targets - {module} - _with_parents(module, modules)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return circles


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_import_circle():
    assert import_circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    # The control: a graph with a circle through three modules, and one without.
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_function_level_imports_count():
    tree = ast.parse("def f():\n    from hp_agent.trainer import train\nif TYPE_CHECKING:\n    import hp_agent.cli\n")
    assert [node.module for node in _runtime_imports(tree) if isinstance(node, ast.ImportFrom)] == ["hp_agent.trainer"]
    assert not [node for node in _runtime_imports(tree) if isinstance(node, ast.Import)]


def test_no_import_from_a_lower_layer_up():
    graph = import_graph()
    upward = sorted(f"{module} -> {target}"
                    for module, targets in graph.items() for target in targets
                    for importer, above in FORBIDDEN if _under(module, importer)
                    and any(_under(target, prefix) for prefix in above))
    assert upward == []


@pytest.mark.parametrize("module", ["hp_agent.envs.base", "hp_agent.envs", "hp_agent.envs.alfworld", "hp_agent.config"])
def test_the_env_side_loads_no_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"importing {module} loads {out.strip()}"


def test_the_package_still_exports_its_api():
    import hp_agent
    import hp_agent.evaluation
    import hp_agent.trainer  # a submodule named like an export would shadow it once imported

    assert callable(hp_agent.train) and callable(hp_agent.evaluate) and hp_agent.TextEnv.__name__ == "TextEnv"
    assert {name for name in hp_agent.__all__ if name in hp_agent._EXPORTS} == set(hp_agent.__all__)
    assert not {name for name in hp_agent.__all__ if (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name).is_dir()}
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        hp_agent.trian  # noqa: B018
