"""Every bad input at every level: a catalogue, a test per (input, level), and the table in
docs/bad-inputs.md, generated from what the levels really do so that it cannot drift.

    pytest tests/test_bad_inputs.py                         the CPU part (what CI runs)
    pytest -m gpu tests/test_bad_inputs.py                  on a GPU: every case on CUDA tensors
    python -m tests.test_bad_inputs --write-table           regenerate docs/bad-inputs.md (CPU)
    python -m tests.test_bad_inputs --gpu-report reports/bad-inputs-gpu.json
                                                            on a GPU: what each level does there,
                                                            for the table's GPU section

What a level must do with a bad input: refuse it with a ValueError or TypeError
that names the component and the argument, says what was expected and what was given, and
does so before any kernel runs; or, where torch itself computes through (NaN, Inf, float64,
some inputs without requires_grad, q is k), compute what the float64 reference computes:
the finite values and the gradients within the dtype's bound (equivalence/tolerances.py);
with NaN or Inf in an input, NaN and Inf at exactly the places torch's own operators put
them (TORCH_OPS). Never crash the process, never hang.

The catalogue (CATALOGUE) is data: one `Bad` per input, made from good `tiny` arguments by a
change, with what each level must do with it. Each is tried at the five levels and at "own",
your code registered with `levels.register` (Level 1's math without Level 1's validation: the
validator `register` puts in front of it is the only thing between a bad input and the math).
A level that cannot run here (Level 5 without a GPU) must say so with levels.status's reason,
except for inputs the contract refuses: the validator runs first at every level, so those are
refused even where the level could not run.

Inputs that could take the process down if a check were missing (tensors on a device a
kernel cannot read, views spanning 2**31 elements) run in a subprocess at the levels that
launch kernels of their own; a crash or a hang there is an outcome ("crashed", "hung") that
fails the test. Views spanning 2**31 elements hold a few elements of a sparse file mapped
into memory: nothing is allocated but the pages written.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import levels  # first: it switches Triton's interpreter on where there is no GPU

import pytest
import torch
import torch.nn.functional as F

from equivalence import cards
from equivalence.check import compare, flatten
from equivalence.tolerances import tolerance
from levels.contract import COMPONENTS

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "bad-inputs.md"
GPU_REPORT = ROOT / "reports" / "bad-inputs-gpu.json"
WRITE_TABLE = "python -m tests.test_bad_inputs --write-table"
WRITE_GPU_REPORT = f"python -m tests.test_bad_inputs --gpu-report {GPU_REPORT.relative_to(ROOT)}"

OWN = "own"  # the registered level: Level 1's math behind the validator only
COLUMNS = levels.LEVEL_NAMES + (OWN,)
KERNEL_LEVELS = ("triton", "cuda")  # levels that hand pointers to kernels of their own
SUBPROCESS_TIMEOUT_S = 300

# What a level may do with an input. An expectation is one of these or several joined by
# "|" (the GPU's Level 5 or Triton's float64 dot: either answer is right, the table says
# which one a machine gave). "compute" means: computes what the float64 reference does.
VALUE_ERROR, TYPE_ERROR, COMPUTE = "ValueError", "TypeError", "compute"
ALL = "all"  # Bad.grads: every argument the spec differentiates


# ---------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bad:
    component: str
    slug: str  # unique within the component: the test id
    what: str  # the table's row
    change: Callable[[dict, torch.device], dict]  # good args, device -> the arguments to replace
    arg: str | None = None  # the argument a refusal must name
    expect: str = VALUE_ERROR  # at every level, unless `levels` says otherwise
    levels: tuple = ()  # ((level, expectation), ...)
    variant: str | None = None  # of the spec (default: its first)
    dtype: torch.dtype = torch.float32
    size: str | dict | None = None  # of the spec (default: SIZES)
    grads: tuple | str = ()  # the arguments that require grad (ALL: those the spec differentiates)
    backward: bool = True  # computed: also compare the gradients of inputs that require grad
    shapes_only: bool = False  # computed on meta tensors: there are no values to compare
    like_torch: bool = False  # NaN/Inf: judged against torch's own ops (TORCH_OPS), not the spec
    note: str = ""  # what "computed" means for this row, in the table
    devices: tuple = ("cpu", "cuda")  # where the row is tried
    isolate: tuple = ()  # levels at which it runs in a subprocess
    env: tuple = ()  # ((name, value), ...) for that subprocess
    only: tuple = ()  # the levels it is about (others: not tried, "-")

    @property
    def key(self) -> str:
        return f"{self.component}/{self.slug}"

    def expectation(self, level: str) -> str:
        return dict(self.levels).get(level, self.expect)

    @property
    def by_contract(self) -> bool:
        """Refused at every level alike: the shared validator's doing."""
        return not self.levels and not self.only and self.expect in (VALUE_ERROR, TYPE_ERROR)

    def tried(self, level: str, device: str) -> bool:
        return device in self.devices and (not self.only or level in self.only)

    def args(self, device) -> dict:
        device = torch.device(device)
        spec = cards.get(self.component)
        variant = self.variant or next(iter(spec.variants))
        size = SIZES[self.component] if self.size is None else self.size
        good = dict(spec.case(size, variant, self.dtype, device, seed=0).args)
        args = good | self.change(good, device)
        for name in spec.differentiable if self.grads == ALL else self.grads:
            if isinstance(args.get(name), torch.Tensor):
                args[name].requires_grad_()  # in place: an alias (k is q) is the same leaf
        return args


def other_device(device: torch.device) -> str:
    """Another device than `device` that this machine has: meta on a CPU, the CPU on a GPU."""
    return "meta" if device.type == "cpu" else "cpu"


