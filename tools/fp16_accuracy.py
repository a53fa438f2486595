"""How far each output of a zoo export is from the float64 evaluation of the original, for the original and for
the optimized model (max and mean |error|, from `onnx_norm.verify`'s golden comparison), on ONNX Runtime's CPU
provider. docs/accuracy.md lists what it measured.

    python tools/fp16_accuracy.py bert:torchscript-14:fp16-converted llama:torchscript-14:fp16
"""

from __future__ import annotations

import argparse

import onnx

import onnx_norm
from onnx_norm.zoo.export import export


def measure(item: str) -> list[str]:
    name, exporter, dtype = item.split(":")
    source = export(name, exporter, dtype)  # type: ignore[arg-type]
    original = onnx.load(source.path)
    optimized, _ = onnx_norm.optimize(original, take_over_native=True)
    report = onnx_norm.verify(original, optimized, inputs=[source.inputs()])
    rows = []
    for output in report.outputs:
        g = output.golden
        if g is None:
            rows.append(f"{item} {output.name}: no float64 result ({output.verdict})")
            continue
        ratio = g.optimized_mean_abs / max(g.original_mean_abs, 1e-30)
        rows.append(
            f"{item} {output.name}: original max {g.original_max_abs:.3g} mean {g.original_mean_abs:.3g} | "
            f"optimized max {g.optimized_max_abs:.3g} mean {g.optimized_mean_abs:.3g} | mean ratio {ratio:.2f} | "
            f"margin {g.margin:.2g} | {g.less_accurate or 'not less accurate (verify)'}"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="NAME:EXPORTER:DTYPE, e.g. gpt2:torchscript-14:fp16-converted")
    for item in parser.parse_args().models:
        for row in measure(item):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
