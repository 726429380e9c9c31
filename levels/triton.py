"""Level 4 — Triton: hand-written kernels, one file per component in `triton_kernels/`.

What it adds over torch.compile: we decide the tiling, what is fused and what stays in
registers/shared memory (a flash-attention kernel never writes the score matrix; an MLP
GEMM applies bias+GELU before its tile ever leaves the chip), and we write the backward
pass ourselves instead of relying on autograd of many small ops.

What it costs: correctness is ours (masks at every edge, fp32 accumulation, races in
reductions), so is the backward pass, and so is tuning block sizes per GPU. And a first call
at every new shape compiles kernels (seconds, cold; the launchers compile all of a call's
forward and backward kernels at once, in threads: triton_kernels/launch.py).

This module is thin on purpose: it validates with the shared contract, then calls the
launcher in `triton_kernels/<component>.py`, which picks the grid and runs the kernels
through an autograd.Function. On a GPU, the first call of each argument signature also
records its launches, and later calls replay them from C++ with a C++ autograd node
(triton_kernels/replay.py): Python decides once per signature, not once per call.

Without a GPU, Level 4 runs in Triton's CPU interpreter (TRITON_INTERPRET=1), switched on by
`levels` itself before any kernel is defined. It is slow (use the `tiny` sizes) and it does not emulate
bfloat16 arithmetic (the kernels upcast to fp32, as they must on a GPU anyway).
"""

from __future__ import annotations

import importlib
import os

import torch

from .contract import (Plans, _describe, _fail, autocasts, conv_bn_buffers, one_call,
                       require_32bit_offsets, require_device, signature, validate_attention,
                       validate_conv_bn, validate_layer_norm, validate_lstm, validate_mlp,
                       validate_newton_schulz, validate_rms_norm, validate_rope,
                       validate_swiglu_mlp)

from . import TRITON_IMPORTED_TOO_EARLY

# `levels/__init__.py` has switched the interpreter on where there is no GPU (it must
# happen before anything imports triton).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


_MODULES: dict = {}  # component -> triton_kernels.<component>, imported on first use


def _kernels(component: str):
    """triton_kernels.<component>, imported once. Every call looks it up here rather than
    through importlib: torch.compile cannot trace an import (each call would break the
    graph), but it traces a dict lookup; the first eager call or `load_kernels` fills it."""
    module = _MODULES.get(component)
    if module is None:
        if not _MODULES:  # the first kernels: Level 4's host path replays calls from now on
            importlib.import_module("triton_kernels.replay").install(signature)
        module = _MODULES[component] = importlib.import_module(f"triton_kernels.{component}")
    return module


def load_kernels(component: str) -> None:
    """Import `component`'s kernels now (levels.nn calls it when a layer takes this level),
    so that a model compiled before its first eager call traces no import."""
    _kernels(component)


def unavailable_reason(device: torch.device, component: str | None = None) -> str | None:
    # the missing GPU first: it is the reason, whatever the interpreter setting says
    if device.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU here: torch.cuda.is_available() is False"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not installed ({exc}); it ships for Linux only"
    if INTERPRETED and TRITON_IMPORTED_TOO_EARLY:
        return ("triton was imported before `levels`, so its interpreter (TRITON_INTERPRET=1) "
                "could not be switched on in time: import levels first, or set TRITON_INTERPRET=1 "
                "in the environment")
    if INTERPRETED and device.type != "cpu":
        return "TRITON_INTERPRET=1 is set: Triton kernels run on CPU tensors only in this process"
    if not INTERPRETED and device.type != "cuda":
        return ("Triton kernels need CUDA tensors on this machine (it has a GPU); set "
                "TRITON_INTERPRET=1 before importing levels.triton to run them on the CPU")
    for c in ([component] if component else []):
        try:
            _kernels(c)
        except ModuleNotFoundError as exc:
            if exc.name == f"triton_kernels.{c}":
                return f"Level 4 (Triton) has no {c} kernel yet"
            raise
    return None


def uses_tf32(component: str, device: torch.device, dtype: torch.dtype) -> bool:
    module = _kernels(component)
    return bool(getattr(module, "uses_tf32", lambda device, dtype: False)(device, dtype))


# After the contract, what only this level needs (the launchers in triton_kernels/ check the
# rest: head dimension, widths, float64), all before any kernel runs:
#  - the device the kernels run on: the interpreter reads CPU memory, a compiled kernel
#    GPU memory; the other one's pointer is garbage to it (or a crash);
#  - offsets: the GEMMs behind mlp and lstm (triton_kernels/gemm.py) index with 32-bit
#    offsets; gemm refuses too, but it can only name its own operands ('a', 'b');
#  - attention's grid: (query blocks, B * H), and CUDA refuses a launch whose second axis
#    exceeds 65535 ("invalid argument", after the outputs were allocated). The limit is
#    the kernel's, so the interpreter keeps it too: the same call fails the same way.