def randn(*shape, device) -> torch.Tensor:
    """Seeded, like the cards' inputs: a table row is the same call on every run."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)


def with_value(t: torch.Tensor, index: tuple, value: float) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def cast(args: dict, dtype: torch.dtype, names=None) -> dict:
    return {k: v.to(dtype) for k, v in args.items()
            if isinstance(v, torch.Tensor) and (names is None or k in names)}


_SPARSE_FILES = []


def far_apart(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t's values in a view whose elements along `dim` lie >= 2**31 elements apart: the
    offsets a kernel computes for it do not fit 32 bits. On a CPU the memory is a sparse
    file mapped into the process (removed at once: the mapping keeps it), so only the pages
    written cost anything and no machine lacks the 8 GB such a tensor seems to need; a GPU
    (the device run, 80 GB and more) allocates them."""
    stride = list(t.contiguous().stride())
    stride[dim] = -(-2 ** 31 // max(t.shape[dim] - 1, 1))
    needed = 1 + sum((n - 1) * s for n, s in zip(t.shape, stride))
    if t.device.type == "cpu":
        fd, path = tempfile.mkstemp(prefix="bad-inputs-", suffix=".sparse")
        os.close(fd)
        try:
            storage = torch.from_file(path, shared=True, size=needed, dtype=t.dtype)
        finally:
            os.unlink(path)
    else:
        storage = torch.empty(needed, dtype=t.dtype, device=t.device)
    view = storage.as_strided(tuple(t.shape), tuple(stride))
    _SPARSE_FILES.append(storage)
    return view.copy_(t)


MAIN = {"attention": "q", "layer_norm": "x", "mlp": "x", "lstm": "x", "conv_bn": "x",
        "rms_norm": "x", "rope": "x", "swiglu_mlp": "x", "newton_schulz": "G"}
# The cards' `tiny` sizes, but two LSTM steps instead of five: torch.compile unrolls the time
# loop, and every row that reaches Level 3 with new shapes, dtypes or grads compiles anew.
SIZES = {c: "tiny" for c in COMPONENTS} | {"lstm": dict(B=3, T=2, I=12, H=16)}

# Refused by the contract, at every level: (component, slug, argument, error, change, what).
# `change(args, device)` returns the arguments it replaces.
REFUSED = [
    # ---- attention: q, k, v (1, 2, 37, 16)
    ("attention", "q-rank", "q", VALUE_ERROR, lambda a, d: {"q": a["q"][0]},
     "q is 3-D (no batch axis)"),
    ("attention", "k-head-dim", "k", VALUE_ERROR,
     lambda a, d: {"k": a["k"][..., :8], "v": a["v"][..., :8]},
     "k and v have another head dimension than q"),
    ("attention", "v-length", "v", VALUE_ERROR, lambda a, d: {"v": a["v"][:, :, :5]},
     "v has fewer keys than k"),
    ("attention", "k-heads", "k", VALUE_ERROR,
     lambda a, d: {n: torch.cat([a[n], a[n][:, :1]], 1) for n in "kv"},
     "k and v with 3 heads for q's 2 (H_kv must divide H)"),
    ("attention", "head-dim-zero", "q", VALUE_ERROR, lambda a, d: {n: a[n][..., :0] for n in "qkv"},
     "q, k, v with a head dimension of 0"),
    ("attention", "alignment-value", "causal_alignment", VALUE_ERROR,
     lambda a, d: {"causal": True, "causal_alignment": "bottom-left"},
     "causal_alignment = 'bottom-left'"),
    ("attention", "alignment-bool", "causal_alignment", TYPE_ERROR,
     lambda a, d: {"causal": True, "causal_alignment": True}, "causal_alignment = True"),
    ("attention", "kv-lens-list", "kv_lens", TYPE_ERROR, lambda a, d: {"kv_lens": [37]},
     "kv_lens a list, not a tensor"),
    ("attention", "kv-lens-float", "kv_lens", TYPE_ERROR,
     lambda a, d: {"kv_lens": torch.tensor([37.0], device=d)}, "kv_lens is float32"),
    ("attention", "kv-lens-shape", "kv_lens", VALUE_ERROR,
     lambda a, d: {"kv_lens": torch.tensor([37, 37], device=d)}, "kv_lens with 2 lengths for B = 1"),
    ("attention", "kv-lens-device", "kv_lens", VALUE_ERROR,
     lambda a, d: {"kv_lens": torch.tensor([37]).to(other_device(d))},
     "kv_lens on another device"),
    # rope=(cos, sin[, interleaved]): tables (P, D/2) = (40, 8) unless the row says otherwise
    ("attention", "rope-table-shape", "rope", VALUE_ERROR,
     lambda a, d: {"rope": (randn(40, 16, device=d), randn(40, 16, device=d))},
     "rope's tables (40, 16): one column per feature, not per pair"),
    ("attention", "rope-odd-head", "rope", VALUE_ERROR,
     lambda a, d: {**{n: a[n][..., :15] for n in "qkv"},
                   "rope": (randn(40, 7, device=d), randn(40, 7, device=d))},
     "rope with a head dimension of 15 (pairs need D even)"),
    ("attention", "rope-few-positions", "rope", VALUE_ERROR,
     lambda a, d: {"rope": (randn(30, 8, device=d), randn(30, 8, device=d))},
     "rope's tables of 30 positions for 37 keys"),
    ("attention", "rope-more-queries", "rope", VALUE_ERROR,
     lambda a, d: {"q": torch.cat([a["q"], a["q"][:, :, :3]], 2), "causal": True,
                   "causal_alignment": "bottom_right",
                   "rope": (randn(40, 8, device=d), randn(40, 8, device=d))},
     "rope with bottom_right and 40 queries for 37 keys (no position before 0)"),
    ("attention", "rope-grad", "rope", VALUE_ERROR,
     lambda a, d: {"rope": (randn(40, 8, device=d).requires_grad_(), randn(40, 8, device=d))},
     "rope's cos requires grad"),
    ("attention", "rope-float16", "rope", TYPE_ERROR,
     lambda a, d: {"rope": (randn(40, 8, device=d).half(), randn(40, 8, device=d).half())},
     "rope's tables float16, q float32"),
    ("attention", "rope-device", "rope", VALUE_ERROR,
     lambda a, d: {"rope": (randn(40, 8, device=d), randn(40, 8, device=d).to(other_device(d)))},
     "rope's sin on another device"),
    ("attention", "rope-one-table", "rope", TYPE_ERROR, lambda a, d: {"rope": randn(40, 8, device=d)},
     "rope a tensor, not (cos, sin)"),
    ("attention", "rope-flag-int", "rope", TYPE_ERROR,
     lambda a, d: {"rope": (randn(40, 8, device=d), randn(40, 8, device=d), 1)},
     "rope's interleaved = 1 (an int)"),
    ("attention", "q-int", "q", TYPE_ERROR, lambda a, d: {"q": a["q"].to(torch.int32)}, "q is int32"),
    ("attention", "k-bool", "k", TYPE_ERROR, lambda a, d: {"k": a["k"] > 0}, "k is bool"),
    ("attention", "v-float64", "v", TYPE_ERROR, lambda a, d: {"v": a["v"].double()},
     "v is float64, q and k float32"),
    ("attention", "k-device", "k", VALUE_ERROR, lambda a, d: {"k": a["k"].to(other_device(d))},
     "k on another device (meta on a CPU, the CPU on a GPU)"),
    ("attention", "q-numpy", "q", TYPE_ERROR, lambda a, d: {"q": a["q"].cpu().numpy()},
     "q is a NumPy array"),
    ("attention", "scale-inf", "scale", VALUE_ERROR, lambda a, d: {"scale": math.inf}, "scale = inf"),
    ("attention", "scale-nan", "scale", VALUE_ERROR, lambda a, d: {"scale": math.nan}, "scale = NaN"),
    ("attention", "causal-int", "causal", TYPE_ERROR, lambda a, d: {"causal": 1},
     "causal = 1 (an int)"),
    # ---- layer_norm: x (2, 5, 129), weight and bias (129,)
    ("layer_norm", "x-scalar", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][0, 0, 0]}, "x is 0-D"),
    ("layer_norm", "weight-length", "weight", VALUE_ERROR, lambda a, d: {"weight": a["weight"][:-1]},
     "weight one element short"),
    ("layer_norm", "bias-rank", "bias", VALUE_ERROR, lambda a, d: {"bias": a["bias"][None]},
     "bias is 2-D"),
    ("layer_norm", "x-int", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].long()}, "x is int64"),
    ("layer_norm", "weight-bool", "weight", TYPE_ERROR, lambda a, d: {"weight": a["weight"] > 0},
     "weight is bool"),
    ("layer_norm", "x-float8", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].to(torch.float8_e4m3fn)},
     "x is float8_e4m3fn"),
    ("layer_norm", "weight-float16", "weight", TYPE_ERROR, lambda a, d: {"weight": a["weight"].half()},
     "weight is float16, x float32"),
    ("layer_norm", "bias-device", "bias", VALUE_ERROR,
     lambda a, d: {"bias": a["bias"].to(other_device(d))},
     "bias on another device"),
    ("layer_norm", "eps-zero", "eps", VALUE_ERROR, lambda a, d: {"eps": 0.0}, "eps = 0"),
    ("layer_norm", "eps-inf", "eps", VALUE_ERROR, lambda a, d: {"eps": math.inf}, "eps = inf"),
    # ---- rms_norm: x (2, 5, 129), weight (129,)
    ("rms_norm", "x-scalar", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][0, 0, 0]}, "x is 0-D"),
    ("rms_norm", "weight-length", "weight", VALUE_ERROR, lambda a, d: {"weight": a["weight"][:-1]},
     "weight one element short"),
    ("rms_norm", "weight-rank", "weight", VALUE_ERROR, lambda a, d: {"weight": a["weight"][None]},
     "weight is 2-D"),
    ("rms_norm", "x-int", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].long()}, "x is int64"),
    ("rms_norm", "weight-float16", "weight", TYPE_ERROR, lambda a, d: {"weight": a["weight"].half()},
     "weight is float16, x float32"),
    ("rms_norm", "weight-device", "weight", VALUE_ERROR,
     lambda a, d: {"weight": a["weight"].to(other_device(d))}, "weight on another device"),
    ("rms_norm", "weight-list", "weight", TYPE_ERROR, lambda a, d: {"weight": a["weight"].tolist()},
     "weight is a Python list"),
    ("rms_norm", "eps-zero", "eps", VALUE_ERROR, lambda a, d: {"eps": 0.0}, "eps = 0"),
    ("rms_norm", "eps-none", "eps", TYPE_ERROR, lambda a, d: {"eps": None},
     "eps = None (nn.RMSNorm's default; the function takes a number)"),
    # ---- mlp: x (2, 9, 24), w1 (72, 24), b1 (72,), w2 (20, 72), b2 (20,)
    ("mlp", "x-scalar", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][0, 0, 0]}, "x is 0-D"),
    ("mlp", "w1-transposed", "w1", VALUE_ERROR, lambda a, d: {"w1": a["w1"].t()},
     "w1 is (in_features, hidden): transposed"),
    ("mlp", "w2-rank", "w2", VALUE_ERROR, lambda a, d: {"w2": a["w2"][None]}, "w2 is 3-D"),
    ("mlp", "b2-length", "b2", VALUE_ERROR, lambda a, d: {"b2": a["b2"][:-1]}, "b2 one element short"),
    ("mlp", "x-int", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].to(torch.int32)}, "x is int32"),
    ("mlp", "b1-bool", "b1", TYPE_ERROR, lambda a, d: {"b1": a["b1"] > 0}, "b1 is bool"),
    ("mlp", "w2-bfloat16", "w2", TYPE_ERROR, lambda a, d: {"w2": a["w2"].bfloat16()},
     "w2 is bfloat16, x float32"),
    ("mlp", "w1-device", "w1", VALUE_ERROR, lambda a, d: {"w1": a["w1"].to(other_device(d))},
     "w1 on another device"),
    ("mlp", "no-hidden", "w1", VALUE_ERROR,
     lambda a, d: {"w1": a["w1"][:0], "b1": a["b1"][:0], "w2": a["w2"][:, :0]}, "hidden size 0"),
    # ---- swiglu_mlp: x (2, 9, 24), w_gate and w_up (44, 24), w_down (20, 44)
    ("swiglu_mlp", "x-scalar", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][0, 0, 0]}, "x is 0-D"),
    ("swiglu_mlp", "x-width", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][..., :-1]},
     "x one feature short of w_gate's and w_up's in_features"),
    ("swiglu_mlp", "w_up-transposed", "w_up", VALUE_ERROR, lambda a, d: {"w_up": a["w_up"].t()},
     "w_up is (in_features, hidden): transposed"),
    ("swiglu_mlp", "w_gate-hidden", "w_gate", VALUE_ERROR, lambda a, d: {"w_gate": a["w_gate"][:-1]},
     "w_gate one hidden unit short of w_up's and w_down's"),
    ("swiglu_mlp", "w_down-rank", "w_down", VALUE_ERROR, lambda a, d: {"w_down": a["w_down"][None]},
     "w_down is 3-D"),
    ("swiglu_mlp", "x-int", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].to(torch.int32)}, "x is int32"),
    ("swiglu_mlp", "w_up-float16", "w_up", TYPE_ERROR, lambda a, d: {"w_up": a["w_up"].half()},
     "w_up is float16, x float32"),
    ("swiglu_mlp", "w_down-device", "w_down", VALUE_ERROR,
     lambda a, d: {"w_down": a["w_down"].to(other_device(d))}, "w_down on another device"),
    ("swiglu_mlp", "no-hidden", "w_gate", VALUE_ERROR,
     lambda a, d: {"w_gate": a["w_gate"][:0], "w_up": a["w_up"][:0], "w_down": a["w_down"][:, :0]},
     "hidden size 0"),
    # ---- lstm: x (3, 2, 12), h0 and c0 (1, 3, 16), w_ih (64, 12), w_hh (64, 16), biases (64,)
    ("lstm", "x-rank", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][0]}, "x is 2-D (no batch axis)"),
    ("lstm", "h0-rank", "h0", VALUE_ERROR, lambda a, d: {"h0": a["h0"][0]},
     "h0 without nn.LSTM's layer axis"),
    ("lstm", "c0-batch", "c0", VALUE_ERROR, lambda a, d: {"c0": a["c0"][:, :1]},
     "c0 for another batch size"),
    ("lstm", "w_hh-shape", "w_hh", VALUE_ERROR, lambda a, d: {"w_hh": a["w_hh"][:-1]},
     "w_hh not (4*hidden, hidden)"),
    ("lstm", "w_ih-inputs", "w_ih", VALUE_ERROR, lambda a, d: {"w_ih": a["w_ih"][:, :-1]},
     "w_ih for another input size"),
    ("lstm", "x-int", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].long()}, "x is int64"),
    ("lstm", "b_ih-bool", "b_ih", TYPE_ERROR, lambda a, d: {"b_ih": a["b_ih"] > 0}, "b_ih is bool"),
    ("lstm", "h0-float64", "h0", TYPE_ERROR, lambda a, d: {"h0": a["h0"].double()},
     "h0 is float64, x float32"),
    ("lstm", "b_hh-device", "b_hh", VALUE_ERROR, lambda a, d: {"b_hh": a["b_hh"].to(other_device(d))},
     "b_hh on another device"),
    ("lstm", "no-steps", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][:, :0]},
     "x with no time steps (T = 0: nn.LSTM refuses it too)"),
    # ---- conv_bn: x (2, 3, 9, 11), conv_weight (5, 3, 3, 3), per-channel vectors (5,)
    ("conv_bn", "x-rank", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][0]}, "x is 3-D (no batch axis)"),
    ("conv_bn", "weight-channels", "conv_weight", VALUE_ERROR,
     lambda a, d: {"conv_weight": a["conv_weight"][:, :-1]}, "conv_weight for another C_in"),
    ("conv_bn", "running_var-length", "running_var", VALUE_ERROR,
     lambda a, d: {"running_var": a["running_var"][:-1]}, "running_var one channel short"),
    ("conv_bn", "x-small", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][:, :, :1, :1], "padding": 0},
     "x smaller than the kernel"),
    ("conv_bn", "x-uint8", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].to(torch.uint8)}, "x is uint8"),
    ("conv_bn", "running_mean-int", "running_mean", TYPE_ERROR,
     lambda a, d: {"running_mean": a["running_mean"].long(), "training": True},
     "running_mean is int64 (training)"),
    ("conv_bn", "stats-float32", "running_mean", TYPE_ERROR,
     lambda a, d: cast(a, torch.float16, ("x", "conv_weight", "conv_bias", "bn_weight", "bn_bias")),
     "running statistics float32, the rest float16"),
    ("conv_bn", "conv_bias-device", "conv_bias", VALUE_ERROR,
     lambda a, d: {"conv_bias": a["conv_bias"].to(other_device(d))}, "conv_bias on another device"),
    ("conv_bn", "stride-zero", "stride", VALUE_ERROR, lambda a, d: {"stride": 0}, "stride = 0"),
    ("conv_bn", "padding-triple", "padding", TYPE_ERROR, lambda a, d: {"padding": (1, 1, 1)},
     "padding = (1, 1, 1)"),
    ("conv_bn", "eps-inf", "eps", VALUE_ERROR, lambda a, d: {"eps": math.inf}, "eps = inf"),
    ("conv_bn", "momentum-big", "momentum", VALUE_ERROR, lambda a, d: {"momentum": 1.5},
     "momentum = 1.5"),
    ("conv_bn", "one-pixel-batch", "x", VALUE_ERROR,
     lambda a, d: {"x": a["x"][:1, :, :3, :3], "padding": 0, "training": True},
     "training on one output pixel (no variance)"),
    ("conv_bn", "running_mean-grad", "running_mean", VALUE_ERROR,
     lambda a, d: {"running_mean": a["running_mean"].requires_grad_()},
     "running_mean requires grad (eval)"),
    ("conv_bn", "running_var-grad", "running_var", VALUE_ERROR,
     lambda a, d: {"running_var": a["running_var"].requires_grad_(), "training": True},
     "running_var requires grad (training)"),
    ("conv_bn", "stats-alias", "running_mean", VALUE_ERROR,
     lambda a, d: {"running_var": a["running_mean"], "training": True},
     "running_var is running_mean (training)"),
    ("conv_bn", "stats-expanded", "running_mean", VALUE_ERROR,
     lambda a, d: {"running_mean": torch.zeros(1, device=d).expand_as(a["running_mean"]),
                   "training": True},
     "running_mean an expanded view: one element for every channel (training)"),
    ("conv_bn", "stats-in-bias", "running_mean", VALUE_ERROR,
     lambda a, d: {"running_mean": a["bn_bias"], "training": True},
     "running_mean is bn_bias (training)"),
    ("conv_bn", "stats-inference", "running_mean", VALUE_ERROR,
     lambda a, d: {"running_mean": _inference_copy(a["running_mean"]), "training": True},
     "running_mean made under torch.inference_mode (training)"),
    # ---- newton_schulz: G (40, 24)
    ("newton_schulz", "G-4d", "G", VALUE_ERROR, lambda a, d: {"G": a["G"][None, None]},
     "G is 4-D (a batch of batches: rank 2 or 3 only)"),
    ("newton_schulz", "G-vector", "G", VALUE_ERROR, lambda a, d: {"G": a["G"][0]},
     "G is 1-D (a bias: Muon leaves it to AdamW)"),
    ("newton_schulz", "no-rows", "G", VALUE_ERROR, lambda a, d: {"G": a["G"][:0]},
     "G with no rows"),
    ("newton_schulz", "batch-no-cols", "G", VALUE_ERROR,
     lambda a, d: {"G": a["G"][None].expand(2, -1, -1)[..., :0]},
     "a batch of 2 matrices with no columns"),
    ("newton_schulz", "G-int", "G", TYPE_ERROR, lambda a, d: {"G": a["G"].to(torch.int32)},
     "G is int32"),
    ("newton_schulz", "G-grad", "G", VALUE_ERROR, lambda a, d: {"G": a["G"].requires_grad_()},
     "G requires grad (it has no backward)"),
    ("newton_schulz", "steps-negative", "steps", VALUE_ERROR, lambda a, d: {"steps": -1},
     "steps = -1"),
    ("newton_schulz", "steps-float", "steps", TYPE_ERROR, lambda a, d: {"steps": 5.0},
     "steps = 5.0 (a float)"),
    ("newton_schulz", "coefficients-two", "coefficients", TYPE_ERROR,
     lambda a, d: {"coefficients": (3.4445, -4.775)}, "two coefficients for three"),
    ("newton_schulz", "coefficients-nan", "coefficients[1]", VALUE_ERROR,
     lambda a, d: {"coefficients": (3.4445, math.nan, 2.0315)}, "a NaN coefficient"),
    ("newton_schulz", "eps-zero", "eps", VALUE_ERROR, lambda a, d: {"eps": 0.0}, "eps = 0"),
    # ---- rope: x (2, 3, 37, 20), cos and sin (37, 10)
    ("rope", "x-rank", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][0]}, "x is 3-D (no batch axis)"),
    ("rope", "x-odd", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][..., :19]},
     "x with an odd head dimension"),
    ("rope", "x-length", "x", VALUE_ERROR, lambda a, d: {"x": a["x"][:, :, :5]},
     "x with fewer positions than the tables"),
    ("rope", "cos-hf-table", "cos", VALUE_ERROR,
     lambda a, d: {n: torch.cat((a[n], a[n]), -1) for n in ("cos", "sin")},
     "cos and sin (N, D), HF's repeated halves"),
    ("rope", "cos-partial", "cos", VALUE_ERROR,
     lambda a, d: {n: a[n][:, :4] for n in ("cos", "sin")},
     "cos and sin for 8 of 20 features (partial rotary)"),
    ("rope", "sin-batched", "sin", VALUE_ERROR, lambda a, d: {"sin": a["sin"].expand(2, 37, 10)},
     "sin (B, N, D/2): a table per batch element"),
    ("rope", "x-int", "x", TYPE_ERROR, lambda a, d: {"x": a["x"].to(torch.int32)}, "x is int32"),
    ("rope", "sin-float16", "sin", TYPE_ERROR, lambda a, d: {"sin": a["sin"].half()},
     "sin is float16, x float32"),
    ("rope", "cos-device", "cos", VALUE_ERROR, lambda a, d: {"cos": a["cos"].to(other_device(d))},
     "cos on another device"),
    ("rope", "cos-grad", "cos", VALUE_ERROR, lambda a, d: {"cos": a["cos"].requires_grad_()},
     "cos requires grad (a table, not differentiated)"),
    ("rope", "interleaved-int", "interleaved", TYPE_ERROR, lambda a, d: {"interleaved": 1},
     "interleaved = 1 (an int)"),
]


