"""Level 3 — torch.compile: the Level 1 code, captured by Dynamo and compiled by Inductor.

What it adds over TorchScript: no restricted language. Dynamo reads the bytecode of plain
Python, records every tensor op into one FX graph (fullgraph=True: any construct it
cannot capture is an error here, not a silent "graph break" back to eager), AOTAutograd
derives the backward graph ahead of time, and Inductor lowers both graphs to generated
code: Triton kernels on a GPU, C++/OpenMP loops with SIMD on a CPU. It fuses far more than
pointwise chains — reductions with their producers and consumers (LayerNorm's statistics
and normalization become one kernel), epilogues after GEMMs, the whole LSTM cell — and it
fuses the backward too. Matmuls and convolutions stay library calls (cuBLAS/cuDNN, oneDNN)
unless max-autotune finds a generated template that beats them.

It also rewrites: Inductor's pattern matcher recognizes textbook attention
(matmul -> scale -> softmax -> matmul) and replaces it with one fused
scaled_dot_product_attention call (a flash-attention kernel, on the CPU too), so for
`attention` without a mask no kernel of Inductor's own is generated at all. The causal
variant here masks with masked_fill, a shape the patterns did not match on the builds we
tried (torch 2.13), and gets Inductor's own fused softmax kernel between two GEMMs;
`explain` shows what your build does. `configure(sdpa_rewrite=False)` (or
`levels explain --component attention --level compile`) shows what Inductor writes for the
full variant when the rewrite is off.

What it costs: compilation. The first call with a new shape, dtype, variant, grad mode or
deterministic setting traces and compiles (seconds; tens of seconds with max-autotune);
later calls check guards and launch the cached code. The LSTM compiles its time loop in
chunks of a few steps, not whole (see below: compile time would grow with the sequence).
The harness times the first call separately and `levels compare` reports the break-even call
count. Note that the equivalence check runs under torch.use_deterministic_algorithms,
which Dynamo guards on: the check and the timing compile separate graphs.

Settings (documented choices, changeable with `configure()` or environment variables):
  mode     LEVELS_COMPILE_MODE. Default: "default" everywhere, what `torch.compile(model)`
           gives a newcomer. "max-autotune-no-cudagraphs" benchmarks GEMM/conv templates
           against cuBLAS/cuDNN for every shape: faster kernels at times, much slower
           first calls (the LSTM at the bench shape on the H100: 58.7 s cold against
           9.6 s in "default"). CUDA graphs stay off: the harness passes fresh tensors
           every call, and conv_bn's training mode updates its running statistics in
           place, both of which CUDA-graph replay would turn into copies or errors.
  dynamic  LEVELS_COMPILE_DYNAMIC=1. Default False: every new shape compiles a graph
           specialized to it (the fastest code, one compile per shape). True compiles
           symbolic-shape kernels that serve all sizes, at some speed cost.
"""

from __future__ import annotations

import os
import threading

import torch

from . import native
from .contract import (COMPONENTS, autocasts, validate_attention, validate_conv_bn, validate_layer_norm,
                       validate_lstm, validate_mlp, validate_newton_schulz, validate_rms_norm,
                       validate_rope, validate_swiglu_mlp)

DEFAULT_MODES = {"cpu": "default", "cuda": "default"}
KNOWN_MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs")

# Each distinct (shape, dtype, variant, grad mode, deterministic mode) is one more compiled
# graph of the same function. Dynamo's default limit of 8 per function turns the 9th into a
# hard error under fullgraph=True; a full check + benchmark run needs a few dozen.
RECOMPILE_LIMIT = 64


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name} must be 0 or 1; got {value!r}")


def _check_mode(mode: str, what: str) -> str:
    if mode == "reduce-overhead":
        raise ValueError(f"{what} must not be 'reduce-overhead' here: CUDA graphs replay fixed "
                         "buffers, but every call gets fresh tensors and conv_bn(training=True) "
                         "updates its inputs in place")
    if mode != "auto" and mode not in KNOWN_MODES:
        raise ValueError(f"{what} must be 'auto' or one of {', '.join(KNOWN_MODES)}; got {mode!r}")
    return mode


_ENV_MODE = os.environ.get("LEVELS_COMPILE_MODE") or "auto"
_check_mode(_ENV_MODE, "environment variable LEVELS_COMPILE_MODE")

_lock = threading.Lock()
_settings = {"mode": None if _ENV_MODE == "auto" else _ENV_MODE,
             "dynamic": bool(_env_flag("LEVELS_COMPILE_DYNAMIC")),
             "sdpa_rewrite": True}
_compiled: dict = {}


