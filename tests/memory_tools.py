"""tools/memory_check.py as a module, for the tests that build models with it and measure a child's peak RSS.

tools/ is not a package, so it is loaded from its path once here instead of in every test module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

MEMORY_CHECK = Path(__file__).resolve().parents[1] / "tools" / "memory_check.py"

_spec = importlib.util.spec_from_file_location("memory_check", MEMORY_CHECK)
assert _spec is not None and _spec.loader is not None
memory_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(memory_check)
