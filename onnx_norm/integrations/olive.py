"""An Olive pass, `OnnxNormFusion`, for Olive workflow configs (olive-ai 0.13).

Olive finds passes through its package config (`olive/olive_config.json`: pass name -> `module_path`); a pass that
lives outside Olive's tree is added with a package config of one's own, given to `olive run --package-config` or
`olive.workflows.run(..., package_config=...)` (Olive's CLI help: "location of individual pass module
implementation ... might also include user owned/proprietary/private pass implementations"). That file replaces
Olive's, so `package_config()` returns Olive's own with our pass added; `python -m onnx_norm.integrations.olive
PATH` writes it.

The pass runs `onnx_norm.optimize` with its options and hands Olive an `OnnxNormModel`: an ONNX model handler whose
sessions register our custom-op library. Olive's session options have no key for a custom-op library (only
`use_ort_extensions`, which registers onnxruntime-extensions'), so the handler creates the session itself, with
Olive's inference settings applied the way Olive applies them. Later passes that write a plain `ONNXModel` keep the
model runnable without the library, through the model-local functions our ops carry.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from olive.common.ort_inference import check_and_normalize_provider_args, get_ort_available_providers
from olive.hardware.accelerator import AcceleratorSpec, Device
from olive.model import ONNXModelHandler
from olive.model.config.registry import model_handler_registry
from olive.model.utils import resolve_onnx_path
from olive.passes import Pass
from olive.passes.onnx.common import get_external_data_config
from olive.passes.pass_config import BasePassConfig, PassConfigParam
from olive.resource_path import LocalFile, LocalFolder

logger = logging.getLogger(__name__)

PASS_NAME = "OnnxNormFusion"
MODEL_TYPE = "OnnxNormModel"
#: The module Olive imports the pass from. Spelled out: run as `python -m onnx_norm.integrations.olive`, this
#: module's `__name__` is `__main__`, which `olive run` (another process) cannot import the pass from.
MODULE = "onnx_norm.integrations.olive"


@model_handler_registry(MODEL_TYPE)
class OnnxNormModelHandler(ONNXModelHandler):
    """An ONNX model whose ONNX Runtime sessions have the onnx-norm custom-op library registered."""

    def prepare_session(
        self,
        inference_settings: dict[str, Any] | None = None,
        device: Device = Device.CPU,
        execution_providers: str | list[str] | None = None,
        rank: int | None = None,
    ) -> Any:
        import onnxruntime as ort

        from onnx_norm.library import session_options

        settings = self.merge_inference_settings(inference_settings, execution_providers)
        if not settings["execution_provider"]:
            settings["execution_provider"] = self._get_default_execution_providers(device)
            settings["provider_options"] = None
        options = session_options(_ort_options(settings.get("session_options") or {}))
        providers, provider_options = check_and_normalize_provider_args(
            settings["execution_provider"], settings.get("provider_options"), get_ort_available_providers()
        )
        if device == Device.GPU and rank is not None:
            for provider, provider_option in zip(providers, provider_options, strict=True):
                if provider == "CUDAExecutionProvider":
                    provider_option["device_id"] = str(rank)
        return ort.InferenceSession(
            str(self.model_path), options, providers=providers, provider_options=provider_options
        )


def _ort_options(settings: dict[str, Any]) -> Any:
    """SessionOptions from Olive's `session_options` settings (the keys olive.common.ort_inference reads)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    for key in ("inter_op_num_threads", "intra_op_num_threads", "log_severity_level"):
        if settings.get(key) is not None:
            setattr(options, key, settings[key])
    if settings.get("enable_profiling"):
        options.enable_profiling = True
    if settings.get("execution_mode") is not None:
        options.execution_mode = ort.ExecutionMode(settings["execution_mode"])
    if settings.get("graph_optimization_level") is not None:
        options.graph_optimization_level = ort.GraphOptimizationLevel(settings["graph_optimization_level"])
    for key, value in (settings.get("extra_session_config") or {}).items():
        options.add_session_config_entry(key, value)
    return options


