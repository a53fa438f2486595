"""The norm families, one module each; every module here registers its family when imported (family.py).

The built-in LayerNorm and RMSNorm come first: the shared matcher asks the statistic recognisers in registration
order. Any other module in this folder is found and imported by `family.families()`; adding a family is adding a
module here (docs/adding_a_norm_family.md).
"""

from onnx_norm.rewrite.families import layer_norm, rms_norm

__all__ = ["layer_norm", "rms_norm"]
