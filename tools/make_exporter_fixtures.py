"""Export tiny models with the exporters and tool chains people use, as small ONNX fixtures for the tests.

Each family runs in the Python environment that has its exporter (TensorFlow, JAX and Paddle pin numpy, protobuf
and onnx differently from each other and from torch, so they usually live in separate virtual environments). The
script imports nothing of onnx_norm, so it runs in any of them. It writes `<family>-<model>.onnx` files and merges
their entries into `manifest.json` in the output folder (the entries of the families it re-ran are replaced):

    python tools/make_exporter_fixtures.py --family onnxscript,onnx-functions,timm,diffusers,toolchains
    /path/to/tf-venv/bin/python tools/make_exporter_fixtures.py --family tf2onnx       # tensorflow-cpu, tf2onnx
    /path/to/jax-venv/bin/python tools/make_exporter_fixtures.py --family jax2onnx     # jax, flax, jax2onnx
    /path/to/paddle-venv/bin/python tools/make_exporter_fixtures.py --family paddle2onnx  # paddlepaddle, paddle2onnx

Default output: tests/data/exporters. Models are built from constructors or configs with seeded random weights,
so a re-run writes the same graphs up to the exporters' own naming. Every manifest entry says how many norms the
model computes (`norms`; `native` of them already a norm op), the input shapes to check it with, and the versions
that produced it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN = 16
SEQ = 5
EPS = 1e-5
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "exporters"


def version(*packages: str) -> str:
    found = []
    for package in packages:
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


class Fixture(dict):
    """One manifest entry; `model` is the serialized ONNX model (dropped from the manifest)."""

    def __init__(
        self,
        name: str,
        model: bytes,
        *,
        norms: int,
        shapes: dict[str, list[int]],
        versions: str,
        native: int = 0,
        what: str = "",
    ) -> None:
        super().__init__(
            name=name, norms=norms, native=native, shapes=shapes, versions=versions, what=what, model=model
        )


# ---------------------------------------------------------------------------------------------------- tf2onnx
def tf2onnx_fixtures() -> Iterator[Fixture]:
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)

    class HandRMSNorm(keras.layers.Layer):
        """The RMSNorm people write by hand in Keras (no built-in one before Keras 3.9)."""

        def build(self, shape: Any) -> None:
            self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")

        def call(self, x: Any) -> Any:
            ms = keras.ops.mean(keras.ops.square(x), axis=-1, keepdims=True)
            return x * keras.ops.rsqrt(ms + 1e-6) * self.scale

    kinds = ["layernorm", "layernorm-2axes", "layernorm-plain", "rmsnorm"]
    if hasattr(keras.layers, "RMSNormalization"):
        kinds.append("rmsnorm-keras")
    versions = version("tensorflow-cpu", "tensorflow", "keras", "tf2onnx")
    opsets = dict.fromkeys(kinds, (13, 17, 18))
    yield from _keras_fixtures(keras, ("keras", "Keras"), opsets, versions, rng, HandRMSNorm)
    try:
        # Keras 2 (tf.keras up to TensorFlow 2.15, `tf_keras` since): its LayerNormalization runs a fused batch
        # norm over a 4-D reshape, which tf2onnx writes with GlobalAveragePool moments.
        import tf_keras
    except ImportError:
        return
    tf_keras.utils.set_random_seed(0)
    versions = version("tensorflow-cpu", "tensorflow", "tf_keras", "tf2onnx")
    opsets = {"layernorm": (13, 17), "layernorm-2axes": (13,), "layernorm-plain": (13,)}
    yield from _keras_fixtures(tf_keras, ("keras2", "Keras 2 (tf_keras)"), opsets, versions, rng, None)


def _keras_layer(keras: Any, kind: str, hand_rms: Any) -> Any:
    if kind == "layernorm":
        return keras.layers.LayerNormalization(axis=-1, epsilon=EPS)
    if kind == "layernorm-2axes":
        return keras.layers.LayerNormalization(axis=[-2, -1], epsilon=EPS)
    if kind == "layernorm-plain":
        return keras.layers.LayerNormalization(axis=-1, epsilon=EPS, center=False, scale=False)
    if kind == "rmsnorm-keras":
        return keras.layers.RMSNormalization(axis=-1, epsilon=1e-6)
    return hand_rms()


def _keras_fixtures(
    keras: Any, names: tuple[str, str], opsets: dict[str, tuple[int, ...]], versions: str, rng: Any, hand_rms: Any
) -> Iterator[Fixture]:
    """Each kind of norm between two Dense layers, through tf2onnx at each of its opsets; `names`: the fixtures'
    name prefix and the Keras flavour as their description says it."""
    prefix, flavour = names
    import tensorflow as tf
    import tf2onnx

    for kind, kind_opsets in opsets.items():
        seq = SEQ if kind == "layernorm-2axes" else None  # a norm over (seq, hidden) needs a static seq
        inputs = keras.Input((seq, HIDDEN), name="x")
        norm = _keras_layer(keras, kind, hand_rms)
        h = keras.layers.Dense(HIDDEN)(inputs)
        outputs = keras.layers.Dense(HIDDEN)(norm(h))
        model = keras.Model(inputs, outputs)
        # Random norm parameters: a unit scale and zero shift would hide a scale applied twice or not at all.
        norm.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(np.float32) for w in norm.get_weights()])
        spec = (tf.TensorSpec((None, seq, HIDDEN), tf.float32, name="x"),)
        function = tf.function(lambda x, m=model: m(x, training=False), input_signature=spec)
        for opset in kind_opsets:
            proto, _ = tf2onnx.convert.from_function(function, input_signature=spec, opset=opset)
            yield Fixture(
                f"{prefix}-{kind}-opset{opset}",
                proto.SerializeToString(),
                norms=1,
                shapes={proto.graph.input[0].name: [2, SEQ, HIDDEN]},
                versions=versions,
                what=f"{flavour} {kind} between two Dense layers, tf2onnx opset {opset}",
            )


# ---------------------------------------------------------------------------------------------------- jax2onnx
def jax2onnx_fixtures() -> Iterator[Fixture]:
    import jax
    from flax import nnx
    from jax2onnx import to_onnx

    versions = version("jax", "flax", "jax2onnx")

    def randomize(module: Any, seed: int) -> None:
        """nnx norms start with scale 1 and bias 0; random values show a missing or doubled scale."""
        key = jax.random.key(seed)
        for path, param in nnx.iter_graph(module):
            if isinstance(param, nnx.Param) and any(p in ("scale", "bias") for p in map(str, path)):
                key, sub = jax.random.split(key)
                param[...] = jax.random.uniform(sub, param.shape, minval=0.5, maxval=1.5)

    class Wrapped(nnx.Module):
        def __init__(self, norm: Any, rngs: nnx.Rngs) -> None:
            self.inp = nnx.Linear(HIDDEN, HIDDEN, rngs=rngs)
            self.norm = norm
            self.out = nnx.Linear(HIDDEN, HIDDEN, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.out(self.norm(self.inp(x)))

    class Block(nnx.Module):
        """A pre-norm transformer block: attention and MLP, each behind a LayerNorm."""

        def __init__(self, rngs: nnx.Rngs) -> None:
            self.ln1 = nnx.LayerNorm(HIDDEN, epsilon=EPS, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(2, HIDDEN, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(HIDDEN, epsilon=EPS, rngs=rngs)
            self.up = nnx.Linear(HIDDEN, 2 * HIDDEN, rngs=rngs)
            self.down = nnx.Linear(2 * HIDDEN, HIDDEN, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            h = self.ln1(x)
            x = x + self.attn(h, h, h)
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    rngs = nnx.Rngs(0)
    models = {
        "nnx-layernorm": (Wrapped(nnx.LayerNorm(HIDDEN, epsilon=EPS, rngs=rngs), rngs), 1),
        "nnx-rmsnorm": (Wrapped(nnx.RMSNorm(HIDDEN, epsilon=1e-6, rngs=rngs), rngs), 1),
        "nnx-block": (Block(rngs), 2),
    }
    for seed, (name, (module, norms)) in enumerate(models.items()):
        randomize(module, seed)
        proto = to_onnx(module, [("B", SEQ, HIDDEN)], model_name=name)
        yield Fixture(
            name,
            proto.SerializeToString(),
            norms=norms,
            shapes={proto.graph.input[0].name: [2, SEQ, HIDDEN]},
            versions=versions,
            what=f"flax {name} (random weights), jax2onnx.to_onnx with a symbolic batch",
        )


# ---------------------------------------------------------------------------------------------------- paddle2onnx
def paddle2onnx_fixtures() -> Iterator[Fixture]:
    import onnx
    import paddle

    paddle.seed(0)
    versions = version("paddlepaddle", "paddle2onnx")

    class HandRMSNorm(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.weight = self.create_parameter([HIDDEN], default_initializer=paddle.nn.initializer.Uniform(0.5, 1.5))

        def forward(self, x: Any) -> Any:
            ms = paddle.mean(x * x, axis=-1, keepdim=True)
            return x * paddle.rsqrt(ms + 1e-6) * self.weight

    class Wrapped(paddle.nn.Layer):
        def __init__(self, norm: Any) -> None:
            super().__init__()
            self.inp = paddle.nn.Linear(HIDDEN, HIDDEN)
            self.norm = norm
            self.out = paddle.nn.Linear(HIDDEN, HIDDEN)

        def forward(self, x: Any) -> Any:
            return self.out(self.norm(self.inp(x)))

    layer_norm = paddle.nn.LayerNorm(HIDDEN, epsilon=EPS)
    with paddle.no_grad():
        layer_norm.weight.set_value(paddle.uniform([HIDDEN], min=0.5, max=1.5))
        layer_norm.bias.set_value(paddle.uniform([HIDDEN], min=-0.5, max=0.5))
    models = {"layernorm": Wrapped(layer_norm), "rmsnorm": Wrapped(HandRMSNorm())}
    # None: paddle.onnx.export's own default opset (9, which its docs still give), as most users run it.
    for (name, layer), opset in itertools.product(models.items(), (13, 17, None)):
        layer.eval()
        options = {} if opset is None else {"opset_version": opset}
        with tempfile.TemporaryDirectory() as tmp:
            spec = [paddle.static.InputSpec([None, SEQ, HIDDEN], "float32", "x")]
            paddle.onnx.export(layer, str(Path(tmp) / "model"), input_spec=spec, **options)
            proto = onnx.load(str(Path(tmp) / "model.onnx"))
        written = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        suffix = {13: "", 17: "-opset17", None: "-default-opset"}[opset]
        yield Fixture(
            f"{name}{suffix}",
            proto.SerializeToString(),
            norms=1,
            native=_native_norms(proto),
            shapes={proto.graph.input[0].name: [2, SEQ, HIDDEN]},
            versions=versions,
            what=f"paddle.nn {name} between two Linear layers, paddle.onnx.export opset "
            + (f"{opset}" if opset else f"left at its default (writes {written})"),
        )


# ---------------------------------------------------------------------------------------------------- torch
def _torch() -> Any:
    import torch

    torch.manual_seed(0)
    return torch


def _norm_calls(module: Any, args: tuple[Any, ...]) -> int:
    from onnx_norm.zoo.norms import count_norm_calls

    names = [f"a{i}" for i in range(len(args))]

    return count_norm_calls(_Positional(module, names), dict(zip(names, args, strict=True))).total


class _Positional:
    """Adapts keyword calls to a module that takes positional inputs (for count_norm_calls)."""

    def __init__(self, module: Any, names: list[str]) -> None:
        self.module, self.names = module, names

    def named_modules(self) -> Any:
        return self.module.named_modules()

    def __call__(self, **kwargs: Any) -> Any:
        return self.module(*(kwargs[n] for n in self.names))


def torch_export(module: Any, args: tuple[Any, ...], exporter: str, *, dynamic_batch: bool = True) -> bytes:
    """`torchscript` (opset 14, batch dynamic), `dynamo` (opset 18, static shapes, the exporter's own
    optimization on) or `dynamo-unoptimized` (its constant folding off: onnxscript's CastLike spellings stay)."""
    import io
    import warnings

    import torch

    module.eval()
    names = [f"input{i}" for i in range(len(args))]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buffer = io.BytesIO()
            axes = {n: {0: "batch"} for n in names} if dynamic_batch else None
            torch.onnx.export(
                module, args, buffer, opset_version=14, dynamo=False, input_names=names, dynamic_axes=axes
            )
            return buffer.getvalue()
        program = torch.onnx.export(
            module, args, dynamo=True, opset_version=18, optimize=exporter == "dynamo", verbose=False
        )
        return program.model_proto.SerializeToString()


def _torch_fixtures(
    models: dict[str, tuple[Any, tuple[Any, ...]]], exporters: tuple[str, ...], versions: str, what: str
) -> Iterator[Fixture]:
    import onnx

    for name, (module, args) in models.items():
        norms = _norm_calls(module.eval(), args)
        for exporter in exporters:
            data = torch_export(module, args, exporter)
            proto = onnx.load_from_string(data)
            shapes = {i.name: list(a.shape) for i, a in zip(proto.graph.input, args, strict=False)}
            yield Fixture(
                f"{name}-{exporter}",
                data,
                norms=norms,
                native=_native_norms(proto),
                shapes=shapes,
                versions=versions,
                what=f"{what} {name}, torch.onnx.export {exporter}",
            )


def _native_norms(proto: Any) -> int:
    norm_ops = {"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"}
    norm_ops |= {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
    return sum(n.op_type in norm_ops for n in proto.graph.node)


class _LlamaRMSNorm:
    """transformers' LlamaRMSNorm as a plain torch module factory (fp32 statistics, weight after the cast);
    `upcast=False` leaves the Casts out."""

    @staticmethod
    def make(hidden: int, upcast: bool = True) -> Any:
        torch = _torch()

        class LlamaRMSNorm(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)

            def forward(self, x: Any) -> Any:
                h = x.to(torch.float32) if upcast else x
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
                return self.weight * (h.to(x.dtype) if upcast else h)

        return LlamaRMSNorm()


def _tiny_block(upcast: bool = True) -> Any:
    """A LayerNorm and an RMSNorm in a small pre-norm block, each before a Linear."""
    torch = _torch()

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = torch.nn.LayerNorm(HIDDEN)
            self.up = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
            self.down = torch.nn.Linear(2 * HIDDEN, HIDDEN)
            self.rms = _LlamaRMSNorm.make(HIDDEN, upcast)
            self.head = torch.nn.Linear(HIDDEN, HIDDEN)
            with torch.no_grad():
                self.ln.weight.uniform_(0.5, 1.5)
                self.ln.bias.uniform_(-0.5, 0.5)

        def forward(self, x: Any) -> Any:
            x = x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))
            return self.head(self.rms(x))

    return Block()