class OnnxNormFusion(Pass):
    """Fuses decomposed LayerNorm/RMSNorm subgraphs into single ops (onnx-norm); see docs/integrations.md."""

    @classmethod
    def _default_config(cls, accelerator_spec: AcceleratorSpec) -> dict[str, PassConfigParam]:
        from onnx_norm import defaults
        from onnx_norm.rewrite import RULE_NAMES, TARGETS

        return {
            "target": PassConfigParam(
                type_=str,
                default_value=defaults.TARGET,
                description=f"ops to emit: {', '.join(TARGETS)} (as `onnx-norm optimize --target`)",
            ),
            "disable": PassConfigParam(
                type_=list[str], default_value=[], description=f"rules to skip, of: {', '.join(RULE_NAMES)}"
            ),
            "take_over_native": PassConfigParam(
                type_=bool,
                default_value=False,
                description="also move norms that are already native ops (LayerNormalization, "
                "SimplifiedLayerNormalization, Skip*) onto the target's ops",
            ),
            "verify_rewrites": PassConfigParam(
                type_=bool, default_value=True, description="prove each candidate on random inputs before rewriting"
            ),
            "verify": PassConfigParam(
                type_=bool,
                default_value=False,
                description="run onnx-norm's parity gate on the result against the input model; fail the pass if "
                "it does not pass",
            ),
            **get_external_data_config(),
        }

    def _run_for_config(
        self, model: ONNXModelHandler, config: type[BasePassConfig], output_model_path: str
    ) -> ONNXModelHandler:

        from onnx_norm import model_io
        from onnx_norm.rewrite import TARGETS, optimize

        if config.target not in TARGETS:
            raise ValueError(f"{PASS_NAME}: unknown target {config.target!r}; expected one of {', '.join(TARGETS)}")
        output_model_path = resolve_onnx_path(output_model_path, Path(model.model_path).name)
        rewritten, report = optimize(
            model_io.load(model.model_path),
            target=config.target,
            disable=config.disable,
            take_over_native=config.take_over_native,
            verify_rewrites=config.verify_rewrites,
        )
        logger.info("%s: fused %d norm(s) %s", PASS_NAME, len(report.norms), report.rule_counts)
        written = _save(rewritten, Path(output_model_path), config)
        if config.verify:
            _gate(model.model_path, output_model_path)
        settings = written.to_json()["config"]
        if config.target != "onnx-norm":
            return written  # standard or ORT ops: nothing to register
        settings["inference_settings"] = model.inference_settings
        return OnnxNormModelHandler(**settings)


def _save(rewritten: Any, path: Path, config: Any) -> ONNXModelHandler:
    """Writes the rewritten model as onnx-norm's `save` does, its weights streamed from the input's memory-mapped
    data, never all in memory: external data when Olive's `save_as_external_data` asks for it (named
    `external_data_name` when given), when the input had it, or past protobuf's 2 GiB; else inline. Olive's own
    writer would first read every external tensor into memory (the input's data file lies in neither Olive's
    output folder nor its cache, so the output cannot refer to it)."""
    from onnx_norm import model_io

    path.parent.mkdir(parents=True, exist_ok=True)
    external = True if config.save_as_external_data else None
    data_name = config.external_data_name or None
    model_io.save(rewritten, path, external_data=external, data_name=data_name)
    if (path.parent / (data_name or model_io.data_file(path).name)).exists():
        return ONNXModelHandler(model_path=LocalFolder({"path": path.parent}), onnx_file_name=path.name)
    return ONNXModelHandler(model_path=LocalFile({"path": path}))


def _gate(original: str, written: str) -> None:
    """onnx-norm's parity gate on the model the pass wrote (sessions from both files: no copy of the weights)."""
    from onnx_norm.parity import verify

    if not verify(original, written).passed:
        raise RuntimeError(f"{PASS_NAME}: the rewritten model failed onnx-norm's parity gate against {original}")


def package_config() -> dict[str, Any]:
    """Olive's package config with `OnnxNormFusion` added, for `olive run --package-config`."""
    from olive.package_config import OlivePackageConfig

    with open(OlivePackageConfig.get_default_config_path()) as f:
        config = json.load(f)
    config["passes"][PASS_NAME] = {
        "module_path": f"{MODULE}.{PASS_NAME}",
        "supported_providers": ["*"],
        "supported_accelerators": ["*"],
        "supported_precisions": ["*"],
        "supported_algorithms": [],
        "supported_quantization_encodings": [],
        "extra_dependencies": [],
    }
    return config


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description=f"Write Olive's package config with the {PASS_NAME} pass added, for "
        "`olive run --config WORKFLOW.json --package-config PACKAGE_CONFIG.json`.",
    )
    parser.add_argument("package_config", metavar="PACKAGE_CONFIG.json", help="where to write the package config")
    args = parser.parse_args(argv)
    path = Path(args.package_config)
    try:
        path.write_text(json.dumps(package_config(), indent=2) + "\n")
    except OSError as err:
        print(f"{parser.prog}: error: cannot write {path}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(
        f"wrote {path}: Olive's package config with {PASS_NAME}; next: olive run --config workflow.json "
        f'--package-config {path} (a workflow with {{"type": "{PASS_NAME}"}} in "passes")'
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
