"""What the input, model and session layers share about failures: InputError, and ONNX Runtime's messages on one
line. A module of its own (it imports nothing of onnx_norm) so that the layers that raise and report these, which
also use each other (inputs, model_io, weights, sessions), need not import each other for them."""

from __future__ import annotations

import re


class InputError(ValueError):
    """Inputs that do not fit the model: unknown names, wrong shapes or dtypes, unreadable files; or weights
    that do not fit the memory available."""


_ORT_SOURCE = re.compile(r"\S*onnxruntime_src/\S+:\d+ ")


def ort_message(err: BaseException) -> str:
    """ONNX Runtime's error message on one line, without the paths of its source files."""
    return _ORT_SOURCE.sub("", " ".join(str(err).split()))