def onnxscript_fixtures() -> Iterator[Fixture]:
    """CastLike spellings: norms written as onnxscript functions with Python literals (onnxscript turns
    `ms + 1e-6` into `Add(ms, CastLike(Constant, ms))`), and torch's dynamo exporter with its optimization off."""
    import onnx
    from onnx import numpy_helper
    from onnxscript_norms import FUNCTIONS

    versions = version("onnxscript", "torch")
    rng = np.random.default_rng(0)
    for name, function in FUNCTIONS.items():
        proto = function.to_model_proto()
        # The parameters become initializers, as an exporter writes them.
        params = [i for i in proto.graph.input if i.name != "x"]
        for param in params:
            value = rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)
            proto.graph.initializer.append(numpy_helper.from_array(value, param.name))
            proto.graph.input.remove(param)
        onnx.checker.check_model(proto)
        yield Fixture(
            f"script-{name}",
            proto.SerializeToString(),
            norms=1,
            shapes={"x": [2, SEQ, HIDDEN]},
            versions=versions,
            what=f"{name} written as an onnxscript function with a Python-literal epsilon (CastLike)",
        )
    torch = _torch()
    yield from _torch_fixtures(
        {"block": (_tiny_block(), (torch.randn(2, SEQ, HIDDEN),))},
        ("dynamo-unoptimized",),
        versions,
        "LayerNorm + LlamaRMSNorm block",
    )


