"""Work-arounds for the zoo's optional third-party packages."""

from __future__ import annotations

import importlib.util
import logging
import sys

logger = logging.getLogger(__name__)

_META = "torchvision._meta_registrations"


def tolerate_cuda_torchvision() -> None:
    """Lets transformers and timm import a torchvision built for CUDA torch beside the CPU torch.

    torchvision's PyPI wheel links its C ops against CUDA torch; beside the CPU build (which this project pins) they
    do not load (torchvision then reports `extension._has_ops() == False`, as it was designed to), but its import
    still fails: `_meta_registrations` registers fake kernels for `torchvision::nms` and `qnms` without the guard its
    other registrations have ("operator torchvision::nms does not exist"). transformers imports torchvision whenever
    it is installed, and timm needs its Python parts (transforms, `ops.misc`), so every export would fail.

    Here torchvision's own `_meta_registrations` runs up to that first unguarded registration and stays imported as
    far as it got: everything of torchvision is its own code (no module is replaced), only the fake kernels of C ops
    that do not exist are not registered, and its C ops stay unusable, as they were.
    """
    if _META in sys.modules:
        return
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return
    except RuntimeError as err:
        logger.debug("torchvision's C ops do not load (%s); importing it without their fake kernels", err)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _import_meta_registrations_partly()


def _import_meta_registrations_partly() -> None:
    """Executes torchvision's `_meta_registrations` (which imports the torchvision package first, and the package
    finds this module in `sys.modules`) and keeps it there when it stops at a registration for a C op that did not
    load (the message names the missing `torchvision::` operator). Any other failure is raised."""
    package = importlib.util.find_spec("torchvision")
    locations = package.submodule_search_locations if package else None
    if not locations:
        return
    spec = importlib.util.spec_from_file_location(_META, f"{locations[0]}/_meta_registrations.py")
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[_META] = module
    try:
        spec.loader.exec_module(module)
    except RuntimeError as err:
        if not ("operator torchvision::" in str(err) and "does not exist" in str(err)):
            del sys.modules[_META]
            raise
        logger.debug("torchvision's fake kernels stop at an op its C library lacks: %s", err)