def _inference_copy(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return t.clone()


# Rows whose answer depends on the level: computed where torch computes, refused where a
# level's kernels cannot take them. Each is written out: they are few, and each different.
PER_LEVEL = [
    Bad("conv_bn", "batch-norm-float32",
        "BatchNorm's weights and statistics float32, x and the convolution bfloat16 (autocast's "
        "mixed precision, training)",
        lambda a, d: cast(a, torch.float32, ("bn_weight", "bn_bias", "running_mean", "running_var")),
        arg="x", expect=COMPUTE, variant="train", dtype=torch.bfloat16, grads=ALL,
        note="float32 statistics"),
    Bad("attention", "head-dim-264", "head dimension 264 (past the kernels' widest tile, 256)",
        lambda a, d: {n: randn(1, 2, 37, 264, device=d) for n in "qkv"}, arg="q",
        expect=COMPUTE, levels=(("triton", VALUE_ERROR), ("cuda", VALUE_ERROR)), backward=False,
        note="any head dimension"),
    Bad("attention", "many-slices", "batch x heads = 65536 (q, k, v expanded along the batch)",
        lambda a, d: {n: randn(1, 1, 2, 16, device=d).expand(65536, 1, 2, 16) for n in "qkv"},
        arg="q", expect=COMPUTE, levels=(("triton", VALUE_ERROR),), backward=False),
    Bad("layer_norm", "wide", "a row of 65537 elements",
        lambda a, d: {"x": randn(2, 65537, device=d), "weight": torch.ones(65537, device=d),
                      "bias": torch.zeros(65537, device=d)},
        arg="x", expect=COMPUTE, levels=(("triton", VALUE_ERROR),), backward=False),
    Bad("rms_norm", "wide", "a row of 65537 elements",
        lambda a, d: {"x": randn(2, 65537, device=d), "weight": torch.ones(65537, device=d)},
        arg="x", expect=COMPUTE, levels=(("triton", VALUE_ERROR),), backward=False),
]
for _c, _main in MAIN.items():
    _float64_triton = {"attention": f"{TYPE_ERROR}|{COMPUTE}", "lstm": f"{TYPE_ERROR}|{COMPUTE}"}
    PER_LEVEL.append(Bad(
        _c, "float64", "every tensor float64 (no grad)", lambda a, d: cast(a, torch.float64),
        arg=_main, expect=COMPUTE,
        levels=(("triton", _float64_triton.get(_c, TYPE_ERROR)), ("cuda", TYPE_ERROR)),
        backward=False, note="float32's accuracy at least"))
    PER_LEVEL.append(Bad(
        _c, "meta", "every tensor on the meta device (no data)",
        lambda a, d: {k: v.to("meta") for k, v in a.items() if isinstance(v, torch.Tensor)},
        arg=_main, expect=COMPUTE, levels=(("triton", VALUE_ERROR), ("cuda", VALUE_ERROR)),
        shapes_only=True, note="shapes only", isolate=KERNEL_LEVELS))

# Where the elements of the main input lie >= 2**31 apart: the 32-bit offsets of a kernel
# would wrap. Levels 1-3 are torch's (64-bit); Level 4 refuses where its kernels use 32-bit
# offsets (attention within a (batch, head) slice, the GEMMs of mlp and lstm, conv_bn) and
# computes where they are 64-bit (layer_norm's rows). Level 5: the device run says.
FAR_APART = {  # component: (argument, dim, shape parameters, Level 4)
    "attention": ("q", 2, dict(B=1, H=1, N=2, D=16), VALUE_ERROR),
    "layer_norm": ("x", 0, dict(rows=(2,), N=16), COMPUTE),
    "rms_norm": ("x", 0, dict(rows=(2,), N=16), COMPUTE),
    "mlp": ("x", 0, dict(rows=(2,), K=8, hidden=16, N=8), VALUE_ERROR),
    "lstm": ("x", 0, dict(B=2, T=1, I=8, H=16), VALUE_ERROR),
    "conv_bn": ("x", 0, dict(N=2, C_in=3, H=5, W=5, C_out=4, k=3, stride=1, padding=1), VALUE_ERROR),
    "rope": ("x", 0, dict(B=2, H=1, N=2, D=16), COMPUTE),  # 64-bit offsets in the kernel
    "swiglu_mlp": ("x", 0, dict(rows=(2,), K=8, hidden=16, N=8), VALUE_ERROR),
    "newton_schulz": ("G", 0, dict(rows=2, cols=16), VALUE_ERROR),
}
for _c, (_arg, _dim, _shape, _triton) in FAR_APART.items():
    PER_LEVEL.append(Bad(
        _c, "far-apart", f"{_arg}'s elements 2**31 apart (a view of a sparse file)",
        lambda a, d, _arg=_arg, _dim=_dim: {_arg: far_apart(a[_arg], _dim)},
        arg=_arg, expect=COMPUTE, size=_shape, backward=False,
        levels=(("triton", _triton), ("cuda", f"{VALUE_ERROR}|{COMPUTE}")),
        isolate=KERNEL_LEVELS, note="64-bit offsets"))

# Computed through at every level, as torch does:
# (component, slug, variant, arguments that require grad, change, what, note)
COMPUTED = [
    ("attention", "nan", "causal", ALL, lambda a, d: {"k": with_value(a["k"], (0, 0, 3, 0), math.nan)},
     "a NaN in k (causal: earlier queries never see it)", "NaN as torch, in the gradients too"),
    ("attention", "inf", "causal", ALL, lambda a, d: {"q": with_value(a["q"], (0, 1, 5, 0), math.inf)},
     "+Inf in q (causal)", "Inf and NaN as torch (forward)"),
    ("attention", "some-grad", "full", ("q",), lambda a, d: {},
     "only q requires grad (k, v frozen)", "gradients as torch"),
    ("attention", "q-is-k-is-v", "full", ("q",), lambda a, d: {"k": a["q"], "v": a["q"]},
     "q is k is v (one tensor, three roles)", "gradients summed"),
    ("attention", "empty", "full", ALL, lambda a, d: {n: a[n][:0] for n in "qkv"},
     "a batch of 0 (B = 0)", "empty, as torch"),
    ("attention", "no-queries", "causal", ALL, lambda a, d: {"q": a["q"][:, :, :0]},
     "no queries (Nq = 0, causal)", "empty, as torch"),
    ("attention", "no-keys", "full", ALL, lambda a, d: {n: a[n][:, :, :0] for n in "kv"},
     "no keys (Nk = 0)", "zeros, as torch"),
    ("attention", "head-dim-24", "causal", ALL,
     lambda a, d: {n: randn(1, 2, 37, 24, device=d) for n in "qkv"},
     "head dimension 24 (no power of two)", "any head dimension up to 256"),
    ("layer_norm", "nan", None, ALL, lambda a, d: {"x": with_value(a["x"], (0, 1, 7), math.nan)},
     "a NaN in x", "NaN as torch, in the gradients too"),
    ("layer_norm", "inf", None, ALL, lambda a, d: {"x": with_value(a["x"], (1, 2, 0), math.inf)},
     "+Inf in x", "Inf and NaN as torch (forward)"),
    ("layer_norm", "some-grad", None, ("x",), lambda a, d: {},
     "only x requires grad (weight, bias frozen)", "gradients as torch"),
    ("rms_norm", "nan", None, ALL, lambda a, d: {"x": with_value(a["x"], (0, 1, 7), math.nan)},
     "a NaN in x", "NaN as torch, in the gradients too"),
    ("rms_norm", "inf", None, ALL, lambda a, d: {"x": with_value(a["x"], (1, 2, 0), math.inf)},
     "+Inf in x", "Inf and NaN as torch (forward)"),
    ("rms_norm", "some-grad", None, ("x",), lambda a, d: {},
     "only x requires grad (weight frozen)", "gradients as torch"),
    ("layer_norm", "empty", None, ALL, lambda a, d: {"x": a["x"][:0]},
     "x with no rows (a batch of 0)", "empty, zero weight and bias gradients, as torch"),
    ("mlp", "nan", None, ALL, lambda a, d: {"x": with_value(a["x"], (0, 3, 5), math.nan)},
     "a NaN in x", "NaN as torch, in the gradients too"),
    ("mlp", "inf", None, ALL, lambda a, d: {"x": with_value(a["x"], (1, 0, 0), -math.inf)},
     "-Inf in x", "Inf and NaN as torch (forward)"),
    ("mlp", "some-grad", None, ("w1", "b1", "w2", "b2"), lambda a, d: {},
     "x does not require grad, the weights do (a first layer)", "gradients as torch"),
    ("swiglu_mlp", "nan", None, ALL, lambda a, d: {"x": with_value(a["x"], (0, 3, 5), math.nan)},
     "a NaN in x", "NaN as torch, in the gradients too"),
    ("swiglu_mlp", "inf", None, ALL, lambda a, d: {"x": with_value(a["x"], (1, 0, 0), -math.inf)},
     "-Inf in x", "Inf and NaN as torch (forward)"),
    ("swiglu_mlp", "some-grad", None, ("w_gate", "w_up", "w_down"), lambda a, d: {},
     "x does not require grad, the weights do (a first layer)", "gradients as torch"),
    ("lstm", "nan", None, ALL, lambda a, d: {"x": with_value(a["x"], (1, 0, 3), math.nan)},
     "a NaN in x (one sequence, its first step)", "NaN as torch, in the gradients too"),
    ("lstm", "inf", None, ALL, lambda a, d: {"h0": with_value(a["h0"], (0, 0, 0), math.inf)},
     "+Inf in h0", "Inf and NaN as torch (forward)"),
    ("lstm", "some-grad", None, ("w_ih", "w_hh", "b_ih", "b_hh"), lambda a, d: {},
     "only the weights require grad (x, h0, c0 do not)", "gradients as torch"),
    ("conv_bn", "nan", "eval", ALL, lambda a, d: {"x": with_value(a["x"], (0, 1, 4, 4), math.nan)},
     "a NaN in x (eval)", "NaN as torch, in the gradients too"),
    ("conv_bn", "inf", "train", ALL, lambda a, d: {"x": with_value(a["x"], (1, 0, 2, 3), math.inf)},
     "+Inf in x (training: the batch statistics)", "Inf and NaN as torch (forward)"),
    ("conv_bn", "some-grad", "train", ("conv_weight", "conv_bias", "bn_weight", "bn_bias"),
     lambda a, d: {}, "x does not require grad, the parameters do (training)", "gradients as torch"),
    ("rope", "nan", "half", ALL, lambda a, d: {"x": with_value(a["x"], (0, 1, 4, 3), math.nan)},
     "a NaN in x", "NaN as torch, in the gradients too"),
    ("newton_schulz", "nan", None, (), lambda a, d: {"G": with_value(a["G"], (3, 5), math.nan)},
     "a NaN in G", "NaN everywhere, as torch (the norm is NaN)"),
    ("newton_schulz", "inf", None, (), lambda a, d: {"G": with_value(a["G"], (0, 2), math.inf)},
     "+Inf in G", "NaN everywhere, as torch (inf / inf, then A A)"),
    ("newton_schulz", "zero", None, (), lambda a, d: {"G": torch.zeros_like(a["G"])},
     "G all zeros (a parameter that got no gradient)", "zeros, as torch (eps keeps 0/0 away)"),
    ("newton_schulz", "batch-one-nan", None, (),
     lambda a, d: {"G": torch.stack((a["G"], with_value(a["G"], (3, 5), math.nan), a["G"]))},
     "a NaN in one matrix of a batch of 3", "NaN in that matrix only, as torch (a norm per matrix)"),
    ("newton_schulz", "empty", None, (), lambda a, d: {"G": a["G"][None][:0]},
     "a batch of 0 matrices (B = 0)", "empty, as torch (nothing launched)"),
    ("rope", "inf", "interleaved", ALL,
     lambda a, d: {"x": with_value(a["x"], (1, 2, 0, 5), math.inf)},
     "+Inf in x (interleaved)", "Inf and NaN as torch (forward)"),
    # Empty tensors: a batch of 0 (and rope's no positions), computed as torch computes them
    ("rms_norm", "empty", None, ALL, lambda a, d: {"x": a["x"][:0]},
     "x with no rows (a batch of 0)", "empty, a zero weight gradient, as torch"),
    ("mlp", "empty", None, ALL, lambda a, d: {"x": a["x"][:0]},
     "x with no rows (a batch of 0)", "empty, zero weight and bias gradients, as torch"),
    ("swiglu_mlp", "empty", None, ALL, lambda a, d: {"x": a["x"][:0]},
     "x with no rows (a batch of 0)", "empty, zero weight gradients, as torch"),
    ("lstm", "empty", None, ALL,
     lambda a, d: {"x": a["x"][:0], "h0": a["h0"][:, :0], "c0": a["c0"][:, :0]},
     "a batch of 0 sequences (B = 0)", "empty, zero weight gradients, as nn.LSTM"),
    ("conv_bn", "empty", "eval", ALL, lambda a, d: {"x": a["x"][:0]},
     "a batch of 0 images (eval)", "empty, zero parameter gradients, as torch"),
    ("conv_bn", "empty-train", "train", ALL, lambda a, d: {"x": a["x"][:0]},
     "a batch of 0 images (training)",
     "empty, zero parameter gradients, running statistics untouched, as torch"),
    ("rope", "empty", "half", ALL, lambda a, d: {"x": a["x"][:0]},
     "a batch of 0 (B = 0)", "empty, as torch"),
    ("rope", "no-positions", "interleaved", ALL,
     lambda a, d: {"x": a["x"][:, :, :0], "cos": a["cos"][:0], "sin": a["sin"][:0]},
     "x and the tables with no positions (N = 0)", "empty, as torch"),
]

# Only on a GPU: the device mix-ups a CPU cannot make.
GPU_ONLY = [
    Bad(_c, "cpu-tensors", "CPU tensors, on a machine with a GPU",
        lambda a, d: {k: v.cpu() for k, v in a.items() if isinstance(v, torch.Tensor)},
        arg=_main, expect=COMPUTE, levels=(("triton", VALUE_ERROR), ("cuda", VALUE_ERROR)),
        devices=("cuda",), backward=False, isolate=KERNEL_LEVELS)
    for _c, _main in MAIN.items()
] + [
    Bad(_c, "interpreter-cuda", "CUDA tensors to Triton's interpreter (TRITON_INTERPRET=1)",
        lambda a, d: {}, arg=_main, only=("triton",), devices=("cuda",),
        isolate=("triton",), env=(("TRITON_INTERPRET", "1"),))
    for _c, _main in MAIN.items()
]


def _catalogue() -> list[Bad]:
    rows = [Bad(c, slug, what, change, arg=arg, expect=error) for c, slug, arg, error, change, what
            in REFUSED]
    rows += PER_LEVEL
    # Inf: the forward only. Gradients through an infinity are inf - inf or 0 * inf, and
    # torch's own kernels disagree on them (SDPA's math path and matmul + softmax put NaN at
    # different places of grad k), so there is no "as torch" to hold a level to.
    rows += [Bad(c, slug, what, change, arg=MAIN[c], expect=COMPUTE, variant=variant, grads=grads,
                 note=note, like_torch=slug in ("nan", "inf"), backward=slug != "inf")
             for c, slug, variant, grads, change, what, note in COMPUTED]
    rows += GPU_ONLY
    order = {c: i for i, c in enumerate(COMPONENTS)}
    return sorted(rows, key=lambda b: order[b.component])  # stable: catalogue order within


CATALOGUE = _catalogue()
BY_KEY = {b.key: b for b in CATALOGUE}
assert len(BY_KEY) == len(CATALOGUE), "two rows share a key"


# ---------------------------------------------------------------------------------------
# Your code as a level: Level 1's math, nothing else. `levels.register` puts the contract's
# validator in front of each function: the only check between a bad input and the math.
# ---------------------------------------------------------------------------------------

def _own_functions() -> dict:
    from levels import native

    def attention(q, k, v, causal=False, scale=None):
        return native.attention_math(q, k, v, causal, q.shape[-1] ** -0.5 if scale is None else scale)

    def layer_norm(x, weight, bias, eps=1e-5):
        return native.layer_norm_math(x, weight, bias, eps)

    def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
        return native.conv_bn_math(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean,
                                   running_var, stride, padding, eps, momentum, training)

    def rms_norm(x, weight, eps=1e-6):
        return native.rms_norm_math(x, weight, eps)

    def rope(x, cos, sin, interleaved=False):
        return native.rope_math(x, cos, sin, interleaved)

    def newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
        return native.newton_schulz_math(G, steps, *coefficients, eps)

    return {"newton_schulz": newton_schulz,
            "attention": attention, "layer_norm": layer_norm, "mlp": native.mlp_math,
            "lstm": native.lstm_math, "conv_bn": conv_bn, "rms_norm": rms_norm, "rope": rope,
            "swiglu_mlp": native.swiglu_mlp_math}


@contextlib.contextmanager
def opened(level: str):
    """The level's module; OWN is registered for the call only, so that no other test
    (`check()` runs every registered level) ever sees it."""
    if level != OWN:
        yield levels.get(level)
        return
    levels.register(OWN, _own_functions(), title="Level 1's math behind the validator")
    try:
        yield levels.get(OWN)
    finally:
        levels.unregister(OWN)


def level_status(level: str, device, component: str) -> str | None:
    return None if level == OWN else levels.status(level, device, component)


# ---------------------------------------------------------------------------------------
# Trying one input at one level
# ---------------------------------------------------------------------------------------

@dataclass
class Outcome:
    kind: str  # "raised", "computed", "unavailable", "wrong", "crashed", "hung", "not tried"
    error: str = ""  # the exception's type name
    message: str = ""  # the exception's message, or what was wrong, or the reason
    ok: bool = True  # computed: matched the reference

    def acceptable(self, bad: Bad, level: str) -> tuple[bool, str]:
        """Whether this is something `bad` allows at `level`, and if not, why not."""
        allowed = bad.expectation(level).split("|")
        if self.kind == "raised" and self.error in allowed:
            if f"'{bad.arg}'" not in self.message or bad.component not in self.message:
                return False, (f"the {self.error} does not name the component and the argument "
                               f"'{bad.arg}': {self.message}")
            if bad.by_contract and not (" must " in self.message and "; got " in self.message):
                return False, (f"a contract error says what it expected and what it got "
                               f"('must ...; got ...'): {self.message}")
            return True, ""
        if self.kind == "computed" and COMPUTE in allowed:
            return self.ok, self.message
        if self.kind == "unavailable" and not bad.by_contract:
            # try_case says "unavailable" only when the error carries levels.status's reason;
            # an input the contract refuses never gets that far (the validator runs first).
            return True, ""
        return False, f"expected {' or '.join(allowed)}, got {self.describe()}"

    def describe(self) -> str:
        return {"raised": f"{self.error}: {self.message}", "computed": f"computed ({self.message})"
                if self.message else "computed"}.get(self.kind, f"{self.kind}: {self.message}")


class LevelRaised(Exception):
    """The level (forward or backward) raised `exc`: an outcome, not a bug of this test."""

    def __init__(self, exc: BaseException):
        super().__init__(repr(exc))
        self.exc = exc


def _level(call):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - whatever the level raises is its outcome
        raise LevelRaised(exc) from exc


# ---------------------------------------------------------------------------------------
# "As torch does" with NaN and Inf: torch's own operators, in float64. The cards' references
# are written from the math (their own sigmoid, GELU, softmax), which is what finite inputs
# are checked against; at infinities the math and torch part ways in the gradients (the
# derivative of 1 / (1 + exp(-z)) at z = -inf is 0 * inf = NaN, torch.sigmoid's is 0), and
# what a user can expect of a level there is what torch does.
# ---------------------------------------------------------------------------------------

def _torch_attention(q, k, v, causal=False, scale=None):
    # Written out rather than F.scaled_dot_product_attention, whose answer to a NaN depends
    # on the backend it picks: CUDA's float64 math backend adds the causal mask as a -inf
    # bias (NaN + -inf = NaN: a NaN key poisons every row, even those the mask hides it
    # from), the CPU's kernel masks (only the rows that see the key). Masking is the
    # definition every level implements: a hidden key is never seen.
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, -math.inf)
    return (torch.matmul(torch.softmax(scores, dim=-1), v),)


