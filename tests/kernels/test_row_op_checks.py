"""The row ops' kernel checks without a kernel (tools/gpu_harness/row_op_checks.py): every check module is listed in
`CHECKS` and every listed one exists, and each module's cases are a working check: unique names, a reference (the op
record's) that agrees with itself, and a comparison that catches one wrong element of Y. The kernels themselves run
in the emulator in tests/test_<op>_cuda.py and `gpu_check.py --self-test`, on a GPU in `gpu_check.py`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import row_op_checks as rows

HARNESS = Path(rows.__file__).parent


def test_every_check_module_is_listed_once() -> None:
    modules = sorted(path.stem for path in HARNESS.glob("*_check.py"))
    assert sorted(rows.CHECKS) == modules
    assert len(set(rows.CHECKS)) == len(rows.CHECKS)


@pytest.mark.parametrize("name", rows.CHECKS)
def test_the_cases_are_a_working_check(name: str) -> None:
    """Each case (the full set): the reference matches itself, and Y with one element moved by ten tolerances does
    not. Inputs are drawn as the runners draw them (rng seeded with the case's index)."""
    cases = rows.load(name).build_cases(quick=False)
    assert len({case.name() for case in cases}) == len(cases), "duplicate case names"
    assert {case.name() for case in rows.load(name).build_cases(quick=True)} <= {case.name() for case in cases}
    for i, case in enumerate(cases):
        inputs = case.inputs(np.random.default_rng(i))
        want = case.reference(inputs)
        assert want.shape == inputs["x"].shape and np.isfinite(want.astype(np.float64)).all(), case.name()
        assert case.compare(want.copy(), want) is None, case.name()
        wrong = want.astype(np.float64)
        wrong.flat[wrong.size // 2] += 10 * rows.TOLERANCE[case.y_type] * (1 + abs(wrong.flat[wrong.size // 2]))
        assert case.compare(wrong, want) is not None, case.name()


def test_the_reference_refuses_an_input_the_op_does_not_have() -> None:
    """record_reference maps inputs to the op record by name: one the record lacks is an error, not dropped."""
    x = np.ones((2, 3, 4), np.float32)
    mod = np.zeros((2, 4), np.float32)
    y = rows.record_reference("ModulatedRMSNorm", {"x": x, "scale": None, "mod_scale": mod, "mod_shift": mod})
    assert y.shape == x.shape
    with pytest.raises(ValueError, match="ModulatedRMSNorm has no input bias"):
        rows.record_reference("ModulatedRMSNorm", {"x": x, "bias": x[0, 0], "mod_scale": mod, "mod_shift": mod})
