"""Work-arounds for the zoo's optional third-party packages."""

from __future__ import annotations

import logging
import sys
import types

logger = logging.getLogger(__name__)


def tolerate_cuda_torchvision() -> None:
    """Lets transformers and timm import a torchvision built for CUDA torch beside the CPU torch.

    torchvision's PyPI wheel links its C ops against CUDA torch; beside the CPU build (which this project pins) they
    do not load, and torchvision's import then fails while registering their meta kernels ("operator
    torchvision::nms does not exist"). transformers imports torchvision whenever it is installed (timm, from the
    zoo-full extra, pulls it in), so every export would fail. The zoo uses only torchvision's Python parts: the
    meta registrations are skipped, and its C ops stay unusable, as they were.
    """
    if "torchvision._meta_registrations" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return
    except RuntimeError as err:
        logger.debug("torchvision's C ops do not load (%s); importing it without their meta kernels", err)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
