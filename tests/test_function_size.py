"""The house rule on function size, kept true by walking the sources: no function longer than 60 lines and no public
function with more than 8 parameters, in onnx_norm/ and in the GPU harness's build module. A function that grows
past either names itself here; its options belong in a dataclass (onnx_norm/options.py shows the shape).

The C++/CUDA sources (custom_ops/src/, the GPU harness's .cc/.cu/.cuh) keep the same 60 lines, found by a small
scanner (cpp_functions): a kernel that must stay whole names itself in CPP_LONG_FUNCTIONS with its reason. A kernel's
steps split into `__device__ __forceinline__` helpers, inlined: the kernels split that way compile to the SASS they
had as one function (docs/cuda_kernels.md says how that was checked); tests/kernels/test_cuda_build.py keeps the spill
check."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [*sorted((ROOT / "onnx_norm").rglob("*.py")), ROOT / "tools" / "gpu_harness" / "gpu_build.py"]
MAX_LINES = 60
MAX_PUBLIC_PARAMETERS = 8
CPP_SOURCES = sorted(
    path
    for path in [*(ROOT / "custom_ops" / "src").rglob("*"), *(ROOT / "tools" / "gpu_harness").glob("*")]
    if path.suffix in (".cc", ".h", ".cu", ".cuh")
)
# "path:function" -> why it stays longer than MAX_LINES (none now: every kernel's steps are helpers).
CPP_LONG_FUNCTIONS: dict[str, str] = {}

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


# --- C++/CUDA -----------------------------------------------------------------------------------------------------
# Comments, string and character literals and preprocessor lines: blanked (newlines kept, so line numbers stay), so
# that a brace in them is no code and a macro's body is no function.
_CPP_NOISE = re.compile(
    r'//[^\n]*|/\*.*?\*/|R"(?P<d>[^(\s]*)\(.*?\)(?P=d)"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    r"|^[ \t]*#(?:\\\n|[^\n])*",
    re.DOTALL | re.MULTILINE,
)
# What a `{` opens is read from the text before it (its head, since the last `;`, `{` or `}` of the scope).
_CPP_SCOPE = re.compile(r"(?:.*\bnamespace\b.*|extern)", re.DOTALL)  # extern "C" { ... }
_CPP_CLASS = re.compile(r"(?:typedef\s+)?(?:class|struct|union|enum)\b")
# Names whose parentheses are not a function's parameter list (operator()'s own `()` among them).
_CPP_ATTRIBUTE = re.compile(
    r"\b(?:__attribute__|__launch_bounds__|__declspec|alignas|noexcept|throw|decltype|operator)\s*$"
)
_CPP_NAME = re.compile(r"(?:operator\s*\(\s*\)|operator\s*[^\w\s(]+|~?[\w:]+(?:\s*<[^()]*>)?)\s*$")


@dataclasses.dataclass(frozen=True)
class CppFunction:
    name: str
    line: int  # the line of its name (a `template <...>` line above it is left out, like a decorator)
    end: int  # the line of its closing brace

    @property
    def lines(self) -> int:
        return self.end - self.line + 1


def cpp_functions(text: str) -> list[CppFunction]:
    """Every function body of a C++/CUDA source, in the order they start. A body is matched brace by brace and
    counted whole: its lambdas, local classes and control blocks are lines of it. Namespaces, classes, structs,
    unions and enums are scopes whose member functions are found; initializer braces (`= {...}`, `x{...}`, a
    constructor's member initializers) are neither."""
    code = _CPP_NOISE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    found: list[CppFunction] = []
    end = _scan_scope(code, 0, found)
    if end != len(code):
        raise ValueError(f"unbalanced '}}' on line {_line(code, end)}")
    return found


def _scan_scope(code: str, start: int, found: list[CppFunction]) -> int:
    """Reads a scope from `start` to its closing brace (or the end of the text): returns that brace's index."""
    head = i = start
    while i < len(code) and code[i] != "}":
        if code[i] == ";":
            head = i + 1
        elif code[i] == "{":
            kind, name = _brace_kind(code, head, i)
            if kind == "scope":
                i = _scan_scope(code, i + 1, found)
            elif kind == "function":
                i = _closing_brace(code, i)
                found.append(CppFunction(name, _line(code, code.index(name, head)), _line(code, i)))
            else:  # an initializer: part of the declaration it is in
                i = _closing_brace(code, i) + 1
                continue
            head = i + 1
        i += 1
    return i


def _line(code: str, index: int) -> int:
    return code.count("\n", 0, index) + 1


def _closing_brace(code: str, i: int) -> int:
    depth = 0
    for j in range(i, len(code)):
        depth += {"{": 1, "}": -1}.get(code[j], 0)
        if depth == 0:
            return j
    raise ValueError(f"unclosed '{{' on line {_line(code, i)}")


def _brace_kind(code: str, start: int, brace: int) -> tuple[str, str]:
    """("scope" | "function" | "initializer", the function's name) for the `{` at `brace`, whose head starts at
    `start`."""
    head = code[start:brace].strip()
    head = re.sub(r"^(?:(?:public|private|protected)\s*:\s*)+", "", head)
    while head.startswith("template"):
        head = _after_template_parameters(head)
    if _CPP_SCOPE.fullmatch(head) or _CPP_CLASS.match(head):
        return "scope", ""
    declarator = _first_call(head)
    if declarator is None or (not re.search(r"\boperator\b", head) and _top_level_assignment(head)):
        return "initializer", ""
    name_end, after = declarator
    # After the parameters, a single `:` starts a constructor's member initializers: a `{` right after a name
    # there is one member's initializer; the body follows a `)` or `}`.
    if re.search(r"(?<!:):(?!:)", head[after:]) and not re.search(r"[)}]$", head):
        return "initializer", ""
    return "function", _CPP_NAME.search(head[:name_end]).group().strip()


def _after_template_parameters(head: str) -> str:
    depth = 0
    for j, c in enumerate(head):
        depth += {"<": 1, ">": -1}.get(c, 0)
        if depth == 0 and c == ">":
            return head[j + 1 :].lstrip()
    return ""


def _first_call(head: str) -> tuple[int, int] | None:
    """The function's parameter list: the first top-level `(...)` that follows a name other than an attribute
    (`__launch_bounds__(...)`, `noexcept(...)`, `operator()`'s own): the name's end and the index after the `)`;
    None without one."""
    depth = 0
    for j, c in enumerate(head):
        if c == "(" and depth == 0 and not _CPP_ATTRIBUTE.search(head[:j]):
            close = j + _closing_paren(head[j:])
            return j, close + 1
        depth += {"(": 1, ")": -1}.get(c, 0)
    return None


def _closing_paren(text: str) -> int:
    depth = 0
    for j, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return j
    return len(text) - 1


def _top_level_assignment(head: str) -> bool:
    """An `=` outside parentheses and brackets: a variable's initializer (`x = {...}`), not a default argument."""
    depth = 0
    for c in head:
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(c, 0)
        if c == "=" and depth == 0:
            return True
    return False


def cpp_offenders(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for function in cpp_functions(path.read_text()):
            if function.lines > MAX_LINES:
                found.append(f"{where}:{function.line} {function.name}: {function.lines} lines")
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


def _lines(prefix: str, count: int) -> str:
    return "".join(f"{prefix}{i};\n" for i in range(count))


# A C++/CUDA sample: what the scanner must find, each function's lines from its name to its closing brace.
CPP_SAMPLE = "".join(
    [
        "// a comment with a brace { that is no code\n",
        "#define BRACES(x) { x; }\n",
        "namespace outer {\n",  # a namespace 260 lines long: a scope, not a function
        "namespace {\n",
        "const int kTable[] = {1, 2, 3};\n",  # an initializer
        "enum class Kind : int { kA, kB };\n",
        "struct Long {\n",  # a struct 66 lines long, its members' bodies short
        "  int a = 0;\n",
        "  int b{1};\n",
        "  Long(int x) : a(x), b{x} {\n",  # member initializers, then the constructor's body
        _lines("    a += ", 3),
        "  }\n",
        "  int Get() const { return a; }\n",
        "  int operator()(int x) const { return a + x; }\n",
        _lines("  int field", 55),
        "};\n",
        "}  // namespace\n",
        "\n",
        "template <typename T, int N>\n",
        "__global__ void __launch_bounds__(Max(N), 1) LongKernel(T* p) {\n",  # 63 lines: found
        '  const char* text = "} not a brace";\n',
        "  for (int i = 0; i < N; ++i) {\n",  # a control block: lines of the kernel
        _lines("    p[i] += ", 58),
        "  }\n",
        "}\n",
        "\n",
        "int WithLambda(int x) {\n",  # 61 lines with its lambda: found
        "  auto f = [&](int y) {\n",
        _lines("    x += y + ", 55),
        "    return x;\n",
        "  };\n",
        "  return f(x);\n",
        "}\n",
        "\n",
        'extern "C" int Fits(int x) {\n',  # exactly 60 lines: fits
        _lines("  x += ", 58),
        "}\n",
        "}  // namespace outer\n",
    ]
)


def test_the_cpp_scanner_tells_functions_from_scopes_and_counts_lambdas_with_their_function() -> None:
    found = [(f.name, f.lines) for f in cpp_functions(CPP_SAMPLE)]
    assert found == [("Long", 5), ("Get", 1), ("operator()", 1), ("LongKernel", 63), ("WithLambda", 61), ("Fits", 60)]


def test_the_cpp_walk_names_the_long_ones(tmp_path: Path) -> None:
    source = tmp_path / "sample.cu"
    source.write_text(CPP_SAMPLE)
    assert [item.split(" ", 1)[1] for item in cpp_offenders([source])] == [
        "LongKernel: 63 lines",
        "WithLambda: 61 lines",
    ]


def test_an_unbalanced_cpp_source_is_an_error_not_a_silent_pass() -> None:
    with pytest.raises(ValueError, match="unclosed"):
        cpp_functions("void f() {\n  if (x) {\n}\n")
    with pytest.raises(ValueError, match="unbalanced"):
        cpp_functions("void f() {}\n}\n")


def test_the_cpp_sources_are_scanned() -> None:
    """The walk covers every C++/CUDA source and finds the kernels in them (a scanner that found nothing would
    pass the size rule)."""
    names = {f.name for path in CPP_SOURCES for f in cpp_functions(path.read_text())}
    assert {"RegisterRowKernel", "SharedRowKernel", "ClusterRowKernel", "PrepareProblem", "RegisterCustomOps"} <= names
    assert any(path.suffix == ".cuh" for path in CPP_SOURCES)
    assert any(path.parent.name == "gpu_harness" for path in CPP_SOURCES)


def test_no_cpp_function_is_too_long() -> None:
    found = [item for item in cpp_offenders(CPP_SOURCES) if _exception_key(item) not in CPP_LONG_FUNCTIONS]
    stale = set(CPP_LONG_FUNCTIONS) - {_exception_key(item) for item in cpp_offenders(CPP_SOURCES)}
    assert not stale, f"CPP_LONG_FUNCTIONS names functions that are no longer too long: {sorted(stale)}"
    if found:
        pytest.fail(
            f"C++/CUDA functions over {MAX_LINES} lines (split them into named steps; a CUDA kernel's into "
            "__device__ __forceinline__ helpers):\n" + "\n".join(found)
        )


def _exception_key(item: str) -> str:
    """'path:line name: N lines' -> 'path:name', the key of CPP_LONG_FUNCTIONS."""
    where, rest = item.split(" ", 1)
    return f"{where.rsplit(':', 1)[0]}:{rest.split(':', 1)[0]}"