# A few of each (last axis, several axes, all axes, the default, opset 18's axes input); onnx has 57.
_ONNX_FUNCTION_CASES = {
    f"{op}_normalization_{case}_expanded"
    for op in ("layer", "rms")
    for case in ("2d_axis_negative_1", "3d_axis_negative_1_epsilon", "4d_axis1", "4d_axis0", "default_axis")
} | {"layer_normalization_3d_axis_negative_1_epsilon_expanded_ver18"}


def onnx_function_fixtures() -> Iterator[Fixture]:
    """ONNX's own function expansions of LayerNormalization-17 and RMSNormalization-23 (what an inliner or an older
    runtime turns the ops into): a selection of the `_expanded` node tests of onnx's backend test cases."""
    import onnx
    from onnx.backend.test.case.node import collect_testcases

    versions = version("onnx")
    for case in collect_testcases():
        if not case.name.startswith(("test_layer_normalization", "test_rms_normalization")):
            continue
        if case.name.removeprefix("test_") not in _ONNX_FUNCTION_CASES:
            continue
        inputs = case.data_sets[0][0]
        proto = case.model
        onnx.checker.check_model(proto)
        yield Fixture(
            case.name.removeprefix("test_"),
            proto.SerializeToString(),
            norms=1,
            shapes={v.name: list(a.shape) for v, a in zip(proto.graph.input, inputs, strict=True)},
            versions=versions,
            what=f"onnx backend test case {case.name}: the op's function body inlined",
        )


