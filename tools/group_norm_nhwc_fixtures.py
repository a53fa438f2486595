"""The channels-last GroupNorm fixtures of tests/rewrite/test_group_norm_nhwc.py (tests/data/group_norm/), so that CI,
which
has no tensorflow or jax, still runs the rewrite on tf2onnx's spelling of Keras' `layers.GroupNormalization` and
jax2onnx's of flax's `nnx.GroupNorm` and `linen.GroupNorm`. Regenerate (tensorflow-cpu, tf2onnx, jax, flax and
jax2onnx installed in the venv, jax2onnx with --no-deps so that it does not pull the CPU onnxruntime over
onnxruntime-gpu; an optional extra, never needed by CI) with

    python tools/group_norm_nhwc_fixtures.py
    python tools/group_norm_nhwc_fixtures.py --bench build/group-norm-nhwc   # the bench exports, not committed

Tiny sizes, random weights: a GroupNorm over [N, H, W, C] with G groups (1 < G < C and G = 1), with and
without a following swish (SiLU), static and dynamic batch. `manifest-channels-last.json` records the versions, the
input shape (a dynamic batch is exported as None and run with the size given), the groups, whether a swish follows
and the GroupNorm count.

`--fp16` writes only the Keras exports made under the `mixed_float16` policy (`manifest-channels-last-fp16.json`:
the norm computed in float32, its output Cast to float16, the swish in float16).

`--bench DIR` writes the exports tools/bench_group_norm_nhwc.py times instead (`manifest-bench.json`): the same
layers at a Stable Diffusion UNet block's size (GroupNorm(32, 320) at 32x32, batch 2) with G = 32 and swish/SiLU and
with G = 1, and a VAE decoder's (GroupNorm(32, 128) at 128x128) with swish/SiLU. `--only keras` or `--only flax`
exports one of the two, for a venv that has only TensorFlow or only JAX.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent.parent / "tests" / "data" / "group_norm"
CHANNELS = 8
SHAPE = [2, 4, 4, CHANNELS]
#: name -> (groups, activation, static batch)
CASES = {
    "keras-group-norm-g4": (4, None, True),
    "keras-group-norm-g4-swish": (4, "swish", True),
    "keras-group-norm-g1-swish-dynamic": (1, "swish", False),
    "keras-group-norm-g2-dynamic": (2, None, False),
}
JAX_CASES = {
    "flax-nnx-group-norm-g4-silu": (4, "silu", True),
    "flax-nnx-group-norm-g1": (1, None, True),
    "flax-nnx-group-norm-g2-silu-dynamic": (2, "silu", False),
    "flax-linen-group-norm-g4-silu": (4, "silu", True),
}
#: name -> (groups, activation, static batch), exported under Keras' mixed_float16 policy
#: (manifest-channels-last-fp16.json)
MIXED_CASES = {
    "keras-group-norm-g4-swish-mixed-float16": (4, "swish", True),
    "keras-group-norm-g1-dynamic-mixed-float16": (1, None, False),
}
UNET, VAE = [2, 32, 32, 320], [1, 128, 128, 128]
#: name -> (shape [N, H, W, C], groups, activation): the bench exports (static batch)
BENCH_CASES = {
    "keras-unet-g32-swish": (UNET, 32, "swish"),
    "keras-unet-g1": (UNET, 1, None),
    "keras-vae-g32-swish": (VAE, 32, "swish"),
    "flax-nnx-unet-g32-silu": (UNET, 32, "silu"),
    "flax-nnx-unet-g1": (UNET, 1, None),
    "flax-nnx-vae-g32-silu": (VAE, 32, "silu"),
}


def keras_model(groups: int, activation: str | None, static: bool, shape: list[int] = SHAPE) -> Any:
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    batch = shape[0] if static else None
    x = keras.Input(shape=tuple(shape[1:]), batch_size=batch, name="x")
    norm = keras.layers.GroupNormalization(groups=groups, epsilon=1e-3)
    y = norm(x)
    if activation is not None:
        y = keras.layers.Activation(activation)(y)
    rng = np.random.default_rng(0)
    norm.set_weights([rng.normal(1.0, 0.3, shape[-1]), rng.normal(0.0, 0.3, shape[-1])])
    return keras.Model(x, y)


def export_keras(
    name: str, groups: int, activation: str | None, static: bool, *, folder: Path = FOLDER, shape: list[int] = SHAPE
) -> dict[str, Any]:
    import tensorflow as tf
    import tf2onnx

    model = keras_model(groups, activation, static, shape)
    batch = shape[0] if static else None
    spec = (tf.TensorSpec([batch, *shape[1:]], tf.float32, name="x"),)
    file = f"{name}.onnx"
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(folder / file))
    versions = f"tensorflow {tf.__version__}, tf2onnx {tf2onnx.__version__}"
    return _manifest_entry(file, groups, activation == "swish", shape, static, versions)


def _manifest_entry(
    file: str, groups: int, silu: bool, shape: list[int], static: bool, versions: str
) -> dict[str, Any]:
    """The manifest's record of one exported fixture (one GroupNorm each), whichever framework wrote it."""
    return {
        "file": file,
        "group_norms": 1,
        "groups": groups,
        "silu": silu,
        "shape": shape,
        "static_batch": static,
        "versions": versions,
    }


