"""Defaults and choices of the API's options: the one place that `verify()`, `bench()` and the CLI's flags read
them from, so that a call and a command line without options do the same thing.

Kept free of imports on purpose: the CLI builds its parser from it without loading ONNX Runtime.
"""

from __future__ import annotations

from typing import Literal

Provider = Literal["cpu", "cuda"]
OptLevel = Literal["all", "extended", "basic", "disabled"]
Stat = Literal["elementwise", "max", "mean", "quantile"]
GoldenMethod = Literal["auto", "ort", "reference", "none"]

PROVIDERS: tuple[Provider, ...] = ("cpu", "cuda")
OPT_LEVELS: tuple[OptLevel, ...] = ("all", "extended", "basic", "disabled")
STATS: tuple[Stat, ...] = ("elementwise", "max", "mean", "quantile")
GOLDEN_METHODS: tuple[GoldenMethod, ...] = ("auto", "ort", "reference", "none")

#: What the rewrite emits (a name in onnx_norm.rewrite.TARGETS); the default of optimize(), which the rewrite owns.
TARGET = "onnx-norm"

PROVIDER: Provider = "cpu"
DEVICE_ID = 0
SEED = 0

#: Generated input samples per parity check: two catch a fused norm that is right for one input by accident.
SAMPLES = 2
ERROR_QUANTILE = 0.99
GOLDEN: GoldenMethod = "auto"
#: ONNX Runtime's graph optimizations for the original model in the parity gate: all, as users run it.
ORIGINAL_OPTIMIZATION: OptLevel = "all"

#: Bench rounds: unrecorded warm-up rounds, then timed rounds per variant.
WARMUP = 5
REPEAT = 20
#: Sessions per variant, used in turn: two sessions of one model can differ by a few percent for their whole
#: lives on a CPU (where their buffers landed), and three average that out.
SESSIONS_PER_VARIANT = 3
#: CUDA graphs in the bench (ONNX Runtime's `enable_cuda_graph`): off, as ORT's default; needs the CUDA provider.
CUDA_GRAPH = False
