"""The house rule on function size, kept true by walking the sources: no function longer than 60 lines and no public
function with more than 8 parameters, in onnx_norm/ and in the GPU harness's build module. A function that grows
past either names itself here; its options belong in a dataclass (onnx_norm/options.py shows the shape)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [*sorted((ROOT / "onnx_norm").rglob("*.py")), ROOT / "tools" / "gpu_harness" / "gpu_build.py"]
MAX_LINES = 60
MAX_PUBLIC_PARAMETERS = 8

Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST) -> Iterator[Function]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def lines(function: Function) -> int:
    """From the `def` (decorators left out) to the last line of the body, docstring and comments included."""
    assert function.end_lineno is not None
    return function.end_lineno - function.lineno + 1


def parameters(function: Function) -> list[str]:
    """Every parameter a caller can pass, `*args` and `**kwargs` one each; `self` and `cls` are not passed."""
    args = function.args
    names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    names += [f"*{a.arg}" for a in (args.vararg,) if a is not None]
    names += [f"**{a.arg}" for a in (args.kwarg,) if a is not None]
    return [name for name in names if name not in ("self", "cls")]


def is_public(function: Function) -> bool:
    return not function.name.startswith("_") or (function.name.startswith("__") and function.name.endswith("__"))


def offenders(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for function in functions(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{function.lineno} {function.name}"
            if lines(function) > MAX_LINES:
                found.append(f"{where}: {lines(function)} lines")
            if is_public(function) and len(parameters(function)) > MAX_PUBLIC_PARAMETERS:
                found.append(f"{where}: {len(parameters(function))} parameters")
    return found


def test_the_walk_finds_a_long_function_and_a_wide_public_one(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    source.write_text(
        f"def long():\n{body}\n\n"
        "def wide(a, b, c, d, e, f, g, h, *, i):\n    pass\n\n"
        "def _wide(a, b, c, d, e, f, g, h, i):\n    pass\n\n"
        "class C:\n    def method(self, a, b, c, d, e, f, g, *args, **kwargs):\n        pass\n\n"
        "def fits(a, b, c, d, e, f, g, h):\n" + "\n".join(f"    y{i} = {i}" for i in range(59)) + "\n"
    )
    assert [item.split(" ", 1)[1] for item in offenders([source])] == [
        "long: 61 lines",
        "wide: 9 parameters",
        "method: 9 parameters",
    ]


def test_no_function_is_too_long_and_no_public_one_takes_too_many_parameters() -> None:
    found = offenders(SOURCES)
    if found:
        pytest.fail(
            f"functions over {MAX_LINES} lines or public ones over {MAX_PUBLIC_PARAMETERS} parameters:\n"
            + "\n".join(found)
        )
