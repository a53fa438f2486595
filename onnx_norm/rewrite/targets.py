"""Turns a matched norm (`NormSpec`) into nodes for one target.

- `onnx-norm`: one of our ops (domain `onnx_norm`, docs/ops.md), every attribute set explicitly.
- `onnx`: standard `LayerNormalization` (opset >= 17) / `RMSNormalization` (opset >= 23), whose semantics are
  their ONNX function bodies: statistics in float32 (stash_type 1), the normalised value rounded to the op's type
  T, then the scale multiply and bias add in T. A residual becomes an `Add` in front of the op.
- `ort`: ONNX Runtime's `LayerNormalization` (its contrib version below opset 17), `SimplifiedLayerNormalization`,
  and the com.microsoft `SkipLayerNormalization` / `SkipSimplifiedLayerNormalization`. Their kernels compute in
  float32 and round once, to the output type; the Skip ops normalise the unrounded sum, so they only take float32
  residuals (a float16/bfloat16 residual becomes an `Add` in front of the norm, as in the graph, and is widened
  to float32 in front of an op computing in float32: `_widen_sum`).

A fused op must reproduce the graph it replaces, including where the graph rounds to float16/bfloat16
(`normalized_type`, `multiply_type`, `output_type`). For `onnx` and `ort` the planner folds into the op as many
of the scale and bias steps as its rounding allows, and computes the rest with explicit `Mul`/`Add`/`Cast` nodes
that round exactly where the graph does (float32 arithmetic, then a Cast; docs/ops.md explains why this
reproduces a native float16/bfloat16 op). Casting float16/bfloat16 to float32 is exact, so an op can always run
in float32 on cast inputs. Where no exact form exists `unsupported_reason` says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import FLOAT_TYPES, is_onnx_domain, onnx_opset, type_name
from onnx_norm.ops.functions import MIN_BODY_OPSET
from onnx_norm.ops.schema import DOMAIN, MS_DOMAIN, OPSET_VERSION, NativeOp, OpSignature, native_ops, op_for
from onnx_norm.rewrite import family
from onnx_norm.rewrite.family import Emitter, Lowering
from onnx_norm.rewrite.spec import NormSpec, elem_type, row_group_dims

#: Key of the metadata property naming the rule that produced a node.
RULE_METADATA_KEY = "onnx_norm.rule"

#: Emit Y in X's type where an exact Cast gives the graph's Y type. The library honours output_type only where
#: ONNX Runtime takes a custom op's output type from its shape inference, which needs X's rank known and a recent
#: runtime (1.31 does; 1.21 may not); the kernel refuses the node elsewhere. Nodes that need another Y type are
#: emitted as the op and a Cast where that is exact (the graph rounds to X's type last, or X is float32), and a
#: float32 Y from a narrower X as the op on X cast to float32 (exact: widening is, and the kernels compute from the
#: widened X). Only where neither form exists (a Skip op with a float32 Y from float16 X and Skip, whose Sum keeps
#: X's type; a Y of another narrow type) does the op carry output_type, and only when X's rank is known
#: (`_honours_output_type`).
LIBRARY_TYPES_Y_LIKE_X = True

_FLOAT = int(ir.DataType.FLOAT)
_BF16 = int(ir.DataType.BFLOAT16)
_INT64_MAX = np.iinfo(np.int64).max
#: How messages list the element types the ops take ("fp32, fp16 or bf16").
FLOAT_TYPE_LIST = ", ".join(type_name(t) for t in FLOAT_TYPES[:-1]) + f" or {type_name(FLOAT_TYPES[-1])}"


def _float_if_unset(elem_type: int) -> int:
    return elem_type or _FLOAT


# --------------------------------------------------------------------------------------------------------------
# Core ops and plans: which op computes the norm core, in which type, how many of the scale/bias steps it folds in.


#: An op that computes a norm core: its name and opset, and how it is called (the op records' native ops).
CoreOp = NativeOp


@dataclasses.dataclass(frozen=True)
class _Plan:
    core: CoreOp | OpSignature
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


def _common_reason(spec: NormSpec) -> str | None:
    """What no built-in op takes: other element types, a bias or mean on an RMS norm, a negative axis."""
    if spec.x_type not in FLOAT_TYPES:
        return f"input element type {type_name(spec.x.dtype)} is not {FLOAT_TYPE_LIST}"
    for name, value in (("skip", spec.skip), ("scale", spec.scale), ("bias", spec.bias)):
        if value is not None and elem_type(value) not in FLOAT_TYPES:
            return f"{name} element type {type_name(value.dtype)} is not {FLOAT_TYPE_LIST}"
    if spec.skip is not None and elem_type(spec.skip) != spec.x_type:
        return "the residual addends have different element types"
    for name, elem in (
        ("normalized_type", spec.attrs.normalized_type),
        ("multiply_type", spec.attrs.multiply_type),
        ("output_type", spec.attrs.output_type),
    ):
        if elem and elem not in FLOAT_TYPES:
            return f"{name} {elem} is not {FLOAT_TYPE_LIST}"
    if "mean" not in family.get(spec.kind).outputs and (spec.bias is not None or spec.mean is not None):
        return "an RMS norm has no bias and no mean"
    if spec.sum is not None and spec.skip is None:
        return "a residual sum output needs a residual input"
    if spec.attrs.axis >= 0:
        return f"axis must be negative (counted from the end), got {spec.attrs.axis}"
    return None


# Rounding models: whether an op computing the core and the first `folded` steps in `core_type` rounds where the
# graph does (the part of `_exact` that differs between targets).


def _rounds_after_each_step(spec: NormSpec, folded: int, core_type: int) -> bool:
    """ONNX's ops round to their type after normalising and after each folded step (their function bodies)."""
    roundings = _roundings(spec)
    if any(r != core_type for r in roundings[:folded]):
        return False
    return roundings[folded] == core_type or core_type == _FLOAT