def _torch_layer_norm(x, weight, bias, eps=1e-5):
    return (F.layer_norm(x, (x.shape[-1],), weight, bias, eps),)


def _torch_rms_norm(x, weight, eps=1e-6):
    return (F.rms_norm(x, (x.shape[-1],), weight, eps),)


def _torch_mlp(x, w1, b1, w2, b2):
    return (F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),)


def _torch_swiglu_mlp(x, w_gate, w_up, w_down):
    return (F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down),)


def _torch_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    module = torch.nn.LSTM(x.shape[-1], w_hh.shape[1], batch_first=True, device="meta")
    weights = {"weight_ih_l0": w_ih, "weight_hh_l0": w_hh, "bias_ih_l0": b_ih, "bias_hh_l0": b_hh}
    out, (h, c) = torch.func.functional_call(module, weights, (x, (h0, c0)))
    return out, h, c


def _torch_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                   stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    mean, var = running_mean.detach().clone(), running_var.detach().clone()  # updated in place
    y = F.conv2d(x, conv_weight, conv_bias, stride, padding)
    out = F.batch_norm(y, mean, var, bn_weight, bn_bias, training, momentum, eps)
    return (out, mean, var) if training else (out,)


def _torch_rope(x, cos, sin, interleaved=False):
    # HF transformers' apply_rotary_pos_emb (torch has no RoPE operator), in Meta's pair
    # order for interleaved=True
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return (torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2),)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return (x * torch.cat((cos, cos), -1) + rotated * torch.cat((sin, sin), -1),)


