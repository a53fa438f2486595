"""`onnx-norm optimize FOLDER -o OUT` for ONNX Runtime GenAI model folders (the work is `genai.optimize_folder`)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def _with_folder_shapes(args: argparse.Namespace, shapes: dict[str, int]) -> argparse.Namespace:
    """`args` with `--shape DIM:VALUE` added for each dim read from the folder that the user did not give."""
    given = {text.split(":", 1)[0] for text in args.shape}
    extra = [f"{dim}:{value}" for dim, value in shapes.items() if dim not in given]
    return argparse.Namespace(**{**vars(args), "shape": [*args.shape, *extra]})


def run_folder(args: argparse.Namespace) -> int:
    """The optimize subcommand on a folder: same flags; `--verify` gates every rewritten model of the folder."""
    from onnx_norm import model_io
    from onnx_norm.cli import UsageError
    from onnx_norm.cli import args as common
    from onnx_norm.cli.inspect import write_report
    from onnx_norm.integrations import genai

    source, output = Path(args.input), Path(args.output)
    if args.external_data == "never":
        raise UsageError("--external-data never: a GenAI folder keeps the external data of its models")
    try:
        report = genai.optimize_folder(
            source,
            output,
            target=args.target,
            disable=args.disable,
            take_over_native=args.take_over_native,
            overwrite=args.force,
        )
    except (genai.GenAIFolderError, model_io.ModelLoadError, model_io.ModelSaveError) as err:
        raise UsageError(str(err)) from err
    console = common.console(quiet=bool(args.quiet))  # -q: as optimize, nothing but errors
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
    if args.verify:
        from onnx_norm.cli.verify import gate

        # Written before the gate (it compares files); taken back out unless every model passes. GenAI decoders
        # need consistent lengths and the cache's head size: read from the folder, unless given with --shape.
        passed = False
        try:
            for name, file in report.files.items():
                flags = _with_folder_shapes(args, genai.verify_shapes(source, name))
                if gate(str(source / file), str(output / file), flags, console=console) != 0:
                    common.console().print(f"[red]FAILED[/red] parity gate on {name}: {output} not written")
                    return 1
            passed = True
        finally:
            if not passed:
                shutil.rmtree(output, ignore_errors=True)
    if report.library:
        how = "hard-linked to the installed library" if report.library_linked else "copied: no hard link possible here"
        console.print(f"registered {report.library} in genai_config.json ({how}; GenAI loads it only from the folder)")
    console.print(f"wrote {output}")
    return 0