def _rounds_once(spec: NormSpec, folded: int, core_type: int) -> bool:
    """ONNX Runtime's kernels round once, to the op's output type, after the last folded step: the graph must not
    round before that, and round there to that type (or round nowhere before the final output Cast)."""
    roundings = _roundings(spec)
    if any(r != _FLOAT for r in roundings[:folded]):
        return False
    last = folded == len(_steps(spec))
    final_type = spec.attrs.output_type or spec.x_type
    gemma = last and roundings[folded] == _FLOAT and core_type == final_type
    return core_type in (roundings[folded], _FLOAT) or gemma


def _exact(
    spec: NormSpec, core: CoreOp, rounds: Callable[[NormSpec, int, int], bool], *, folded: int, core_type: int
) -> bool:
    """Whether `core` computing the norm and the first `folded` steps in `core_type` rounds where the graph does;
    after the op, a float32 result can still be rounded where the graph rounds next, with a Cast."""
    if not rounds(spec, folded, core_type):
        return False
    if core.single_type and not _exact_cast(spec.x_type, core_type):
        return False
    if core.takes_skip and core_type != spec.x_type:
        return False
    steps = _steps(spec)[:folded]
    if not all(_exact_cast(elem_type(value), core_type) for _, value in steps):
        return False
    # A per-head or per-group scale ([H, D] normalised over D) is computed by a Mul/Add after the scale-free core:
    # the native ops take one row (ONNX Runtime's CUDA LayerNorm was silently wrong on rank-reduced scales,
    # onnxruntime#28971).
    if any(row_group_dims(value, -spec.attrs.axis) for _, value in steps):
        return False
    # The Skip ops take a 1-D gamma and beta.
    return not (core.takes_skip and folded and any(_rank_of(value) != 1 for _, value in steps))