def _torch_newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    return (cards.get("newton_schulz").module._muon_reference(G, steps, coefficients, eps),)


TORCH_OPS = {"newton_schulz": _torch_newton_schulz, "attention": _torch_attention, "layer_norm": _torch_layer_norm, "mlp": _torch_mlp,
             "lstm": _torch_lstm, "conv_bn": _torch_conv_bn, "rms_norm": _torch_rms_norm,
             "rope": _torch_rope, "swiglu_mlp": _torch_swiglu_mlp}


def _upstream(outs, dtype) -> list:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(o.shape, generator=g).to(device=o.device, dtype=dtype) for o in outs]


def _differs(name: str, got, ref: torch.Tensor, bound: float, dtype, scale=None,
             expected_dtype=None) -> str:
    """'' if `got` is `ref` (float64): NaN, +Inf and -Inf at exactly ref's places, the finite
    values within `bound` of the call's `dtype` (relative to ||scale|| where the spec says
    ref is exactly 0), `got` itself of `expected_dtype` (default `dtype`); else what differs."""
    expected_dtype = dtype if expected_dtype is None else expected_dtype
    if not isinstance(got, torch.Tensor):
        return f"{name}: expected a tensor, got {type(got).__name__}"
    if (tuple(got.shape) != tuple(ref.shape) or got.dtype != expected_dtype
            or got.device != ref.device):
        return (f"{name}: {got.dtype} {tuple(got.shape)} on {got.device}, expected "
                f"{expected_dtype} {tuple(ref.shape)} on {ref.device}")
    got64 = got.detach().to(torch.float64)
    for what, where in (("NaN", torch.isnan), ("+Inf", torch.isposinf), ("-Inf", torch.isneginf)):
        if not torch.equal(where(got64), where(ref)):
            return (f"{name}: {what} at {int(where(got64).sum())} places, the reference at "
                    f"{int(where(ref).sum())}, not all the same")
    finite = torch.isfinite(ref)
    c = compare(name, got[finite], ref[finite], bound, expected_dtype, scale=scale)
    return "" if c.ok else f"{name}: relative error {c.rel_err:.3g} > {bound:g}"