def flax_model(groups: int, activation: str | None, channels: int = CHANNELS) -> Any:
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self) -> None:
            self.norm = nnx.GroupNorm(channels, num_groups=groups, epsilon=1e-5, rngs=nnx.Rngs(0))
            rng = np.random.default_rng(0)
            self.norm.scale.value = jnp.asarray(rng.normal(1.0, 0.3, channels), jnp.float32)
            self.norm.bias.value = jnp.asarray(rng.normal(0.0, 0.3, channels), jnp.float32)

        def __call__(self, x: Any) -> Any:
            y = self.norm(x)
            return nnx.silu(y) if activation == "silu" else y

    return Block()


def linen_function(groups: int, activation: str | None) -> Any:
    """`linen.GroupNorm` applied with random scale and bias, as a function of x (jax2onnx traces functions)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import linen

    norm = linen.GroupNorm(num_groups=groups, epsilon=1e-5)
    params = norm.init(jax.random.PRNGKey(0), jnp.ones(SHAPE, jnp.float32))
    rng = np.random.default_rng(0)
    params = {"params": {"scale": jnp.asarray(rng.normal(1.0, 0.3, CHANNELS), jnp.float32)}}
    params["params"]["bias"] = jnp.asarray(rng.normal(0.0, 0.3, CHANNELS), jnp.float32)

    def apply(x: Any) -> Any:
        y = norm.apply(params, x)
        return linen.silu(y) if activation == "silu" else y

    return apply


def export_jax(
    name: str, groups: int, activation: str | None, static: bool, *, folder: Path = FOLDER, shape: list[int] = SHAPE
) -> dict[str, Any]:
    from importlib.metadata import version

    import onnx
    from jax2onnx import to_onnx

    traced = shape if static else ["B", *shape[1:]]
    module = linen_function(groups, activation) if "linen" in name else flax_model(groups, activation, shape[-1])
    model = to_onnx(module, [tuple(traced)])
    file = f"{name}.onnx"
    onnx.save(model, str(folder / file))
    versions = f"jax {version('jax')}, flax {version('flax')}, jax2onnx {version('jax2onnx')}"
    return _manifest_entry(file, groups, activation == "silu", shape, static, versions)


def bench_exports(folder: Path, only: str | None) -> None:
    """The bench-sized exports into `folder`, merged into its manifest-bench.json (entries of the other exporter
    kept, so that the Keras and the flax exports can come from two venvs)."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "manifest-bench.json"
    kept = json.loads(manifest.read_text()) if manifest.exists() else []
    made = []
    for name, (shape, groups, activation) in BENCH_CASES.items():
        keras = name.startswith("keras")
        if only is None or only == ("keras" if keras else "flax"):
            export = export_keras if keras else export_jax
            made.append(export(name, groups, activation, True, folder=folder, shape=shape))
    files = {e["file"] for e in made}
    entries = [e for e in kept if e["file"] not in files] + made
    manifest.write_text(json.dumps(sorted(entries, key=lambda e: e["file"]), indent=1) + "\n")


def mixed_float16_exports() -> None:
    """MIXED_CASES under Keras' mixed_float16 policy (the policy reset after each)."""
    import keras

    entries = []
    for name, case in MIXED_CASES.items():
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            entries.append(export_keras(name, *case) | {"policy": "mixed_float16"})
        finally:
            keras.mixed_precision.set_global_policy("float32")
    (FOLDER / "manifest-channels-last-fp16.json").write_text(json.dumps(entries, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp16", action="store_true", help="write only the mixed_float16 Keras exports")
    parser.add_argument("--bench", type=Path, help="write the bench exports into this folder instead")
    parser.add_argument("--only", choices=("keras", "flax"), help="export with one of the two only")
    args = parser.parse_args()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    if args.bench is not None:
        bench_exports(args.bench, args.only)
        return
    if args.fp16:
        mixed_float16_exports()
        return
    entries = [export_keras(name, *case) for name, case in CASES.items() if args.only != "flax"]
    entries += [export_jax(name, *case) for name, case in JAX_CASES.items() if args.only != "keras"]
    (FOLDER / "manifest-channels-last.json").write_text(json.dumps(entries, indent=1) + "\n")


if __name__ == "__main__":
    main()
