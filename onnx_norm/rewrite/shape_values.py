"""The values of the small integer tensors that exporters compute shapes with (`Shape`, `Gather`, `Concat`,
`Div`, ...), element by element, each a number, a named dim of the model, or unknown; and the shapes of the
`Reshape`s and `Expand`s they feed (`give_shapes`), where onnx's inference left them vague.

TorchScript writes `x.view(*x.shape[:-1], groups, x.shape[-1] // groups)` as `Shape(x) -> Gather -> Div -> Cast ->
Unsqueeze -> Concat -> Reshape`; onnx's data propagation stops at the `Div` and leaves the group dim unknown, and so
the dims after the view back. Evaluated here, `Shape(x)` gives x's dims (`b`, `s`, 128), the `Div` of the static one
gives 2, and the Reshape's output gets `[b, s, 2, 64]`: exact, as every step computes what the runtime computes on
the dims it has, and a dim whose value depends on a runtime value it does not know stays unknown.

A view also holds as many elements as its input, which gives one element of its target that no arithmetic gives
(dynamo's group count `2 * Min(s, P) // s`) and one dim of its input that no inference sized (a scan output viewed
`[b, s, -1]`, then `[b, s, 2, 32]`). And the dims onnx's inference once named `unk__N` (which its later rounds keep)
get the names their inputs carry through element-wise ops, reductions, `Split` and `MatMul` (`_carried_dims`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.reductions import REDUCTIONS, reduction_axes

logger = logging.getLogger(__name__)

#: One element: a number, a named dim (the model's dim_param, or the `unk__N` onnx's inference gave a dim it could not
#: size: one name is one size), or unknown.
Element = int | float | str | None


class _Tensor:
    """A shape tensor's elements, and whether it is a scalar (rank 0) or a vector (rank 1)."""

    __slots__ = ("elements", "scalar")

    def __init__(self, elements: list[Element], scalar: bool = False) -> None:
        self.elements = elements
        self.scalar = scalar and len(elements) == 1


#: The longest shape tensor evaluated (a shape has at most a few dozen dims).
_MAX_ELEMENTS = 64
#: How far back from a Reshape the evaluation follows its target's computation.
_MAX_DEPTH = 24


def dim_element(dim: int | ir.SymbolicDim) -> Element:
    """A dim of a shape as an element: its size, its name, or None for a dim without either."""
    if isinstance(dim, int):
        return dim
    return None if dim.value is None else str(dim.value)


def _inferred_name(element: Element) -> bool:
    """A name onnx's inference made up for a dim it could not size (`unk__N`): known only as itself."""
    return isinstance(element, str) and element.startswith("unk__")


class ShapeValues:
    """Evaluates integer tensors computed from `Shape` and constants, once each (`of`)."""

    def __init__(self) -> None:
        self._seen: dict[ir.Value, _Tensor | None] = {}

    def of(self, value: ir.Value | None, depth: int = 0) -> _Tensor | None:
        """The elements of `value`, or None when it is not a shape tensor this can follow."""
        if value is None or depth > _MAX_DEPTH:
            return None
        if value in self._seen:
            return self._seen[value]
        found = self._constant(value) or self._computed(value, depth) or _unknown_elements(value)
        if found is not None and len(found.elements) > _MAX_ELEMENTS:
            found = None
        self._seen[value] = found
        return found

    @staticmethod
    def _constant(value: ir.Value) -> _Tensor | None:
        if value.dtype is None or (value.dtype.is_floating_point() and value.producer() is None):
            return None
        array = constants.constant_array(value)
        if array is None or array.ndim > 1 or array.size > _MAX_ELEMENTS or array.dtype.kind not in "iuf":
            return None
        return _Tensor(array.reshape(-1).tolist(), scalar=array.ndim == 0)

    def _computed(self, value: ir.Value, depth: int) -> _Tensor | None:
        node = value.producer()
        if node is None or not is_onnx_domain(node.domain) or len(node.outputs) != 1:
            return None
        if node.op_type == "Shape":
            return _shape(node)
        step = _STEPS.get(node.op_type)
        if step is None:
            return None
        inputs = [self.of(v, depth + 1) if v is not None else None for v in node.inputs]
        try:
            return step(node, inputs)
        except (IndexError, KeyError, ValueError, TypeError, ZeroDivisionError, OverflowError):
            return None  # an index out of range, a missing attribute: not a value this can give