GRID_AXIS_LIMIT = 65535


def _on_kernel_device(component: str, name: str, t: torch.Tensor):
    if INTERPRETED:
        require_device(component, name, t, "cpu", "Level 4 runs in Triton's CPU interpreter in "
                       "this process: TRITON_INTERPRET=1")
    else:
        require_device(component, name, t, "cuda", "Level 4's kernels run on the GPU; to run them "
                       "on CPU tensors, set TRITON_INTERPRET=1 before importing levels")


def _gemm_reads(x: torch.Tensor) -> dict:
    """{"x": x} if the GEMM indexes x's own memory, that is if x.reshape(-1, x.shape[-1]) is
    a view (then it spans what x spans); {} if reshape copies x into a contiguous tensor,
    whose offsets the extents checked below bound."""
    try:
        x.view(-1, x.shape[-1])
    except RuntimeError:
        return {}
    return {"x": x}


def _no_float64_on_gpu(component: str, name: str, t: torch.Tensor):
    """The interpreter runs tl.dot in float64 with numpy; compiled Triton has no float64
    dot and fails inside its compiler (a CompilationError naming kernel source lines)."""
    if t.dtype == torch.float64 and not INTERPRETED:
        _fail(component, name, "float16, bfloat16 or float32 for Level 4's compiled kernels "
              "(tl.dot has no float64 path on the GPU; Triton's CPU interpreter computes float64)",
              _describe(t), TypeError)


# Each function validates the first call of an argument signature (the contract, then the
# checks above) and keeps the verdict (levels.contract.Plans): later calls with the same
# shapes, strides, dtypes and devices go straight to the launcher.

def _attention_plan(q, k, v, causal, scale, causal_alignment, kv_lens, rope):
    s = validate_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    _on_kernel_device("attention", "q", q)
    _no_float64_on_gpu("attention", "q", q)
    if s["B"] * s["H"] > GRID_AXIS_LIMIT:
        _fail("attention", "q", f"at most {GRID_AXIS_LIMIT} (batch x heads) slices for Level 4 "
              f"(Triton): its kernels give each slice a program on one grid axis, which CUDA "
              f"limits to {GRID_AXIS_LIMIT}", f"{_describe(q)} ({s['B'] * s['H']} slices)")
    tables = (s["rope_cos"], s["rope_sin"]) if rope is not None else ()
    _kernels("attention").check(q, k, v, tables)
    # the plan keeps no tensor: the tables of each call are that call's
    return s["scale"], s["bottom_right"], s["rope_interleaved"], s["rope_offset"]


def _layer_norm_plan(x, weight, bias, eps):
    validate_layer_norm(x, weight, bias, eps)
    _on_kernel_device("layer_norm", "x", x)
    _kernels("layer_norm").check(x)
    return float(eps)


def _rms_norm_plan(x, weight, eps):
    validate_rms_norm(x, weight, eps)
    _on_kernel_device("rms_norm", "x", x)
    _kernels("rms_norm").check(x)
    return float(eps)


def _mlp_plan(x, w1, b1, w2, b2):
    s = validate_mlp(x, w1, b1, w2, b2)
    _on_kernel_device("mlp", "x", x)
    widest = max(s["K"], s["hidden"], s["N"])
    require_32bit_offsets("mlp", "Level 4 (Triton)", {**_gemm_reads(x), "w1": w1, "w2": w2},
                          {("x", "(rows, features) activations and their gradients"):
                           s["M"] * widest})
    _kernels("mlp").check(x)
    return True


def _swiglu_mlp_plan(x, w_gate, w_up, w_down):
    s = validate_swiglu_mlp(x, w_gate, w_up, w_down)
    _on_kernel_device("swiglu_mlp", "x", x)
    widest = max(s["K"], s["hidden"], s["N"])
    require_32bit_offsets("swiglu_mlp", "Level 4 (Triton)",
                          {**_gemm_reads(x), "w_gate": w_gate, "w_up": w_up, "w_down": w_down},
                          {("x", "(rows, features) activations and their gradients"):
                           s["M"] * widest})
    _kernels("swiglu_mlp").check(x)
    return True


