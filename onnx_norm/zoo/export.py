"""Export zoo models with each exporter and dtype, cached on disk.

Exports take seconds to minutes, so each one is written once under a cache directory keyed by model, exporter,
dtype, the model's config fingerprint and the versions of everything that shapes the graph. Next to each model
the cache keeps the inputs to run it with, a float64 torch evaluation of the same weights on those inputs (the
golden outputs that fp16 comparisons need), and how many norm modules the forward pass ran.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from onnx_norm.zoo.compat import tolerate_cuda_torchvision
from onnx_norm.zoo.models import ZOO, ZooModel, build_model, dynamic_axes, example_inputs
from onnx_norm.zoo.norms import count_norm_calls

logger = logging.getLogger(__name__)

Exporter = Literal["torchscript-14", "torchscript-17", "dynamo"]
Dtype = Literal["fp32", "fp16", "fp16-converted"]
EXPORTERS: tuple[Exporter, ...] = ("torchscript-14", "torchscript-17", "dynamo")
# fp16: model.half() before export; fp16-converted: the fp32 export converted to fp16 by ONNX Runtime's converter.
DTYPES: tuple[Dtype, ...] = ("fp32", "fp16", "fp16-converted")

CACHE_ENV = "ONNX_NORM_ZOO_CACHE"
# Part of every cache key: bump it when a change to the export steps (not to a model's config, which has its own
# fingerprint) must invalidate existing cache entries.
_FORMAT_VERSION = 2
_FP16_CONVERTER = "ort-float16-sorted"
TRACE_SHAPE = (2, 8)  # batch, sequence used while exporting
TEST_SHAPE = (3, 11)  # another shape, so that the tests exercise the dynamic axes


class ZooExportError(RuntimeError):
    """The exporter could not export this model; the message says why."""


@dataclasses.dataclass(frozen=True)
class ZooExport:
    """One exported model in the cache."""

    model: str
    exporter: Exporter
    dtype: Dtype
    directory: Path
    norm_calls: dict[str, int]  # outermost norm-module calls in one forward pass, per class name
    output_names: list[str]
    dynamic_shapes_ok: bool  # the export runs at TEST_SHAPE; if not, inputs() are at TRACE_SHAPE

    @property
    def path(self) -> Path:
        return self.directory / "model.onnx"

    @property
    def norms_in_forward(self) -> int:
        return sum(self.norm_calls.values())

    def inputs(self) -> dict[str, np.ndarray]:
        with np.load(self.directory / "inputs.npz") as data:
            return {name: data[name] for name in data.files}

    def golden(self) -> dict[str, np.ndarray] | None:
        """Float64 torch outputs of the same weights on `inputs()` (for fp16: the fp16-rounded weights)."""
        path = self.directory / "golden.npz"
        if not path.exists():
            return None
        with np.load(path) as data:
            return {name: data[name] for name in self.output_names if name in data.files}


def default_cache_dir() -> Path:
    """$ONNX_NORM_ZOO_CACHE, else `onnx-norm/zoo` in the user's cache folder ($XDG_CACHE_HOME, else ~/.cache), as
    pip keeps its wheels: a clone or worktree reuses the exports an earlier one made with the same code and versions
    (the cache key holds both), else the temp dir when there is no home folder."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or (os.path.join(Path.home(), ".cache") if "HOME" in os.environ else "")
    if base:
        folder = Path(base) / "onnx-norm" / "zoo"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        except OSError as err:  # a read-only home (some CI containers): the exports are made anew in the temp dir
            logger.info("zoo export cache %s cannot be made (%s); using the temp dir", folder, err)
    return Path(tempfile.gettempdir()) / "onnx-norm-zoo"


@functools.cache
def _source_fingerprint() -> str:
    """A hash of this package's sources (configs, export steps, norm counting): an export made by other code is
    another cache entry, so that a cache shared between checkouts never serves a stale graph."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _versions() -> str:
    import onnx
    import onnxscript
    import torch

    tolerate_cuda_torchvision()
    import transformers

    parts = [
        f"v{_FORMAT_VERSION}",
        _source_fingerprint(),
        torch.__version__,
        transformers.__version__,
        onnx.__version__,
        onnxscript.__version__,
    ]
    return "-".join(p.replace("+", "_") for p in parts)


def _ort_version() -> str:
    """ONNX Runtime's version: its float16 converter makes the fp16-converted exports."""
    import onnxruntime

    return onnxruntime.__version__.replace("+", "_")