def timm_fixtures() -> Iterator[Fixture]:
    """ConvNeXt (channels-first LayerNorm2d in the stem and downsampling, channels-last LayerNorm in the blocks),
    ViT and Swin at toy sizes, through both torch exporters."""
    from onnx_norm.zoo.compat import tolerate_cuda_torchvision

    tolerate_cuda_torchvision()
    from timm.models.convnext import ConvNeXt
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.vision_transformer import VisionTransformer

    torch = _torch()
    image = torch.randn(2, 3, 32, 32)
    models = {
        "convnext": ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), num_classes=4),
        "convnext-convmlp": ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), num_classes=4, conv_mlp=True),
        "vit": VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=4),
        "swin": SwinTransformer(
            img_size=32, patch_size=4, window_size=4, embed_dim=8, depths=(1, 1), num_heads=(1, 2), num_classes=4
        ),
    }
    for module in models.values():
        _randomize_norms(module)
    yield from _torch_fixtures(
        {name: (module, (image,)) for name, module in models.items()},
        ("torchscript", "dynamo"),
        version("timm", "torch"),
        "timm",
    )


def timm_group_norm_fixtures() -> Iterator[Fixture]:
    """timm's GroupNorm1 models at toy sizes: MetaFormer with the arguments of timm's `poolformer_s12` (GroupNorm1,
    with bias; a LayerNorm2d before the head) and `poolformerv2_s12` (GroupNorm1NoBias; LayerNorm2dNoBias in the
    downsampling), depths and widths shrunk (the registered functions fix both), through both torch exporters."""
    _timm()
    from timm.layers import GroupNorm1
    from timm.models.metaformer import GroupNorm1NoBias, MetaFormer

    torch = _torch()
    # 64 classes: verify's max and mean over the logits are statistics, not one or two extreme draws of fp32 noise.
    tiny = {"depths": (1, 1, 1, 1), "dims": (8, 8, 16, 16), "num_classes": 64, "use_mlp_head": False}
    v1 = {"downsample_norm": None, "mlp_act": torch.nn.GELU, "mlp_bias": True, "res_scale_init_values": None}
    models = {
        "poolformer": MetaFormer(**tiny, **v1, norm_layers=GroupNorm1, layer_scale_init_values=1e-5),
        "poolformerv2": MetaFormer(**tiny, norm_layers=GroupNorm1NoBias),
    }
    yield from _timm_group_norm(models, torch.randn(2, 3, 32, 32))


