"""The import graph of onnx_norm has no circle and no arrow from a lower layer up.

Every `import` and `from ... import` inside the package counts, at module level and inside functions alike (an
import moved into a function to dodge a circle is still one), and so do imports under `if TYPE_CHECKING:`: a
type a module names is part of what a reader must hold in their head, and a type-only circle is a circle of
meaning. A circle is reported with its modules, so the edge to cut is visible; so is an import that goes up the
layers (LAYERS)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "onnx_norm"


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: The package's layers, lowest first, each a list of its top-level modules and subpackages: a module may import
#: from its own layer and the ones below, never from one above. A new top-level module takes its place here.
LAYERS: list[list[str]] = [
    ["errors", "defaults", "dtypes", "accuracy", "library", "inline_weights"],
    ["ops"],
    ["model_io", "weights", "correspond"],
    ["paths", "sessions", "input_spec", "input_values", "inputs", "options"],
    ["rewrite", "zoo"],
    ["parity", "bench_check", "bench", "bench_plot"],
    ["integrations"],
    ["cli", "__main__", ""],
]


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in known)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = module.split(".")[: None if is_package else -1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            name = f"{base}.{alias.name}"
            if name in known:
                yield name  # a submodule
            elif base in known:
                yield base  # a name defined in the module


def import_graph(package: Path = PACKAGE) -> nx.DiGraph:
    files = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, module, is_package, set(files)):
                if target != module and not module.startswith(f"{target}."):
                    graph.add_edge(module, target)  # a package's own __init__ runs first anyway: not an edge
    return graph


def test_the_graph_is_read_from_the_sources() -> None:
    graph = import_graph()
    assert graph.has_edge("onnx_norm.rewrite.targets", "onnx_norm.rewrite.spec")
    assert graph.has_edge("onnx_norm.rewrite.families", "onnx_norm.rewrite.families.layer_norm")
    assert len(graph) > 50


def test_a_circle_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n")
    (package / "d.py").write_text("from . import c\n")
    graph = import_graph(package)
    assert sorted(sorted(c) for c in nx.simple_cycles(graph)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert graph.has_edge("pkg.d", "pkg.c") and graph.has_edge("pkg.c", "pkg.d")  # a type-only import counts


def test_onnx_norm_has_no_import_circle() -> None:
    circles = [sorted(component) for component in nx.strongly_connected_components(import_graph())]
    circles = [c for c in circles if len(c) > 1]
    if circles:
        pytest.fail("import circles: " + "; ".join(" <-> ".join(c) for c in circles))


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} is in no layer: give onnx_norm.{top} its place in LAYERS")


def test_no_import_goes_up_the_layers() -> None:
    graph = import_graph()
    upward = [f"{a} -> {b}" for a, b in graph.edges if _layer(b) > _layer(a)]
    if upward:
        pytest.fail("imports from a higher layer: " + "; ".join(sorted(upward)))


def test_an_upward_import_is_found() -> None:
    graph = import_graph()
    assert _layer("onnx_norm.ops.norms") < _layer("onnx_norm.rewrite.match") < _layer("onnx_norm.cli.verify")
    assert all(_layer(b) <= _layer(a) for a, b in graph.edges)
    with pytest.raises(AssertionError, match="in no layer"):
        _layer("onnx_norm.nowhere")
