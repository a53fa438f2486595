"""ONNX Runtime sessions for an original model and its optimized copy, on the same provider.

The optimized model gets our custom-op library registered when it uses the `onnx_norm` domain. A CUDA request
that ONNX Runtime silently served on the CPU provider (it logs and falls back, it does not raise) is an error:
no CUDA result is ever reported from a CPU run.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from onnx_norm import defaults, weights
from onnx_norm.defaults import OptLevel, Provider
from onnx_norm.errors import ort_message
from onnx_norm.model_io import ModelFile, proto_nodes
from onnx_norm.ops.reference import np_dtype
from onnx_norm.ops.schema import DOMAIN

logger = logging.getLogger(__name__)


#: ONNX Runtime's name of each provider and level the options offer (defaults.PROVIDERS, defaults.OPT_LEVELS).
PROVIDERS: dict[str, str] = dict(
    zip(defaults.PROVIDERS, ("CPUExecutionProvider", "CUDAExecutionProvider"), strict=True)
)
OPT_LEVELS: dict[str, ort.GraphOptimizationLevel] = dict(
    zip(
        defaults.OPT_LEVELS,
        (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        ),
        strict=True,
    )
)
#: ONNX Runtime's transformer that folds the Casts it inserts before CPU nodes without a half-precision kernel into
#: fp32 copies of fp16/bf16 initializers (inference_session.cc; its name in `disabled_optimizers`).
_HALF_WEIGHTS_FOLDER = "FuseFp16InitializerToFp32NodeTransformer"
# Protobuf refuses to serialize a message of 2 GiB or more; such models go to ORT through a file.
_PROTOBUF_LIMIT = 2**31 - 1


class SessionError(RuntimeError):
    """A session could not be created or run (ONNX Runtime rejected the model or failed running it)."""


class RuntimeUnavailableError(SessionError):
    """The machine cannot run the model as asked: the library is not built, or CUDA is unavailable. Not a
    property of the model: the parity gate reports it as a usage error, never as a parity failure."""


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How to run a model: provider, threads and ORT's own graph optimizations."""

    provider: Provider = defaults.PROVIDER
    threads: int | None = None
    optimization: OptLevel = "all"
    device_id: int = defaults.DEVICE_ID
    # Idle intra-op threads spin-wait by default; the bench turns that off so that one session's spinning
    # threads do not steal cycles from the session timed next.
    spinning: bool = True
    # ONNX Runtime's CUDA graphs (capture on the first bound run, replay after): only on the CUDA provider, and only
    # with every input and output bound to device memory that never moves (Runner with preallocated outputs).
    cuda_graph: bool = defaults.CUDA_GRAPH
    # ORT's priority-based execution order: runs a node as soon as it can feed the next one, where the default order
    # may run every input-free node first (the float64 copy's weight Casts: all the weights in float64 at once).
    priority_order: bool = False
    # Half-precision weights stay as they are on the CPU provider (`half_weights_at_run`): without it ORT converts
    # every fp16/bf16 weight of a node it has no half-precision kernel for into an fp32 initializer at load (twice
    # the weights' size, per session, not shareable).
    half_weights_at_run: bool = False
    # ORT's CPU memory arena keeps the memory of every freed tensor for the session (and grows in powers of two):
    # without it, a large temporary (a weight cast where used) goes back to the system once freed.
    cpu_arena: bool = True

    def __post_init__(self) -> None:
        if self.cuda_graph and self.provider != "cuda":
            raise ValueError(f"CUDA graphs need the cuda provider, not {self.provider!r}")

    def replace(self, **changes: object) -> RuntimeConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def model_label(role: str, model: object) -> str:
    """How errors name a model: `the original model (path)`, or just the role for an in-memory model."""
    return f"the {role} model ({model})" if isinstance(model, (str, Path, ModelFile)) else f"the {role} model"


def uses_custom_ops(model: onnx.ModelProto) -> bool:
    """Whether any node (or function) of the model is in our op domain."""
    if any(opset.domain == DOMAIN for opset in model.opset_import):
        return any(node.domain == DOMAIN for node in proto_nodes(model))
    return False


def library_available() -> bool:
    """Whether our custom-op library is built and loadable."""
    try:
        from onnx_norm import library
    except ImportError:
        return False
    return bool(library.library_available()) if hasattr(library, "library_available") else True


def has_local_functions(model: onnx.ModelProto) -> bool:
    """Whether every `onnx_norm` node has a model-local function ORT can inline when the library is absent."""
    functions = {(function.domain, function.name) for function in model.functions}
    return all((node.domain, node.op_type) in functions for node in proto_nodes(model) if node.domain == DOMAIN)


