"""Fuzzed equivalence: hypothesis draws shapes, dtypes, layouts and options for every
component, and every level available here must pass `check_args` on them (the float64
reference, forward and backward, NaN-poisoned allocations, memory around the views).

Each component's strategy draws a plain dict of parameters (shape, dtype, layout,
options, magnitude, seed); `_args` turns it into the component's arguments with a
torch.Generator seeded from it, the way the cards' make_args do. The named hard cases
(HARD_CASES) run at every level on every run, whatever hypothesis draws:

  widths and lengths that are no multiple of any block (1, 17, 1023), batch 1, causal with
  N = 1 and D = 16, rows of ~1e4 (softmax and LayerNorm stability), float16 near overflow,
  constant LayerNorm rows, all-zero RMSNorm rows, stride-2 convolutions padded by more than the kernel's half-width.

Runs. CI (the default): a few examples per component and level, `derandomize=True` so
every run draws the same cases, Triton in its CPU interpreter at tiny sizes, and
torch.compile at fewer examples (every new shape is a new compilation):

    python -m pytest tests/test_fuzz.py                          # < 2 minutes on 2 cores

Nightly (the long run; the same cases first, then many more):

    LEVELS_FUZZ_EXAMPLES=200 python -m pytest tests/test_fuzz.py

LEVELS_FUZZ_COMPILE_EXAMPLES overrides the torch.compile count (default: EXAMPLES / 8,
between 2 and 24: Level 3 allows 64 compiled graphs per function in one process). The
`gpu` tests run the same strategies on CUDA tensors at Levels 4 and 5 (`pytest -m gpu` on
the device), larger sizes included.

What is *not* drawn, and why (each is ill-conditioned by nature, so no implementation
meets the bound there; the bound is never loosened instead):
  * LayerNorm rows with an offset much larger than their spread in float32: the mean
    itself is rounded at |offset| * u, and x - mean amplifies that by |offset| / std
    (1e4 * 6e-8 = 6e-4 > 1e-5). Large rows are drawn with spread ~ offset instead.
  * Attention scores of ~1e4 in float32: a score computed in fp32 is off by ~|s| * u in
    absolute terms, and softmax turns that into a relative error of the same size
    (~1e-3 > 1e-5). The ~1e4 softmax rows run in bfloat16 (and float16), where the bound
    absorbs it and a kernel that forgets to subtract the row max still overflows to NaN.
  * float16 inputs near overflow for attention, the MLP, the LSTM and conv_bn: there the
    exact gradients (or the MLP's, the convolution's outputs) exceed 65504 themselves, so
    no float16 result can match them. LayerNorm's outputs and gradients stay small however
    large x is: its near-overflow case is the one that tests a kernel squaring in fp16.
  * conv_bn in training mode with fewer than 3 values per channel (N * H_out * W_out):
    with 2 the normalized values are +-sqrt(var / (var + eps)) and the gradient through
    BatchNorm is an eps-size cancellation (1 - xhat^2): PyTorch itself misses the fp32
    bound by 30-80x (tests/test_cuda_conv_bn.py). With 1 BatchNorm2d refuses the input.
"""

from __future__ import annotations

import math
import os
import warnings
import shlex
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import levels
import levels.triton  # noqa: F401  (first: the interpreter must be on before triton loads)
from equivalence import cards
from equivalence.check import check_args