def configure(mode: str | None = None, dynamic: bool | None = None,
              sdpa_rewrite: bool | None = None) -> dict:
    """Change how Level 3 compiles; arguments left as None keep their current value.

    mode: a torch.compile mode ("default", "max-autotune-no-cudagraphs", ...) or "auto"
      for the per-device default. dynamic: compile for symbolic shapes. sdpa_rewrite:
      False turns Inductor's pattern matcher off (it is what rewrites attention into
      scaled_dot_product_attention; it also does a few other rewrites). Returns the
      settings now in force. Functions compiled earlier are dropped, not mixed."""
    if mode is not None:
        _check_mode(mode, "argument 'mode'")
    for name, value in (("dynamic", dynamic), ("sdpa_rewrite", sdpa_rewrite)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"argument '{name}' must be a bool or None; got {value!r}")
    with _lock:
        if mode is not None:
            _settings["mode"] = None if mode == "auto" else mode
        if dynamic is not None:
            _settings["dynamic"] = dynamic
        if sdpa_rewrite is not None:
            _settings["sdpa_rewrite"] = sdpa_rewrite
        _compiled.clear()
        return dict(_settings)


def settings(device: str | torch.device = "cpu") -> dict:
    """The settings a call on `device` compiles with: mode, dynamic, sdpa_rewrite."""
    device = torch.device(device)
    mode = _settings["mode"] or DEFAULT_MODES.get(device.type, "default")
    return {"mode": mode, "dynamic": _settings["dynamic"],
            "sdpa_rewrite": _settings["sdpa_rewrite"]}


def compile_kwargs(device: str | torch.device = "cpu", inductor: dict | None = None,
                   **overrides) -> dict:
    """The keyword arguments for torch.compile that this level uses on `device`; `inductor`:
    Inductor options of one call's own (see EMPTY_BATCH), on top of the settings."""
    s = settings(device) | overrides
    kwargs = {"fullgraph": True, "dynamic": s["dynamic"]}
    options = dict(inductor or {})
    if not s["sdpa_rewrite"]:
        options["pattern_matcher"] = False
    if not options:
        kwargs["mode"] = s["mode"]
    else:
        # torch.compile takes a mode *or* options; a mode is just a set of options.
        from torch._inductor import list_mode_options
        kwargs["options"] = {**list_mode_options(s["mode"], s["dynamic"]), **options}
    return kwargs


# ---------------------------------------------------------------------------------------
# The math is Level 1's, function for function, without the input validation: that runs
# eagerly before the call, so a bad input fails with the contract's error instead of
# inside a trace. What Inductor makes of each (see `levels explain ... --level compile`):
#   attention   unmasked: rewritten into one fused SDPA call; causal: two GEMMs around
#               one fused scale-mask-softmax kernel; rope=: one pointwise kernel rotates q
#               and k (each read once, written once) before the first GEMM
#   layer_norm  one "persistent reduction" kernel per row block: statistics and output
#   rms_norm    the same, with one statistic (the mean square) instead of two
#   mlp         the bias and the GELU in one pass over the first GEMM's output
#   swiglu_mlp  SiLU and the product in one pass over the two GEMMs' outputs (Inductor
#               may also fuse it into a GEMM's epilogue under max-autotune)
#   lstm        the time loop in graphs of LSTM_CHUNK steps: Dynamo unrolls a loop, so
#               each graph holds that many copies of the cell (a GEMM plus one fused
#               kernel for all the gate math), and Level 1's loop calls it T / LSTM_CHUNK
#               times. The chunk is the trade-off between the two ways to get it wrong:
#               the whole loop in one graph compiles for a time that grows with T (61 s
#               cold at T = 64 on an H100, forward and backward) and again for every new T;
#               one step per graph compiles in ~3 s but pays Dynamo's guards and the
#               autograd wrapper on the host at every step (~0.3 ms a step there: 4x the
#               unrolled loop's steady time). A last, shorter chunk is one more graph.
#   rope        one pointwise kernel: both halves read, rotated and written in one pass
#               (the slices and the cat/stack become index arithmetic)
#   newton_schulz  the loop unrolled (steps is a constant of the graph): three GEMMs a
#               step with b*A + c*A^2 and a*X + B X each one pointwise kernel, or folded
#               into the GEMMs as addmm's alpha/beta
#   conv_bn     the normalization fused into one pass after the convolution; BN is folded
#               into the weights only when they are constants (freezing), which a
#               training-capable call is not; in training mode AOTAutograd turns the
#               in-place running-stat updates into a functional graph plus copies back
# ---------------------------------------------------------------------------------------

# What torch.compile sees, per component (lstm: a chunk of the time loop; see above).
# Found by name, as every component's Level 1 math is `native.<component>_math`: a component
# added later needs no line here.
MATH = {c: getattr(native, f"{c}_math") for c in COMPONENTS}
MATH["lstm"] = native.lstm_steps
LSTM_CHUNK = 8  # time steps per compiled graph