def timm_group_norm_registered_fixtures() -> Iterator[Fixture]:
    """timm's registered `poolformer_s12` and `poolformerv2_s12` as `timm.create_model` builds them (random weights,
    12M parameters each, 1000 classes, 64x64 images), through both torch exporters: the full-zoo run's check of the
    real sizes. (With 4 classes, the fp32 noise of 28 norms re-summed drew a max error 3.4x the original's over the
    4 logits of one export, while each fused GroupNorm is closer to float64 than ONNX Runtime's InstanceNormalization
    route.)"""
    timm, torch = _timm(), _torch()
    names = ("poolformer_s12", "poolformerv2_s12")
    models = {name: timm.create_model(name, pretrained=False) for name in names}
    yield from _timm_group_norm(models, torch.randn(1, 3, 64, 64))


def _timm_group_norm(models: dict[str, Any], image: Any) -> Iterator[Fixture]:
    """The models' fixtures, each entry also counting the GroupNorm calls of one forward pass (`group_norms`; `norms`
    counts them too, beside the LayerNorms)."""
    for module in models.values():
        _randomize_norms(module, group_norms=True)
    calls = {name: _group_norm_calls(module.eval(), image) for name, module in models.items()}
    fixtures = _torch_fixtures(
        {name: (module, (image,)) for name, module in models.items()},
        ("torchscript", "dynamo"),
        version("timm", "torchvision", "torch"),
        "timm",
    )
    for fixture in fixtures:
        name = fixture["name"].rsplit("-", 1)[0]
        fixture["group_norms"] = calls[name]
        fixture["norms"] += calls[name]
        yield fixture