EXAMPLES = int(os.environ.get("LEVELS_FUZZ_EXAMPLES", "4"))
COMPILE_EXAMPLES = int(os.environ.get("LEVELS_FUZZ_COMPILE_EXAMPLES",
                                      min(24, max(2, EXAMPLES // 8))))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TRITON_HEAD_DIMS = (16, 32)  # head sizes small enough for the interpreter
CPU_LEVELS = ("native", "torchscript", "compile", "triton")
GPU_LEVELS = ("triton", "cuda")


# ---------------------------------------------------------------------------------------
# From drawn parameters to a component's arguments
# ---------------------------------------------------------------------------------------

def _randn(shape, g, scale=1.0, shift=0.0):
    return torch.randn(shape, generator=g, dtype=torch.float32) * scale + shift


def _attention(p, g):
    s = p["shape"]
    B, H, Nq, Nk, D = s["B"], s["H"], s["Nq"], s["Nk"], s["D"]
    q, k, v = _randn((B, H, Nq, D), g), _randn((B, H, Nk, D), g), _randn((B, H, Nk, D), g)
    if p["magnitude"] == "large":
        # Every score row offset by ~1e4 (its own sign), spread O(1): q's last coordinate
        # large, every key's exactly 1. Softmax is invariant to the offset; exp of it is not.
        # |q| <= 6e4 < 65504, so float16 holds it: scores of 0.5e4 to 1.5e4 at D = 16.
        sign = torch.randint(0, 2, (B, H, Nq), generator=g) * 2 - 1
        q[..., -1] = sign * (torch.rand((B, H, Nq), generator=g) + 0.5) * 4e4
        k[..., -1] = 1.0
    args = dict(q=q, k=k, v=v, causal=p["options"]["causal"], scale=p["options"]["scale"])
    rope = p["options"].get("rope")
    if rope:  # tables of random angles, a few positions longer than the call needs
        theta = torch.rand((max(Nq, Nk) + 2, D // 2), generator=g) * 6.3 - 3.15
        args["rope"] = (torch.cos(theta), torch.sin(theta), rope == "interleaved")
    return args


def _layer_norm(p, g):
    s = p["shape"]
    N = s["N"]
    x = _randn((*s["rows"], N), g, scale=2.0, shift=0.5)
    if p["magnitude"] == "large":  # ~1e4, spread of the same size (see the module doc)
        x = _randn((*s["rows"], N), g, scale=1e4) + _randn((*s["rows"], 1), g, scale=1e4)
    elif p["magnitude"] == "near_overflow":  # fp16 max is 65504: x * x overflows in fp16
        x = (torch.rand((*s["rows"], N), generator=g) * 2 - 1) * 65000
    elif p["magnitude"] == "constant_rows":  # var = 0 on every other row: xhat must be 0
        # Quarters in [-8, 8]: every sum of up to 2**16 of them is exact in fp32, so the mean
        # is exact in any order. (A constant that rounds when summed is ill-conditioned by
        # nature: a mean off by u*|c| moves xhat by u*|c|/sqrt(eps), 8e-5 for PyTorch itself.)
        const = torch.randint(-32, 33, (x.view(-1, N)[::2].shape[0], 1), generator=g) / 4
        x.view(-1, N)[::2] = const
    return dict(x=x, weight=_randn((N,), g, 0.5, 1.0), bias=_randn((N,), g, 0.5),
                eps=p["options"]["eps"])


def _rms_norm(p, g):
    s = p["shape"]
    N = s["N"]
    x = _randn((*s["rows"], N), g, scale=2.0, shift=0.5)
    if p["magnitude"] == "large":  # ~1e4: no cancellation in RMSNorm, any offset is fine
        x = _randn((*s["rows"], N), g, scale=1e4, shift=1e4)
    elif p["magnitude"] == "near_overflow":  # fp16 max is 65504: x * x overflows in fp16
        x = (torch.rand((*s["rows"], N), generator=g) * 2 - 1) * 65000
    elif p["magnitude"] == "zero_rows":  # every other row 0: y = 0, rstd = 1/sqrt(eps)
        x.view(-1, N)[::2] = 0.0
    return dict(x=x, weight=_randn((N,), g, 0.5, 1.0), eps=p["options"]["eps"])


def _mlp(p, g):
    s = p["shape"]
    K, Hd, N = s["K"], s["hidden"], s["N"]
    return dict(x=_randn((*s["rows"], K), g), w1=_randn((Hd, K), g, K ** -0.5),
                b1=_randn((Hd,), g, 0.5), w2=_randn((N, Hd), g, Hd ** -0.5), b2=_randn((N,), g, 0.5))


def _swiglu_mlp(p, g):
    s = p["shape"]
    K, Hd, N = s["K"], s["hidden"], s["N"]
    return dict(x=_randn((*s["rows"], K), g), w_gate=_randn((Hd, K), g, K ** -0.5),
                w_up=_randn((Hd, K), g, K ** -0.5), w_down=_randn((N, Hd), g, Hd ** -0.5))


def _lstm(p, g):
    s = p["shape"]
    B, T, I, H = s["B"], s["T"], s["I"], s["H"]
    bound = H ** -0.5

    def uniform(shape):
        return (torch.rand(shape, generator=g) * 2 - 1) * bound
    return dict(x=_randn((B, T, I), g), h0=_randn((1, B, H), g, 0.5), c0=_randn((1, B, H), g, 0.5),
                w_ih=uniform((4 * H, I)), w_hh=uniform((4 * H, H)), b_ih=uniform((4 * H,)),
                b_hh=uniform((4 * H,)))


def _conv_bn(p, g):
    s = p["shape"]
    N, Ci, H, W, Co, k = (s[n] for n in ("N", "C_in", "H", "W", "C_out", "k"))
    return dict(x=_randn((N, Ci, H, W), g), conv_weight=_randn((Co, Ci, k, k), g, (Ci * k * k) ** -0.5),
                conv_bias=_randn((Co,), g, 0.5),
                bn_weight=torch.rand((Co,), generator=g) + 0.5, bn_bias=_randn((Co,), g, 0.5),
                running_mean=_randn((Co,), g, 0.5), running_var=torch.rand((Co,), generator=g) * 1.5 + 0.5,
                stride=s["stride"], padding=s["padding"], eps=1e-5, momentum=p["options"]["momentum"],
                training=p["options"]["training"])


def _rope(p, g):
    s = p["shape"]
    B, H, N, D = s["B"], s["H"], s["N"], s["D"]
    theta = (torch.rand((N, D // 2), generator=g) * 2 - 1) * math.pi
    x = _randn((B, H, N, D), g, scale=1e4 if p["magnitude"] == "large" else 1.0)
    return dict(x=x, cos=theta.cos(), sin=theta.sin(), interleaved=p["options"]["interleaved"])


BUILDERS = {"attention": _attention, "layer_norm": _layer_norm, "mlp": _mlp, "lstm": _lstm,
            "conv_bn": _conv_bn, "rms_norm": _rms_norm, "rope": _rope, "swiglu_mlp": _swiglu_mlp}

# Layouts beyond `contiguous` and the spec's own `strided` (STRIDED / attention's packed
# qkv): argument -> cards.LAYOUT_KINDS kind.
LAYOUTS = {
    "attention": {"sliced": dict(q="row_padded", k="row_padded", v="row_padded"),
                  "every_other": dict(q="last_every_other", k="last_every_other",
                                      v="last_every_other")},
    "layer_norm": {"sliced": dict(x="row_padded"),
                   "every_other": dict(x="last_every_other", weight="every_other",
                                       bias="every_other")},
    "mlp": {"sliced": dict(x="row_padded", b1="every_other"),
            "transposed": dict(w1="transposed", w2="transposed")},
    "lstm": {"sliced": dict(x="row_padded", h0="last_every_other")},
    "rms_norm": {"sliced": dict(x="row_padded"),
                 "every_other": dict(x="last_every_other", weight="every_other")},
    "swiglu_mlp": {"sliced": dict(x="row_padded", w_down="row_padded"),
                   "mixed": dict(w_gate="transposed")},  # gate and up weights laid out apart
    "conv_bn": {"channels_last": dict(x="channels_last", conv_weight="channels_last"),
                "sliced": dict(x="last_every_other", bn_bias="every_other")},
    "rope": {"sliced": dict(x="row_padded", cos="row_padded"),
             "every_other": dict(x="last_every_other", cos="last_every_other",
                                 sin="last_every_other")},
}


def _args(component: str, p: dict, device="cpu") -> dict:
    g = torch.Generator(device="cpu").manual_seed(p["seed"])
    dtype = DTYPES[p["dtype"]]
    def cast(v):  # a tensor, or attention's rope=(cos, sin, interleaved)
        if isinstance(v, tuple):
            return tuple(cast(t) for t in v)
        return v.to(device=device, dtype=dtype) if isinstance(v, torch.Tensor) else v
    args = {name: cast(v) for name, v in BUILDERS[component](p, g).items()}
    layout = p["layout"]
    if layout == "strided":
        spec = cards.get(component)
        variant = spec.case_from_args(args).variant
        return spec.strided(args, spec.module.MUTATED.get(variant, ()))
    if layout != "contiguous":
        for name, kind in LAYOUTS[component][layout].items():
            args[name] = cards.as_view(args[name], kind)
    return args


# Cases tried and passed per (device, level, component), for the committed count of a run:
# LEVELS_FUZZ_REPORT=reports/fuzz-gpu.json python -m pytest -m gpu tests/test_fuzz.py
COUNTS: dict = {}


# The weights that meet x in an F.linear at Levels 1 and 2 (torch's own matmul).
_LINEAR_WEIGHTS = {"mlp": ("w1",), "swiglu_mlp": ("w_gate", "w_up")}


def _torch_linear_wrong_here(component: str, args: dict) -> bool:
    """Whether torch's own bfloat16 F.linear returns non-finite values on these finite
    arguments on this CPU while float32 does not. Seen on a CPU with AMX (oneDNN's AMX bf16
    path, torch 2.13.0): x a strided view starting 2 bytes past an aligned address (storage
    offset 1, stride (6, 1)), w1 transposed; with ONEDNN_MAX_CPU_ISA=AVX2 the same call is
    right. That is an upstream bug, and Levels 1 and 2 are torch's own ops: they fail there
    for a reason that is not theirs, which the check below names instead of asserting."""
    x = args.get("x")
    if (component not in _LINEAR_WEIGHTS or x is None or x.device.type != "cpu"
            or x.dtype != torch.bfloat16):
        return False
    for name in _LINEAR_WEIGHTS[component]:
        w = args[name]
        if (not torch.nn.functional.linear(x, w).isfinite().all()
                and torch.nn.functional.linear(x.float(), w.float()).isfinite().all()):
            return True
    return False


def _check(component: str, level: str, p: dict, device="cpu"):
    reason = levels.status(level, device, component)
    if reason:
        pytest.skip(f"{level}: {reason}")
    key = f"{torch.device(device).type} {level} {component}"
    tally = COUNTS.setdefault(key, {"tried": 0, "passed": 0, "failed_params": []})
    tally["tried"] += 1
    args = _args(component, p, device)
    try:
        result = check_args(component, level, args, seed=p["seed"])
    except BaseException:
        tally["failed_params"].append(repr(p) + " (raised)")
        _write_counts()
        raise
    if result.status == "pass":
        tally["passed"] += 1
    elif level in ("native", "torchscript") and _torch_linear_wrong_here(component, args):
        # Counted and reported, not passed: torch's F.linear itself is wrong on this input
        tally.setdefault("torch_linear_wrong", []).append(repr(p))
        _write_counts()
        warnings.warn(f"{component} at {level}: torch's bfloat16 F.linear returned NaN/Inf on "
                      f"this CPU for {p} (an upstream oneDNN bug on AMX CPUs; "
                      "ONEDNN_MAX_CPU_ISA=AVX2 avoids it): not counted as a pass",
                      RuntimeWarning, stacklevel=2)
        return
    else:
        tally["failed_params"].append(repr(p))
    _write_counts()
    assert result.status == "pass", f"{result.summary()}\n  params: {p}"


_PREVIOUS: dict | None = None  # the report file as this process found it


def _write_counts():
    """Rewrite the report after every case, so a run cut off by a time limit still leaves
    its counts. A report already in the file from an earlier run (another -k selection, an
    example count of its own) is kept and extended: each run's command is listed, and each
    (device, level, component) carries the example count it was run with."""
    global _PREVIOUS
    path = os.environ.get("LEVELS_FUZZ_REPORT")
    if not path or not COUNTS:
        return
    import datetime
    import json
    import platform

    if _PREVIOUS is None:
        try:
            _PREVIOUS = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            _PREVIOUS = {}
    command = (f"LEVELS_FUZZ_REPORT={path} LEVELS_FUZZ_EXAMPLES={EXAMPLES} "
               f"python -m pytest {shlex.join(sys.argv[1:])}")
    counts = dict(_PREVIOUS.get("counts", {}))
    counts.update({key: tally | {"examples_per_test": EXAMPLES} for key, tally in COUNTS.items()})
    commands = [c for c in _PREVIOUS.get("commands", []) if c != command] + [command]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    Path(path).write_text(json.dumps({
        "what": "tests/test_fuzz.py: hypothesis cases tried and passed per device, level and "
                "component (a failing case stops its test: hypothesis shrinks it first, and "
                "the shrunk attempts count as tried)",
        "commands": commands, "gpu": gpu, "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "counts": dict(sorted(counts.items()))}, indent=1) + "\n")


# ---------------------------------------------------------------------------------------
# Strategies: one per component, each drawing a plain dict (readable in a failure report
# and in HARD_CASES). `small`: interpreter-sized (Triton on the CPU, torch.compile).
# ---------------------------------------------------------------------------------------

ODD = st.sampled_from([1, 2, 3, 5, 7, 16, 17, 31, 33])
SEEDS = st.integers(0, 2 ** 31 - 1)


def _layout(component, draw, allowed=None):
    names = ["contiguous", "strided", *LAYOUTS[component]]
    return draw(st.sampled_from([n for n in names if allowed is None or n in allowed]))


@st.composite
def attention_params(draw, small=False, dtypes=("float32", "bfloat16"), head_dims=None):
    dtype = draw(st.sampled_from(dtypes))
    causal = draw(st.booleans())
    Nq = draw(ODD if small else st.integers(1, 80))
    # Nk = 1 is fine: grad q and grad k are then exactly 0 (softmax over one key is
    # constant), and the spec measures them against their natural scale (cards/attention.py).
    Nk = Nq if causal else draw(st.sampled_from([Nq, 17, 40]))
    D = draw(st.sampled_from(head_dims or ((16, 32) if small else (1, 8, 16, 17, 32, 64))))
    # Two keys at a small D: grad k_1 = -grad k_2 row by row (softmax's gradient sums to 0
    # over the keys), every element a cancellation; PyTorch's own fp32 misses by 3.8x at D=1.
    assume(Nk >= 3 or D >= 8)
    layouts = None if Nq == Nk else ["contiguous", "sliced", "every_other"]  # packed needs Nq == Nk
    return dict(shape=dict(B=draw(st.integers(1, 2)), H=draw(st.integers(1, 3)), Nq=Nq, Nk=Nk, D=D),
                dtype=dtype, layout=_layout("attention", draw, layouts),
                options=dict(causal=causal, scale=draw(st.sampled_from([None, 0.05, 1.0])),
                             # rope= fused (pairs need an even head size)
                             rope=draw(st.sampled_from([None, "half", "interleaved"]))
                             if D % 2 == 0 else None),
                # ~1e4 scores only where the bound can hold (module doc)
                magnitude="normal",  # ~1e4 scores: test_attention_scores_1e4 (known failures)
                seed=draw(SEEDS))


def _norm_params(draw, component, small, dtypes, eps, magnitudes):
    """A normalization over the last dimension: x (*rows, N), its eps and magnitudes."""
    rows = draw(st.lists(st.integers(1, 4 if small else 9), min_size=1, max_size=2))
    return dict(shape=dict(rows=tuple(rows),
                           N=draw(st.sampled_from([1, 2, 17, 64, 129, 1023]) if small else
                                  st.integers(1, 1100))),
                dtype=draw(st.sampled_from(dtypes)), layout=_layout(component, draw),
                options=dict(eps=draw(st.sampled_from(eps))),
                magnitude=draw(st.sampled_from(magnitudes)), seed=draw(SEEDS))


@st.composite
def layer_norm_params(draw, small=False, dtypes=("float32", "bfloat16")):
    return _norm_params(draw, "layer_norm", small, dtypes, [1e-5, 1e-3, 0.1],
                        ["normal", "large", "constant_rows"])


@st.composite
def rms_norm_params(draw, small=False, dtypes=("float32", "bfloat16")):
    return _norm_params(draw, "rms_norm", small, dtypes, [1e-6, 1e-5, 0.1],
                        ["normal", "large", "zero_rows"])


@st.composite
def mlp_params(draw, small=False, dtypes=("float32", "bfloat16")):
    dim = ODD if small else st.integers(1, 130)
    rows = draw(st.lists(st.integers(1, 5 if small else 40), min_size=1, max_size=2))
    hidden = draw(dim)
    # One row through one hidden unit: grad x is a single product through GELU', which
    # has a root at h = -0.75 where Phi(h) + h phi(h) cancels; one value near it is
    # ill-conditioned by nature (PyTorch's own fp32 misses by 1.3x); with more, the
    # tensor's norm is carried by the well-conditioned ones.
    assume(math.prod(rows) * hidden >= 2)
    return dict(shape=dict(rows=tuple(rows), K=draw(dim), hidden=hidden, N=draw(dim)),
                dtype=draw(st.sampled_from(dtypes)), layout=_layout("mlp", draw), options={},
                magnitude="normal", seed=draw(SEEDS))


@st.composite
def swiglu_mlp_params(draw, small=False, dtypes=("float32", "bfloat16")):
    dim = ODD if small else st.integers(1, 130)
    rows = draw(st.lists(st.integers(1, 5 if small else 40), min_size=1, max_size=2))
    hidden = draw(dim)
    # As the MLP's: SiLU' has a root (g = -1.28) where one row through one hidden unit makes
    # grad x a single ill-conditioned product; with more the norm is carried by the others.
    assume(math.prod(rows) * hidden >= 2)
    return dict(shape=dict(rows=tuple(rows), K=draw(dim), hidden=hidden, N=draw(dim)),
                dtype=draw(st.sampled_from(dtypes)), layout=_layout("swiglu_mlp", draw),
                options={}, magnitude="normal", seed=draw(SEEDS))


@st.composite
def lstm_params(draw, small=False, dtypes=("float32", "bfloat16")):
    dim = st.sampled_from([1, 2, 5, 8, 17]) if small else st.integers(1, 40)
    return dict(shape=dict(B=draw(st.integers(1, 4)), T=draw(st.integers(1, 4 if small else 12)),
                           I=draw(dim), H=draw(dim)),
                dtype=draw(st.sampled_from(dtypes)), layout=_layout("lstm", draw), options={},
                magnitude="normal", seed=draw(SEEDS))


def _conv_outputs(s):
    return tuple((n + 2 * s["padding"] - s["k"]) // s["stride"] + 1 for n in (s["H"], s["W"]))


@st.composite
def conv_bn_params(draw, small=False, dtypes=("float32", "bfloat16")):
    k = draw(st.sampled_from([1, 2, 3, 5]))
    shape = dict(N=draw(st.integers(1, 3)), C_in=draw(st.integers(1, 6 if small else 20)),
                 H=draw(st.integers(1, 9 if small else 20)), W=draw(st.integers(1, 9 if small else 20)),
                 C_out=draw(st.integers(1, 6 if small else 20)), k=k,
                 stride=draw(st.integers(1, 3)), padding=draw(st.integers(0, k + 1)))
    ho, wo = _conv_outputs(shape)
    training = draw(st.booleans())
    # a kernel larger than the padded image is refused by the contract; training needs
    # >= 3 values per channel (module doc: with 2 it is ill-conditioned by nature)
    assume(ho >= 1 and wo >= 1 and (not training or shape["N"] * ho * wo >= 3))
    return dict(shape=shape, dtype=draw(st.sampled_from(dtypes)), layout=_layout("conv_bn", draw),
                options=dict(training=training, momentum=draw(st.sampled_from([0.1, 0.0, 1.0]))),
                magnitude="normal", seed=draw(SEEDS))


@st.composite
def rope_params(draw, small=False, dtypes=("float32", "bfloat16")):
    D = draw(st.sampled_from([2, 6, 16, 34] if small else [2, 8, 34, 64, 96, 128]))
    return dict(shape=dict(B=draw(st.integers(1, 2)), H=draw(st.integers(1, 3)),
                           N=draw(ODD if small else st.integers(1, 80)), D=D),
                dtype=draw(st.sampled_from(dtypes)), layout=_layout("rope", draw),
                options=dict(interleaved=draw(st.booleans())),
                magnitude=draw(st.sampled_from(["normal", "large"])), seed=draw(SEEDS))


STRATEGIES = {"attention": attention_params, "layer_norm": layer_norm_params, "mlp": mlp_params,
              "lstm": lstm_params, "conv_bn": conv_bn_params, "rms_norm": rms_norm_params,
              "rope": rope_params, "swiglu_mlp": swiglu_mlp_params}


def _p(shape, dtype="float32", layout="contiguous", options=None, magnitude="normal", seed=15):
    return dict(shape=shape, dtype=dtype, layout=layout, options=options or {},
                magnitude=magnitude, seed=seed)


# The named hard cases: (name, params, runs in the interpreter). Each runs at every level
# (the large ones not in Triton's interpreter, where they would take minutes; the nightly
# run and the GPU run them there).
HARD_CASES = {
    "attention": [
        ("causal N=1 D=16", _p(dict(B=1, H=1, Nq=1, Nk=1, D=16), options=dict(causal=True, scale=None)), True),
        ("batch 1, N=17, strided", _p(dict(B=1, H=2, Nq=17, Nk=17, D=16), layout="strided",
                                      options=dict(causal=True, scale=None)), True),
        ("N=1023 causal", _p(dict(B=1, H=1, Nq=1023, Nk=1023, D=16), options=dict(causal=True, scale=None)), False),
    ],
    "layer_norm": [
        ("width 1", _p(dict(rows=(3,), N=1), options=dict(eps=1e-5)), True),
        ("width 17, batch 1", _p(dict(rows=(1,), N=17), layout="strided", options=dict(eps=1e-5)), True),
        ("width 1023", _p(dict(rows=(2,), N=1023), options=dict(eps=1e-5)), True),
        ("rows ~1e4", _p(dict(rows=(2, 3), N=129), options=dict(eps=1e-5), magnitude="large"), True),
        ("rows ~1e4, bf16", _p(dict(rows=(4,), N=17), "bfloat16", options=dict(eps=1e-5),
                               magnitude="large"), True),
        ("constant rows", _p(dict(rows=(4,), N=33), options=dict(eps=1e-5), magnitude="constant_rows"), True),
        ("fp16 near overflow", _p(dict(rows=(3,), N=129), "float16", options=dict(eps=1e-5),
                                  magnitude="near_overflow"), True),
        ("fp16 near overflow, strided", _p(dict(rows=(2,), N=17), "float16", layout="strided",
                                           options=dict(eps=1e-5), magnitude="near_overflow"), True),
    ],
    "rms_norm": [
        ("width 1", _p(dict(rows=(3,), N=1), options=dict(eps=1e-6)), True),
        ("width 17, batch 1", _p(dict(rows=(1,), N=17), layout="strided", options=dict(eps=1e-6)), True),
        ("width 1023", _p(dict(rows=(2,), N=1023), options=dict(eps=1e-6)), True),
        ("rows ~1e4, bf16", _p(dict(rows=(4,), N=17), "bfloat16", options=dict(eps=1e-6),
                               magnitude="large"), True),
        ("zero rows", _p(dict(rows=(4,), N=33), options=dict(eps=1e-6), magnitude="zero_rows"), True),
        ("fp16 near overflow", _p(dict(rows=(3,), N=129), "float16", options=dict(eps=1e-6),
                                  magnitude="near_overflow"), True),
    ],
    "mlp": [
        ("all widths 1, 8 rows", _p(dict(rows=(8,), K=1, hidden=1, N=1)), True),
        ("widths 17, batch 1", _p(dict(rows=(1,), K=17, hidden=17, N=17), layout="strided"), True),
        ("hidden 1023", _p(dict(rows=(3,), K=17, hidden=1023, N=5)), True),
    ],
    "swiglu_mlp": [
        ("all widths 1, 8 rows", _p(dict(rows=(8,), K=1, hidden=1, N=1)), True),
        ("widths 17, batch 1", _p(dict(rows=(1,), K=17, hidden=17, N=17), layout="strided"), True),
        ("hidden 1023", _p(dict(rows=(3,), K=17, hidden=1023, N=5)), True),
    ],
    "lstm": [
        ("batch 1, T=1, widths 1", _p(dict(B=1, T=1, I=1, H=1)), True),
        ("batch 1, H=17, strided", _p(dict(B=1, T=3, I=17, H=17), layout="strided"), True),
    ],
    "conv_bn": [
        ("stride 2, padding 2 > 3//2, train", _p(dict(N=2, C_in=3, H=7, W=6, C_out=5, k=3, stride=2,
                                                      padding=2), options=dict(training=True, momentum=0.1)), True),
        ("stride 2, padding 3, channels_last eval",
         _p(dict(N=1, C_in=4, H=5, W=9, C_out=3, k=3, stride=2, padding=3), layout="channels_last",
            options=dict(training=False, momentum=0.1)), True),
        ("batch 1, 1x1, strided train", _p(dict(N=1, C_in=17, H=3, W=1, C_out=17, k=1, stride=1, padding=0),
                                           layout="strided", options=dict(training=True, momentum=0.1)), True),
    ],
    "rope": [
        ("one pair, one position", _p(dict(B=1, H=1, N=1, D=2), options=dict(interleaved=False)), True),
        ("17 pairs, interleaved, strided", _p(dict(B=2, H=3, N=17, D=34), layout="strided",
                                              options=dict(interleaved=True)), True),
        ("x ~1e4, bf16, every other", _p(dict(B=1, H=2, N=5, D=16), "bfloat16", layout="every_other",
                                         options=dict(interleaved=False), magnitude="large"), True),
    ],
}


def _run(component: str, level: str, strategy, max_examples: int, interpreter: bool, device="cpu"):
    """Hypothesis over `strategy`, the component's hard cases first."""
    @settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.differing_executors])
    @given(params=strategy)
    def fuzz(params):
        _check(component, level, params, device)

    for _, params, cheap in reversed(HARD_CASES[component]):
        if cheap or not interpreter:
            fuzz = example(params=params)(fuzz)
    fuzz()


COMPONENT_NAMES = tuple(STRATEGIES)


@pytest.mark.parametrize("component", COMPONENT_NAMES)
@pytest.mark.parametrize("level", ("native", "torchscript"))
def test_fuzz_eager_levels(level, component):
    _run(component, level, STRATEGIES[component](), EXAMPLES, interpreter=False)


@pytest.mark.parametrize("component", COMPONENT_NAMES)
def test_fuzz_compile(component):
    _run(component, "compile", STRATEGIES[component](small=True), COMPILE_EXAMPLES, interpreter=True)


@pytest.mark.parametrize("component", COMPONENT_NAMES)
def test_fuzz_triton_interpreter(component):
    strategy = STRATEGIES[component](small=True)
    if component == "attention":
        strategy = attention_params(small=True, head_dims=TRITON_HEAD_DIMS)
    _run(component, "triton", strategy, EXAMPLES, interpreter=True)


# ---------------------------------------------------------------------------------------
# The GPU part: the same strategies on CUDA tensors at Levels 4 and 5, float16 too
# ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("component", COMPONENT_NAMES)
@pytest.mark.parametrize("level", GPU_LEVELS)
def test_fuzz_gpu(level, component):
    dtypes = ("float32", "bfloat16", "float16")
    strategy = STRATEGIES[component](dtypes=dtypes)
    if component == "attention":
        strategy = attention_params(dtypes=dtypes, head_dims=(16, 32, 64, 128))
    _run(component, level, strategy, EXAMPLES, interpreter=False, device="cuda")


# ---------------------------------------------------------------------------------------
# Softmax stability: score rows offset by ~1e4 (16-bit inputs; in fp32 it is excluded,
# module doc). Kept out of the hypothesis runs because Levels 1 and 2 fail it (below).
# ---------------------------------------------------------------------------------------

SCORES_1E4 = {dtype: _p(dict(B=1, H=2, Nq=17, Nk=17, D=16), dtype, magnitude="large",
                        options=dict(causal=causal, scale=None))
              for dtype, causal in (("bfloat16", False), ("float16", True))}
EAGER_16BIT_SCORES = (
    "Levels 1-2 compute q k^T with torch.matmul in the input dtype, so scores of ~1e4 are "
    "stored in bf16/fp16 (spacing 64/8 there) before softmax: up to |s|*u of error in a "
    "logit, O(1) in the probabilities (rel 0.3-0.5 measured). Flash-style levels keep the "
    "scores in fp32 and pass")


COMPILE_CAUSAL_16BIT_SCORES = (
    "Level 3, causal (masked_fill: no SDPA rewrite, module doc of levels/compiled.py): the "
    "q k^T GEMM stays a library call whose fp16 output rounds scores of ~1e4 to a spacing "
    "of 8 before Inductor's softmax: rel 0.5-0.65 measured. The full variant, rewritten to "
    "a fused SDPA kernel, passes")


def _known(level, dtype, reason):
    return pytest.param(level, dtype, marks=pytest.mark.xfail(strict=True, reason=reason))


@pytest.mark.parametrize("level, dtype", [
    _known("native", "bfloat16", EAGER_16BIT_SCORES), _known("native", "float16", EAGER_16BIT_SCORES),
    _known("torchscript", "bfloat16", EAGER_16BIT_SCORES),
    _known("torchscript", "float16", EAGER_16BIT_SCORES),
    ("compile", "bfloat16"), _known("compile", "float16", COMPILE_CAUSAL_16BIT_SCORES),
    ("triton", "bfloat16"), ("triton", "float16")])
def test_attention_scores_1e4(level, dtype):
    _check("attention", level, SCORES_1E4[dtype])


@pytest.mark.parametrize("level", ["native", "triton"])
def test_attention_one_key(level):
    # Found by this fuzzer: with one key the exact grad q and grad k are 0 and Level 4's
    # rounding-sized residue read as a relative error of 1e301, a gap in the checker (the
    # spec now measures such gradients against their natural scale), not in the kernel.
    _check("attention", level, _p(dict(B=1, H=1, Nq=1, Nk=1, D=16), seed=0,
                                  options=dict(causal=True, scale=None)))
