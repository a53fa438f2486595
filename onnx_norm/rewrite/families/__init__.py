"""The norm families, one module each, registered here explicitly and in this order (family.py).

The built-in LayerNorm and RMSNorm come first: the shared matcher asks the statistic recognisers in registration
order. The families whose recognisers call the shared matcher for a norm inside their match follow. Adding a
family is adding its module to the import and its entry to `BUILT_IN` (docs/adding_a_norm_family.md).
"""

from onnx_norm.rewrite import family
from onnx_norm.rewrite.families import gated_norm, group_norm, l2_norm, layer_norm, modulated_norm, rms_norm

#: Every built-in family, in registration order.
BUILT_IN: tuple[family.NormFamily, ...] = (
    layer_norm.FAMILY,
    rms_norm.FAMILY,
    *modulated_norm.FAMILIES,
    group_norm.FAMILY,
    l2_norm.FAMILY,
    gated_norm.FAMILY,
)

for _built_in in BUILT_IN:
    family.register(_built_in)

__all__ = ["BUILT_IN"]
