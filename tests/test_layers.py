"""The floor plan: imports point one way (loopdock -> bridge -> actors -> runtime) and no
two files import each other, directly or round a circle.

Every import counts: module level, under ``TYPE_CHECKING`` and inside functions. The scan
reads the source (nothing is imported), so it sees what a reader of the code sees.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("runtime", "actors", "bridge", "loopdock")  # lowest first
PACKAGES = (*LAYERS, "benchmarks")
# Each folder installs under the one namespace (setup.py): runtime/ is loopdock.runtime.
_FOLDER_PACKAGE = {name: "loopdock" if name == "loopdock" else f"loopdock.{name}" for name in PACKAGES}


def _module_name(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([_FOLDER_PACKAGE[folder], *parts])


def _layer(module: str) -> str | None:
    """The folder (layer) a module's file is in, or None for a module outside the project."""
    parts = module.split(".")
    if parts[0] != "loopdock":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "loopdock"


def _files() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a project module in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                # ``from pkg import submodule`` imports the submodule itself.
                target = f"{module}.{alias.name}"
                found.append((node.lineno, target if target in modules else module))
    return [(line, m) for line, m in found if m in modules]


def _graph() -> tuple[dict[str, Path], dict[str, list[tuple[int, str]]]]:
    modules = _files()
    return modules, {name: _imports(name, path, modules) for name, path in modules.items()}


def test_imports_point_down_the_layers_only():
    modules, graph = _graph()
    upward = []
    for name, imports in graph.items():
        top = _layer(name)
        if top not in LAYERS:
            continue
        allowed = set(LAYERS[: LAYERS.index(top) + 1]) | ({"benchmarks"} if top == "loopdock" else set())
        upward += [f"{modules[name].relative_to(ROOT)}:{line} imports {m}" for line, m in imports
                   if _layer(m) not in allowed]
    assert upward == []


def test_no_two_files_import_each_other_round_a_circle():
    _, graph = _graph()
    # Tarjan's strongly connected components: a component of more than one file is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for _, target in graph[node]:
            if target == node:
                continue
            if target not in index:
                visit(target)
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

    for node in graph:
        if node not in index:
            visit(node)
    assert circles == []


def test_the_scan_sees_relative_typing_and_function_imports(tmp_path):
    # The scan itself could pass by seeing nothing: check it on a file that has each kind.
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .._supervisor import Supervisor\n"
        "if TYPE_CHECKING:\n    from loopdock import Runtime\n"
        "def f():\n    from loopdock.bridge import serve_bridge\n"
    )
    path = ROOT / "actors" / "dock" / "_probe.py"
    modules = {"loopdock.actors._supervisor": path, "loopdock": path, "loopdock.bridge": path,
               "loopdock.actors.dock._probe": path}
    path_text = tmp_path / "_probe.py"
    path_text.write_text(source)
    found = {m for _, m in _imports("loopdock.actors.dock._probe", path_text.parent / "_probe.py", modules)}
    assert found == {"loopdock.actors._supervisor", "loopdock", "loopdock.bridge"}
    assert {_layer(m) for m in found} == {"actors", "loopdock", "bridge"}
    assert _module_name(ROOT / "runtime" / "cluster" / "__init__.py") == "loopdock.runtime.cluster"


def test_a_layer_is_entered_only_through_its_doors():
    # Across layers an import names a layer's public package (its __init__, or a public
    # subpackage's: runtime.models, runtime.cluster, ...) and public names only, never a
    # private module or name: what a layer keeps private can change without its users.
    modules = _files()
    private = []
    for name, path in modules.items():
        for line, target in _imports(name, path, modules):
            if _layer(target) != _layer(name) and any(part.startswith("_") for part in target.split(".")):
                private.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _layer(node.module) not in (
                None, _layer(name)
            ):
                private += [f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{alias.name}"
                            for alias in node.names if alias.name.startswith("_")]
    assert private == []
