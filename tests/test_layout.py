"""The package's layers (rookworld/__init__.py's docstring) hold: every module is in one,
imports (module-level and inside functions) go to the same layer or below, no cycles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rookworld

ROOT = Path(rookworld.__file__).parent


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package by its __init__)."""
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module -> the package's modules it imports, wherever the import statement is."""
    graph = {}
    for name, f in mods.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                         for a in node.names}
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def layers() -> dict[str, int]:
    """Top-level name (module or subpackage) -> layer index, from the package docstring."""
    text = rookworld.__doc__.replace("\n        ", " ")  # continuation lines
    rows = re.findall(r"^    ([a-z ]+): ([a-z0-9_, ]+)$", text, flags=re.M)
    assert len(rows) >= 8, rows
    return {n.strip(): i for i, (_, names) in enumerate(rows) for n in names.split(",")}


def layer_of(module: str, table: dict[str, int]) -> int:
    top = module.split(".")[1] if "." in module else module
    return table[top]


def test_every_module_is_in_a_layer():
    table = layers()
    missing = sorted(m for m in modules() if (m.split(".") + [m])[1] not in table)
    assert not missing, f"add these to a layer in rookworld/__init__.py: {missing}"
    tops = {(m.split(".") + [m])[1] for m in modules()}
    assert not set(table) - tops, f"listed but not in the package: {set(table) - tops}"


def test_imports_go_down_the_layers_only():
    table, graph = layers(), import_graph(modules())
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if layer_of(d, table) > layer_of(m, table))
    assert not upward, upward


def test_the_import_graph_has_no_cycle():
    graph = import_graph(modules())
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, " -> ".join(path[path.index(d):] + [m, d]) \
                if d in path else f"{m} -> {d}"
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_relative_imports_resolve_and_the_layers_stack_in_order():
    graph = import_graph(modules())
    assert "rookworld.sft" in graph["rookworld.anchor"]  # a relative import, resolved
    assert "rookworld.chess_tasks.sample" in graph["rookworld.chess_tasks.environment"]
    table = layers()
    assert layer_of("rookworld.train", table) > layer_of("rookworld.engine", table) \
        > layer_of("rookworld.gpt2", table) > layer_of("rookworld.files", table)