def export(name: str, exporter: Exporter, dtype: Dtype = "fp32", cache_dir: Path | str | None = None) -> ZooExport:
    """The cached export of zoo model `name`, exporting it first if it is not in the cache.

    Raises `ZooExportError` when the exporter fails on this model (the failure is cached too, so a test run
    does not pay for it twice).
    """
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}")
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; known: {', '.join(EXPORTERS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    spec = ZOO[name]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    versions = _versions() + (f"-{_FP16_CONVERTER}-{_ort_version()}" if dtype == "fp16-converted" else "")
    directory = root / f"{name}-{exporter}-{dtype}-{spec.fingerprint()}-{versions}"
    if not (directory / "meta.json").exists():
        _export_once(spec, exporter, dtype, directory)
    meta = json.loads((directory / "meta.json").read_text())
    if meta.get("error"):
        raise ZooExportError(f"{name} / {exporter} / {dtype}: {meta['error']}")
    return ZooExport(
        model=name,
        exporter=exporter,
        dtype=dtype,
        directory=directory,
        norm_calls=meta["norm_calls"],
        output_names=meta["output_names"],
        dynamic_shapes_ok=meta["dynamic_shapes_ok"],
    )


def _export_once(spec: ZooModel, exporter: Exporter, dtype: Dtype, directory: Path) -> None:
    """Exports into `directory` unless another process does: the test workers (pytest-xdist) and coverage runs
    share the cache, and a worker that finds the export under way waits for it rather than paying for it again."""
    from filelock import FileLock

    root = directory.parent
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(root / f".{directory.name}.lock"):
        if (directory / "meta.json").exists():  # done by the process that held the lock
            return
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=root))
        try:
            _export_into(spec, exporter, dtype, staging, root)
            try:
                staging.rename(directory)
            except OSError:  # a process without the lock (an older onnx-norm) finished the same export first
                if not (directory / "meta.json").exists():
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


class _Flatten:
    """Calls a Hugging Face model with positional tensors and returns its tensor outputs as a tuple."""

    @staticmethod
    def wrap(model: Any, input_names: Sequence[str]) -> Any:
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> tuple[Any, ...]:
                kwargs = dict(zip(input_names, args, strict=True))
                output = self.model(**kwargs, **_call_options(self.model))
                return tuple(v for v in output.values() if isinstance(v, torch.Tensor))

        return Wrapper().eval()


def _call_options(model: Any) -> dict[str, Any]:
    # No KV cache: a cache object is not a tensor output and would change the graph between exporters.
    return {"use_cache": False} if getattr(model.config, "use_cache", None) is not None else {}


def to_torch(inputs: dict[str, np.ndarray], float_dtype: Any = None) -> dict[str, Any]:
    """numpy inputs as torch tensors, floating ones converted to `float_dtype` when given."""
    import torch

    tensors = {}
    for name, array in inputs.items():
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if float_dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(float_dtype)
        tensors[name] = tensor
    return tensors


def output_names_of(model: Any, inputs: dict[str, Any]) -> list[str]:
    """The names of the tensor outputs of one forward pass, in order: the exported graph's outputs."""
    import torch

    with torch.no_grad():
        output = model(**inputs, **_call_options(model))
    return [k for k, v in output.items() if isinstance(v, torch.Tensor)]


def _export_into(spec: ZooModel, exporter: Exporter, dtype: Dtype, directory: Path, root: Path) -> None:
    meta: dict[str, Any] = {"model": spec.name, "exporter": exporter, "dtype": dtype, "versions": _versions()}
    try:
        if dtype == "fp16-converted":
            _convert_to_fp16(spec, exporter, directory, root, meta)
        else:
            _torch_export(spec, exporter, dtype, directory, meta)
    except ZooExportError as err:
        meta["error"] = str(err)
    except Exception as err:  # an exporter failure of any kind is a property of this model, cached as such
        logger.debug("export of %s / %s / %s failed", spec.name, exporter, dtype, exc_info=True)
        meta["error"] = _describe(err)
    (directory / "meta.json").write_text(json.dumps(meta, indent=1))


