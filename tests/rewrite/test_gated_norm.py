"""The gated RMSNorm family (onnx_norm/rewrite/families/gated_norm.py, op GatedRMSNorm): graphs spelling
`rmsnorm(x * silu(z)) * w` and `rmsnorm(x) * w * silu(z)` out, over the last dim or in groups of it, fuse into one
GatedRMSNorm with the numbers of the original (its model-local function and the library's kernel) and no less
accurate than it against float64; near-misses stay unfused; the onnx and ort targets fuse the RMSNorm alone and say
why; the norm modules of transformers' Mamba2, Falcon-H1 and Qwen3-Next, exported by both torch exporters in
float32 and float16, fuse."""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from rewrite_support import FLOAT, FLOAT16, assert_not_less_accurate, const, fused_ops, make_model, run

from onnx_norm import library, parity
from onnx_norm.ops.gated_norm import GATED_RMS_NORM, gated_rms_norm
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import optimize

D = 16
SHAPE = [2, 3, D]
FULL_ZOO = os.environ.get("ONNX_NORM_FULL_ZOO", "") not in ("", "0")
_NP = {FLOAT: np.float32, FLOAT16: np.float16}


def _silu(z: str, out: str, cast: bool) -> list[onnx.NodeProto]:
    """out = z' * Sigmoid(z'), z' = z or z cast to float32."""
    nodes = [helper.make_node("Cast", [z], [f"{out}_zf"], to=FLOAT)] if cast else []
    zf = f"{out}_zf" if cast else z
    return [*nodes, helper.make_node("Sigmoid", [zf], [f"{out}_s"]), helper.make_node("Mul", [zf, f"{out}_s"], [out])]


def _rms(x: str, out: str) -> list[onnx.NodeProto]:
    """out = x / sqrt(mean(x * x, -1) + eps) over the last axis (float32)."""
    return [
        helper.make_node("Mul", [x, x], [f"{out}_sq"]),
        helper.make_node("ReduceMean", [f"{out}_sq"], [f"{out}_ms"], axes=[-1]),
        helper.make_node("Add", [f"{out}_ms", "eps"], [f"{out}_me"]),
        helper.make_node("Sqrt", [f"{out}_me"], [f"{out}_r"]),
        helper.make_node("Div", [x, f"{out}_r"], [out]),
    ]


