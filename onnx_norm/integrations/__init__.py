"""onnx-norm inside the tools people already use: the torch exporters, ONNX Runtime GenAI, Optimum and Olive.

One module per tool; each imports its tool only when used, so `import onnx_norm.integrations` is cheap and works
where none of them is installed. What each was checked with is in docs/integrations.md.
"""

from __future__ import annotations