def _library_options(options: ort.SessionOptions, model: onnx.ModelProto | None) -> ort.SessionOptions:
    if not library_available():
        if model is not None and has_local_functions(model):
            logger.warning(
                "the onnx-norm custom-op library is not built: %s ops run as their model-local ONNX functions, "
                "not as fused kernels",
                DOMAIN,
            )
            return options
        raise RuntimeUnavailableError(
            f"the model uses {DOMAIN} ops but the onnx-norm custom-op library is not built; "
            "reinstall with `pip install .`"
        )
    from onnx_norm import library

    return library.session_options(options)


def ort_log_level() -> int:
    """ONNX Runtime's log severity for our sessions, following this module's logger: ORT's errors are raised as
    exceptions and reported once (with the model named), so by default it logs nothing below fatal, which would
    otherwise print coloured lines around our one-line message; -v shows its errors, -vv its warnings too."""
    if logger.isEnabledFor(logging.DEBUG):
        return 2
    if logger.isEnabledFor(logging.INFO):
        return 3
    return 4


def session_options(
    config: RuntimeConfig,
    *,
    custom_ops: bool,
    profile_prefix: str | None = None,
    model: onnx.ModelProto | None = None,
) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = OPT_LEVELS[config.optimization]
    if config.threads:
        options.intra_op_num_threads = config.threads
        options.inter_op_num_threads = 1
    options.log_severity_level = ort_log_level()
    if config.priority_order or config.half_weights_at_run:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if config.half_weights_at_run or not config.cpu_arena:
        # With half_weights_at_run, the fp32 copy of a weight is made by its Cast right before the node that reads
        # it (priority order: the default order may run every input-free Cast first) and freed after it; without the
        # arena that memory goes back to the system after each run instead of staying reserved per session.
        options.enable_cpu_mem_arena = False
    if not config.spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if custom_ops:
        options = _library_options(options, model)
    return options


def providers(config: RuntimeConfig) -> list[str | tuple[str, dict[str, str]]]:
    """The `providers` argument of an InferenceSession for `config`, with the CUDA provider's options."""
    if config.provider == "cuda":
        options = {"device_id": str(config.device_id)}
        if config.cuda_graph:
            options["enable_cuda_graph"] = "1"
        return [(PROVIDERS["cuda"], options), PROVIDERS["cpu"]]
    return [PROVIDERS["cpu"]]


def half_weights_policy(where: str, at_once: int) -> str:
    """What sessions with `RuntimeConfig.half_weights_at_run` do, for the reports of verify and the bench (`where`:
    which sessions; `at_once`: the most bytes of fp32 copies that exist at once, `weights.session_copies`)."""
    return (
        f"half-precision weights kept in their type {where} and cast to fp32 where used, at most about "
        f"{at_once / weights.GIB:.2f} GiB at once (ONNX Runtime's fp16-initializer fusion, {_HALF_WEIGHTS_FOLDER}, "
        "off: on the CPU provider it folds them into fp32 copies at load, twice the weights per session), "
        "priority-based execution order, CPU memory arena off"
    )


def disabled_optimizers(config: RuntimeConfig) -> list[str]:
    """ONNX Runtime transformers `config` turns off (InferenceSession's `disabled_optimizers`)."""
    return [_HALF_WEIGHTS_FOLDER] if config.half_weights_at_run and config.provider == "cpu" else []


def _preload_cuda() -> None:
    # The CUDA libraries of the nvidia-* wheels are not on the loader path; ORT finds them only after this.
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as err:
            logger.debug("onnxruntime.preload_dlls failed: %s", err)