def judge(bad: Bad, fn, tf32: bool, args: dict) -> Outcome:
    """Call `fn` (a level's function) on `args`; if it returns, compare with the float64
    reference on the same inputs, aliases kept (q is k stays true for the reference), and
    the gradients of the inputs that require grad. LevelRaised if the level raises."""
    spec = cards.get(bad.component)
    case = spec.case_from_args(args)
    tensors = case.tensors()
    dtype = case.dtype
    if bad.shapes_only:
        outs = flatten(_level(lambda: fn(**args)))
        real = {k: torch.zeros(v.shape, dtype=torch.float64) if isinstance(v, torch.Tensor) else v
                for k, v in args.items()}
        device = next(iter(tensors.values())).device
        for name, got, ref in zip(case.outputs, outs, spec.reference(real)):
            if (not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(ref.shape)
                    or got.dtype != dtype or got.device != device):
                return Outcome("computed", message=f"{name}: expected a {dtype} tensor of shape "
                               f"{tuple(ref.shape)} on {device}, got {got!r:.120}", ok=False)
        return Outcome("computed", message=bad.note)

    # float64 twins, one per tensor object, taken before the call updates any buffer
    twins = {}
    for t in tensors.values():
        if id(t) not in twins:
            twins[id(t)] = t.detach().to(torch.float64).requires_grad_(t.requires_grad)
    leaves = {id(t): t for t in tensors.values() if t.requires_grad}  # each tensor once

    outs = flatten(_level(lambda: fn(**args))) + [args[name] for name in case.mutated]
    ref_args = {k: twins[id(v)] if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    ref_outs = (TORCH_OPS[bad.component](**ref_args) if bad.like_torch
                else spec.reference(ref_args))
    if len(outs) != len(ref_outs):
        return Outcome("computed", message=f"returned {len(outs)} tensors, expected "
                       f"{len(ref_outs)}", ok=False)
    # float64 inputs are held to float32's bound: Level 1 (and with it Levels 2-3) computes
    # its statistics in float32, so that is the accuracy the ladder offers in float64.
    bound = tolerance(torch.float32 if dtype == torch.float64 else dtype, tf32=tf32)
    # each output in the call's dtype; an updated buffer and a gradient in their tensor's own
    # (float32 running statistics beside a 16-bit x stay float32)
    own = {name: args[name].dtype for name in case.mutated}
    problems = [_differs(n, o, r.detach(), bound, dtype, expected_dtype=own.get(n, dtype))
                for n, o, r in zip(case.outputs, outs, ref_outs)]
    returned = outs[:case.n_returned]
    if not leaves:
        if any(o.requires_grad for o in returned):
            problems.append("an output requires grad although no input does")
    elif bad.backward:
        upstream = _upstream(returned, dtype)
        upstream64 = [u.to(torch.float64) for u in upstream]
        got = _level(lambda: torch.autograd.grad(returned, list(leaves.values()), upstream,
                                                 allow_unused=True))
        want = torch.autograd.grad(ref_outs[:case.n_returned], [twins[i] for i in leaves],
                                   upstream64, allow_unused=True)
        names = {id(v): k for k, v in reversed(list(tensors.items()))}  # an alias's first name
        want = {names[i]: torch.zeros_like(twins[i]) if w is None else w
                for i, w in zip(leaves, want)}
        # gradients that are exactly 0 here (conv_bias in training): measured against the
        # size the spec says they would have had, as `check` does
        scales = spec.zero_gradient_scales(ref_args, upstream64, want)
        for i, g in zip(leaves, got):
            name = names[i]
            problems.append(f"grad {name}: none (dropped by the level)" if g is None else
                            _differs(f"grad {name}", g, want[name], bound, dtype, scales.get(name),
                                     expected_dtype=leaves[i].dtype))
    problems = [p for p in problems if p]
    return Outcome("computed", message="; ".join(problems) or bad.note, ok=not problems)


def try_case(bad: Bad, level: str, device: str) -> Outcome:
    """What `level` does with `bad` on `device`, in this process."""
    if not bad.tried(level, device):
        return Outcome("not tried")
    args = bad.args(device)
    dtype = next((v.dtype for v in args.values() if isinstance(v, torch.Tensor)), bad.dtype)
    try:
        with opened(level) as module:
            tf32 = bool(module.uses_tf32(bad.component, torch.device(device), dtype))
            return judge(bad, getattr(module, bad.component), tf32, args)
    except LevelRaised as raised:
        exc = raised.exc
        if isinstance(exc, (ValueError, TypeError)):
            return Outcome("raised", type(exc).__name__, str(exc))
        first = next((v for v in args.values() if isinstance(v, torch.Tensor)), None)
        reason = level_status(level, first.device if first is not None else device, bad.component)
        if reason and reason in str(exc):
            return Outcome("unavailable", type(exc).__name__, reason)
        return Outcome("raised", type(exc).__name__, str(exc))
    finally:
        _SPARSE_FILES.clear()


# ---------------------------------------------------------------------------------------
# Isolation: a subprocess per (level, device, environment) for the rows that could crash
# ---------------------------------------------------------------------------------------

def _isolated(device: str, env: tuple, cases: list[tuple[str, str]]) -> dict:
    """Run `cases` ((key, level) pairs) in subprocesses: one for all of them, and a fresh one
    after each case that crashed or hung (that case's outcome), until each has an outcome."""
    results: dict[tuple[str, str], Outcome] = {}
    todo = list(cases)
    while todo:
        cmd = [sys.executable, "-m", "tests.test_bad_inputs", "--isolated", device,
               ",".join(f"{key}@{level}" for key, level in todo)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=os.environ | dict(env), capture_output=True,
                                  text=True, timeout=SUBPROCESS_TIMEOUT_S)
            stdout, rc, tail = proc.stdout, proc.returncode, proc.stderr.strip()[-600:]
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            rc, tail = None, f"no answer within {SUBPROCESS_TIMEOUT_S} s"
        started = None
        for line in stdout.splitlines():
            if line.startswith("START "):
                started = tuple(line[6:].split("@"))
            elif line.startswith("RESULT "):
                found = json.loads(line[7:])
                results[(found["key"], found["level"])] = Outcome(**found["outcome"])
                started = None
        if started is None:  # it stopped between cases: what it did not answer, it cannot
            for case in todo:
                results.setdefault(case, Outcome("crashed", message=f"exit code {rc}: {tail}"))
        elif rc is None:
            results[started] = Outcome("hung", message=tail)
        else:
            results[started] = Outcome("crashed", message=f"exit code {rc} (negative: the "
                                       f"signal): {tail}")
        todo = [case for case in todo if case not in results]
    return results


@functools.cache
def _isolated_batch(device: str, env: tuple) -> dict:
    """Every isolated case for `device` and `env`, all levels, in one subprocess."""
    cases = [(b.key, level) for b in CATALOGUE for level in b.isolate
             if b.env == env and b.tried(level, device)]
    return _isolated(device, env, cases)


@functools.cache
def outcome(key: str, level: str, device: str) -> Outcome:
    bad = BY_KEY[key]
    if level in bad.isolate and bad.tried(level, device):
        return _isolated_batch(device, bad.env)[(key, level)]
    return try_case(bad, level, device)


ABORT_AT = "BAD_INPUTS_ABORT_AT"  # key@level: the subprocess dies there (tests the net)


def _run_isolated(device: str, cases: str) -> None:
    for case in cases.split(","):
        key, level = case.split("@")
        print(f"START {key}@{level}", flush=True)
        if os.environ.get(ABORT_AT) == case:
            os.abort()
        found = try_case(BY_KEY[key], level, device)
        print("RESULT " + json.dumps({"key": key, "level": level, "outcome": asdict(found)}),
              flush=True)


# ---------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------

HEADERS = {"native": "1 native", "torchscript": "2 torchscript", "compile": "3 compile",
           "triton": "4 triton", "cuda": "5 cuda", OWN: "own code"}


def _short(message: str, component: str, expected_only: bool = False) -> str:
    """'layer_norm: argument 'x' must be ...; got ...' -> 'x' must be ...; got ... (without
    what was given: expected_only)."""
    text = message.removeprefix(f"{component}: ").removeprefix("argument ").split("\n")[0]
    return text.split("; got ")[0] if expected_only else text


def _cell(found: Outcome, component: str, row_message: str, on_gpu: bool) -> str:
    if found.kind == "raised":
        if found.message == row_message:
            return found.error
        return f"{found.error}: {_short(found.message, component, expected_only=True)}"
    if found.kind == "computed":
        if not found.ok:
            return f"WRONG: {found.message}"
        return f"computed ({found.message})" if found.message else "computed"
    if found.kind == "unavailable":
        if not on_gpu and found.message.startswith("needs a CUDA GPU"):
            return "GPU only: see reports/"
        return f"n/a: {found.message.split(';')[0]}"
    if found.kind == "not tried":
        return "GPU only: see reports/" if not on_gpu else "-"
    return f"{found.kind.upper()}: {found.message}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_section(outcomes: dict, on_gpu: bool) -> list[str]:
    """Markdown tables, one per component, of {key: {level: Outcome}}."""
    lines = []
    for component in COMPONENTS:
        lines += [f"### {component}", "",
                  "| bad input | " + " | ".join(HEADERS[c] for c in COLUMNS) + " | the error says |",
                  "|---" * (len(COLUMNS) + 2) + "|"]
        for bad in CATALOGUE:
            if bad.component != component or bad.key not in outcomes:
                continue
            row = outcomes[bad.key]
            first = next((row[c] for c in COLUMNS if row[c].kind == "raised"), None)
            message = first.message if first else ""
            cells = [_cell(row[c], component, message, on_gpu) for c in COLUMNS]
            said = f"{first.error}: {_short(first.message, component)}" if first else ""
            lines.append(f"| {_escape(bad.what)} | " + " | ".join(_escape(c) for c in cells)
                         + f" | {_escape(said)} |")
        lines.append("")
    return lines


def cpu_outcomes() -> dict:
    return {b.key: {c: outcome(b.key, c, "cpu") for c in COLUMNS} for b in CATALOGUE}


def gpu_outcomes() -> dict:
    return {b.key: {c: outcome(b.key, c, "cuda") for c in COLUMNS} for b in CATALOGUE
            if "cuda" in b.devices}


def render_table(cpu: dict, gpu_report: dict | None) -> str:
    lines = [
        "# Bad inputs at every level",
        "",
        "<!-- generated: do not edit. Regenerate with "
        f"`{WRITE_TABLE}` (tests/test_bad_inputs.py fails when this file differs from what "
        "the code does now). -->",
        "",
        "Every input in the catalogue of `tests/test_bad_inputs.py`, tried at each level and at",
        "`own code`: functions of your own registered with `levels.register` (here Level 1's",
        "math with no checks of its own, so the contract's validator is all that stands between",
        "a bad input and the math). A cell says what the call did:",
        "",
        "- `ValueError`, `TypeError`: refused before any kernel ran, with the message in the last",
        "  column (it names the component, the argument, what was expected and what was given);",
        "  a cell that adds a message is a level's own refusal (its kernels' limits);",
        "- `computed (...)`: ran, and matched the float64 reference on the same inputs: the",
        "  outputs and the gradients of the inputs that require grad within the dtype's bound",
        "  (`equivalence/tolerances.py`); with a NaN in an input, NaN and Inf at exactly the",
        "  places torch's own operators put them, outputs and gradients; with an Inf, in the",
        "  outputs only (torch's own kernels disagree about gradients through an infinity).",
        "  float64 inputs are held to float32's bound: Level 1 computes its layer_norm and",
        "  conv_bn statistics in float32;",
        "- `n/a: ...`: the level cannot run this here, with `levels.status`'s reason; `-`: the",
        "  row is about another level.",
        "",
        "Inputs the contract refuses are refused at every level, available or not: the validator",
        "(`levels/contract.py`) runs before anything else, Level 5's too. NaN and Inf are computed",
        "through at every level, as torch does: refusing them would cost a pass over every input.",
        "",
        "## On a CPU",
        "",
        "Triton runs in its interpreter (`TRITON_INTERPRET=1`); Level 5 needs a GPU: its cells say",
        "`GPU only: see reports/` where the answer depends on running its kernels (the GPU section",
        "below has them).",
        "",
    ]
    lines += render_section(cpu, on_gpu=False)
    lines += ["## On a GPU", ""]
    if gpu_report is None:
        lines += [f"Not run on a GPU yet. On one: `{WRITE_GPU_REPORT}`, then `{WRITE_TABLE}` here.", ""]
    else:
        lines += [f"{gpu_report['device']}, torch {gpu_report['torch']}: read from "
                  f"`{GPU_REPORT.relative_to(ROOT)}`, written there by `{WRITE_GPU_REPORT}`. "
                  "Triton runs compiled.", ""]
        found = {key: {c: Outcome(**o) for c, o in row.items()}
                 for key, row in gpu_report["outcomes"].items()}
        lines += render_section(found, on_gpu=True)
    return "\n".join(lines).rstrip() + "\n"


def read_gpu_report() -> dict | None:
    return json.loads(GPU_REPORT.read_text()) if GPU_REPORT.exists() else None


# ---------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------

def _params(device: str):
    marks = [pytest.mark.gpu] if device == "cuda" else []
    return [pytest.param(b.key, level, marks=marks, id=f"{b.key}-{level}")
            for b in CATALOGUE for level in COLUMNS if device in b.devices]


def _assert_acceptable(key: str, level: str, device: str):
    bad = BY_KEY[key]
    found = outcome(key, level, device)
    if found.kind == "not tried":
        pytest.skip(f"{key} is about {', '.join(bad.only)} only")
    ok, why = found.acceptable(bad, level)
    assert ok, f"{key} at {level} on {device}: {why}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU table: Triton runs compiled here")