def _lstm_plan(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    s = validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    _on_kernel_device("lstm", "x", x)
    _no_float64_on_gpu("lstm", "x", x)
    require_32bit_offsets("lstm", "Level 4 (Triton)", {**_gemm_reads(x), "w_ih": w_ih, "w_hh": w_hh},
                          {("x", "(B*T, 4*hidden) gate pre-activations and their gradients"):
                           s["B"] * s["T"] * 4 * s["H"]})
    _kernels("lstm")
    return True


def _conv_bn_plan(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                  stride, padding, eps, momentum, training):
    s = validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                         stride, padding, eps, momentum, training)
    _on_kernel_device("conv_bn", "x", x)
    _kernels("conv_bn").check(x, conv_weight)
    return s["stride"], s["padding"], float(eps), float(momentum)


def _rope_plan(x, cos, sin, interleaved):
    validate_rope(x, cos, sin, interleaved)
    _on_kernel_device("rope", "x", x)
    _kernels("rope").check(x)
    return bool(interleaved)


def _newton_schulz_plan(G, steps, coefficients, eps):
    s = validate_newton_schulz(G, steps, coefficients, eps)
    _on_kernel_device("newton_schulz", "G", G)
    _kernels("newton_schulz").check(G)
    # One matrix's offsets are 32-bit; each program adds its matrix's batch offset in 64 bits,
    # so a batch may span more than 2**31 elements where each of its matrices does not.
    one = G if G.dim() == 2 or G.shape[0] == 0 else G[0]
    require_32bit_offsets("newton_schulz", "Level 4 (Triton)", {"G": one},
                          {("G", "(m, n) iterates and the (m, m) Gram matrices of one matrix"):
                           s["M"] * max(s["N"], s["M"])})
    return s["steps"], s["a"], s["b"], s["c"], s["eps"]


_ATTENTION = Plans(_attention_plan)
_LAYER_NORM = Plans(_layer_norm_plan)
_MLP = Plans(_mlp_plan)
_LSTM = Plans(_lstm_plan)
_SWIGLU_MLP = Plans(_swiglu_mlp_plan)
_CONV_BN = Plans(_conv_bn_plan, extra=conv_bn_buffers)
_RMS_NORM = Plans(_rms_norm_plan)
_ROPE = Plans(_rope_plan)
_NEWTON_SCHULZ = Plans(_newton_schulz_plan)


@autocasts("attention")
@one_call
def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    scale, bottom_right, interleaved, offset = _ATTENTION(q, k, v, causal, scale,
                                                          causal_alignment, kv_lens, rope)
    if rope is not None:  # fused: q and k turned in registers as the kernels load them
        rope = (rope[0], rope[1], interleaved, offset)
    return _MODULES["attention"].attention(q, k, v, causal, scale, bottom_right=bottom_right,
                                           kv_lens=kv_lens, rope=rope)


@autocasts("layer_norm")
@one_call
def layer_norm(x, weight, bias, eps=1e-5):
    eps = _LAYER_NORM(x, weight, bias, eps)
    return _MODULES["layer_norm"].layer_norm(x, weight, bias, eps)


@autocasts("rms_norm")
@one_call
def rms_norm(x, weight, eps=1e-6):
    eps = _RMS_NORM(x, weight, eps)
    return _MODULES["rms_norm"].rms_norm(x, weight, eps)


@autocasts("mlp")
@one_call
def mlp(x, w1, b1, w2, b2):
    _MLP(x, w1, b1, w2, b2)
    return _MODULES["mlp"].mlp(x, w1, b1, w2, b2)


@autocasts("swiglu_mlp")
@one_call
def swiglu_mlp(x, w_gate, w_up, w_down):
    _SWIGLU_MLP(x, w_gate, w_up, w_down)
    return _MODULES["swiglu_mlp"].swiglu_mlp(x, w_gate, w_up, w_down)


@autocasts("lstm")
@one_call
def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    _LSTM(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return _MODULES["lstm"].lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)


@autocasts("conv_bn")
@one_call
def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    stride, padding, eps, momentum = _CONV_BN(x, conv_weight, conv_bias, bn_weight, bn_bias,
                                              running_mean, running_var, stride, padding, eps,
                                              momentum, training)
    return _MODULES["conv_bn"].conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean,
                                       running_var, stride, padding, eps, momentum, training)


@autocasts("rope")
@one_call
def rope(x, cos, sin, interleaved=False):
    interleaved = _ROPE(x, cos, sin, interleaved)
    return _MODULES["rope"].rope(x, cos, sin, interleaved)


# ---------------------------------------------------------------------------------------
# explain: what the kernels are, and (on a GPU) what the compiler made of them.
# ---------------------------------------------------------------------------------------

