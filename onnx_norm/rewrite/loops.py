"""Loop bodies as the matchers need them: typed inputs, and the loop-carried values that never change.

tf2onnx writes a TensorFlow while loop as a `Loop` whose body declares its inputs without shapes, and passes every
tensor the body reads (a LayerNorm's gamma and beta among them) through as a loop-carried value that the body
returns unchanged (`Identity(gamma_in)`). onnx's shape inference then knows nothing inside the body (a norm there
has an input of unknown rank) nor after the Loop. Here:

- a loop-carried body input without a shape takes the shape of the value the Loop starts it with: exact for an
  input the body returns unchanged (every iteration sees that value); for one the body changes, an assumption that
  shape inference then checks (the body must return it with the same shape, so by induction every iteration sees
  it), taken back when it does not hold;
- an input the body returns unchanged is marked loop-invariant: a scale or bias read from it is a parameter the
  fused op reads at run time, like a graph input (constants.is_runtime_parameter).

`Scan` bodies (opset >= 9) get the same marking for their state variables: state `i` is body input `i` and comes
back as body output `i`. onnx's inference types a Scan body's inputs from the Scan's own, so they need no more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain

#: Value.meta key set on a Loop body input that every iteration sees unchanged.
INVARIANT_KEY = "onnx_norm.loop_invariant"
#: Value.meta key set on every input of a Loop or Scan body (the iteration count, the condition, the loop-carried
#: values, a Scan's states and scan inputs): what a body input holds can change from one iteration to the next.
BODY_INPUT_KEY = "onnx_norm.body_input"


@dataclasses.dataclass
class Assumed:
    """A body input given the shape of the Loop's initial value although the body computes its next value."""

    body: ir.Graph
    index: int  # of the body input; the body returns its next value as output `index - 1`
    before: dict[ir.Value, ir.Shape | None]  # the body's value shapes before inference used the assumption


def _loops(model: ir.Model) -> Iterator[tuple[ir.Node, ir.Graph]]:
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            body = node.attributes.get("body")
            if (
                node.op_type == "Loop"
                and is_onnx_domain(node.domain)
                and isinstance(getattr(body, "value", None), ir.Graph)
            ):
                yield node, body.value  # type: ignore[union-attr]


def _scans(model: ir.Model) -> Iterator[tuple[ir.Node, ir.Graph, int]]:
    """(Scan node, body, number of state variables) for every opset >= 9 Scan: its inputs are the states then the
    scan inputs, as the body's are (opset 8's has a sequence_lens input first and a batch dim)."""
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            body = node.attributes.get("body")
            scan_inputs = node.attributes.get("num_scan_inputs")
            if (
                node.op_type == "Scan"
                and is_onnx_domain(node.domain)
                and isinstance(getattr(body, "value", None), ir.Graph)
                and scan_inputs is not None
                and len(body.value.inputs) == len(node.inputs)  # type: ignore[union-attr]
            ):
                yield node, body.value, len(node.inputs) - int(scan_inputs.value)  # type: ignore[union-attr]


def returned_unchanged(body: ir.Graph, index: int) -> bool:
    """Whether the Loop body returns its loop-carried input `index` as it is (directly or through Identity)."""
    return index >= 2 and _returns_input(body, index, index - 1)


def _returns_input(body: ir.Graph, index: int, output: int) -> bool:
    """Whether body output `output` is body input `index` itself, directly or through Identity nodes."""
    if output >= len(body.outputs) or index >= len(body.inputs):
        return False
    value: ir.Value | None = body.outputs[output]
    for _ in range(8):
        if value is body.inputs[index]:
            return True
        node = None if value is None else value.producer()
        if node is None or node.op_type != "Identity" or not is_onnx_domain(node.domain) or node.graph is not body:
            return False
        value = node.inputs[0]
    return False


def type_bodies(model: ir.Model) -> tuple[list[Assumed], bool]:
    """Marks the loop-invariant body inputs and gives loop-carried body inputs without a shape the shape of the
    Loop's initial value; returns the assumptions to check after shape inference (`check`) and whether any type
    or shape was set."""
    assumed = []
    typed = False
    for loop, body in _loops(model):
        for value in body.inputs:
            value.meta[BODY_INPUT_KEY] = True
        for index in range(2, min(len(body.inputs), len(loop.inputs))):
            inner, outer = body.inputs[index], loop.inputs[index]
            if outer is None:
                continue
            invariant = returned_unchanged(body, index)
            if invariant:
                inner.meta[INVARIANT_KEY] = True
            if inner.type is None and outer.type is not None:
                inner.type = outer.type
                typed = True
            if inner.shape is not None or outer.shape is None:
                continue
            typed = True
            if not invariant:
                before = {v: v.shape for node in ir.traversal.RecursiveGraphIterator(body) for v in node.outputs}
                assumed.append(Assumed(body, index, before))
            inner.shape = ir.Shape(list(outer.shape))
    for _, body, states in _scans(model):
        for value in body.inputs:
            value.meta[BODY_INPUT_KEY] = True
        for index in range(states):
            if _returns_input(body, index, index):
                body.inputs[index].meta[INVARIANT_KEY] = True
    return assumed, typed


def check(assumed: list[Assumed]) -> bool:
    """Takes back each assumed shape the body does not return its input with (and what inference derived from
    it); True when any was taken back (inference should run again)."""
    changed = False
    for entry in assumed:
        inner = entry.body.inputs[entry.index]
        returned = entry.body.outputs[entry.index - 1]
        if _same_dims(returned.shape, inner.shape):
            continue
        inner.shape = None
        for value, shape in entry.before.items():
            value.shape = shape
        changed = True
    return changed


def loop_output_shapes(model: ir.Model) -> bool:
    """Gives a Loop's outputs without a shape the shape the body keeps them in (onnx's inference of Loop often
    leaves them unknown, and a norm after the Loop then has an input of unknown rank): a loop-carried output has its
    body input's shape when the body returns it with that shape (zero iterations return the initial value, which
    has it too); a scan output is the body's per-iteration value stacked along a new first dim (the iteration
    count, left unnamed). True when any shape was set (inference should run again)."""
    changed = False
    for loop, body in _loops(model):
        carried = len(body.inputs) - 2
        for index, output in enumerate(loop.outputs):
            if output.shape is not None and not any(not isinstance(d, int) and d.value is None for d in output.shape):
                continue
            returned = body.outputs[index + 1] if index + 1 < len(body.outputs) else None
            if returned is None or returned.shape is None:
                continue
            if index < carried:
                inner = body.inputs[index + 2]
                if not _same_dims(returned.shape, inner.shape):
                    continue
                shape = ir.Shape(list(inner.shape))  # type: ignore[arg-type]
            else:
                shape = ir.Shape([None, *returned.shape])
            if output.shape is not None and len(output.shape) != len(shape):
                continue  # inference says otherwise: keep what it says
            output.shape = shape
            if output.type is None and returned.type is not None:
                output.type = returned.type
            changed = True
    return changed


def _same_dims(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    """Equal static or named dims (an anonymous dim may be any size, so it equals nothing)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(
        (isinstance(p, int) and p == q) or (not isinstance(p, int) and p.value is not None and p == q)
        for p, q in zip(a, b, strict=True)
    )


def is_invariant(value: ir.Value) -> bool:
    return bool(value.meta.get(INVARIANT_KEY))


def is_body_input(value: ir.Value) -> bool:
    return bool(value.meta.get(BODY_INPUT_KEY))
