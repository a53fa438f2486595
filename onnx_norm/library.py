"""Locating and registering the fused-op library (`libonnx_norm_ops.so`) with ONNX Runtime."""

from __future__ import annotations

import importlib.resources
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime as ort

logger = logging.getLogger(__name__)

_LIBRARY_NAMES = {"linux": "libonnx_norm_ops.so", "darwin": "libonnx_norm_ops.dylib", "win32": "onnx_norm_ops.dll"}
LIBRARY_NAME = _LIBRARY_NAMES.get(sys.platform, "libonnx_norm_ops.so")


class LibraryNotFoundError(FileNotFoundError):
    """The custom-op library was not built or not installed next to the package."""


def get_library_path() -> str:
    """Path of the custom-op library, for `SessionOptions.register_custom_ops_library`.

    Raises LibraryNotFoundError if the package was not installed with `pip install` (which builds it).
    """
    # importlib.resources, not __file__: an editable install keeps the sources here but puts the
    # built library in site-packages, and resources see both.
    resource = importlib.resources.files("onnx_norm").joinpath(LIBRARY_NAME)
    if not resource.is_file():
        raise LibraryNotFoundError(
            f"{LIBRARY_NAME} not found in the onnx_norm package; it is built by `pip install .` "
            "(or `pip install -e .`) from the repository root. See docs/build.md."
        )
    return str(resource)


def library_available() -> bool:
    """True if the custom-op library is installed."""
    try:
        get_library_path()
    except LibraryNotFoundError:
        return False
    return True


def session_options(options: ort.SessionOptions | None = None) -> ort.SessionOptions:
    """`options` (or new SessionOptions) with the fused-op library registered."""
    import onnxruntime as ort

    if options is None:
        options = ort.SessionOptions()
    path = get_library_path()
    logger.debug("registering custom-op library %s", path)
    options.register_custom_ops_library(path)
    return options