def call(component: str, fn, args: tuple):
    """Run `fn` (MATH[component], compiled) on a contract call's prepared `args`: directly,
    or for the LSTM as Level 1's time loop, LSTM_CHUNK steps per call."""
    if component != "lstm":
        return fn(*args)

    def steps(x_proj, b_hh, h, c, w_hh):
        outs = []
        for t0 in range(0, x_proj.shape[1], LSTM_CHUNK):
            out, h, c = fn(x_proj[:, t0:t0 + LSTM_CHUNK], b_hh, h, c, w_hh)
            outs.append(out)
        return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), h, c

    return native.lstm_math(*args, steps=steps)


def compiled(component: str, device: str | torch.device = "cpu", inductor: dict | None = None):
    """The torch.compile'd math of `component` for `device` (built once per settings and
    `inductor` options: see compile_kwargs)."""
    if component not in MATH:
        raise ValueError(f"argument 'component' must be one of {', '.join(MATH)}; "
                         f"got {component!r}")
    kwargs = compile_kwargs(device, inductor)
    key = (component, repr(sorted(kwargs.items())))
    with _lock:
        if key not in _compiled:
            if torch._dynamo.config.recompile_limit < RECOMPILE_LIMIT:
                torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
            _compiled[key] = torch.compile(MATH[component], **kwargs)
        return _compiled[key]


def reset() -> None:
    """Forget every compiled graph (all of Dynamo's, not only ours): the next call
    compiles again, which is how a notebook shows the cost of the first call."""
    with _lock:
        _compiled.clear()
    torch._dynamo.reset()


def _dynamo_reason() -> str | None:
    """Why Dynamo cannot run under this Python, or None.

    Once Dynamo is imported (any compiled call imports it), Dynamo answers. Before that,
    `_dynamo_rule` does: importing torch._dynamo only to ask costs 1.4 s on a 2-core CPU,
    and `levels doctor` answers in a second."""
    import sys

    if "torch._dynamo" in sys.modules:
        from torch._dynamo import is_dynamo_supported
        return None if is_dynamo_supported() else "torch.compile (Dynamo) does not support this Python"
    return _dynamo_rule()


def _dynamo_rule() -> str | None:
    """The rule torch.compile applies on entry, without importing Dynamo. A test holds it to
    Dynamo's own answer for every Python the rule distinguishes, so a torch that changes
    its rule fails that test instead of drifting silently."""
    import importlib.util
    import sys
    import sysconfig

    if importlib.util.find_spec("torch._dynamo") is None:
        return "this torch has no torch._dynamo: torch.compile needs torch >= 2.0"
    if sys.version_info >= (3, 15):
        return "torch.compile does not support Python 3.15+ in this torch"
    if sysconfig.get_config_var("Py_GIL_DISABLED") == 1 and sys.version_info < (3, 13, 3):
        return "torch.compile does not support a free-threaded Python older than 3.13.3"
    return None


def _cpp_compiler_reason() -> str | None:
    """Why Inductor finds no C++ compiler for CPU code, or None. As with Dynamo: Inductor
    answers once it is imported, `_cpp_compiler_rule` before that."""
    import sys

    if "torch._inductor" in sys.modules:
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler
            get_cpp_compiler()
        except Exception as exc:  # noqa: BLE001
            return f"Inductor needs a C++ compiler for CPU code and found none ({exc})"
        return None
    return _cpp_compiler_rule()