def _model(
    *, before: bool, groups: int = 1, dtype: int = FLOAT, swap: bool = False, gate_z: str = "z"
) -> onnx.ModelProto:
    """Mamba2's order (before) or Qwen3-Next's, in `groups` groups of the last dim; a narrow `dtype` computes in
    float32 between Casts as the modules do (the normalised value rounded to it before the weight)."""
    narrow = dtype != FLOAT
    nodes = _silu(gate_z, "g", narrow)
    nodes += [helper.make_node("Cast", ["x"], ["xf"], to=FLOAT)] if narrow else []
    xf = "xf" if narrow else "x"
    inits = [const("eps", np.float32(1e-6)), const("w", (1 + 0.1 * np.arange(D)).astype(_NP[dtype]))]
    if before:
        nodes.append(helper.make_node("Mul", ["g", xf] if swap else [xf, "g"], ["v"]))
        data = "v"
    else:
        data = xf
    if groups > 1:
        inits += [const("split", np.array([0, 0, groups, D // groups])), const("back", np.array(SHAPE))]
        nodes.append(helper.make_node("Reshape", [data, "split"], ["v4"]))
        nodes += _rms("v4", "n4")
        nodes.append(helper.make_node("Reshape", ["n4", "back"], ["n"]))
    else:
        nodes += _rms(data, "n")
    nodes += [helper.make_node("Cast", ["n"], ["nt"], to=dtype)] if narrow else []
    nodes.append(helper.make_node("Mul", ["w", "nt" if narrow else "n"], ["wn"]))
    if before:
        nodes.append(helper.make_node("Identity", ["wn"], ["y"]))
    else:
        nodes += [helper.make_node("Cast", ["wn"], ["wnf"], to=FLOAT)] if narrow else []
        nodes.append(
            helper.make_node(
                "Mul", ["g", "wnf" if narrow else "wn"] if swap else ["wnf" if narrow else "wn", "g"], ["gy"]
            )
        )
        nodes.append(helper.make_node("Cast", ["gy"], ["y"], to=dtype))
    inputs = [("x", dtype, SHAPE), ("z", dtype, SHAPE)]
    return make_model(nodes, inputs, [("y", dtype, SHAPE)], inits, opset=17)


def _feeds(model: onnx.ModelProto, seed: int = 0, empty: bool = False) -> dict[str, np.ndarray]:
    """Random inputs; a named dim gets a size of its own (0 with `empty`: a batch of no rows)."""
    rng = np.random.default_rng(seed)
    named: dict[str, int] = {}

    def size(dim: onnx.TensorShapeProto.Dimension) -> int:
        if dim.HasField("dim_value"):
            return dim.dim_value
        return named.setdefault(dim.dim_param, 0 if empty else 2 + len(named))

    return {
        v.name: rng.standard_normal([size(d) for d in v.type.tensor_type.shape.dim]).astype(
            helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        )
        for v in model.graph.input
    }


def _check_fused(model: onnx.ModelProto, tol: float = 1e-5) -> onnx.ModelProto:
    """One GatedRMSNorm and nothing of the norm left; its function and the library's kernel give the original's
    numbers, the kernel no less accurately than ONNX Runtime against float64."""
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == ["GatedRMSNorm"], [m.reason for m in report.near_misses]
    assert {n.op_type for n in optimized.graph.node} <= {"GatedRMSNorm", "Constant", "Identity"}
    feeds = _feeds(model)
    want = run(model, feeds)[0]
    runs = [run(optimized, feeds)[0]]
    if library.library_available():
        session = ort.InferenceSession(
            optimized.SerializeToString(), library.session_options(), providers=["CPUExecutionProvider"]
        )
        runs.append(session.run(None, feeds)[0])
        assert_not_less_accurate(model, optimized, feeds)
    for got in runs:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    return optimized


def _attrs(model: onnx.ModelProto) -> dict[str, object]:
    node = next(n for n in model.graph.node if n.op_type == "GatedRMSNorm")
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("before", [True, False])
def test_spelled_out_gated_norms_fuse(before: bool, groups: int, swap: bool) -> None:
    attrs = _attrs(_check_fused(_model(before=before, groups=groups, swap=swap)))
    assert attrs["norm_before_gate"] == (0 if before else 1)
    assert attrs["group_size"] == (D // groups if groups > 1 else 0)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("before", [True, False])
def test_float16_gated_norms_fuse_with_their_rounding_points(before: bool, groups: int) -> None:
    attrs = _attrs(_check_fused(_model(before=before, groups=groups, dtype=FLOAT16), tol=2e-3))
    assert attrs["normalized_type"] == FLOAT16 and attrs["multiply_type"] == FLOAT16


def test_a_gate_of_another_tensor_is_not_a_gate() -> None:
    """z * Sigmoid(x) is no silu: the RMSNorm alone is fused, the Sigmoid and the Muls stay."""
    model = _model(before=True)
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.input[0] = "x"
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["RMSNorm"]
    assert "Sigmoid" in {n.op_type for n in optimized.graph.node}


def test_a_gate_read_elsewhere_is_not_folded() -> None:
    """The gated product is also a graph output: the gated op would remove it; the RMSNorm alone is fused."""
    model = _model(before=True)
    model.graph.output.append(helper.make_tensor_value_info("v", FLOAT, SHAPE))
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["RMSNorm"]
    feeds = _feeds(model)
    for a, b in zip(run(model, feeds), run(optimized, feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_a_gate_that_broadcasts_is_not_fused() -> None:
    """Z of shape [2, 1, D] broadcast over the rows: the op takes Z of X's shape only."""
    model = _model(before=True)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 1
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["RMSNorm"]


def test_a_plain_rms_norm_is_not_gated() -> None:
    model = make_model(
        [*_rms("x", "n"), helper.make_node("Mul", ["n", "w"], ["y"])],
        [("x", FLOAT, SHAPE)],
        [("y", FLOAT, SHAPE)],
        [const("eps", np.float32(1e-6)), const("w", np.ones(D, np.float32))],
    )
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["RMSNorm"]


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_other_targets_fuse_the_norm_inside_and_say_why(target: str) -> None:
    model = _model(before=False)
    optimized, report = optimize(model, target=target)
    assert not any(n.domain == DOMAIN for n in optimized.graph.node)
    assert "Sigmoid" in {n.op_type for n in optimized.graph.node}
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "has no gated RMSNorm; the RMSNorm inside is fused alone" in reasons
    if target == "ort":  # ONNX's RMSNormalization needs opset 23; this graph is opset 17
        assert "SimplifiedLayerNormalization" in {n.op_type for n in optimized.graph.node}
    feeds = _feeds(model)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# The library's kernel against the op record's reference


@pytest.mark.skipif(not library.library_available(), reason="the custom-op library is not built")
@pytest.mark.parametrize("dtype", [FLOAT, FLOAT16])
@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("group_size", [0, 8])
@pytest.mark.parametrize("scale", [True, False])
def test_kernel_matches_the_reference(dtype: int, order: int, group_size: int, scale: bool) -> None:
    shape = [3, 5, 32]
    rounding = {"normalized_type": dtype, "multiply_type": dtype} if dtype != FLOAT else {}
    inputs = ["x", "z", "w"] if scale else ["x", "z"]
    node = helper.make_node(
        GATED_RMS_NORM.name, inputs, ["y"], domain=DOMAIN, group_size=group_size, norm_before_gate=order, **rounding
    )
    shapes = {"x": shape, "z": shape, "w": [32]}
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, dtype, shapes[n]) for n in inputs],
        [helper.make_tensor_value_info("y", dtype, shape)],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    rng = np.random.default_rng(1)
    feeds = {n: (rng.standard_normal(shapes[n]) + (1.0 if n == "w" else 0.0)).astype(_NP[dtype]) for n in inputs}
    session = ort.InferenceSession(
        model.SerializeToString(), library.session_options(), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, feeds)[0]
    want = gated_rms_norm(*feeds.values(), group_size=group_size, norm_before_gate=order, **rounding)[0]
    tol = 1e-3 if dtype == FLOAT16 else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.skipif(not library.library_available(), reason="the custom-op library is not built")
def test_kernel_rejects_a_group_size_that_does_not_divide_the_row() -> None:
    node = helper.make_node(GATED_RMS_NORM.name, ["x", "z"], ["y"], domain=DOMAIN, group_size=5)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, FLOAT, [2, 16]) for n in ("x", "z")],
        [helper.make_tensor_value_info("y", FLOAT, [2, 16])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    session = ort.InferenceSession(
        model.SerializeToString(), library.session_options(), providers=["CPUExecutionProvider"]
    )
    x = np.ones([2, 16], np.float32)
    with pytest.raises(Exception, match="group_size 5 does not divide the last dim of X"):
        session.run(None, {"x": x, "z": x})


# --------------------------------------------------------------------------------------------------------------
# The transformers modules, exported


def _hf_module(name: str):
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1RMSNormGated
    from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    return {
        "mamba2": lambda: MambaRMSNormGated(D, D),
        "mamba2-groups": lambda: MambaRMSNormGated(D, D // 4),
        "qwen3-next": lambda: Qwen3NextRMSNormGated(D),
        "falcon-h1": lambda: FalconH1RMSNormGated(D, n_groups=1, norm_before_gate=True),
        "falcon-h1-gate-first-groups": lambda: FalconH1RMSNormGated(D, n_groups=2, norm_before_gate=False),
        "falcon-h1-groups": lambda: FalconH1RMSNormGated(D, n_groups=2, norm_before_gate=True),
    }[name]()


def _export(name: str, half: bool, dynamo: bool, dynamic: bool = False) -> onnx.ModelProto:
    """The module exported; `dynamic`: batch and sequence dims named (TorchScript then computes each view's target
    from `Shape` of the data)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")

    class Gated(torch.nn.Module):
        def __init__(self, norm: torch.nn.Module) -> None:
            super().__init__()
            self.norm = norm

        def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            return self.norm(x, z)

    torch.manual_seed(0)
    dtype = torch.float16 if half else torch.float32
    module = Gated(_hf_module(name)).to(dtype).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(1 + 0.5 * torch.randn_like(p))
    args = (torch.randn(*SHAPE, dtype=dtype), torch.randn(*SHAPE, dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            return torch.onnx.export(module, args, dynamo=True, input_names=["x", "z"], verbose=False).model_proto
        buffer = io.BytesIO()
        axes = {name: {0: "batch", 1: "sequence"} for name in ("x", "z")} if dynamic else None
        torch.onnx.export(
            module, args, buffer, dynamo=False, input_names=["x", "z"], opset_version=18, dynamic_axes=axes
        )
    return onnx.load_from_string(buffer.getvalue())


MODULES = ["mamba2", "mamba2-groups", "qwen3-next", "falcon-h1", "falcon-h1-gate-first-groups", "falcon-h1-groups"]


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("name", MODULES)
def test_transformers_gated_norms_fuse_torchscript(name: str, half: bool) -> None:
    _check_fused(_export(name, half, dynamo=False), tol=2e-3 if half else 1e-5)


@pytest.mark.parametrize("name", MODULES)
def test_transformers_gated_norms_fuse_torchscript_with_dynamic_axes(name: str) -> None:
    """Named batch and sequence dims: the views' targets are `Shape` arithmetic on the gated product (evaluated by
    shape_values), and those `Shape`s read the gate's input instead once the product is gone."""
    model = _export(name, False, dynamo=False, dynamic=True)
    optimized = _check_fused(model)
    # A batch of no rows runs too (the op's function sizes its view in groups without a -1).
    empty = _feeds(model, empty=True)
    want = run(model, empty)[0]
    assert want.shape == (0, 0, D)
    assert run(optimized, empty)[0].shape == want.shape


@pytest.mark.parametrize(
    ("name", "half"),
    [("mamba2-groups", False), ("qwen3-next", True)]
    + (
        [
            (n, h)
            for n in MODULES
            for h in (False, True)
            if (n, h) not in {("mamba2-groups", False), ("qwen3-next", True)}
        ]
        if FULL_ZOO
        else []
    ),
)
def test_transformers_gated_norms_fuse_dynamo(name: str, half: bool) -> None:
    """One of each order by default (each dynamo export takes seconds); every module with ONNX_NORM_FULL_ZOO=1."""
    pytest.importorskip("onnxscript")
    _check_fused(_export(name, half, dynamo=True), tol=2e-3 if half else 1e-5)


def _with_last_dim(model: onnx.ModelProto, index: int, name: str) -> onnx.ModelProto:
    """The model with input `index`'s last dim named instead of sized (as a view's unresolved `-1` leaves it)."""
    dim = model.graph.input[index].type.tensor_type.shape.dim[-1]
    dim.ClearField("dim_value")
    dim.dim_param = name
    return model


def test_an_input_whose_last_dim_is_unknown_is_expanded_to_the_gates_shape() -> None:
    """Mamba2's scan output viewed [b, s, -1]: no inference sizes its last dim, but `x * silu(z)` with Z's [.., 16]
    can only have Z's shape. The op reads X expanded to Z's shape, exactly what the gate's Mul read."""
    model = _with_last_dim(_model(before=True, groups=2), 0, "d")
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["GatedRMSNorm"], [m.reason for m in report.near_misses]
    assert sorted(n.op_type for n in optimized.graph.node if n.op_type not in ("Constant", "Identity")) == [
        "Expand",
        "GatedRMSNorm",
        "Shape",
    ]
    assert "x expanded to the gate's shape" in report.norms[0].variant
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(SHAPE).astype(np.float32) for name in ("x", "z")}
    want = run(model, feeds)[0]
    np.testing.assert_allclose(run(optimized, feeds)[0], want, rtol=1e-5, atol=1e-5)
    if library.library_available():
        session = ort.InferenceSession(
            optimized.SerializeToString(), library.session_options(), providers=["CPUExecutionProvider"]
        )
        np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
    feeds["x"] = feeds["x"][..., :1]  # a last dim of 1 broadcasts in the original, and so in the Expand
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("before", "index"), [(False, 0), (True, 1)])
def test_shapes_not_known_to_agree_are_not_gated(before: bool, index: int) -> None:
    """The gate after the norm with X's last dim unknown (a broadcast X would change the statistic), or Z's last dim
    unknown (Z could be the one that broadcasts): the RMSNorm is fused alone."""
    optimized, _ = optimize(_with_last_dim(_model(before=before), index, "d"))
    assert "GatedRMSNorm" not in fused_ops(optimized)


# --------------------------------------------------------------------------------------------------------------
# A whole model: transformers' Mamba2ForCausalLM, tiny, random weights


def _mamba2_model(dynamo: bool, half: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two Mamba2 layers (grouped gated norms: 2 groups of 64), exported with named batch and sequence dims. The
    scan output's view `[b, s, -1]` has a last dim no inference sizes (the scan pads s to whole chunks, P); dynamo
    also writes the group count as `2 * Min(s, P) // s`, which only the view's element count gives."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Mamba2Config(
        vocab_size=64, hidden_size=64, state_size=16, num_heads=8, head_dim=16, n_groups=2, num_hidden_layers=2,
        expand=2, conv_kernel=4, chunk_size=8, use_cache=False,
    )  # fmt: skip
    lm = transformers.Mamba2ForCausalLM(config).eval()
    return _export_lm(lm.half() if half else lm, dynamo)


def _export_lm(lm, dynamo: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A causal LM's logits for `ids` [2, 12], exported with named batch and sequence dims, and those feeds."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=ids, use_cache=False).logits

    ids = torch.randint(0, 64, (2, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")},)
            exported = torch.onnx.export(
                Logits(), (ids,), dynamo=True, input_names=["ids"], dynamic_shapes=dims, verbose=False
            )
            model = exported.model_proto
        else:
            buffer = io.BytesIO()
            axes = {"ids": {0: "batch", 1: "sequence"}}
            torch.onnx.export(Logits(), (ids,), buffer, dynamo=False, input_names=["ids"], dynamic_axes=axes)
            model = onnx.load_from_string(buffer.getvalue())
    for node in model.graph.node:  # TorchScript writes `permute(0, -2, -1, 1)` as is; ONNX Runtime refuses it
        for attr in node.attribute:
            if node.op_type == "Transpose" and attr.name == "perm":
                attr.ints[:] = [p % len(attr.ints) for p in attr.ints]
    return model, {"ids": ids.numpy()}


@pytest.mark.parametrize(
    ("dynamo", "half"),
    [(False, False), (True, False), (False, True)] + ([(True, True)] if FULL_ZOO else []),
)
def test_mamba2_model_fuses_its_gated_norms(dynamo: bool, half: bool) -> None:
    """Both gated norms fused; the numbers of the original (float16: within its own rounding), and the gate."""
    model, feeds = _mamba2_model(dynamo, half)
    optimized, report = optimize(model)
    kinds = sorted(record.rule for record in report.norms)
    assert kinds.count("gated_rms_norm") == 2, ([r.variant for r in report.norms], report.near_misses)
    gated = [r.variant for r in report.norms if r.rule == "gated_rms_norm"]
    assert all("groups of 64" in v for v in gated), gated
    sigmoids = [sum(n.op_type == "Sigmoid" for n in m.graph.node) for m in (model, optimized)]
    assert sigmoids[0] - sigmoids[1] == 2  # the gates' (the conv's SiLU stays)
    tol = 2e-2 if half else 1e-4
    want = run(model, feeds)[0].astype(np.float32)
    np.testing.assert_allclose(run(optimized, feeds)[0].astype(np.float32), want, rtol=tol, atol=tol)
    if library.library_available():
        session = ort.InferenceSession(
            optimized.SerializeToString(), library.session_options(), providers=["CPUExecutionProvider"]
        )
        np.testing.assert_allclose(session.run(None, feeds)[0].astype(np.float32), want, rtol=tol, atol=tol)
        # The gate users ship with, per fused norm too: a whole model's float32 error after the scan is noise at the
        # last ulp, so the element-wise accuracy check of the single-norm tests is the gate's verdict here.
        report = parity.verify(model, optimized, inputs=[feeds], per_node=True)
        assert report.passed, report


def _qwen3_next(transformers):
    """Qwen3-Next's linear-attention layer (its gated delta rule: `l2norm` of q and k, the gated RMSNorm of the
    output, the gate after the norm) beside a full-attention layer (per-head q/k RMSNorms), dense MLPs (the MoE's
    grouped matmul does not export)."""
    config = transformers.Qwen3NextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"], mlp_only_layers=[0, 1], use_cache=False,
    )  # fmt: skip
    return transformers.Qwen3NextForCausalLM(config)


def _nemotron_h(transformers):
    """Nemotron-H's pattern `M*-`: a Mamba2 layer (its grouped gated norm, the gate before the norm), attention,
    an MLP. (Its TorchScript export fails on `aten::diff`.)"""
    config = transformers.NemotronHConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=3, hybrid_override_pattern="M*-", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=64, mamba_num_heads=8, mamba_head_dim=16,
        ssm_state_size=16, n_groups=2, mamba_d_conv=4, chunk_size=8, mamba_expand=2, use_cache=False,
    )  # fmt: skip
    return transformers.NemotronHForCausalLM(config)


def _zamba2(transformers):
    """Zamba2: Mamba2 layers (grouped gated norms) and a hybrid layer with the shared attention block."""
    config = transformers.Zamba2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
        num_attention_heads=4, num_key_value_heads=4, attention_head_dim=32, intermediate_size=64,
        mamba_d_state=16, mamba_headdim=16, n_mamba_heads=8, mamba_ngroups=2, mamba_d_conv=4, chunk_size=8,
        mamba_expand=2, num_mem_blocks=1, use_shared_attention_adapter=False, use_mem_rope=False, use_cache=False,
    )  # fmt: skip
    return transformers.Zamba2ForCausalLM(config)


def _granite_hybrid(transformers):
    """Granite 4's GraniteMoeHybrid: a Mamba2 layer (its grouped gated norm) and an attention layer, dense MLPs."""
    config = transformers.GraniteMoeHybridConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, layer_types=["mamba", "attention"],
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, mamba_n_heads=8, mamba_d_head=16,
        mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8, mamba_expand=2,
        num_local_experts=0, shared_intermediate_size=64, use_cache=False,
    )  # fmt: skip
    return transformers.GraniteMoeHybridForCausalLM(config)


#: model -> (builder, the norms its export fuses by rule).
_HYBRID_LMS = {
    "qwen3_next": (_qwen3_next, {"gated_rms_norm": 1, "l2_norm": 2}),
    "nemotron_h": (_nemotron_h, {"gated_rms_norm": 1}),
    "zamba2": (_zamba2, {"gated_rms_norm": 2}),
    "granite_hybrid": (_granite_hybrid, {"gated_rms_norm": 1}),
}


@pytest.mark.skipif(not FULL_ZOO, reason="15-50 s dynamo exports: ONNX_NORM_FULL_ZOO=1")
@pytest.mark.parametrize("name", sorted(_HYBRID_LMS))
def test_hybrid_models_fuse_their_gated_and_l2_norms(name: str) -> None:
    """Exported by dynamo with named batch and sequence dims: every norm fused, the gated and the L2 ones included,
    and the gate passes."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    build, fused = _HYBRID_LMS[name]
    model, feeds = _export_lm(build(transformers).eval(), dynamo=True)
    optimized, report = optimize(model)
    rules = [record.rule for record in report.norms]
    assert {rule: rules.count(rule) for rule in fused} == fused, rules
    assert not report.near_misses, report.near_misses
    if library.library_available():
        report = parity.verify(model, optimized, inputs=[feeds], per_node=True)
        assert report.passed, report