def _timm() -> Any:
    """timm, imported beside a torchvision whose C ops do not load (onnx_norm.zoo.compat)."""
    from onnx_norm.zoo.compat import tolerate_cuda_torchvision

    tolerate_cuda_torchvision()
    import timm

    return timm


def _group_norm_calls(module: Any, image: Any) -> int:
    """How many times one forward pass runs a `torch.nn.GroupNorm` (timm's GroupNorm1 is one)."""
    torch = _torch()
    count = 0

    def hook(*_: Any) -> None:
        nonlocal count
        count += 1

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, torch.nn.GroupNorm)]
    try:
        with torch.no_grad():
            module(image)
    finally:
        for handle in handles:
            handle.remove()
    return count


def _randomize_norms(module: Any, group_norms: bool = False) -> None:
    """Norm weights away from 1 and biases away from 0, so that a scale dropped or applied twice shows."""
    from onnx_norm.zoo.models import is_norm_module

    torch = _torch()
    with torch.no_grad():
        for sub in module.modules():
            if is_norm_module(sub) or (group_norms and isinstance(sub, torch.nn.GroupNorm)):
                for param in sub.parameters(recurse=False):
                    param.uniform_(0.5, 1.5)


def diffusers_fixtures() -> Iterator[Fixture]:
    """Attention with RMSNorm on q and k, AdaLayerNorm, AdaLayerNormZero and AdaLayerNormContinuous (LayerNorm
    without affine as SD3's final norm, and RMSNorm with its weight), through both torch exporters."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.normalization import AdaLayerNorm, AdaLayerNormContinuous, AdaLayerNormZero

    torch = _torch()

    class AdaZero(torch.nn.Module):  # the tuple output, with the gates applied as a DiT block applies them
        def __init__(self) -> None:
            super().__init__()
            self.norm = AdaLayerNormZero(HIDDEN, num_embeddings=None)

        def forward(self, x: Any, emb: Any) -> Any:
            h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm(x, emb=emb)
            return h * gate_msa[:, None] + shift_mlp[:, None] * scale_mlp[:, None] + gate_mlp[:, None]

    class Ada(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = AdaLayerNorm(HIDDEN, num_embeddings=None, output_dim=2 * HIDDEN, chunk_dim=1)

        def forward(self, x: Any, temb: Any) -> Any:
            return self.norm(x, temb=temb)

    attention = Attention(query_dim=HIDDEN, heads=2, dim_head=8, qk_norm="rms_norm", eps=1e-6)
    x, emb = torch.randn(2, SEQ, HIDDEN), torch.randn(2, HIDDEN)
    models = {"attention-qk-rmsnorm": (attention, (x,)), "adalayernorm": (Ada(), (x, emb))}
    models["adalayernorm-zero"] = (AdaZero(), (x, emb))
    continuous = AdaLayerNormContinuous(HIDDEN, HIDDEN, elementwise_affine=False, eps=1e-6)
    models["adalayernorm-continuous"] = (continuous, (x, emb))
    continuous_rms = AdaLayerNormContinuous(HIDDEN, HIDDEN, elementwise_affine=True, eps=1e-6, norm_type="rms_norm")
    models["adalayernorm-continuous-rms"] = (continuous_rms, (x, emb))
    for module, _ in models.values():
        _randomize_norms(module)
    yield from _torch_fixtures(models, ("torchscript", "dynamo"), version("diffusers", "torch"), "diffusers")


def toolchain_fixtures() -> Iterator[Fixture]:
    """The LayerNorm + RMSNorm block exported by TorchScript, then through another tool first: onnxslim, onnxsim,
    ONNX Runtime's transformers optimizer (which fuses both norms into its own ops), and the float16 conversions of
    onnxconverter-common and ONNX Runtime with keep_io_types=True."""
    import onnx

    torch = _torch()
    x = torch.randn(2, SEQ, HIDDEN)
    blocks = {upcast: _tiny_block(upcast).eval() for upcast in (True, False)}
    norms = _norm_calls(blocks[True], (x,))
    bases = {
        upcast: onnx.load_from_string(torch_export(block, (x,), "torchscript")) for upcast, block in blocks.items()
    }
    shapes = {"input0": [2, SEQ, HIDDEN]}
    for name, (convert, packages) in _TOOLCHAINS.items():
        # onnxconverter-common 1.16 breaks the LlamaRMSNorm's Cast(to=float) (it keeps the Cast, records float16 and
        # leaves float32 meeting float16: ONNX Runtime refuses the model), so it converts the block without them.
        upcast = name != "float16-keep-io"
        copy = onnx.ModelProto()
        copy.CopyFrom(bases[upcast])  # the transformers optimizer rewrites the proto it is given
        try:
            converted = convert(copy)
        except ImportError as err:
            print(f"toolchains: {name} skipped ({err})", file=sys.stderr)
            continue
        yield Fixture(
            f"block-{name}",
            converted.SerializeToString(),
            norms=norms,
            native=_native_norms(converted),
            shapes=shapes,
            versions=version("torch", *packages),
            what=f"LayerNorm + {'LlamaRMSNorm' if upcast else 'RMSNorm'} block, TorchScript opset 14, then {name}",
        )


def _onnxslim(model: Any) -> Any:
    import onnxslim

    return onnxslim.slim(model)


def _onnxsim(model: Any) -> Any:
    import onnxsim

    simplified, ok = onnxsim.simplify(model)
    assert ok, "onnxsim could not validate its output"
    return simplified


def _ort_transformers(model: Any) -> Any:
    from onnxruntime.transformers.optimizer import optimize_model

    return optimize_model(model, model_type="bert", opt_level=0, use_gpu=False, num_heads=0, hidden_size=0).model


def _float16(model: Any) -> Any:
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(model, keep_io_types=True)


def _ort_float16(model: Any) -> Any:
    """ONNX Runtime's own float16 converter (the one its transformers optimizer uses), which keeps the Casts valid;
    it appends the input Casts after their consumers, so the graph is sorted as ORT's OnnxModel does."""
    from onnxruntime.transformers import float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    converted = float16.convert_float_to_float16(model, keep_io_types=True)
    OnnxModel(converted).topological_sort()
    return converted