def _cpp_compiler_rule() -> str | None:
    """Inductor's compiler search without importing Inductor: `$CXX`, else g++ (clang++ on
    macOS), and its `--version` must run. Held to Inductor's answer by a test."""
    import subprocess
    import sys

    cxx = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")
    try:
        subprocess.run([cxx, "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return (f"Inductor needs a C++ compiler for CPU code and found none (`{cxx} --version` "
                f"failed: {type(exc).__name__}); install g++ or set CXX")
    return None


def unavailable_reason(device: torch.device, component: str | None = None) -> str | None:
    device = torch.device(device)
    try:
        reason = _dynamo_reason()
    except Exception as exc:  # noqa: BLE001
        return f"torch.compile is not usable here: {type(exc).__name__}: {exc}"
    if reason:
        return reason
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device here (torch.cuda.is_available() is False)"
        from torch.utils._triton import has_triton
        if not has_triton():
            return ("Inductor generates GPU kernels in Triton, and Triton is not installed or "
                    "does not support this GPU")
    elif device.type == "cpu":
        return _cpp_compiler_reason()
    return None


uses_tf32 = native.uses_tf32  # the same library GEMMs/convolutions as Level 1


# ---------------------------------------------------------------------------------------
# The contract: validate eagerly, then call the compiled math. `prepare` is public so that
# `equivalence.explain` can compile the same math on the same arguments.
# ---------------------------------------------------------------------------------------

def _prepare_attention(q, k, v, causal=False, scale=None, causal_alignment="top_left",
                       kv_lens=None, rope=None):
    s = validate_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    return (q, k, v, causal, s["scale"], s["bottom_right"], kv_lens, s["rope_cos"], s["rope_sin"],
            s["rope_interleaved"], s["rope_offset"])


def _prepare_layer_norm(x, weight, bias, eps=1e-5):
    validate_layer_norm(x, weight, bias, eps)
    return (x, weight, bias, float(eps))


def _prepare_rms_norm(x, weight, eps=1e-6):
    validate_rms_norm(x, weight, eps)
    return (x, weight, float(eps))


def _prepare_mlp(x, w1, b1, w2, b2):
    validate_mlp(x, w1, b1, w2, b2)
    return (x, w1, b1, w2, b2)


def _prepare_swiglu_mlp(x, w_gate, w_up, w_down):
    validate_swiglu_mlp(x, w_gate, w_up, w_down)
    return (x, w_gate, w_up, w_down)


def _prepare_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return (x, h0, c0, w_ih, w_hh, b_ih, b_hh)


def _prepare_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                     stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    s = validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                         stride, padding, eps, momentum, training)
    return (x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            s["stride"], s["padding"], float(eps), float(momentum), training)


def _prepare_rope(x, cos, sin, interleaved=False):
    validate_rope(x, cos, sin, interleaved)
    return (x, cos, sin, interleaved)


def _prepare_newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    s = validate_newton_schulz(G, steps, coefficients, eps)
    return (G, s["steps"], s["a"], s["b"], s["c"], s["eps"])


# Found by name (`_prepare_<component>` above), as MATH is.
_PREPARE = {c: globals()[f"_prepare_{c}"] for c in COMPONENTS}


def prepare(component: str, *args, **kwargs) -> tuple:
    """Validate a contract call and return the positional arguments for `call(component, ...)`."""
    if component not in _PREPARE:
        raise ValueError(f"argument 'component' must be one of {', '.join(MATH)}; "
                         f"got {component!r}")
    return _PREPARE[component](*args, **kwargs)


@autocasts("attention")
def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    args = _prepare_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    return compiled("attention", q.device)(*args)


@autocasts("layer_norm")
def layer_norm(x, weight, bias, eps=1e-5):
    args = _prepare_layer_norm(x, weight, bias, eps)
    return compiled("layer_norm", x.device)(*args)


@autocasts("rms_norm")
def rms_norm(x, weight, eps=1e-6):
    args = _prepare_rms_norm(x, weight, eps)
    return compiled("rms_norm", x.device)(*args)


@autocasts("mlp")
def mlp(x, w1, b1, w2, b2):
    args = _prepare_mlp(x, w1, b1, w2, b2)
    return compiled("mlp", x.device)(*args)


@autocasts("swiglu_mlp")
def swiglu_mlp(x, w_gate, w_up, w_down):
    args = _prepare_swiglu_mlp(x, w_gate, w_up, w_down)
    return compiled("swiglu_mlp", x.device)(*args)


@autocasts("lstm")
def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    args = _prepare_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return call("lstm", compiled("lstm", x.device), args)


# A batch of 0 images is compiled without Inductor's layout optimization (which runs
# convolutions channels_last): with it, torch 2.13 on a CPU fails in the backward, the real
# convolution_backward of an empty batch returning conv_weight's gradient in another layout
# than its fake kernel promised ("expected size 3==3, stride 1==9 ... Error in op:
# torch.ops.aten.convolution_backward.default"). A graph of no image loses nothing by it.
EMPTY_BATCH = {"layout_optimization": False}


@autocasts("conv_bn")
def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    args = _prepare_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean,
                            running_var, stride, padding, eps, momentum, training)
    return compiled("conv_bn", x.device, EMPTY_BATCH if x.shape[0] == 0 else None)(*args)


@autocasts("rope")
def rope(x, cos, sin, interleaved=False):
    args = _prepare_rope(x, cos, sin, interleaved)
    return compiled("rope", x.device)(*args)


@autocasts("newton_schulz")
def newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    args = _prepare_newton_schulz(G, steps, coefficients, eps)
    if G.numel() == 0:  # an empty batch: nothing to launch (and no graph compiled for it)
        return torch.empty(G.shape, dtype=G.dtype, device=G.device)
    return compiled("newton_schulz", G.device)(*args)
