"""Count the norm modules a torch model actually runs in one forward pass.

A module defined but not run (a pooler's norm that the output does not need, a norm in an unused branch) must not
be expected in the exported graph, and a shared module run twice (ALBERT's shared layer) appears twice in it, so
the count is of calls, taken with forward hooks. A norm module that calls another norm module (a subclass wrapper)
counts once: only the outermost call is counted.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from onnx_norm.zoo.models import is_norm_module


@dataclasses.dataclass
class NormUsage:
    """What one forward pass ran: calls per norm class, and the qualified names of the modules called."""

    calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    modules: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def count_norm_calls(model: Any, kwargs: dict[str, Any]) -> NormUsage:
    """Run `model(**kwargs)` once under `torch.no_grad()` and count the outermost norm-module calls."""
    import torch

    usage = NormUsage()
    depth = 0

    def pre_hook(module: Any, _args: Any, name: str) -> None:
        nonlocal depth
        if depth == 0:
            usage.calls[type(module).__name__] += 1
            usage.modules.append(name)
        depth += 1

    def post_hook(_module: Any, _args: Any, _output: Any) -> None:
        nonlocal depth
        depth -= 1

    handles = []
    for name, module in model.named_modules():
        if is_norm_module(module):
            handles.append(module.register_forward_pre_hook(lambda m, a, n=name: pre_hook(m, a, n)))
            handles.append(module.register_forward_hook(post_hook))
    try:
        with torch.no_grad():
            model(**kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return usage