_TOOLCHAINS: dict[str, tuple[Callable[[Any], Any], tuple[str, ...]]] = {
    "onnxslim": (_onnxslim, ("onnxslim",)),
    "onnxsim": (_onnxsim, ("onnxsim",)),
    "ort-transformers": (_ort_transformers, ("onnxruntime", "onnxruntime-gpu")),
    "float16-keep-io": (_float16, ("onnxconverter-common",)),
    "ort-float16-keep-io": (_ort_float16, ("onnxruntime", "onnxruntime-gpu")),
}


def _tiny_llama(folder: Path) -> int:
    """A 2-layer LLaMA with random weights saved as a local checkpoint; returns its norm count (2 per layer + the
    final one)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch = _torch()
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=1,  # head size 16: ONNX Runtime's GroupQueryAttention needs a multiple of 16
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    _randomize_norms(model)
    with torch.no_grad():
        model.save_pretrained(folder)
    _tiny_tokenizer(config.vocab_size).save_pretrained(folder)  # the genai builder writes the tokenizer config too
    return 2 * config.num_hidden_layers + 1


def _tiny_tokenizer(vocab: int) -> Any:
    """A word-level tokenizer over made-up tokens: no tokenizer can be downloaded."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2")


def genai_fixtures() -> Iterator[Fixture]:
    """onnxruntime-genai's model builder on a tiny local LLaMA checkpoint (fp32, CPU): native
    SkipSimplifiedLayerNormalization / SimplifiedLayerNormalization ops."""
    import subprocess

    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, out = Path(tmp) / "llama", Path(tmp) / "out"
        norms = _tiny_llama(checkpoint)
        builder = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out)]
        subprocess.run([*builder, "-p", "fp32", "-e", "cpu", "-c", str(Path(tmp) / "cache")], check=True)
        proto = onnx.load(str(out / "model.onnx"))
    yield Fixture(
        "llama",
        proto.SerializeToString(),
        norms=norms,
        native=_native_norms(proto),
        shapes=_genai_shapes(proto),
        versions=version("onnxruntime-genai", "transformers", "torch"),
        what="tiny random LLaMA (2 layers, hidden 16) through onnxruntime_genai.models.builder, fp32 cpu",
    )


