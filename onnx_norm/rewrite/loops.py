"""Loop bodies as the matchers need them: typed inputs, and the loop-carried values that never change.

tf2onnx writes a TensorFlow while loop as a `Loop` whose body declares its inputs without shapes, and passes every
tensor the body reads (a LayerNorm's gamma and beta among them) through as a loop-carried value that the body
returns unchanged (`Identity(gamma_in)`). onnx's shape inference then knows nothing inside the body (a norm there
has an input of unknown rank) nor after the Loop. Here:

- a loop-carried body input without a shape takes the shape of the value the Loop starts it with: exact for an
  input the body returns unchanged (every iteration sees that value); for one the body changes, an assumption that
  shape inference then checks (the body must return it with the same shape, so by induction every iteration sees
  it); where the body keeps the rank but changes a dim (a state grown along the sequence), narrowed to the rank and
  the dims it keeps, and checked again; taken back when not even the rank holds;
- an input the body returns unchanged is marked loop-invariant: a scale or bias read from it is a parameter the
  fused op reads at run time, like a graph input (constants.is_runtime_parameter).

`Scan` bodies (opset >= 9) get the same marking for their state variables: state `i` is body input `i` and comes
back as body output `i`. onnx's inference types a Scan body's inputs from the Scan's own, so they need no more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator

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
    # Dims the assumption was narrowed to leave unknown (`check`); inference names them (`unk__0`), which says
    # nothing about their size.
    unknown: set[int] = dataclasses.field(default_factory=set)


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


def check(assumed: list[Assumed], *, narrow: bool = True) -> tuple[list[Assumed], bool]:
    """Checks each assumed shape against the shape the body returns its input with (by induction, what every
    iteration sees): it holds when the body returns the input's rank with each of its known dims. Where the body
    keeps the rank but not every dim (a state that grows along the sequence), the assumption is narrowed with
    `narrow` to the rank and the dims the body keeps (`_agreed`; the next round of inference checks it again);
    otherwise it is taken back. Either way what inference derived from it goes too. Returns the assumptions still
    standing and whether any changed (inference should run again)."""
    standing: list[Assumed] = []
    changed = False
    for entry in assumed:
        inner = entry.body.inputs[entry.index]
        returned = entry.body.outputs[entry.index - 1]
        if _holds(inner.shape, returned.shape, entry.unknown):
            standing.append(entry)
            continue
        agreed = _agreed(inner.shape, returned.shape, entry.unknown) if narrow else None
        for value, shape in entry.before.items():
            value.shape = shape
        inner.shape = agreed
        if agreed is not None:
            entry.unknown = {i for i, dim in enumerate(agreed) if not _known(dim)}
            standing.append(entry)
        changed = True
    return standing, changed


def _known(dim: object) -> bool:
    return isinstance(dim, int) or getattr(dim, "value", None) is not None


def _holds(assumed: ir.Shape | None, returned: ir.Shape | None, unknown: Collection[int] = ()) -> bool:
    """Whether a value of shape `returned` has every dim `assumed` knows (the same rank; unknown dims, and those at
    the positions `unknown`, match anything)."""
    if assumed is None or returned is None or len(assumed) != len(returned):
        return False
    pairs = enumerate(zip(assumed, returned, strict=True))
    return all(i in unknown or not _known(p) or p == q for i, (p, q) in pairs)


def _agreed(assumed: ir.Shape | None, returned: ir.Shape | None, unknown: Collection[int] = ()) -> ir.Shape | None:
    """The shape of both: `assumed`'s rank, its static or named dims where `returned` has the same, unknown dims
    elsewhere (and at the positions `unknown`); None when the ranks differ or either shape is unknown."""
    if assumed is None or returned is None or len(assumed) != len(returned):
        return None
    pairs = enumerate(zip(assumed, returned, strict=True))
    return ir.Shape([p if i not in unknown and _known(p) and p == q else None for i, (p, q) in pairs])


def loop_output_shapes(model: ir.Model) -> bool:
    """Gives a Loop's outputs without a (full) shape the shape the body keeps them in (onnx's inference of Loop often
    leaves them unknown, and a norm after the Loop then has an input of unknown rank): a loop-carried output has the
    rank and the dims that its body input and what the body returns have in common (zero iterations return the
    initial value, which has the body input's shape; a state the body grows along one dim keeps its rank and the
    other dims); a scan output is the body's per-iteration value stacked along a new first dim (the iteration
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
                # Zero iterations give the initial value (which has the body input's shape), others what the body
                # returns: the dims both have, in the rank they share.
                agreed = _agreed(body.inputs[index + 2].shape, returned.shape)
                if agreed is None:
                    continue
                shape = agreed
            else:
                shape = ir.Shape([None, *returned.shape])
            if output.shape is not None and (len(output.shape) != len(shape) or _holds(shape, output.shape)):
                continue  # inference says otherwise, or knows as much: keep what it says
            output.shape = shape
            if output.type is None and returned.type is not None:
                output.type = returned.type
            changed = True
    return changed


def is_invariant(value: ir.Value) -> bool:
    return bool(value.meta.get(INVARIANT_KEY))


def is_body_input(value: ir.Value) -> bool:
    return bool(value.meta.get(BODY_INPUT_KEY))
