"""Turns a matched norm (`NormSpec`) into nodes for one target.

- `onnx-norm`: one of our ops (domain `onnx_norm`, docs/ops.md), every attribute set explicitly.
- `onnx`: standard `LayerNormalization` (opset >= 17) / `RMSNormalization` (opset >= 23), whose semantics are
  their ONNX function bodies: statistics in float32 (stash_type 1), the normalised value rounded to the op's type
  T, then the scale multiply and bias add in T. A residual becomes an `Add` in front of the op.
- `ort`: ONNX Runtime's `LayerNormalization` (its contrib version below opset 17), `SimplifiedLayerNormalization`,
  and the com.microsoft `SkipLayerNormalization` / `SkipSimplifiedLayerNormalization`. Their kernels compute in
  float32 and round once, to the output type; the Skip ops normalise the unrounded sum, so they only take float32
  residuals (a float16/bfloat16 residual becomes an `Add` in front of the norm, as in the graph).

A fused op must reproduce the graph it replaces, including where the graph rounds to float16/bfloat16
(`normalized_type`, `multiply_type`, `output_type`). For `onnx` and `ort` the planner folds into the op as many
of the scale and bias steps as its rounding allows, and computes the rest with explicit `Mul`/`Add`/`Cast` nodes
that round exactly where the graph does (float32 arithmetic, then a Cast; docs/ops.md explains why this
reproduces a native float16/bfloat16 op). Casting float16/bfloat16 to float32 is exact, so an op can always run
in float32 on cast inputs. Where no exact form exists `unsupported_reason` says why.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.schema import DOMAIN, FLOAT_TYPES, OPSET_VERSION
from onnx_norm.rewrite import family
from onnx_norm.rewrite.family import Lowering
from onnx_norm.rewrite.spec import TARGETS, NormSpec

#: Key of the metadata property naming the rule that produced a node.
RULE_METADATA_KEY = "onnx_norm.rule"
MS_DOMAIN = "com.microsoft"

#: Emit Y in X's type only. The library honours output_type only where ONNX Runtime takes a custom op's output
#: type from its shape inference, which needs X's rank known and a recent runtime (1.31 does; 1.21 may not); the
#: kernel refuses the node elsewhere. Nodes that need another Y type are emitted as the op and a Cast where that
#: is exact, and refused otherwise, so that a model never fails once the library is registered.
LIBRARY_TYPES_Y_LIKE_X = True

_FLOAT = int(ir.DataType.FLOAT)
_BF16 = int(ir.DataType.BFLOAT16)
_INT64_MAX = np.iinfo(np.int64).max
_TYPE_NAMES = {int(ir.DataType.FLOAT): "float32", int(ir.DataType.FLOAT16): "float16", _BF16: "bfloat16"}


def _type_name(elem_type: int) -> str:
    return _TYPE_NAMES.get(elem_type, ir.DataType(elem_type).name if elem_type else "unknown")


def _dtype(value: ir.Value | None) -> int:
    return 0 if value is None or value.dtype is None else int(value.dtype)


def _float_if_unset(elem_type: int) -> int:
    return elem_type or _FLOAT


# --------------------------------------------------------------------------------------------------------------
# Plans: which op computes the norm core, in which type, how many of the scale/bias steps it folds in.


@dataclasses.dataclass(frozen=True)
class _Plan:
    op_type: str  # "" for our ops (no plan needed)
    domain: str
    version: int
    core_type: int  # element type of the op's Y (and of X, Scale, B where the op needs one type)
    cast_x: bool  # X is cast to core_type before the op
    folded: int  # how many of the steps (scale, bias) the op computes
    separate_add: bool  # the residual Add is computed in front of the op
    fused_skip: bool  # the op takes the residual itself (ORT Skip ops)


def _steps(spec: NormSpec) -> list[tuple[str, ir.Value]]:
    steps = []
    if spec.scale is not None:
        steps.append(("scale", spec.scale))
    if spec.bias is not None:
        steps.append(("bias", spec.bias))
    return steps


def _roundings(spec: NormSpec) -> list[int]:
    """Where the graph rounds: before the first step (normalized_type), then after each step (multiply_type);
    float32 where it does not round."""
    a = spec.attrs
    return [_float_if_unset(a.normalized_type)] + [_float_if_unset(a.multiply_type)] * len(_steps(spec))


def _exact_cast(src: int, dst: int) -> bool:
    return dst in (src, _FLOAT)


def _common_reason(spec: NormSpec, target: str) -> str | None:
    if target not in TARGETS:
        return f"unknown target {target!r}; expected one of {', '.join(TARGETS)}"
    if spec.x_type not in FLOAT_TYPES:
        return f"input element type {_type_name(spec.x_type)} is not float32, float16 or bfloat16"
    for name, value in (("skip", spec.skip), ("scale", spec.scale), ("bias", spec.bias)):
        if value is not None and _dtype(value) not in FLOAT_TYPES:
            return f"{name} element type {_type_name(_dtype(value))} is not float32, float16 or bfloat16"
    if spec.skip is not None and _dtype(spec.skip) != spec.x_type:
        return "the residual addends have different element types"
    for name, elem in (
        ("normalized_type", spec.attrs.normalized_type),
        ("multiply_type", spec.attrs.multiply_type),
        ("output_type", spec.attrs.output_type),
    ):
        if elem and elem not in FLOAT_TYPES:
            return f"{name} {elem} is not float32, float16 or bfloat16"
    if spec.kind == "rms" and (spec.bias is not None or spec.mean is not None):
        return "an RMS norm has no bias and no mean"
    if spec.sum is not None and spec.skip is None:
        return "a residual sum output needs a residual input"
    if spec.attrs.axis >= 0:
        return f"axis must be negative (counted from the end), got {spec.attrs.axis}"
    return None


def _core_op(spec: NormSpec, target: str, opset: int) -> tuple[str, str, int, bool]:
    """(op_type, domain, version, single_type) of the op that computes the norm; single_type: X, scale, bias and Y
    share one type (else Y takes the scale's type and X keeps its own)."""
    if target == "onnx":
        if spec.kind == "layer":
            return ("LayerNormalization", "", 17, True)
        return ("RMSNormalization", "", 23, True)
    if spec.kind == "rms":
        return ("SimplifiedLayerNormalization", "", 1, False)
    if opset >= 17:
        return ("LayerNormalization", "", 17, True)
    # Below opset 17 the default-domain name is ONNX Runtime's contrib op.
    return ("LayerNormalization", "", 1, False)


def _plan(spec: NormSpec, target: str, opset: int) -> _Plan | str:
    reason = _common_reason(spec, target)
    if reason:
        return reason
    if target == "onnx-norm":
        if spec.skip is not None and (spec.mean is not None or spec.inv_std is not None):
            return "the onnx_norm Skip ops have no statistics outputs"
        if LIBRARY_TYPES_Y_LIKE_X and spec.attrs.output_type not in (0, spec.x_type) and not _output_cast(spec):
            return (
                f"Y must be {_type_name(spec.attrs.output_type)} without rounding through the input's "
                f"{_type_name(spec.x_type)}, and the onnx_norm library types Y like X (no output_type)"
            )
        return _Plan("", DOMAIN, OPSET_VERSION, 0, False, len(_steps(spec)), False, False)
    op_type, domain, version, single_type = _core_op(spec, target, opset)
    if opset < version:
        return f"{op_type} needs default opset >= {version}, the model imports opset {opset}"
    if target == "onnx" and spec.kind == "rms" and spec.inv_std is not None:
        return "RMSNormalization has no inverse-RMS output"
    steps = _steps(spec)
    roundings = _roundings(spec)
    x_type = spec.x_type
    # ORT's Skip ops normalise the last dim of a 2-D or 3-D input, and normalise the unrounded sum: only a float32
    # residual is rounded the same way as the graph's Add.
    fused_skip = (
        target == "ort"
        and spec.skip is not None
        and x_type == _FLOAT
        and _rank_of(spec.x) in (2, 3)
        and spec.attrs.axis == -1
    )
    if fused_skip:
        op_type = "SkipSimplifiedLayerNormalization" if spec.kind == "rms" else "SkipLayerNormalization"
        domain, version, single_type = MS_DOMAIN, 1, True
    final_type = spec.attrs.output_type or x_type
    for folded in range(len(steps), -1, -1):
        for core_type in dict.fromkeys([x_type, roundings[folded], final_type, _FLOAT]):
            if _exact(spec, target, folded=folded, core_type=core_type, single_type=single_type, fused_skip=fused_skip):
                return _Plan(
                    op_type,
                    domain,
                    version,
                    core_type,
                    single_type and x_type != core_type,
                    folded,
                    spec.skip is not None and not fused_skip,
                    fused_skip,
                )
    if fused_skip:
        # A residual Skip op could not fold what it needs; retry with the residual Add in front.
        retry = dataclasses.replace(spec, skip=None, sum=None)
        plan = _plan(retry, target, opset)
        if isinstance(plan, str):
            return plan
        return dataclasses.replace(plan, separate_add=True)
    # Unreachable while the op can run in float32 with nothing folded; kept so that a new op's constraints
    # produce a reason rather than a wrong plan.
    return (
        f"{op_type} cannot reproduce the graph's rounding (normalized_type={_type_name(spec.attrs.normalized_type)}, "
        f"multiply_type={_type_name(spec.attrs.multiply_type)}, input {_type_name(x_type)}, scale "
        f"{_type_name(_dtype(spec.scale))}) exactly"
    )


def _exact(spec: NormSpec, target: str, *, folded: int, core_type: int, single_type: bool, fused_skip: bool) -> bool:
    """Whether an op computing the core and the first `folded` steps in `core_type` rounds where the graph does."""
    steps = _steps(spec)
    roundings = _roundings(spec)
    # After the op, a float32 result can still be rounded where the graph rounds next, with a Cast.
    if target == "onnx":
        # The op rounds to its type after normalising and after each folded step.
        if any(r != core_type for r in roundings[:folded]):
            return False
        if roundings[folded] != core_type and core_type != _FLOAT:
            return False
    else:
        # ONNX Runtime's kernels round once, to the op's output type, after the last folded step: the graph must
        # not round before that, and round there to that type (or round nowhere before the final output Cast).
        if any(r != _FLOAT for r in roundings[:folded]):
            return False
        last = folded == len(steps)
        final_type = spec.attrs.output_type or spec.x_type
        gemma = last and roundings[folded] == _FLOAT and core_type == final_type
        if core_type not in (roundings[folded], _FLOAT) and not gemma:
            return False
    if single_type and not _exact_cast(spec.x_type, core_type):
        return False
    if fused_skip and core_type != spec.x_type:
        return False
    if not all(_exact_cast(_dtype(value), core_type) for _, value in steps[:folded]):
        return False
    # The Skip ops take a 1-D gamma and beta.
    return not (fused_skip and folded and any(_rank_of(value) != 1 for _, value in steps[:folded]))


def _rank_of(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


# --------------------------------------------------------------------------------------------------------------
# Public API


def unsupported_reason(spec: NormSpec, target: str, opset_imports: dict[str, int]) -> str | None:
    """Why `spec` cannot be emitted exactly for `target` in a model with these opset imports; None if it can."""
    if target not in TARGETS:
        return f"unknown target {target!r}; expected one of {', '.join(TARGETS)}"
    opset = opset_imports.get("", opset_imports.get("ai.onnx", 0))
    if target == "onnx-norm" and opset and opset < 11:
        return f"the onnx_norm ops' model-local functions need default opset >= 11, the model imports {opset}"
    if spec.x_type in (_BF16,) and opset and opset < 13:
        return "bfloat16 needs default opset >= 13"
    lowering = family.get(spec.kind).lowering(target)
    if isinstance(lowering, str):
        return lowering
    return lowering.unsupported(spec, opset)


def standard_lowerings() -> dict[str, Lowering]:
    """The lowerings of the built-in LayerNorm and RMSNorm families, for every target."""
    return {
        target: Lowering(emit=functools.partial(_emit_builtin, target), unsupported=functools.partial(_reason, target))
        for target in TARGETS
    }


def _reason(target: str, spec: NormSpec, opset: int) -> str | None:
    plan = _plan(spec, target, opset)
    return plan if isinstance(plan, str) else None


def _emit_builtin(target: str, op: Any, spec: NormSpec, opset: int) -> list[ir.Value]:
    plan = _plan(spec, target, opset)
    if isinstance(plan, str):
        raise ValueError(f"cannot emit {spec.kind} norm for target {target!r}: {plan}")
    return _emit_onnx_norm(op, spec) if target == "onnx-norm" else _emit_standard(op, spec, plan)


def opset_requirements(target: str, specs: Sequence[NormSpec]) -> dict[str, int]:
    """The minimum opset imports the nodes emitted for `specs` need (a model importing a higher version keeps it;
    the default-domain opset is never raised by us, `unsupported_reason` refuses instead)."""
    if not specs:
        return {}
    if target == "onnx-norm":
        return {DOMAIN: OPSET_VERSION}
    if target == "onnx":
        return {"": max(23 if s.kind == "rms" else 17 for s in specs)}
    if target == "ort":
        needs: dict[str, int] = {}
        if any(s.skip is not None and s.x_type == _FLOAT for s in specs):
            needs[MS_DOMAIN] = 1
        return needs
    raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")


def emit(op: Any, spec: NormSpec, target: str, opset: int | None = None) -> list[ir.Value]:
    """Builds the nodes for `spec` with the builder `op` (builder.Builder, or onnxscript's rewriter builder);
    returns the values replacing `spec.replaced()`.

    `opset` is the model's default-domain opset (it picks between ORT's contrib and the standard
    LayerNormalization); by default the opset imported by the graph holding spec.x, else 17. Raises ValueError
    when the spec cannot be emitted exactly (check `unsupported_reason` first).
    """
    if opset is None:
        graph = spec.x.graph
        opset = graph.opset_imports.get("", 17) if graph is not None else 17
    lowering = family.get(spec.kind).lowering(target)
    reason = lowering if isinstance(lowering, str) else lowering.unsupported(spec, opset)
    if reason is not None:
        raise ValueError(f"cannot emit {spec.kind} norm for target {target!r}: {reason}")
    assert isinstance(lowering, Lowering)
    results = lowering.emit(op, spec, opset)
    for new, old in zip(results, spec.replaced(), strict=True):
        if new.type is None and old.type is not None:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
    _tag(results, spec.rule)
    return results


def _tag(results: Sequence[ir.Value], rule: str) -> None:
    """Records the rule on every node the builder made (they have no graph yet)."""
    seen: set[int] = set()
    stack = [v.producer() for v in results]
    while stack:
        node = stack.pop()
        if node is None or node.graph is not None or id(node) in seen:
            continue
        seen.add(id(node))
        node.metadata_props[RULE_METADATA_KEY] = rule
        stack.extend(v.producer() for v in node.inputs if v is not None)


def _emit_onnx_norm(op: Any, spec: NormSpec) -> list[ir.Value]:
    if spec.skip is not None:
        name = "SkipRMSNorm" if spec.kind == "rms" else "SkipLayerNorm"
        inputs: list[ir.Value | None] = [spec.x, spec.skip, spec.scale]
        if spec.kind == "layer":
            inputs.append(spec.bias)
        wanted = {"sum": 1}
    elif spec.kind == "rms":
        name, inputs, wanted = "RMSNorm", [spec.x, spec.scale], {"inv_std": 1}
    else:
        name, inputs, wanted = "LayerNorm", [spec.x, spec.scale, spec.bias], {"mean": 1, "inv_std": 2}
    while inputs and inputs[-1] is None:
        inputs.pop()
    requested = {key: index for key, index in wanted.items() if getattr(spec, key) is not None}
    n_outputs = 1 + max(requested.values(), default=0)
    attrs = spec.attrs
    out_cast = _output_cast(spec)
    if out_cast:
        attrs = dataclasses.replace(attrs, output_type=0)
    outputs = op.op(name, *inputs, _domain=DOMAIN, _version=OPSET_VERSION, _outputs=n_outputs, **attrs.as_dict())
    outputs = [outputs] if isinstance(outputs, ir.Value) else list(outputs)
    y = op.Cast(outputs[0], to=out_cast) if out_cast else outputs[0]
    return [y] + [outputs[requested[key]] for key in ("sum", "mean", "inv_std") if key in requested]


def _output_cast(spec: NormSpec) -> int:
    """The type to Cast Y to after an op that keeps Y in X's type, or 0 to set output_type on the op.

    The custom-op library cannot give Y another type than X's (ONNX Runtime infers a custom op's output types
    from its inputs), so where it is exact the op keeps X's type and a Cast follows: when X is float32 (Y is then
    the float32 result itself) or when the graph's last rounding before the output is to X's type anyway.
    """
    a = spec.attrs
    if a.output_type in (0, spec.x_type):
        return 0
    last = a.multiply_type if (spec.scale is not None or spec.bias is not None) else a.normalized_type
    if spec.x_type in (_FLOAT, last):
        return a.output_type
    return 0


def _cast(op: Any, value: ir.Value, to: int, have: int) -> ir.Value:
    return value if have == to else op.Cast(value, to=to)


def _ones(op: Any, spec: NormSpec, x: ir.Value, elem_type: int, one_dim: bool) -> ir.Value:
    """Ones with the shape of the normalised dims (the last dim only if `one_dim`), for ops that need a scale."""
    n_dims = 1 if one_dim else -spec.attrs.axis
    shape = spec.x.shape
    dims = None if shape is None else list(shape)[-n_dims:]
    if dims is not None and all(isinstance(d, int) for d in dims):
        array = np.ones(dims, np.float32)
        tensor = ir.tensor(array) if elem_type == _FLOAT else ir.tensor(array.astype(_np_dtype(elem_type)))
        return op.Constant(value=tensor)
    norm_shape = op.Slice(
        op.Shape(x),
        op.Constant(value=ir.tensor(np.array([-n_dims], np.int64))),
        op.Constant(value=ir.tensor(np.array([_INT64_MAX], np.int64))),
    )
    ones = op.ConstantOfShape(norm_shape, value=ir.tensor(np.array([1.0], np.float32)))
    return _cast(op, ones, elem_type, _FLOAT)


def _np_dtype(elem_type: int) -> np.dtype:
    return ir.DataType(elem_type).numpy()


def _add(op: Any, a: ir.Value, b: ir.Value, elem_type: int) -> ir.Value:
    """a + b rounded to elem_type, for two values of elem_type. ONNX Runtime's CPU provider has no bfloat16
    Add or Mul, so bfloat16 goes through float32 (the same result, docs/ops.md)."""
    if elem_type != _BF16:
        return op.Add(a, b)
    return op.Cast(op.Add(op.Cast(a, to=_FLOAT), op.Cast(b, to=_FLOAT)), to=_BF16)


def _emit_standard(op: Any, spec: NormSpec, plan: _Plan) -> list[ir.Value]:
    x_type = spec.x_type
    x = spec.x
    sum_value = None
    if plan.separate_add:
        assert spec.skip is not None
        x = sum_value = _add(op, spec.x, spec.skip, x_type)
    core_in = _cast(op, x, plan.core_type, x_type) if plan.cast_x else x
    steps = _steps(spec)
    folded = steps[: plan.folded]
    params = {name: _cast(op, value, plan.core_type, _dtype(value)) for name, value in folded}
    one_dim = plan.fused_skip
    scale = params.get("scale")
    if scale is None:
        scale = _ones(op, spec, x, plan.core_type, one_dim)
    bias = params.get("bias")
    attrs: dict[str, Any] = {"epsilon": float(spec.attrs.epsilon)}
    if not plan.fused_skip:
        attrs["axis"] = spec.attrs.axis
        attrs["stash_type"] = 1
    if plan.fused_skip:
        inputs = [core_in, spec.skip, scale] + ([bias] if bias is not None else [])
        # outputs: output, mean, inv_std_var, input_skip_bias_sum
        wanted = {"mean": 1, "inv_std": 2, "sum": 3}
    elif plan.op_type == "SimplifiedLayerNormalization":
        inputs, wanted = [core_in, scale], {"inv_std": 1}
    elif plan.op_type == "RMSNormalization":
        inputs, wanted = [core_in, scale], {}
    else:
        inputs = [core_in, scale] + ([bias] if bias is not None else [])
        wanted = {"mean": 1, "inv_std": 2}
    requested = {key: index for key, index in wanted.items() if getattr(spec, key) is not None}
    n_outputs = 1 + max(requested.values(), default=0)
    outputs = op.op(plan.op_type, *inputs, _domain=plan.domain, _version=plan.version, _outputs=n_outputs, **attrs)
    outputs = [outputs] if isinstance(outputs, ir.Value) else list(outputs)
    # The remaining steps, each in float32 and rounded where the graph rounds.
    y, y_type = outputs[0], plan.core_type
    roundings = _roundings(spec)
    if y_type == _FLOAT and roundings[plan.folded] != _FLOAT:
        y_type = roundings[plan.folded]
        y = op.Cast(y, to=y_type)
    for index in range(plan.folded, len(steps)):
        name, param = steps[index]
        rounding = roundings[index + 1]
        param_type = _dtype(param)
        if y_type == param_type == rounding and rounding != _BF16:
            y = op.Mul(y, param) if name == "scale" else op.Add(y, param)
        else:
            a, b = _cast(op, y, _FLOAT, y_type), _cast(op, param, _FLOAT, param_type)
            y = op.Mul(a, b) if name == "scale" else op.Add(a, b)
            y = _cast(op, y, rounding, _FLOAT)
        y_type = rounding
    y = _cast(op, y, spec.attrs.output_type or x_type, y_type)
    if plan.fused_skip and spec.sum is not None:
        sum_value = outputs[requested["sum"]]
    results = [y]
    if spec.sum is not None:
        assert sum_value is not None
        results.append(sum_value)
    for key in ("mean", "inv_std"):
        if getattr(spec, key) is not None:
            results.append(outputs[requested[key]])
    return results
