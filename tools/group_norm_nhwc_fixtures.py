"""The channels-last GroupNorm fixtures of tests/test_group_norm_nhwc.py (tests/data/group_norm/), so that CI, which
has no tensorflow or jax, still runs the rewrite on tf2onnx's spelling of Keras' `layers.GroupNormalization` and
jax2onnx's of flax's `nnx.GroupNorm` and `linen.GroupNorm`. Regenerate (tensorflow-cpu, tf2onnx, jax, flax and
jax2onnx installed in the venv, jax2onnx with --no-deps so that it does not pull the CPU onnxruntime over
onnxruntime-gpu; an optional extra, never needed by CI) with

    python tools/group_norm_nhwc_fixtures.py

Tiny sizes, random weights: a GroupNorm over [N, H, W, C] with G groups (1 < G < C and G = 1), with and
without a following swish (SiLU), static and dynamic batch. `manifest-channels-last.json` records the versions, the
input shape (a dynamic batch is exported as None and run with the size given), the groups, whether a swish follows
and the GroupNorm count.
"""

from __future__ import annotations

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


def keras_model(groups: int, activation: str | None, static: bool) -> Any:
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    batch = SHAPE[0] if static else None
    x = keras.Input(shape=tuple(SHAPE[1:]), batch_size=batch, name="x")
    norm = keras.layers.GroupNormalization(groups=groups, epsilon=1e-3)
    y = norm(x)
    if activation is not None:
        y = keras.layers.Activation(activation)(y)
    rng = np.random.default_rng(0)
    norm.set_weights([rng.normal(1.0, 0.3, CHANNELS), rng.normal(0.0, 0.3, CHANNELS)])
    return keras.Model(x, y)


def export_keras(name: str, groups: int, activation: str | None, static: bool) -> dict[str, Any]:
    import tensorflow as tf
    import tf2onnx

    model = keras_model(groups, activation, static)
    batch = SHAPE[0] if static else None
    spec = (tf.TensorSpec([batch, *SHAPE[1:]], tf.float32, name="x"),)
    file = f"{name}.onnx"
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(FOLDER / file))
    versions = f"tensorflow {tf.__version__}, tf2onnx {tf2onnx.__version__}"
    return {
        "file": file,
        "group_norms": 1,
        "groups": groups,
        "silu": activation == "swish",
        "shape": SHAPE,
        "static_batch": static,
        "versions": versions,
    }


def flax_model(groups: int, activation: str | None) -> Any:
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self) -> None:
            self.norm = nnx.GroupNorm(CHANNELS, num_groups=groups, epsilon=1e-5, rngs=nnx.Rngs(0))
            rng = np.random.default_rng(0)
            self.norm.scale.value = jnp.asarray(rng.normal(1.0, 0.3, CHANNELS), jnp.float32)
            self.norm.bias.value = jnp.asarray(rng.normal(0.0, 0.3, CHANNELS), jnp.float32)

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


def export_jax(name: str, groups: int, activation: str | None, static: bool) -> dict[str, Any]:
    from importlib.metadata import version

    import onnx
    from jax2onnx import to_onnx

    shape = SHAPE if static else ["B", *SHAPE[1:]]
    module = linen_function(groups, activation) if "linen" in name else flax_model(groups, activation)
    model = to_onnx(module, [tuple(shape)])
    file = f"{name}.onnx"
    onnx.save(model, str(FOLDER / file))
    versions = f"jax {version('jax')}, flax {version('flax')}, jax2onnx {version('jax2onnx')}"
    return {
        "file": file,
        "group_norms": 1,
        "groups": groups,
        "silu": activation == "silu",
        "shape": SHAPE,
        "static_batch": static,
        "versions": versions,
    }


def main() -> None:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    entries = [export_keras(name, *case) for name, case in CASES.items()]
    entries += [export_jax(name, *case) for name, case in JAX_CASES.items()]
    (FOLDER / "manifest-channels-last.json").write_text(json.dumps(entries, indent=1) + "\n")


if __name__ == "__main__":
    main()