def create_session(
    model: onnx.ModelProto | str | Path | ModelFile,
    config: RuntimeConfig,
    *,
    custom_ops: bool | None = None,
    profile_prefix: str | None = None,
    label: str = "the model",
    shared: weights.SharedWeights | None = None,
) -> ort.InferenceSession:
    """An InferenceSession for `model`; `custom_ops=None` registers the library only if the model needs it. Errors
    are SessionError naming `label`.

    A path is loaded by ONNX Runtime itself (its external data too); so is a `ModelFile`'s, whose proto (already
    read) is what this function reads of it. A ModelProto whose external tensors are references (absolute locations:
    `model_io.resolve_external_data`) gets them as OrtValues over memory maps, from `shared` when given (one copy
    for every session sharing it), without reading them into Python memory."""
    proto = model if isinstance(model, onnx.ModelProto) else None
    if isinstance(model, ModelFile):
        signature, model = model.proto, model.path
    else:
        signature = proto if proto is not None else onnx.load(str(model), load_external_data=False)
    if custom_ops is None:
        custom_ops = uses_custom_ops(signature)
    options = session_options(config, custom_ops=custom_ops, profile_prefix=profile_prefix, model=signature)
    if config.provider == "cuda":
        _preload_cuda()
    if config.provider not in PROVIDERS:
        raise RuntimeUnavailableError(f"unknown provider {config.provider!r}; choose from {', '.join(PROVIDERS)}")
    try:
        if proto is None:
            session = _inference_session(str(model), options, config)
        elif weights.has_external_data(proto):
            session = _session_with_shared_weights(proto, options, config, shared or weights.SharedWeights())
        elif proto.ByteSize() < _PROTOBUF_LIMIT:
            session = _inference_session(proto.SerializeToString(), options, config)
        else:
            with tempfile.TemporaryDirectory(prefix="onnx_norm_") as tmp:
                path = os.path.join(tmp, "model.onnx")
                onnx.save_model(proto, path, save_as_external_data=True, location="model.onnx.data")
                session = _inference_session(path, options, config)
    except SessionError:
        raise
    except Exception as err:  # ORT raises its own Fail/InvalidGraph/NotImplemented types
        raise SessionError(f"ONNX Runtime could not load {label}: {ort_message(err)}") from err
    active = session.get_providers()
    wanted = PROVIDERS[config.provider]
    if not active or active[0] != wanted:
        raise RuntimeUnavailableError(
            f"asked for {wanted} but ONNX Runtime runs the model on {active}; it falls back to the CPU when CUDA, "
            "cuDNN or the driver cannot be loaded (see the log above, or run with -v). No result is reported."
        )
    return session


def _inference_session(model: str | bytes, options: ort.SessionOptions, config: RuntimeConfig) -> ort.InferenceSession:
    disabled = disabled_optimizers(config)
    extra = {"disabled_optimizers": disabled} if disabled else {}
    return ort.InferenceSession(model, options, providers=providers(config), **extra)


def _session_with_shared_weights(
    proto: onnx.ModelProto, options: ort.SessionOptions, config: RuntimeConfig, shared: weights.SharedWeights
) -> ort.InferenceSession:
    """A session of a proto with external tensors: a header file beside (links to) its data files, the tensors
    handed over from `shared` (see onnx_norm.weights). The header is removed once ORT has built the session."""
    values = weights.add_initializers(options, proto, shared)
    with weights.session_file(proto) as path:
        session = _inference_session(str(path), options, config)
    session._onnx_norm_weights = (shared, values)  # type: ignore[attr-defined]  # alive as long as the session
    return session


class Runner:
    """Runs one session on fixed inputs. On CUDA the inputs stay on the device and the outputs are bound there,
    so that timed runs measure the model and not host copies."""

    def __init__(
        self,
        session: ort.InferenceSession,
        feeds: Mapping[str, np.ndarray],
        config: RuntimeConfig,
        *,
        label: str = "the model",
        outputs: Mapping[str, ort.OrtValue] | None = None,
    ) -> None:
        """`outputs`: preallocated OrtValues (preallocate_outputs) the outputs are written into, at addresses that
        never change; needed for CUDA graphs. Without them ORT allocates the outputs on the device each run."""
        self.session = session
        self.label = label
        self.config = config
        self.output_names = [out.name for out in session.get_outputs()]
        self._feeds = dict(feeds)
        device = "cuda" if config.provider == "cuda" else "cpu"
        self._binding = session.io_binding()
        self._inputs = {name: to_ortvalue(array, device, config.device_id) for name, array in feeds.items()}
        for name, value in self._inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        self.outputs = dict(outputs) if outputs is not None else None
        for name in self.output_names:
            if self.outputs is not None:
                self._binding.bind_ortvalue_output(name, self.outputs[name])
            else:
                self._binding.bind_output(name, device, config.device_id)

    def run_bound(self) -> None:
        """One run with bound inputs and outputs (for timing); ORT errors become SessionError."""
        try:
            self.session.run_with_iobinding(self._binding)
        except Exception as err:  # ORT's pybind errors (Fail, InvalidArgument, RuntimeError...) share no base
            shapes = ", ".join(f"{name} {list(value.shape())}" for name, value in self._inputs.items())
            message = ort_message(err)
            raise SessionError(f"ONNX Runtime failed to run {self.label} on inputs {shapes}: {message}") from err

    def run(self) -> dict[str, np.ndarray]:
        """One run, outputs copied to host numpy arrays."""
        return run_model(self.session, self._feeds, self.output_names, label=self.label)