def _genai_shapes(proto: Any) -> dict[str, list[int]]:
    """Batch 2, 5 new tokens, no past (past sequence 0)."""
    shapes = {}
    for value in proto.graph.input:
        dims = [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
        concrete = []
        for dim in dims:
            if isinstance(dim, int):
                concrete.append(dim)
            elif "batch" in dim:
                concrete.append(2)
            elif "past" in dim:
                concrete.append(0)
            elif "kv_cache_dim" in dim or "head_size" in dim:
                concrete.append(HIDDEN)  # _tiny_llama's head size (one head)
            else:
                concrete.append(SEQ)
        shapes[value.name] = concrete
    return shapes


def _tiny_bert(folder: Path) -> int:
    """A 2-layer BERT with random weights saved as a local checkpoint; returns its norm count (the embeddings' and
    2 per layer)."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=1,
        max_position_embeddings=64,
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    _randomize_norms(model)
    model.save_pretrained(folder)
    _tiny_tokenizer(config.vocab_size).save_pretrained(folder)
    return 2 * config.num_hidden_layers + 1


def optimum_fixtures() -> Iterator[Fixture]:
    """optimum's ONNX export (optimum-onnx) of tiny local checkpoints: LLaMA without past key values (decomposed
    RMSNorms), BERT at opset 17 (native LayerNormalization ops)."""
    import onnx
    from optimum.exporters.onnx import main_export

    checkpoints = {"llama": (_tiny_llama, None), "bert-opset17": (_tiny_bert, 17)}
    for name, (make, opset) in checkpoints.items():
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint, out = Path(tmp) / name, Path(tmp) / "out"
            norms = make(checkpoint)
            options = {"opset": opset} if opset else {}
            main_export(str(checkpoint), output=str(out), task="feature-extraction", no_post_process=True, **options)
            proto = onnx.load(str(out / "model.onnx"))
        yield Fixture(
            name,
            proto.SerializeToString(),
            norms=norms,
            native=_native_norms(proto),
            shapes=_genai_shapes(proto),
            versions=version("optimum-onnx", "optimum", "transformers", "torch"),
            what=f"tiny random {name} (2 layers, hidden 16) through optimum's main_export, feature-extraction",
        )


FAMILIES: dict[str, Callable[[], Iterator[Fixture]]] = {
    "tf2onnx": tf2onnx_fixtures,
    "jax2onnx": jax2onnx_fixtures,
    "paddle2onnx": paddle2onnx_fixtures,
    "onnxscript": onnxscript_fixtures,
    "onnx-functions": onnx_function_fixtures,
    "timm": timm_fixtures,
    "timm-groupnorm": timm_group_norm_fixtures,
    "timm-groupnorm-registered": timm_group_norm_registered_fixtures,
    "diffusers": diffusers_fixtures,
    "toolchains": toolchain_fixtures,
    "genai": genai_fixtures,
    "optimum": optimum_fixtures,
}


def _strip(data: bytes) -> bytes:
    """Drops doc strings and per-node metadata (the dynamo exporter's stack traces): they are most of a tiny model's
    bytes and mean nothing to the rewrite."""
    import onnx

    model = onnx.load_from_string(data)
    graphs = [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.HasField("g")]
    for graph in graphs:
        graph.doc_string = ""
        for node in graph.node:
            node.doc_string = ""
            del node.metadata_props[:]
        for value in [*graph.value_info, *graph.input, *graph.output]:
            del value.metadata_props[:]
    return model.SerializeToString()


def write(out: Path, family: str, fixtures: list[Fixture]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for stale in manifest.pop(family, []):
        (out / stale["file"]).unlink(missing_ok=True)
    entries = []
    for fixture in fixtures:
        model = _strip(fixture.pop("model"))
        fixture["file"] = f"{family}-{fixture.pop('name')}.onnx"
        (out / fixture["file"]).write_bytes(model)
        entries.append(dict(fixture))
    manifest[family] = entries
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True, help=f"comma-separated: {', '.join(FAMILIES)}")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = parser.parse_args(argv)
    # The torch families reuse the zoo's norm-module rule (onnx_norm.zoo) from this checkout, installed or not.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    families = args.family.split(",")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown family {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    for family in families:
        fixtures = list(FAMILIES[family]())
        write(args.out, family, fixtures)
        print(f"{family}: {len(fixtures)} fixtures in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
