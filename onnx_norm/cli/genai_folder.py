"""`onnx-norm optimize FOLDER -o OUT` for ONNX Runtime GenAI model folders (the work is `genai.optimize_folder`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from onnx_norm.model_io import ModelFile
    from onnx_norm.options import VerifyOptions


def with_folder_shapes(options: VerifyOptions, shapes: dict[str, int]) -> VerifyOptions:
    """`options` with each dim read from the folder that the user did not give (`--shape`) added to its shapes."""
    given = dict(options.input.shapes or {})
    merged = {**given, **{dim: value for dim, value in shapes.items() if dim not in given}}
    if merged == given:
        return options
    return dataclasses.replace(options, input=dataclasses.replace(options.input, shapes=merged))


def _gate_each(source: Path, options: VerifyOptions, console: Console) -> Callable[[str, ModelFile, Path], bool]:
    """The check `genai.optimize_folder` runs on each staged model: the parity gate against the original as the
    rewrite read it. GenAI decoders need consistent lengths and the cache's head size: read from the folder (and
    the model in hand), unless given with --shape."""
    from onnx_norm.cli.verify import gate
    from onnx_norm.integrations import genai

    def check(name: str, original: ModelFile, staged: Path) -> bool:
        shapes = genai.verify_shapes(source, name, original.proto)
        return gate(original, staged, with_folder_shapes(options, shapes), console=console) == 0

    return check


def run_folder(args: argparse.Namespace) -> int:
    """The optimize subcommand on a folder: same flags; `--verify` gates every rewritten model of the folder, each
    once it is staged, and the folder is written only when every model passed."""
    from onnx_norm import model_io
    from onnx_norm.cli import UsageError
    from onnx_norm.cli import args as common
    from onnx_norm.cli.inspect import write_report
    from onnx_norm.integrations import genai

    source, output = Path(args.input), Path(args.output)
    if args.external_data == "never":
        raise UsageError("--external-data never: a GenAI folder keeps the external data of its models")
    options = None
    if args.verify:  # parsed once, before any work: each model's gate gets the objects
        from onnx_norm.cli.verify import parity_options

        options = parity_options(args)
    console = common.console(quiet=bool(args.quiet))  # -q: as optimize, nothing but errors
    try:
        report = genai.optimize_folder(
            source,
            output,
            target=args.target,
            disable=args.disable,
            take_over_native=args.take_over_native,
            overwrite=args.force,
            check=None if options is None else _gate_each(source, options, console),
        )
    except (genai.GenAIFolderError, model_io.ModelLoadError, model_io.ModelSaveError) as err:
        raise UsageError(str(err)) from err
    for name, model_report in report.models.items():
        taken = sum(1 for record in model_report.native_taken_over if record.get("converted"))
        native = sum(count for op, count in model_report.ops_after.items() if "LayerNormalization" in op)
        line = f"{name} ({report.files[name]}): {len(model_report.norms)} fused, {taken} native taken over"
        if native and not args.take_over_native:
            line += f"; {native} native norm op(s) kept (--take-over-native moves them onto our kernels)"
        console.print(line)
    if args.report:  # the decoder's (or the first model's) report
        section = "decoder" if "decoder" in report.models else next(iter(report.models))
        files = {"input": source / report.files[section], "output": output / report.files[section]}
        write_report(args.report, report.models[section], files)
    if report.failed_check is not None:
        common.console().print(f"[red]FAILED[/red] parity gate on {report.failed_check}: {output} not written")
        return 1
    if report.library:
        how = "hard-linked to the installed library" if report.library_linked else "copied: no hard link possible here"
        console.print(f"registered {report.library} in genai_config.json ({how}; GenAI loads it only from the folder)")
    console.print(f"wrote {output}")
    return 0
