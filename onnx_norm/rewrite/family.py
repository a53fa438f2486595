"""The norm-family registry: what a family of norms is, and the one place families are registered.

A family is everything the rewrite needs to know about one kind of norm (docs/adding_a_norm_family.md):

- how it is recognised: either a `statistic` recogniser (the shared matcher, match.py, finds
  `data * (statistic + eps)^-1/2` times constants and asks each family whether the statistic is its own), or a
  whole `find(anchor)` recogniser for norms of another shape (a composite such as a norm followed by more arithmetic,
  which may call `match.find_norm` for its inner norm);
- the ops its matches may end at (`anchor_ops`) and the `kind` its `NormSpec`s carry;
- the float64 `reference` the proof compares the matched subgraph against;
- for each target, how it is emitted (`Lowering`) or a sentence saying why that target cannot express it;
- its rules: the names users can disable, each configured by constructor arguments (residual, channels first).

Families live in `onnx_norm/rewrite/families/`, one module each, and are registered explicitly: that package's
`__init__` registers them in the order the shared matcher asks them, and rules.py, the first reader of the registry
at import time, imports that package. This module imports no family, so the registry, the families and the targets
form no import circle. A new family's kind is named only in its module; the built-in "layer" and "rms" also key the
built-in targets' op tables (targets.py) and the native take-over (native.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.schema import NormAttributes
from onnx_norm.rewrite.spec import Statistic

if TYPE_CHECKING:
    from onnx_norm.rewrite.candidate import Candidate
    from onnx_norm.rewrite.spec import NormSpec

#: A checked lowering, ready to build the nodes of one spec: (builder, spec) -> values replacing spec.replaced().
Emitter = Callable[[Any, "NormSpec"], list[ir.Value]]
#: The float64 reference of a family: (x, params, attrs) -> (y, inv_std, mean or None). `params` holds "scale" and
#: "bias" (None when absent) and each of the spec's `extra_inputs` by name, as arrays broadcastable against x.
#: What a family's native reader gives: the spec, or (spec, perm) for a norm over non-trailing axes.
NativeReading = "NormSpec | tuple[NormSpec, tuple[int, ...]]"
Reference = Callable[[np.ndarray, Mapping[str, np.ndarray | None], NormAttributes], tuple[np.ndarray, ...]]


@dataclasses.dataclass(frozen=True)
class FusionRule:
    """A rule users can disable by name (`--disable`); what it fuses is set by its arguments, not by its name.

    `residual`: the norm's input is a residual Add, fused with it (the Skip ops). `channels_first`: the norm is
    over non-trailing axes, emitted between Transposes. At one node, residual rules are tried first, then
    channels-first ones, then the plain ones.
    """

    name: str
    kind: str
    residual: bool = False
    channels_first: bool = False

    @property
    def order(self) -> int:
        return 0 if self.residual else 1 if self.channels_first else 2


def _always(spec: NormSpec, opset: int) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class Lowering:
    """How one target writes a family's spec.

    `emit(op, spec, opset)` builds nodes with `op` (builder.Builder) and returns the values replacing
    `spec.replaced()`, in that order. `unsupported(spec, opset)` says why this spec cannot be emitted exactly (None:
    it can); `opset` is the model's default-domain opset.
    """

    emit: Callable[[Any, NormSpec, int], list[ir.Value]]
    unsupported: Callable[[NormSpec, int], str | None] = _always
    #: For a norm over non-trailing axes: `in_layout(op, spec, perm)` builds it in X's own layout (no Transposes;
    #: `perm` moves the normalised axes last, `spec.attrs.axis` counts in that layout) and returns the values
    #: replacing `spec.replaced()`, or None, building nothing, when it cannot (targets.emit_transposed then writes
    #: the op between Transposes).
    in_layout: Callable[[Any, NormSpec, tuple[int, ...]], list[ir.Value] | None] | None = None

    def prepare(self, spec: NormSpec, opset: int) -> Emitter | str:
        """Checks `spec` once: why it cannot be emitted, or an emitter `(op, spec) -> values` for it (the driver
        checks when it selects a candidate and emits later, once). Lowerings that plan override this."""
        reason = self.unsupported(spec, opset)
        if reason is not None:
            return reason
        return lambda op, emitted: self.emit(op, emitted, opset)


@dataclasses.dataclass(frozen=True)
class NormFamily:
    """One family of norms. Exactly one of `statistic` and `find` is set."""

    kind: str
    summary: str  # one line: what it computes
    rules: tuple[FusionRule, ...]
    reference: Reference
    lowerings: Mapping[str, Lowering | str]  # target name -> its lowering, or why the target cannot emit it
    anchor_ops: frozenset[str] = frozenset()  # default-domain ops a match ends at (with `find`)
    statistic: Callable[[ir.Value], Statistic | None] | None = None
    find: Callable[[ir.Node], Candidate | None] | None = None
    outputs: tuple[str, ...] = ()  # statistics its op can also return: "mean", "inv_std"
    sweep: int = 0  # lower sweeps run over the whole model first: a composite before the norm inside it
    #: Native default-domain ops of this family the take-over (`--take-over-native`, native.py) converts: op type ->
    #: reader `(node, opset) -> NormSpec`, raising ValueError with the reason a node is left as it is; a norm over
    #: non-trailing axes is `(spec, perm)`, perm moving them last (written as channels-first matches are,
    #: targets.emit_transposed).
    native: Mapping[str, Callable[[ir.Node, int], NativeReading]] = dataclasses.field(default_factory=dict)

    def lowering(self, target: str) -> Lowering | str:
        return self.lowerings.get(target, f"the {target} target has no op for a {self.summary}")


_REGISTRY: dict[str, NormFamily] = {}


def register(family: NormFamily) -> NormFamily:
    """Adds a family (call it at import time of its module in `onnx_norm/rewrite/families/`)."""
    if (family.statistic is None) == (family.find is None):
        raise ValueError(f"family {family.kind!r}: set exactly one of statistic and find")
    if family.find is not None and not family.anchor_ops:
        raise ValueError(f"family {family.kind!r}: a find recogniser needs anchor_ops")
    taken = {rule.name for other in _REGISTRY.values() if other.kind != family.kind for rule in other.rules}
    clash = [rule.name for rule in family.rules if rule.name in taken or rule.kind != family.kind]
    if clash:
        raise ValueError(f"family {family.kind!r}: rule(s) {clash} taken or of another kind")
    _REGISTRY[family.kind] = family
    return family


def families() -> list[NormFamily]:
    """Every registered family, in registration order (the built-in LayerNorm and RMSNorm first)."""
    return list(_REGISTRY.values())


def get(kind: str) -> NormFamily:
    if kind not in _REGISTRY:
        raise ValueError(f"no norm family of kind {kind!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[kind]


def rules() -> list[FusionRule]:
    """Every rule, in the order they are tried: by sweep, then residual, channels-first, plain."""
    found = [(family.sweep, rule.order, rule) for family in families() for rule in family.rules]
    return [rule for _, _, rule in sorted(found, key=lambda entry: entry[:2])]