_PTX_MARKERS = {  # instruction -> what it tells a reader
    "wgmma.mma_async": "Hopper warpgroup tensor-core MMA",
    "mma.sync": "warp-level tensor-core MMA (pre-Hopper path)",
    "ldmatrix": "shared -> registers in MMA fragment layout",
    "cp.async.bulk.tensor": "TMA bulk tensor copy",
    "cp.async": "asynchronous global -> shared copy (pipelining)",
    "ld.global.v4": "16-byte vector global loads",
    "ld.global": "global loads (all widths)",
    "st.global.v4": "16-byte vector global stores",
    "bar.sync": "block-wide barriers",
    "fma.rn.f32": "fp32 fused multiply-adds (CUDA cores)",
    "ld.local": "local-memory (spill) loads",
}


def _compiled(kernel, device: torch.device) -> list:
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        return []
    entry = caches.get(device.index if device.index is not None else torch.cuda.current_device())
    if not entry:
        return []
    return list(entry[0].values())


def _summary(name: str, ck) -> list[str]:
    md = ck.metadata
    lines = [f"  [{name}] warps={getattr(md, 'num_warps', '?')} stages={getattr(md, 'num_stages', '?')} "
             f"shared={getattr(md, 'shared', '?')} B registers={getattr(ck, 'n_regs', '?')} "
             f"spills={getattr(ck, 'n_spills', '?')}"]
    ptx = ck.asm.get("ptx", "")
    counts = [f"{ins}: {ptx.count(ins)}" for ins in _PTX_MARKERS if ptx.count(ins)]
    lines.append("     PTX " + (", ".join(counts) if counts else "(no marker instructions)"))
    try:
        from triton.tools.disasm import get_sass
        sass = get_sass(ck.asm["cubin"])
        ops = ["HGMMA", "HMMA", "LDSM", "LDGSTS", "LDG.E.128", "STG.E.128", "FFMA", "LDL", "STL"]
        lines.append("     SASS " + ", ".join(f"{op}: {sass.count(op)}" for op in ops if op in sass))
    except Exception as exc:  # noqa: BLE001 - SASS needs cuobjdump; PTX above still informs
        lines.append(f"     SASS unavailable ({type(exc).__name__}: {str(exc)[:80]})")
    return lines


def explain(component: str, device: str | torch.device = "cpu") -> str:
    """Kernel source of `component`'s Triton kernels; on a GPU, a summary of each
    specialization this process has compiled (registers, shared memory, spills, the
    instructions that matter). `levels explain` runs the component first, so there are some."""
    import inspect

    device = torch.device(device)
    try:
        module = _kernels(component)
    except ModuleNotFoundError:
        return f"Level 4 (Triton) has no {component} kernel yet"
    kernels = list(getattr(module, "KERNELS", []))
    parts = [f"Level 4 (Triton) — {component}: {len(kernels)} kernel(s) in {module.__name__}",
             (module.__doc__ or "").strip(), ""]
    for k in kernels:
        fn = getattr(k, "fn", k)
        parts += [f"# ---- {fn.__name__} " + "-" * 40, inspect.getsource(fn)]
    parts.append(_host_path())
    if device.type == "cuda" and not INTERPRETED:
        parts.append(f"# ---- compiled on {torch.cuda.get_device_name(device)} " + "-" * 20)
        for k in kernels:
            name = getattr(k, "fn", k).__name__
            compiled = _compiled(k, device)
            if not compiled:
                parts.append(f"  [{name}] not compiled in this process (not used by the calls so far)")
            for ck in compiled:
                parts += _summary(name, ck)
    else:
        parts.append("(compiled-code summary: run on a CUDA GPU without TRITON_INTERPRET)")
    return "\n".join(parts)


def _host_path() -> str:
    """One paragraph: whether calls replay from C++ in this process, and what stays on Python."""
    from triton_kernels import replay

    why = replay.unavailable()
    counts = replay.stats()
    lines = [f"# ---- host path: C++ replay of each signature's recorded launches "
             f"(triton_kernels/replay.py): {'off, ' + why if why else 'on'}; in this process "
             f"{counts['replayed']} signature(s) replay, {counts['python']} stay on the Python "
             f"path"]
    lines += [f"  {name}: {reason}" for name, reason in replay.reasons().items()]
    return "\n".join(lines)


@autocasts("newton_schulz")
@one_call
def newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    plan = _NEWTON_SCHULZ(G, steps, coefficients, eps)
    return _MODULES["newton_schulz"].newton_schulz(G, *plan)