def _rank_of(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


# --------------------------------------------------------------------------------------------------------------
# Targets


@dataclasses.dataclass(frozen=True)
class Target:
    """One target: the ops it writes for the built-in norm families, and what it asks of a model.

    `plan(spec, opset)` chooses the op and where it rounds (or says why it cannot, as a string) and `emit(op, spec,
    plan)` builds the nodes; `native_ops` are the native norm ops it already has ((domain group, op type), see
    native.py), which the take-over leaves alone; `min_opset` is the default-domain opset its models need;
    `attaches_functions`: its ops need model-local functions to run without our library.
    """

    name: str
    help: str
    plan: Callable[[NormSpec, int], _Plan | str]
    emit: Callable[[Any, NormSpec, _Plan], list[ir.Value]]
    opset_needs: Callable[[Sequence[NormSpec]], dict[str, int]]
    native_ops: frozenset[tuple[str, str]] = frozenset()
    min_opset: int = 0
    min_opset_reason: str = ""
    min_opset_hint: str = ""  # what a user of an older model can do instead
    attaches_functions: bool = False

    def lowering(self) -> Lowering:
        """The lowering of the built-in families for this target; its `prepare` plans once."""
        return _TargetLowering(emit=_emit_planned(self), unsupported=_plan_reason(self), target=self)


@dataclasses.dataclass(frozen=True)
class _TargetLowering(Lowering):
    target: Target | None = None

    def prepare(self, spec: NormSpec, opset: int) -> Emitter | str:
        assert self.target is not None
        target = self.target
        plan = target.plan(spec, opset)
        if isinstance(plan, str):
            return plan
        return lambda op, emitted: target.emit(op, emitted, plan)


def _emit_planned(target: Target) -> Callable[[Any, NormSpec, int], list[ir.Value]]:
    def emit(op: Any, spec: NormSpec, opset: int) -> list[ir.Value]:
        plan = target.plan(spec, opset)
        if isinstance(plan, str):
            raise ValueError(plan)
        return target.emit(op, spec, plan)

    return emit


def _plan_reason(target: Target) -> Callable[[NormSpec, int], str | None]:
    def reason(spec: NormSpec, opset: int) -> str | None:
        plan = target.plan(spec, opset)
        return plan if isinstance(plan, str) else None

    return reason


_TARGETS: dict[str, Target] = {}


def register(target: Target) -> Target:
    _TARGETS[target.name] = target
    return target


def get(name: str) -> Target:
    if name not in _TARGETS:
        raise ValueError(f"unknown target {name!r}; expected one of {', '.join(_TARGETS)}")
    return _TARGETS[name]


def _unknown(name: str) -> str:
    return f"unknown target {name!r}; expected one of {', '.join(_TARGETS)}"


# --------------------------------------------------------------------------------------------------------------
# onnx-norm: our ops, one per (family, residual) (`schema.op_for`), every attribute set explicitly.

#: Our ops' statistic outputs, by the NormSpec field each replaces.
_LIBRARY_OUTPUTS = {"Sum": "sum", "Mean": "mean", "InvStdDev": "inv_std", "InvRMS": "inv_std"}


def _plan_onnx_norm(spec: NormSpec, opset: int) -> _Plan | str:
    reason = _common_reason(spec)
    if reason:
        return reason
    if spec.skip is not None and (spec.mean is not None or spec.inv_std is not None):
        return "the onnx_norm Skip ops have no statistics outputs"
    signature = op_for(spec.kind, spec.skip is not None)
    if signature is None:
        return f"onnx_norm has no op for a {spec.kind} norm{' with a residual' if spec.skip is not None else ''}"
    missing = spec.attrs.unsupported_by(signature)
    if missing:
        return f"{signature.name} has no attribute {', '.join(missing)}"
    other_y = spec.attrs.output_type not in (0, spec.x_type) and not _output_cast(spec)
    if other_y and _honours_output_type(spec):
        return _Plan(signature, 0, False, len(_steps(spec)), False, False)
    widen = LIBRARY_TYPES_Y_LIKE_X and other_y
    if widen and (spec.attrs.output_type != _FLOAT or spec.skip is not None):
        # fp16/bf16 in, fp32 out is X cast to fp32 in front (below); a Skip op's Sum must keep X's rounding.
        why = "X cast to float32 gives Y float32 only" if spec.skip is None else "a Skip op's Sum keeps X's rounding"
        return (
            f"Y must be {type_name(spec.attrs.output_type)} without rounding through the input's "
            f"{type_name(spec.x_type)}, and the onnx_norm library types Y like X ({why})"
        )
    return _Plan(signature, _FLOAT if widen else 0, widen, len(_steps(spec)), False, False)


def _emit_onnx_norm(op: Any, spec: NormSpec, plan: _Plan) -> list[ir.Value]:
    signature = plan.core
    assert isinstance(signature, OpSignature)
    # Y in float32 from a narrower X: the op reads X widened (exact; the kernels widen it anyway) and Y is X's type.
    x = spec.x
    if plan.cast_x:
        x = op.Cast(spec.x, to=_FLOAT)
        x.type, x.shape = ir.TensorType(ir.DataType.FLOAT), spec.x.shape  # the model-local functions read X's type
    given = {"X": x, "Skip": spec.skip, "Scale": spec.scale, "Bias": spec.bias}
    inputs = [given[name] for name in signature.inputs]
    while inputs and inputs[-1] is None:
        inputs.pop()
    outputs_of = {_LIBRARY_OUTPUTS[name]: index for index, name in enumerate(signature.outputs) if index}
    requested = {key: index for key, index in outputs_of.items() if getattr(spec, key) is not None}
    n_outputs = 1 + max(requested.values(), default=0)
    attrs = spec.attrs
    out_cast = _output_cast(spec)
    # output_type equal to X's type is written 0 (the same Y): on the CPU a float16 X runs in float32 between ONNX
    # Runtime's Casts, and an explicit output_type=FLOAT16 would then contradict that float32 Y at load.
    if out_cast or plan.cast_x or attrs.output_type == spec.x_type:
        attrs = dataclasses.replace(attrs, output_type=0)
    outputs = op.op(
        signature.name, *inputs, _domain=DOMAIN, _version=OPSET_VERSION, _outputs=n_outputs, **attrs.as_dict()
    )
    outputs = [outputs] if isinstance(outputs, ir.Value) else list(outputs)
    y = op.Cast(outputs[0], to=out_cast) if out_cast else outputs[0]
    return [y] + [outputs[requested[key]] for key in ("sum", "mean", "inv_std") if key in requested]


def _honours_output_type(spec: NormSpec) -> bool:
    """Y of another type than X's through the op's own `output_type`, where the Cast(X) + op form cannot give it
    (a Skip op, whose Sum keeps X's type, or a Y type other than float32): ONNX Runtime applies the type the op's
    shape inference gives Y, which it can only where X's rank is in the model (docs/ops.md). The Cast(X) + op form
    stays where it is exact: it runs on every runtime.

    A Skip op with a float16 X and a float32 Y reads its addends as the original's residual Add does on each
    provider: on the CPU the library has no float16 X, so ONNX Runtime runs the op in float32 and the addends an op
    computed arrive unrounded, as they reach the original's Add (ONNX Runtime's format-1 SkipLayerNorm-with-Cast
    case with a bias Add in front: 8.4e-7 from the float64 result against the original's 7.2e-7; 0.0047, measured
    when the CPU kernels took float16 and rounded them)."""
    if _rank_of(spec.x) is None:
        return False
    if spec.skip is None:
        return spec.attrs.output_type != _FLOAT
    return True


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


# --------------------------------------------------------------------------------------------------------------
# onnx and ort: standard or contrib ops, with the steps they cannot fold computed around them.


def _core(target: str, spec: NormSpec, opset: int, *, skip: bool = False) -> CoreOp | None:
    """The native op `target` computes `spec`'s norm with (the residual too when `skip`), from the op records."""
    record = op_for(spec.kind, skip)
    return None if record is None else record.native(target, opset)


def _onnx_core(spec: NormSpec, opset: int) -> CoreOp | None:
    return _core("onnx", spec, opset)


def _ort_core(spec: NormSpec, opset: int) -> CoreOp | None:
    return _core("ort", spec, opset)


def _ort_skip(spec: NormSpec, opset: int) -> CoreOp | None:
    """ORT's Skip ops normalise the last dim of a 2-D or 3-D input, and normalise the unrounded sum: only a float32
    residual is rounded the same way as the graph's Add."""
    fits = spec.x_type == _FLOAT and _rank_of(spec.x) in (2, 3) and spec.attrs.axis == -1
    return _core("ort", spec, opset, skip=True) if spec.skip is not None and fits else None


def _standard_planner(
    core_op: Callable[[NormSpec, int], CoreOp | None],
    rounds: Callable[[NormSpec, int, int], bool],
    skip_op: Callable[[NormSpec, int], CoreOp | None] = lambda spec, opset: None,
) -> Callable[[NormSpec, int], _Plan | str]:
    def plan(spec: NormSpec, opset: int) -> _Plan | str:
        reason = _common_reason(spec) or spec.attrs.native_reason()
        if reason:
            return reason
        core = core_op(spec, opset)
        if core is None:
            return f"the target has no op for a {spec.kind} norm"
        if opset < core.version:
            return f"{core.op_type} needs default opset >= {core.version}, the model imports opset {opset}"
        if spec.inv_std is not None and "inv_std" not in core.outputs:
            return f"{core.op_type} has no inverse-RMS output"
        fused = skip_op(spec, opset)
        found = _fold(spec, fused or core, rounds, fused is not None)
        if found is not None:
            return found
        if fused is not None:
            # A residual Skip op could not fold what it needs; retry with the residual Add in front.
            retry = plan(dataclasses.replace(spec, skip=None, sum=None), opset)
            if isinstance(retry, str):
                return retry
            widen = retry.cast_x or _widen_sum(spec.x_type, retry.core_type)
            return dataclasses.replace(retry, separate_add=True, cast_x=widen)
        # Unreachable while the op can run in float32 with nothing folded; kept so that a new op's constraints
        # produce a reason rather than a wrong plan.
        return (
            f"{core.op_type} cannot reproduce the graph's rounding (normalized_type="
            f"{type_name(spec.attrs.normalized_type)}, multiply_type={type_name(spec.attrs.multiply_type)}, "
            f"input {type_name(spec.x_type)}, scale {type_name(elem_type(spec.scale))}) exactly"
        )

    return plan


def _fold(spec: NormSpec, core: CoreOp, rounds, fused_skip: bool) -> _Plan | None:
    """The plan folding the most steps into `core`, in the first type that rounds where the graph does."""
    roundings = _roundings(spec)
    x_type = spec.x_type
    final_type = spec.attrs.output_type or x_type
    for folded in range(len(_steps(spec)), -1, -1):
        for core_type in dict.fromkeys([x_type, roundings[folded], final_type, _FLOAT]):
            if _exact(spec, core, rounds, folded=folded, core_type=core_type):
                separate_add = spec.skip is not None and not fused_skip
                cast_x = (core.single_type and x_type != core_type) or (separate_add and _widen_sum(x_type, core_type))
                cast_x = cast_x or _no_kernel_for_x(core, x_type, core_type)
                return _Plan(core, core_type, cast_x, folded, separate_add, fused_skip)
    return None


def _no_kernel_for_x(core: CoreOp, x_type: int, core_type: int) -> bool:
    """A narrow X that the op keeps beside a float32 Y, where its CPU kernels take no such pair (a bfloat16 X of
    ONNX Runtime's SimplifiedLayerNormalization): X is cast to float32 in front instead, exactly."""
    narrow = x_type not in (_FLOAT, *core.narrow_x_with_float_y)
    return not core.single_type and core_type == _FLOAT and narrow


def _widen_sum(x_type: int, core_type: int) -> bool:
    """A narrow residual sum read by an op computing in float32 is widened in front of it, as the graph widened it:
    ONNX Runtime's CPU provider runs the narrow Add in float32 and drops its own Cast back together with ours,
    where an op with a float16 kernel would read the sum rounded (0.0194 from the float64 result against the
    original's 9e-7 on ONNX Runtime's fp16 SkipLayerNorm-with-Cast case). Widening is exact."""
    return core_type == _FLOAT and x_type != _FLOAT


def _cast(op: Any, value: ir.Value, to: int, have: int) -> ir.Value:
    return value if have == to else op.Cast(value, to=to)


def _ones(op: Any, spec: NormSpec, x: ir.Value, elem_type: int, one_dim: bool) -> ir.Value:
    """Ones with the shape of the normalised dims (the last dim only if `one_dim`), for ops that need a scale."""
    n_dims = 1 if one_dim else -spec.attrs.axis
    shape = spec.x.shape
    dims = None if shape is None else list(shape)[-n_dims:]
    if dims is not None and all(isinstance(d, int) for d in dims):
        array = np.ones(dims, np.float32)
        tensor = ir.tensor(array) if elem_type == _FLOAT else ir.tensor(array.astype(_npelem_type(elem_type)))
        return op.Constant(value=tensor)
    norm_shape = op.Slice(
        op.Shape(x),
        op.Constant(value=ir.tensor(np.array([-n_dims], np.int64))),
        op.Constant(value=ir.tensor(np.array([_INT64_MAX], np.int64))),
    )
    ones = op.ConstantOfShape(norm_shape, value=ir.tensor(np.array([1.0], np.float32)))
    return _cast(op, ones, elem_type, _FLOAT)


def _npelem_type(elem_type: int) -> np.dtype:
    return ir.DataType(elem_type).numpy()


def _add(op: Any, a: ir.Value, b: ir.Value, elem_type: int) -> ir.Value:
    """a + b rounded to elem_type, for two values of elem_type. ONNX Runtime's CPU provider has no bfloat16
    Add or Mul, so bfloat16 goes through float32 (the same result, docs/ops.md)."""
    if elem_type != _BF16:
        return op.Add(a, b)
    return op.Cast(op.Add(op.Cast(a, to=_FLOAT), op.Cast(b, to=_FLOAT)), to=_BF16)


def _emit_standard(op: Any, spec: NormSpec, plan: _Plan) -> list[ir.Value]:
    core = plan.core
    assert isinstance(core, CoreOp)
    x, sum_value = spec.x, None
    if plan.separate_add:
        assert spec.skip is not None
        x = sum_value = _add(op, spec.x, spec.skip, spec.x_type)
    core_in = _cast(op, x, plan.core_type, spec.x_type) if plan.cast_x else x
    params = {name: _cast(op, value, plan.core_type, elem_type(value)) for name, value in _steps(spec)[: plan.folded]}
    scale = params.get("scale")
    if scale is None:
        scale = _ones(op, spec, x, plan.core_type, one_dim=core.takes_skip)
    bias = params.get("bias")
    inputs = [core_in, *([spec.skip] if core.takes_skip else []), scale]
    if core.takes_bias and bias is not None:
        inputs.append(bias)
    attrs: dict[str, Any] = {"epsilon": float(spec.attrs.epsilon)}
    if core.axis_attrs:
        attrs["axis"] = spec.attrs.axis
        attrs["stash_type"] = 1
    requested = {key: index for key, index in core.outputs.items() if getattr(spec, key) is not None}
    n_outputs = 1 + max(requested.values(), default=0)
    outputs = op.op(core.op_type, *inputs, _domain=core.domain, _version=core.version, _outputs=n_outputs, **attrs)
    outputs = [outputs] if isinstance(outputs, ir.Value) else list(outputs)
    y = _remaining_steps(op, spec, plan, outputs[0])
    if plan.fused_skip and spec.sum is not None:
        sum_value = outputs[requested["sum"]]
    results = [y]
    if spec.sum is not None:
        assert sum_value is not None
        results.append(sum_value)
    return results + [outputs[requested[key]] for key in ("mean", "inv_std") if getattr(spec, key) is not None]


def _remaining_steps(op: Any, spec: NormSpec, plan: _Plan, y: ir.Value) -> ir.Value:
    """The steps the op did not fold, each in float32 and rounded where the graph rounds, then the output type."""
    y_type = plan.core_type
    roundings = _roundings(spec)
    steps = _steps(spec)
    if y_type == _FLOAT and roundings[plan.folded] != _FLOAT:
        y_type = roundings[plan.folded]
        y = op.Cast(y, to=y_type)
    for index in range(plan.folded, len(steps)):
        name, param = steps[index]
        rounding = roundings[index + 1]
        param_type = elem_type(param)
        if y_type == param_type == rounding and rounding != _BF16:
            y = op.Mul(y, param) if name == "scale" else op.Add(y, param)
        else:
            a, b = _cast(op, y, _FLOAT, y_type), _cast(op, param, _FLOAT, param_type)
            y = op.Mul(a, b) if name == "scale" else op.Add(a, b)
            y = _cast(op, y, rounding, _FLOAT)
        y_type = rounding
    return _cast(op, y, spec.attrs.output_type or spec.x_type, y_type)


# --------------------------------------------------------------------------------------------------------------
# The registered targets


def _library_opsets(specs: Sequence[NormSpec]) -> dict[str, int]:
    return {DOMAIN: OPSET_VERSION} if specs else {}


def _onnx_opsets(specs: Sequence[NormSpec]) -> dict[str, int]:
    cores = [core for core in (_onnx_core(s, 0) for s in specs) if core is not None]
    return {"": max(core.version for core in cores)} if cores else {}


def _native_ops(target: str) -> frozenset[tuple[str, str]]:
    """The native norm ops `target` writes that the built-in take-over reads, as (domain group, op type)."""
    return frozenset(
        ("onnx" if is_onnx_domain(native.domain) else "ms", native.op_type)
        for _, native in native_ops()
        if target in native.targets and native.take_over
    )


def _ort_opsets(specs: Sequence[NormSpec]) -> dict[str, int]:
    return {MS_DOMAIN: 1} if any(s.skip is not None and s.x_type == _FLOAT for s in specs) else {}


ONNX_NORM = register(
    Target(
        "onnx-norm",
        "onnx-norm's fused ops (domain onnx_norm), with model-local functions so the model runs without the library",
        plan=_plan_onnx_norm,
        emit=_emit_onnx_norm,
        opset_needs=_library_opsets,
        min_opset=MIN_BODY_OPSET,
        min_opset_reason=f"the onnx_norm ops' model-local functions need default opset >= {MIN_BODY_OPSET}",
        min_opset_hint=" (the 'ort' target has no such limit)",
        attaches_functions=True,
    )
)
ONNX = register(
    Target(
        "onnx",
        "standard ONNX LayerNormalization (opset >= 17) and RMSNormalization (opset >= 23)",
        plan=_standard_planner(_onnx_core, _rounds_after_each_step),
        emit=_emit_standard,
        opset_needs=_onnx_opsets,
        native_ops=_native_ops("onnx"),
    )
)
ORT = register(
    Target(
        "ort",
        "ONNX Runtime's LayerNormalization, SimplifiedLayerNormalization and com.microsoft Skip ops",
        plan=_standard_planner(_ort_core, _rounds_once, _ort_skip),
        emit=_emit_standard,
        opset_needs=_ort_opsets,
        native_ops=_native_ops("ort"),
    )
)
#: The targets' names, in registration order (the CLI's --target choices).
TARGETS: tuple[str, ...] = tuple(_TARGETS)


# --------------------------------------------------------------------------------------------------------------
# Public API


def standard_lowerings() -> Mapping[str, Lowering]:
    """The lowerings of the built-in LayerNorm and RMSNorm families: every registered target's own, looked up
    when asked (a target registered later is included)."""
    return _TargetLowerings()


class _TargetLowerings(Mapping[str, Lowering]):
    def __getitem__(self, name: str) -> Lowering:
        return _TARGETS[name].lowering()

    def __iter__(self) -> Iterator[str]:
        return iter(_TARGETS)

    def __len__(self) -> int:
        return len(_TARGETS)


def prepare(spec: NormSpec, target: str, opset: int) -> Emitter | str:
    """Checks `spec` for `target` in a model of default-domain opset `opset` (0: unknown) once: why it cannot be
    emitted exactly, or the emitter to call with a builder and the spec (emit(..., prepared=))."""
    if target not in _TARGETS:
        return _unknown(target)
    chosen = _TARGETS[target]
    if chosen.min_opset and opset and opset < chosen.min_opset:
        return f"{chosen.min_opset_reason}, the model imports {opset}{chosen.min_opset_hint}"
    if spec.x_type == _BF16 and opset and opset < 13:
        return "bfloat16 needs default opset >= 13"
    lowering = family.get(spec.kind).lowering(target)
    return lowering if isinstance(lowering, str) else lowering.prepare(spec, opset)


def unsupported_reason(spec: NormSpec, target: str, opset_imports: Mapping[str, int]) -> str | None:
    """Why `spec` cannot be emitted exactly for `target` in a model with these opset imports; None if it can."""
    prepared = prepare(spec, target, onnx_opset(opset_imports) or 0)
    return prepared if isinstance(prepared, str) else None


def opset_requirements(target: str, specs: Sequence[NormSpec]) -> dict[str, int]:
    """The minimum opset imports the nodes emitted for `specs` need (a model importing a higher version keeps it;
    the default-domain opset is never raised by us, `unsupported_reason` refuses instead)."""
    return get(target).opset_needs(specs)


def emit(
    op: Any, spec: NormSpec, target: str, opset: int | None = None, *, prepared: Emitter | None = None
) -> list[ir.Value]:
    """Builds the nodes for `spec` with the builder `op` (builder.Builder, or onnxscript's rewriter builder);
    returns the values replacing `spec.replaced()`.

    `opset` is the model's default-domain opset (it picks between ORT's contrib and the standard
    LayerNormalization); by default the opset imported by the graph holding spec.x, else 17. `prepared`: what
    `prepare` returned for this spec (the check is not repeated). Raises ValueError when the spec cannot be
    emitted exactly (check `unsupported_reason` first).
    """
    if prepared is None:
        if opset is None:
            graph = spec.x.graph
            opset = (onnx_opset(graph.opset_imports) if graph is not None else None) or 17
        checked = prepare(spec, target, opset)
        if isinstance(checked, str):
            raise ValueError(f"cannot emit {spec.kind} norm for target {target!r}: {checked}")
        prepared = checked
    return _finish(prepared(op, spec), spec)


def _finish(results: list[ir.Value], spec: NormSpec) -> list[ir.Value]:
    """The new values typed and shaped as the ones they replace where the builder left that open, their nodes
    tagged with the rule."""
    for new, old in zip(results, spec.replaced(), strict=True):
        if new.type is None and old.type is not None:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
    _tag(results, spec.rule)
    return results


def emit_transposed(
    op: Any, perm: Sequence[int], spec: NormSpec, target: str, *, prepared: Emitter | None = None
) -> list[ir.Value]:
    """A norm over non-trailing axes (`perm`: the Transpose that moves them last, `spec.attrs.axis` counted in that
    layout): written by the target's lowering in X's own layout where it can (`Lowering.in_layout`: a native op
    that takes any one axis), else X (and Skip) transposed, the target's op, and Y transposed back. The
    one home of channels-first emission: the rewrite's channels-first matches and the native take-over use it."""
    lowering = family.get(spec.kind).lowering(target) if target else None
    if isinstance(lowering, Lowering) and lowering.in_layout is not None:
        made = lowering.in_layout(op, spec, tuple(perm))
        if made is not None:
            return _finish(made, spec)
    inverse = [int(i) for i in np.argsort(perm)]
    x_t = op.Transpose(spec.x, perm=list(perm))
    skip_t = None if spec.skip is None else op.Transpose(spec.skip, perm=list(perm))
    if spec.x.dtype is not None:
        x_t.type = ir.TensorType(spec.x.dtype)
    y_t = ir.Value(name=None, type=spec.y.type)
    transposed = dataclasses.replace(spec, x=x_t, skip=skip_t, y=y_t)
    results = emit(op, transposed, target, prepared=prepared)
    return [op.Transpose(results[0], perm=inverse), *results[1:]]


def _tag(results: Sequence[ir.Value], rule: str) -> None:
    """Records the rule on every node the builder made (they have no graph yet)."""
    seen: set[ir.Node] = set()
    stack = [v.producer() for v in results]
    while stack:
        node = stack.pop()
        if node is None or node.graph is not None or node in seen:
            continue
        seen.add(node)
        node.metadata_props[RULE_METADATA_KEY] = rule
        stack.extend(v.producer() for v in node.inputs if v is not None)