@pytest.mark.parametrize("key, level", _params("cpu"))
def test_bad_input_on_cpu(key, level):
    _assert_acceptable(key, level, "cpu")


@pytest.mark.parametrize("key, level", _params("cuda"))
def test_bad_input_on_gpu(key, level):
    _assert_acceptable(key, level, "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the table's CPU part is made on a CPU")
def test_table_in_docs_is_what_the_code_does():
    want = render_table(cpu_outcomes(), read_gpu_report())
    have = TABLE.read_text() if TABLE.exists() else ""
    assert have == want, (f"{TABLE.relative_to(ROOT)} differs from what the levels do now: "
                          f"regenerate it with `{WRITE_TABLE}` and commit it")


def test_a_crash_in_a_subprocess_is_an_outcome_and_the_rest_still_runs():
    first, second = ("layer_norm/x-scalar", "native"), ("layer_norm/weight-length", "native")
    found = _isolated("cpu", ((ABORT_AT, "@".join(first)),), [first, second])
    assert found[first].kind == "crashed" and "exit code -6" in found[first].message, found
    assert found[second].kind == "raised" and found[second].error == VALUE_ERROR, found


def test_catalogue_covers_every_component_and_kind():
    for component in COMPONENTS:
        slugs = {b.slug for b in CATALOGUE if b.component == component}
        for must in ("empty", "float64", "meta", "nan", "inf", "some-grad", "far-apart",
                     "cpu-tensors", "interpreter-cuda"):
            if must == "some-grad" and len(cards.get(component).differentiable) < 2:
                continue  # one differentiable input (rope's x): no subset to leave out
            assert must in slugs, (component, must)
    assert any(b.key == "attention/q-is-k-is-v" for b in CATALOGUE)
    assert any(b.key == "attention/head-dim-24" for b in CATALOGUE)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.test_bad_inputs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write-table", action="store_true", help=f"write {TABLE.relative_to(ROOT)}")
    group.add_argument("--gpu-report", metavar="FILE", help="on a GPU: write what each level does")
    group.add_argument("--isolated", nargs=2, metavar=("DEVICE", "KEY@LEVEL,..."),
                       help=argparse.SUPPRESS)  # the subprocess side of _isolated
    args = parser.parse_args(argv)
    if args.isolated:
        _run_isolated(*args.isolated)
        return 0
    if args.gpu_report:
        if not torch.cuda.is_available():
            print("--gpu-report needs a CUDA GPU: torch.cuda.is_available() is False", file=sys.stderr)
            return 3
        # Row by row, the file rewritten after each: a case that hangs the process (what this
        # run exists to find) still leaves every answer before it, and the log names it.
        report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "outcomes": {}}
        cases = [(b.key, c) for b in CATALOGUE if "cuda" in b.devices for c in COLUMNS]
        for i, (key, level) in enumerate(cases, 1):
            print(f"[{i}/{len(cases)}] {key} @ {level} ...", end=" ", file=sys.stderr, flush=True)
            start = time.monotonic()
            found = outcome(key, level, "cuda")
            ok, why = found.acceptable(BY_KEY[key], level) if found.kind != "not tried" else (True, "")
            print(f"{found.kind} in {time.monotonic() - start:.1f} s" + ("" if ok else f"  UNACCEPTABLE: {why[:300]}"),
                  file=sys.stderr, flush=True)
            report["outcomes"].setdefault(key, {})[level] = asdict(found)
            Path(args.gpu_report).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.gpu_report}")
        return 0
    if torch.cuda.is_available():
        print("--write-table makes the CPU table: run it on a machine without a GPU",
              file=sys.stderr)
        return 3
    TABLE.parent.mkdir(exist_ok=True)
    TABLE.write_text(render_table(cpu_outcomes(), read_gpu_report()))
    print(f"wrote {TABLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