def _describe(err: BaseException) -> str:
    """The root cause of an exporter failure in one line (torch wraps it in several layers of advice)."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def _torch_export(spec: ZooModel, exporter: Exporter, dtype: Dtype, directory: Path, meta: dict[str, Any]) -> None:
    import torch

    model = build_model(spec)
    float_dtype = np.float16 if dtype == "fp16" else np.float32
    trace = example_inputs(spec, *TRACE_SHAPE, seed=0, float_dtype=float_dtype)
    test = example_inputs(spec, *TEST_SHAPE, seed=1, float_dtype=float_dtype)
    as_fp32 = to_torch(test, torch.float32)
    meta["norm_calls"] = dict(count_norm_calls(model, {**as_fp32, **_call_options(model)}).calls)
    meta["output_names"] = output_names_of(model, as_fp32)
    golden = _golden(spec, test, meta["output_names"], half_weights=dtype == "fp16")

    path = directory / "model.onnx"
    write_onnx(model, spec, exporter, dtype, trace, path, meta["output_names"])
    _finish(path, directory, test, trace, golden, meta)


def write_onnx(
    model: Any,
    spec: ZooModel,
    exporter: str,
    dtype: Dtype,
    trace: dict[str, np.ndarray],
    path: Path,
    output_names: list[str],
) -> None:
    """Export `model` (float32) to `path`: `exporter` is "dynamo" or "torchscript-<opset>"."""
    import torch

    if dtype == "fp16":
        model = model.half()
    names = list(trace)
    wrapper = _Flatten.wrap(model, names)
    args = tuple(to_torch(trace).values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings, one screen per model
        if exporter == "dynamo":
            # torch.export cannot translate dynamic_axes for a *args forward; Dim.AUTO lets it keep each
            # axis dynamic unless the model's code specializes it (then the export is checked at TEST_SHAPE).
            axes = dynamic_axes(spec)
            shapes = tuple(dict.fromkeys(axes.get(name, {}), torch.export.Dim.AUTO) for name in names)
            program = torch.onnx.export(
                wrapper,
                args,
                input_names=names,
                output_names=output_names,
                dynamic_shapes=(shapes,),
                dynamo=True,
                verbose=False,
            )
            if program is None:
                raise ZooExportError("the dynamo exporter returned no program")
            program.save(str(path))
        elif exporter.startswith("torchscript-"):
            torch.onnx.export(
                wrapper,
                args,
                str(path),
                input_names=names,
                output_names=output_names,
                dynamic_axes=dynamic_axes(spec),
                opset_version=int(exporter.split("-", 1)[1]),
                dynamo=False,
            )
        else:
            raise ValueError(f"unknown exporter {exporter!r}: use 'dynamo' or 'torchscript-<opset>'")


def _convert_to_fp16(spec: ZooModel, exporter: Exporter, directory: Path, root: Path, meta: dict[str, Any]) -> None:
    import onnx
    from onnxruntime.transformers import float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    source = export(spec.name, exporter, "fp32", root)
    # ONNX Runtime's converter (the one its transformers optimizer uses), not onnxconverter-common's: version 1.16
    # of the latter turns Cast(to=float) into Cast(to=float16) without fixing the recorded types, and leaves fp32
    # values meeting fp16 ones, so ORT refuses 84 of the 117 zoo exports it converts. keep_io_types: users keep
    # float32 inputs and outputs.
    converted = float16.convert_float_to_float16(onnx.load(source.path), keep_io_types=True)
    # The converter appends the Casts of graph inputs after their consumers; ORT sorts, onnx.checker refuses.
    OnnxModel(converted).topological_sort()
    path = directory / "model.onnx"
    onnx.save(converted, path)
    meta["norm_calls"] = source.norm_calls
    meta["output_names"] = source.output_names
    test = source.inputs()
    golden = _golden(spec, test, source.output_names, half_weights=True)
    trace = example_inputs(spec, *TRACE_SHAPE, seed=0)
    try:
        _finish(path, directory, test, trace, golden, meta)
    except Exception as err:
        raise ZooExportError(f"the float16 converter made an invalid model: {err}") from err


def _golden(
    spec: ZooModel, inputs: dict[str, np.ndarray], output_names: list[str], half_weights: bool
) -> dict[str, np.ndarray] | None:
    """Float64 torch outputs for `inputs`, with the weights rounded to fp16 first when the export is fp16."""
    import torch

    model = build_model(spec)
    if half_weights:
        model = model.half()
    model = model.double()
    try:
        with torch.no_grad():
            output = model(**to_torch(inputs, torch.float64), **_call_options(model))
    except Exception as err:  # some models hard-code float32 somewhere; the tests then compare without golden
        logger.info("no float64 golden for %s: %s", spec.name, err)
        return None
    return {k: output[k].numpy() for k in output_names if isinstance(output.get(k), torch.Tensor)}


def _finish(
    path: Path,
    directory: Path,
    test: dict[str, np.ndarray],
    trace: dict[str, np.ndarray],
    golden: dict[str, np.ndarray] | None,
    meta: dict[str, Any],
) -> None:
    """Check that the export runs at the test shape; keep the trace shape where it does not (static export)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed_names = [i.name for i in session.get_inputs()]
    try:
        session.run(None, {k: test[k] for k in feed_names})
        meta["dynamic_shapes_ok"] = True
    except Exception as err:
        logger.info("%s does not run at the test shape (%s); using the trace shape", path, err)
        meta["dynamic_shapes_ok"] = False
        test, golden = trace, None
        try:
            session.run(None, {k: test[k] for k in feed_names})
        except Exception as trace_err:
            raise ZooExportError(
                f"the export does not run in ONNX Runtime, even at the trace shape: {trace_err}"
            ) from None
    np.savez(directory / "inputs.npz", **{k: test[k] for k in feed_names})
    if golden is not None:
        np.savez(directory / "golden.npz", **golden)