def element_type(type_name: str) -> int:
    """The ONNX element type of ONNX Runtime's type string of a tensor: `tensor(float16)` -> TensorProto.FLOAT16."""
    inner = type_name.removeprefix("tensor(").removesuffix(")")
    return int(onnx.TensorProto.DataType.Value(inner.upper()))


def static_output_shapes(session: ort.InferenceSession) -> dict[str, list[int]] | None:
    """Every output's shape when the model fixes them all (no symbolic or unknown dim), else None."""
    shapes = {out.name: list(out.shape) for out in session.get_outputs()}
    if all(isinstance(dim, int) for shape in shapes.values() for dim in shape):
        return shapes
    return None


def preallocate_outputs(
    session: ort.InferenceSession,
    feeds: Mapping[str, np.ndarray],
    device: str = "cpu",
    device_id: int = 0,
    *,
    probe: ort.InferenceSession | None = None,
    label: str = "the model",
) -> dict[str, ort.OrtValue]:
    """An OrtValue on `device` for every output of `session` on `feeds`, to bind with bind_ortvalue_output (CUDA
    graphs replay into fixed addresses). Shapes are the model's when all static, else those of one run of `probe`,
    an ordinary session of the same model (default: `session` itself, which must then not be a CUDA graph session:
    its first run would be the capture)."""
    types = {out.name: element_type(out.type) for out in session.get_outputs()}
    shapes = static_output_shapes(session)
    if shapes is None:
        results = run_model(probe if probe is not None else session, feeds, list(types), label=label)
        shapes = {name: list(np.shape(value)) for name, value in results.items()}
    return {
        name: ort.OrtValue.ortvalue_from_shape_and_type(shapes[name], types[name], device, device_id) for name in types
    }


def run_model(
    session: ort.InferenceSession,
    feeds: Mapping[str, np.ndarray],
    output_names: list[str] | None = None,
    *,
    label: str = "the model",
) -> dict[str, np.ndarray]:
    """Outputs by name for one input set; ORT errors become SessionError naming `label` and the input shapes.
    bfloat16 tensors, which ONNX Runtime cannot take from or give to numpy, go through OrtValues."""
    names = output_names or [out.name for out in session.get_outputs()]
    try:
        if _needs_ortvalues(session, feeds, names):
            return _run_with_ortvalues(session, feeds, names)
        values = session.run(names, dict(feeds))
    except Exception as err:  # ORT raises Fail/InvalidArgument/RuntimeException
        shapes = ", ".join(f"{name} {list(np.shape(value))}" for name, value in feeds.items())
        raise SessionError(f"ONNX Runtime failed to run {label} on inputs {shapes}: {ort_message(err)}") from err
    return dict(zip(names, values, strict=True))


_BFLOAT16 = np.dtype(np_dtype(onnx.TensorProto.BFLOAT16))
_BFLOAT16_TYPE = "tensor(bfloat16)"


def _needs_ortvalues(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], names: list[str]) -> bool:
    if any(np.asarray(value).dtype == _BFLOAT16 for value in feeds.values()):
        return True
    wanted = set(names)
    return any(out.type == _BFLOAT16_TYPE for out in session.get_outputs() if out.name in wanted)


def to_ortvalue(array: np.ndarray, device: str = "cpu", device_id: int = 0) -> ort.OrtValue:
    """An OrtValue holding a copy of `array` (bfloat16 included) on `device`; a scalar stays a scalar."""
    array = np.asarray(array)
    array = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes a 0-d array 1-d
    if array.dtype != _BFLOAT16:
        return ort.OrtValue.ortvalue_from_numpy(array, device, device_id)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), onnx.TensorProto.BFLOAT16, device, device_id)
    value.update_inplace(array.view(np.uint16))
    return value


def from_ortvalue(value: ort.OrtValue) -> np.ndarray:
    """A numpy array from a CPU OrtValue; bfloat16 is read from its buffer (OrtValue.numpy() refuses it)."""
    if value.data_type() != _BFLOAT16_TYPE:
        return value.numpy()
    shape = value.shape()
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, _BFLOAT16)
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(buffer, np.uint16).copy().view(_BFLOAT16).reshape(shape)


def _run_with_ortvalues(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], names: list[str]
) -> dict[str, np.ndarray]:
    binding = session.io_binding()
    inputs = {name: to_ortvalue(np.asarray(array)) for name, array in feeds.items()}
    for name, value in inputs.items():
        binding.bind_ortvalue_input(name, value)
    for name in names:
        binding.bind_output(name, "cpu")  # copied back to the host whatever the provider
    session.run_with_iobinding(binding)
    return {name: from_ortvalue(value) for name, value in zip(names, binding.get_outputs(), strict=True)}