def _unknown_elements(value: ir.Value) -> _Tensor | None:
    """An integer scalar or vector of static length whose elements this cannot follow: that many unknowns (a
    target's other elements still count)."""
    if value.dtype is None or value.dtype.is_floating_point() or value.shape is None or len(value.shape) > 1:
        return None
    if not value.shape:
        return _Tensor([None], scalar=True)
    size = value.shape[0]
    return _Tensor([None] * size) if isinstance(size, int) and size <= _MAX_ELEMENTS else None


def _shape(node: ir.Node) -> _Tensor | None:
    source = node.inputs[0]
    if source is None or source.shape is None:
        return None
    dims = [dim_element(d) for d in source.shape]
    # Python's slice is ONNX's start/end: a negative one counts from the end, both clamp to the rank.
    return _Tensor(dims[_attr(node, "start", 0) : _attr(node, "end", len(dims))])


def _attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def _ints(tensor: _Tensor | None) -> list[int] | None:
    if tensor is None or not all(isinstance(e, int) for e in tensor.elements):
        return None
    return [int(e) for e in tensor.elements]  # type: ignore[arg-type]


def _identity(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    return inputs[0]


def _cast(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    source = inputs[0]
    to = ir.DataType(int(node.attributes["to"].value))
    if source is None or to == ir.DataType.BOOL:
        return None
    if to.is_floating_point():
        return _Tensor([float(e) if isinstance(e, int | float) else e for e in source.elements], source.scalar)
    # Cast to an integer type truncates toward zero, as the runtime does.
    elements = [int(e) if isinstance(e, float) and math.isfinite(e) else e for e in source.elements]
    return _Tensor([None if isinstance(e, float) else e for e in elements], source.scalar)


def _gather(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    data, indices = inputs[0], _ints(inputs[1]) if len(inputs) > 1 else None
    if data is None or data.scalar or indices is None or _attr(node, "axis", 0) != 0:
        return None
    size = len(data.elements)
    picked = [data.elements[i + size if i < 0 else i] for i in indices]
    return _Tensor(picked, scalar=inputs[1] is not None and inputs[1].scalar)


def _slice(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    data = inputs[0]
    starts, ends = _ints(inputs[1]), _ints(inputs[2])
    axes = _ints(inputs[3]) if len(inputs) > 3 and node.inputs[3] is not None else [0]
    steps = _ints(inputs[4]) if len(inputs) > 4 and node.inputs[4] is not None else [1]
    if data is None or data.scalar or not starts or not ends or axes not in ([0], [-1]) or steps is None:
        return None
    return _Tensor(data.elements[slice(starts[0], ends[0], steps[0])])


def _concat(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    if any(t is None or t.scalar for t in inputs):
        return None
    return _Tensor([e for t in inputs for e in t.elements])  # type: ignore[union-attr]


def _unsqueeze(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    source = inputs[0]
    axes = _ints(inputs[1]) if len(inputs) > 1 else [int(a) for a in node.attributes["axes"].value]
    if source is None or not source.scalar or axes not in ([0], [-1]):
        return None
    return _Tensor(source.elements)


def _squeeze(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    source = inputs[0]
    if source is None or source.scalar or len(source.elements) != 1:
        return None
    return _Tensor(source.elements, scalar=True)


def _reshape_1d(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
    """A Reshape between a scalar and a one-element vector (dynamo's `Reshape(floordiv, [1])`)."""
    source, target = inputs[0], _ints(inputs[1])
    if source is None or target is None or len(source.elements) != 1 or target not in ([], [1], [-1]):
        return None
    return _Tensor(source.elements, scalar=not target)


_Step = Callable[[ir.Node, list[_Tensor | None]], _Tensor | None]


def _binary(combine: Callable[[Element, Element], Element]) -> _Step:
    def step(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
        a, b = inputs[0], inputs[1] if len(inputs) > 1 else None
        if a is None or b is None:
            return None
        n = max(len(a.elements), len(b.elements))
        if len(a.elements) not in (1, n) or len(b.elements) not in (1, n):
            return None
        pairs = [(a.elements[i % len(a.elements)], b.elements[i % len(b.elements)]) for i in range(n)]
        return _Tensor([combine(x, y) for x, y in pairs], scalar=a.scalar and b.scalar)

    return step


def _add(x: Element, y: Element) -> Element:
    if isinstance(x, int | float) and isinstance(y, int | float):
        return x + y
    return x if y == 0 else y if x == 0 else None


def _sub(x: Element, y: Element) -> Element:
    if isinstance(x, int | float) and isinstance(y, int | float):
        return x - y
    return x if y == 0 else None


def _mul(x: Element, y: Element) -> Element:
    if isinstance(x, int | float) and isinstance(y, int | float):
        return x * y
    return x if y == 1 else y if x == 1 else None


def _div(x: Element, y: Element) -> Element:
    if isinstance(x, int) and isinstance(y, int) and y != 0:
        quotient = abs(x) // abs(y)  # integer Div truncates toward zero
        return quotient if (x >= 0) == (y > 0) else -quotient
    if isinstance(x, int | float) and isinstance(y, int | float) and y != 0:
        return x / y
    return x if y == 1 else None


def _rounding(round_to: Callable[[float], int]) -> _Step:
    def step(node: ir.Node, inputs: list[_Tensor | None]) -> _Tensor | None:
        source = inputs[0]
        if source is None:
            return None
        rounded = [float(round_to(e)) if isinstance(e, float) else e for e in source.elements]
        return _Tensor(rounded, source.scalar)

    return step


_STEPS: dict[str, _Step] = {
    "Identity": _identity,
    "Cast": _cast,
    "Gather": _gather,
    "Slice": _slice,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape_1d,
    "Add": _binary(_add),
    "Sub": _binary(_sub),
    "Mul": _binary(_mul),
    "Div": _binary(_div),
    "Floor": _rounding(math.floor),
    "Ceil": _rounding(math.ceil),
}


def reshaped_dims(source: list[Element], target: list[Element], allowzero: bool) -> list[Element] | None:
    """The dims of `Reshape(x, target)` for x of dims `source`: 0 copies x's dim (unless `allowzero`), one -1 (or
    the one element not known) takes what is left, found by cancelling the named dims both sides have and dividing
    the sizes; None when the target is no valid one. (Where x is empty the runtime takes any size there, and every
    element-wise reader of the view then refuses it against a peer of the size found.)"""
    dims: list[Element] = []
    for i, element in enumerate(target):
        if isinstance(element, float) or (element == 0 and not allowzero and i >= len(source)):
            return None
        dims.append(source[i] if element == 0 and not allowzero else element)
    if sum(d == -1 for d in dims) > 1:
        return None
    # A -1, or one element computed at run time (dynamo's `512 * ceil(s / 8) // s`): as many elements as x.
    holes = [i for i, d in enumerate(dims) if d == -1 or d is None]
    if len(holes) > 1:
        return [None if d == -1 else d for d in dims]
    if holes:
        dims[holes[0]] = _remaining(source, [d for i, d in enumerate(dims) if i != holes[0]])
    elif _count_differs(source, dims):
        return None  # not as many elements as x (a view of the trace's sizes that the model itself cannot run)
    return dims


def _count_differs(source: list[Element], dims: list[Element]) -> bool:
    """True when `dims` are known to hold another number of elements than `source` (the same names both sides,
    sizes whose products differ)."""
    if any(d is None for d in source) or any(d is None for d in dims):
        return False
    if sorted(d for d in source if isinstance(d, str)) != sorted(d for d in dims if isinstance(d, str)):
        return False
    sizes = [math.prod(int(d) for d in side if isinstance(d, int)) for side in (source, dims)]
    return sizes[0] != sizes[1]


def _remaining(source: list[Element], others: list[Element]) -> Element:
    """The dim that makes `others` hold as many elements as `source`: names cancel, sizes divide."""
    if any(d is None for d in source) or any(d is None for d in others):
        return None
    left = [d for d in source if isinstance(d, str)]
    for name in (d for d in others if isinstance(d, str)):
        if name not in left:
            return None
        left.remove(name)
    if left:
        return None
    size = math.prod(int(d) for d in source if isinstance(d, int))
    rest = math.prod(int(d) for d in others if isinstance(d, int))
    return size // rest if rest > 0 and size % rest == 0 else None


def _expanded_dims(source: list[Element], target: list[Element]) -> list[Element] | None:
    """The dims of `Expand(x, target)`: the two broadcast, a 1 on either side taking the other's dim."""
    rank = max(len(source), len(target))
    a = [1] * (rank - len(source)) + source
    b = [1] * (rank - len(target)) + target
    dims: list[Element] = []
    for x, y in zip(a, b, strict=True):
        if isinstance(x, float) or isinstance(y, float):
            return None
        dims.append(y if x == 1 else x if y in (1, x) else None)
    return dims


def give_shapes(graph: ir.Graph) -> bool:
    """Gives every Reshape and Expand whose target this can evaluate the dims it computes, where onnx's inference
    left them unknown (or only named them `unk__N`); True when it gave any. A dim onnx found is kept: where the two
    disagree the model is left as it is and the disagreement logged."""
    values = ShapeValues()
    changed = False
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if not is_onnx_domain(node.domain) or not node.inputs or node.inputs[0] is None:
            continue
        try:
            changed |= _give_node_shapes(node, values)
        except Exception as err:  # best effort, like inference: a node this cannot read keeps what it has
            logger.info("no shapes from %s %r: %s: %s", node.op_type, node.name, type(err).__name__, err)
    return changed


def _give_node_shapes(node: ir.Node, values: ShapeValues) -> bool:
    carried = _carried_dims(node)
    if carried is not None:
        merged = False
        for output in node.outputs:  # a Split's every output: each keeps its own size on the split axis
            merged |= _merge(output, carried)
        return merged
    if node.op_type not in ("Reshape", "Expand") or len(node.inputs) < 2:
        return False
    source, output = node.inputs[0], node.outputs[0]
    target = values.of(node.inputs[1])
    if source is None or source.shape is None or target is None or target.scalar:
        return False
    dims_in = [dim_element(d) for d in source.shape]
    changed = False
    if node.op_type == "Reshape":
        dims = reshaped_dims(dims_in, target.elements, bool(_attr(node, "allowzero", 0)))
        if dims is not None:
            changed = _size_back(source, _unreshaped_dims(dims_in, dims))
    else:
        dims = _expanded_dims(dims_in, target.elements)
    return (_merge(output, dims) if dims is not None else False) or changed


#: Ops whose output has their first input's shape, through which a dim found for the output is one of the input.
_SAME_SHAPE = frozenset({"Cast", "Identity", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Abs"})
#: Element-wise ops whose output has their inputs' broadcast shape.
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})


def _carried_dims(node: ir.Node) -> list[Element] | None:
    """The dims an element-wise op, a reduction, a Split or a MatMul carries from its inputs to its outputs (None
    on a Split's axis: each output has its own), for those ops (else None).

    onnx's inference keeps a dim it once named `unk__N` (the first round, before a view's dims were known) even
    where a later round would find the input's name: a batch dim lost once is lost for every layer after it. The
    names carried here put it back."""
    shapes = [None if v is None or v.shape is None else [dim_element(d) for d in v.shape] for v in node.inputs]
    if node.op_type in _SAME_SHAPE and len(node.outputs) == 1:
        return shapes[0]
    if node.op_type == "Split" and shapes and shapes[0] is not None:
        rank = len(shapes[0])
        axis = _attr(node, "axis", 0)
        return None if not -rank <= axis < rank else [None if i == axis % rank else d for i, d in enumerate(shapes[0])]
    if node.op_type in _BROADCAST and len(shapes) == 2 and shapes[0] is not None and shapes[1] is not None:
        return _expanded_dims(shapes[0], shapes[1])
    if node.op_type in REDUCTIONS and shapes and shapes[0] is not None:
        axes = reduction_axes(node, len(shapes[0]))
        if axes is None:
            return None
        keep = node.attributes.get("keepdims")
        reduced = {len(shapes[0]) + a for a in axes}
        dims = [1 if i in reduced else d for i, d in enumerate(shapes[0])]
        return dims if keep is None or keep.value else [d for i, d in enumerate(dims) if i not in reduced]
    if node.op_type == "MatMul" and len(shapes) == 2 and shapes[0] is not None and shapes[1] is not None:
        a, b = shapes
        if len(a) < 2 or len(b) < 2:
            return None
        batch = _expanded_dims(a[:-2], b[:-2])
        return None if batch is None else [*batch, a[-2], b[-1]]
    return None


def _size_back(value: ir.Value, dims: list[Element]) -> bool:
    """Gives `value`, and the values it is an element-wise function of, `dims`; never a graph input or output
    (their declared shapes are the model's interface: `_merge`)."""
    changed = False
    for _ in range(_MAX_DEPTH):
        node = value.producer()
        if node is None or not _merge(value, dims):
            break
        changed = True
        if node.op_type not in _SAME_SHAPE or not is_onnx_domain(node.domain) or node.inputs[0] is None:
            break
        value = node.inputs[0]
    return changed


def _unreshaped_dims(source: list[Element], dims: list[Element]) -> list[Element]:
    """`source` with its one unsized dim found from the dims it is reshaped to (Falcon-H1's scan output viewed
    `[b, s, -1]`, which no inference sizes or dynamo names by an expression it could not simplify, then viewed
    `[b, s, 2, 32]` by `Shape` of itself: it has 64): the names cancel, the sizes divide. A view has as many
    elements as its input; where that count is 0 (an empty batch) the dim can be anything, and the runtime gives
    every element-wise reader an error unless it is this one."""
    if any(d is None for d in dims):
        return source
    left = [d for d in dims if isinstance(d, str)]
    unsized = []
    for i, d in enumerate(source):
        if isinstance(d, str) and d in left:
            left.remove(d)  # the same dim both sides (`Shape(x)[0]` in the target)
        elif not isinstance(d, int):
            unsized.append(i)  # no name, `unk__N`, or one the view does not keep (dynamo's unsimplified expression)
    if len(unsized) != 1 or left:
        return source
    others = [d for i, d in enumerate(source) if i != unsized[0]]
    size = math.prod(int(d) for d in dims if isinstance(d, int))
    known = math.prod(int(d) for d in others if isinstance(d, int))
    if known <= 0 or size % known:
        return source
    return [size // known if i == unsized[0] else d for i, d in enumerate(source)]


def _merge(output: ir.Value, dims: list[Element]) -> bool:
    """Gives `output` the dims found where its own are unknown; True when that made it more known. A graph output
    keeps the shape the model declares (its interface)."""
    if output.is_graph_output():
        return False
    old = None if output.shape is None else [dim_element(d) for d in output.shape]
    if old is not None and len(old) != len(dims):
        logger.info("%s: inferred rank %d, its target gives %d; left as it is", output.name, len(old), len(dims))
        return False
    merged: list[int | str | None] = []
    for i, found in enumerate(dims):
        mine = None if old is None else old[i]
        if isinstance(mine, int) and isinstance(found, int) and mine != found:
            logger.info("%s: dim %d inferred %d, its target gives %d; left as it is", output.name, i, mine, found)
            return False
        merged.append(_better(mine, found))
    if merged == old:
        return False
    output.shape = ir.Shape(merged)
    if output.type is None and output.producer() is not None:
        source = output.producer().inputs[0]  # type: ignore[union-attr]
        if source is not None and source.type is not None:
            output.type = source.type
    return True


def _better(mine: Element, found: Element) -> int | str | None:
    """The more informative of the dim inference gave and the dim the target computes: a size beats a name (dynamo
    names a dim by the expression it could not simplify), a name beats a made-up `unk__N` (which then says which
    dim it is the same as), which beats nothing; two names of the model's own are left as the model has them."""
    if isinstance(found, float) or found is None or isinstance(mine, int):
        return mine  # type: ignore[return-value]
    if isinstance(found, int) or mine is None or _inferred_name(mine):
        return found
    return mine  # type: ignore[return-value]


def elements_equal(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    """True when two shapes are known to be equal: the same sizes and the same names (`unk__N` included: one name is
    one dim), no dim without either."""
    if a is None or b is None or len(a) != len(b):
        return False
    pairs = [(dim_element(x), dim_element(y)) for x, y in zip(a, b, strict=True)]
    return all(x is not None and x == y for x, y in pairs)
