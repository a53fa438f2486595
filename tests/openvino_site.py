"""OpenVINO for the tests that run it: tools/setup.sh installs it into build/openvino-site, outside the venv."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator

import pytest
from repo_paths import REPO

OPENVINO_SITE = REPO / "build" / "openvino-site"


@contextlib.contextmanager
def openvino_on_path() -> Iterator[None]:
    """build/openvino-site on sys.path for the block (imports inside it find openvino), or the test skipped."""
    sys.path.append(str(OPENVINO_SITE))
    try:
        if importlib.util.find_spec("openvino") is None:
            pytest.skip(f"openvino is not installed ({OPENVINO_SITE} is what tools/setup.sh fills)")
        yield
    finally:
        sys.path.remove(str(OPENVINO_SITE))
