"""Level 5 — CUDA C++: hand-written kernels in `cuda_kernels/*.cu`, built by
`torch.utils.cpp_extension.load_inline` and called as torch custom ops.

What it adds over Triton: thread-level control. Triton lets us choose a block's tile and
what stays on chip; CUDA makes us (and lets us) choose what every thread, warp and block
does: which thread loads which 16 bytes, how a reduction crosses a warp (shuffles) and a
block (shared memory, barriers), how shared memory is laid out to avoid bank conflicts,
how many accumulators a thread keeps in registers, which tensor-core fragments
(`wmma`/`mma.sync`/`wgmma`) a warp feeds and how copies overlap math (`cp.async`). Each
`.cu` is a ladder of versions, one idea per rung, all selectable
(`LEVELS_CUDA_VERSION_<COMPONENT>=n` or `version=`), so the cost of each idea is measured.

What it costs: the most code for the same math; a slow first build (18.8 s on the H100's
16 cores for all five components' kernel files, cached per user afterwards, see
cuda_kernels/build.py); and mistakes that
are undefined behaviour instead of errors (a wrong index reads someone else's memory and
returns garbage, a missing barrier is a race that passes most runs). That is why every
input is validated here, in Python, before any kernel runs, and why the harness poisons
allocations with NaN.

This module is thin on purpose: it validates with the shared contract, refuses what the
kernels do not do (CPU tensors, float64) naming the argument, builds the library on the
first call (never on import or on `unavailable_reason`), then calls
`cuda_kernels/<component>.py`, which prepares the arguments and calls the ops.

Without a GPU nothing runs, but `levels explain --level cuda` still shows each kernel's
source and what ptxas makes of it (registers, shared memory, spills) wherever nvcc exists.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import torch

from cuda_kernels import build

from .contract import (COMPONENTS, Plans, _describe, _fail, autocasts, conv_bn_buffers,
                       validate_attention, validate_conv_bn, validate_layer_norm, validate_lstm,
                       validate_mlp, validate_newton_schulz, validate_rms_norm, validate_rope,
                       validate_swiglu_mlp)

NO_GPU = ("needs a CUDA GPU; without one, read the kernels with `levels explain --level cuda` "
          "(ptxas report works with nvcc alone)")

# The .cu files a component's kernels live in, when its module does not say
# (`KERNEL_FILES = ("gemm.cu",)` in cuda_kernels/<component>.py): gemm.cu serves the MLP.
DEFAULT_KERNEL_FILES = {"mlp": ("gemm.cu",)}

# equivalence/commands/explain.py may show explain() even where the level cannot run: reading the
# kernels and their ptxas report needs nvcc, not a GPU.
EXPLAIN_WITHOUT_DEVICE = True


def has_kernels(component: str) -> bool:
    return (build.KERNELS_DIR / f"{component}.py").exists()


def _kernels(component: str):
    return importlib.import_module(f"cuda_kernels.{component}")


def _import_kernels() -> dict:
    """component -> cuda_kernels.<component> (or the exception its import raised), for every
    component with kernels, imported with this module: Python only, no build. Filled here,
    before any torch.compile trace can read it, because Dynamo reads a global dictionary once
    per frame: a key added during a trace (by a lazy import) is missing from its copy, a
    KeyError and a graph break; and importlib itself is a graph break under torch 2.11."""
    found = {}
    for component in COMPONENTS:
        if has_kernels(component):
            try:
                found[component] = _kernels(component)
            except Exception as exc:  # noqa: BLE001 - reported by the component's first call
                found[component] = exc
    return found


def _device_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        if torch.cuda.is_available():
            return (f"Level 5 kernels run on CUDA tensors; got device {device} (this machine has a "
                    f"GPU: use --device cuda)")
        return NO_GPU
    if torch.version.cuda is None:
        return ("this torch is a CPU-only build (torch.version.cuda is None): install a CUDA build "
                "of torch to run Level 5")
    if not torch.cuda.is_available():
        return NO_GPU
    return None


def unavailable_reason(device, component: str | None = None) -> str | None:
    """Why Level 5 (or its `component`) cannot run on `device`; None if it can. Cheap: it
    never builds anything (the build happens on the first real call)."""
    device = torch.device(device)
    if component is not None and not has_kernels(component):
        return f"Level 5 has no {component} kernels yet"
    reason = _device_reason(device)
    if reason:
        return reason
    for reason in (build.nvcc_available(), build.ninja_available()):
        if reason:
            return reason
    failed = build.failure()
    if failed:
        return f"the Level 5 build failed in this process:\n{failed}"
    if component is not None and component in build.registration_errors():
        return (f"registering Level 5's {component} ops failed: "
                f"{build.registration_errors()[component]}")
    return None


def uses_tf32(component: str, device, dtype: torch.dtype) -> bool:
    if not has_kernels(component):
        return False
    fn = getattr(_kernels(component), "uses_tf32", None)
    return bool(fn(torch.device(device), dtype)) if fn is not None else False


def _constant_under_compile(fn):
    """torch.compiler.assume_constant_result(fn), minus its `import torch._dynamo` (1.4 s on a
    2-core CPU, paid by every `levels doctor` that merely asks whether Level 5 runs). The
    decorator only sets this attribute, which Dynamo reads while tracing; a test holds the two
    to the same effect, so a torch that marks functions differently fails there."""
    fn._dynamo_marked_constant = True
    return fn


_MODULES = _import_kernels()


@_constant_under_compile
def _availability(component: str, device_index: int) -> str:
    """'' once `component`'s ops are built, loaded and registered on cuda:device_index, else
    the error ('N' + text: not implemented here, 'B' + text: the build or toolchain). Builds
    on the very first call. torch.compile runs it while tracing and keeps only the result,
    so a compiled graph calling Level 5 has no file system or subprocess work in it."""
    if not has_kernels(component):
        return f"N{component}: Level 5 has no {component} kernels yet"
    device = torch.device("cuda", device_index)
    reason = unavailable_reason(device, component)
    if reason:
        return f"B{component}: {reason}"
    try:
        build.load(device)
    except build.BuildError as exc:
        return f"B{component}: {exc}"
    reason = unavailable_reason(device, component)  # its ops may have failed to register
    if reason:
        return f"B{component}: {reason}"
    return ""


@_constant_under_compile
def _reason_on(component: str, device_type: str) -> str:
    """unavailable_reason as a constant torch.compile can trace past (it reads files)."""
    return unavailable_reason(torch.device(device_type), component) or ""


def _ready(component: str, name: str, t: torch.Tensor):
    """After the contract's validation: refuse what no Level 5 kernel does, naming the
    argument, build the library (first call only), return cuda_kernels.<component>."""
    # The dtype first: float64 is wrong at Level 5 on any machine, so a CPU says so too,
    # before saying that it has no GPU.
    if t.dtype == torch.float64:
        _fail(component, name, "float32, float16 or bfloat16 at Level 5 (its kernels have no "
                               "float64 path)", _describe(t), TypeError)
    if t.device.type != "cuda":
        if not torch.cuda.is_available():
            raise NotImplementedError(f"{component}: Level 5 (CUDA C++) "
                                      f"{_reason_on(component, t.device.type)}")
        _fail(component, name, "a CUDA tensor at Level 5 (its kernels run on the GPU)", _describe(t))
    problem = _availability(component, t.device.index)
    if problem:
        raise (NotImplementedError if problem[0] == "N" else build.BuildError)(problem[1:])
    module = _MODULES[component]
    if isinstance(module, Exception):
        raise ImportError(f"cuda_kernels.{component} failed to import: {module}")
    return module


# Each function validates the first call of an argument signature (the contract, then
# `_ready`: dtype, device, the library built) and keeps the verdict (levels.contract.Plans);
# later calls with the same shapes, strides, dtypes and devices make one call into C++: the
# component's op (cuda_kernels/autograd_binding.cpp), its autograd included.

def _attention_plan(q, k, v, causal, scale, causal_alignment, kv_lens, rope):
    s = validate_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    # The plan is kept for every later call of this signature, so it holds what the
    # signature decides (the layout flag, the queries' table offset) and never the tables
    # themselves: each call's own cos and sin go to the op (`attention` below).
    return (_ready("attention", "q", q), s["scale"], s["bottom_right"],
            bool(s["rope_interleaved"]), int(s["rope_offset"]))


def _layer_norm_plan(x, weight, bias, eps):
    validate_layer_norm(x, weight, bias, eps)
    return _ready("layer_norm", "x", x), float(eps)


def _rms_norm_plan(x, weight, eps):
    validate_rms_norm(x, weight, eps)
    return _ready("rms_norm", "x", x), float(eps)


def _mlp_plan(x, w1, b1, w2, b2):
    validate_mlp(x, w1, b1, w2, b2)
    return _ready("mlp", "x", x)


def _swiglu_mlp_plan(x, w_gate, w_up, w_down):
    validate_swiglu_mlp(x, w_gate, w_up, w_down)
    return _ready("swiglu_mlp", "x", x)


def _lstm_plan(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return _ready("lstm", "x", x)


def _conv_bn_plan(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                  stride, padding, eps, momentum, training):
    s = validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                         stride, padding, eps, momentum, training)
    return _ready("conv_bn", "x", x), s["stride"], s["padding"], float(eps), float(momentum)


def _rope_plan(x, cos, sin, interleaved):
    validate_rope(x, cos, sin, interleaved)
    return _ready("rope", "x", x), bool(interleaved)


CUDA_MAX_BATCH = 65535  # newton_schulz.cu's batch axis is a grid's y or z dimension


def _newton_schulz_plan(G, steps, coefficients, eps):
    s = validate_newton_schulz(G, steps, coefficients, eps)
    if s["batch"] > CUDA_MAX_BATCH:
        _fail("newton_schulz", "G", f"a batch of at most {CUDA_MAX_BATCH} matrices for Level 5 "
              "(the batch is a grid dimension of its kernels)", _describe(G))
    return s, _ready("newton_schulz", "G", G)


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
def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    module, scale, bottom_right, interleaved, offset = _ATTENTION(
        q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    cos, sin = (None, None) if rope is None else rope[:2]
    return module.attention(q, k, v, causal, scale, bottom_right=bottom_right, kv_lens=kv_lens,
                            rope_cos=cos, rope_sin=sin, rope_interleaved=interleaved,
                            rope_offset=offset)


@autocasts("layer_norm")
def layer_norm(x, weight, bias, eps=1e-5):
    module, eps = _LAYER_NORM(x, weight, bias, eps)
    return module.layer_norm(x, weight, bias, eps)


@autocasts("rms_norm")
def rms_norm(x, weight, eps=1e-6):
    module, eps = _RMS_NORM(x, weight, eps)
    return module.rms_norm(x, weight, eps)


@autocasts("mlp")
def mlp(x, w1, b1, w2, b2):
    return _MLP(x, w1, b1, w2, b2).mlp(x, w1, b1, w2, b2)


@autocasts("swiglu_mlp")
def swiglu_mlp(x, w_gate, w_up, w_down):
    return _SWIGLU_MLP(x, w_gate, w_up, w_down).swiglu_mlp(x, w_gate, w_up, w_down)


@autocasts("lstm")
def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    return _LSTM(x, h0, c0, w_ih, w_hh, b_ih, b_hh).lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)


@autocasts("conv_bn")
def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    module, stride, padding, eps, momentum = _CONV_BN(
        x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, stride, padding,
        eps, momentum, training)
    return module.conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                          stride, padding, eps, momentum, training)


@autocasts("rope")
def rope(x, cos, sin, interleaved=False):
    module, interleaved = _ROPE(x, cos, sin, interleaved)
    return module.rope(x, cos, sin, interleaved)


# ---------------------------------------------------------------------------------------
# explain: the version ladder, each kernel's source, and what ptxas made of it.
# ---------------------------------------------------------------------------------------

def kernel_files(component: str) -> list[Path]:
    """The .cu files `component` runs: its module's KERNEL_FILES, else <component>.cu
    (and the defaults above)."""
    names = None
    if has_kernels(component):
        try:
            names = getattr(_kernels(component), "KERNEL_FILES", None)
        except Exception:  # noqa: BLE001 - explain must work even if the module does not import
            names = None
    if names is None:
        names = (f"{component}.cu", *DEFAULT_KERNEL_FILES.get(component, ()))
    return [build.KERNELS_DIR / n for n in dict.fromkeys(names) if (build.KERNELS_DIR / n).exists()]


def _blank_comments_and_strings(text: str) -> str:
    """`text` with comments and string/char literals replaced by spaces (same offsets), so
    braces and keywords in them do not count."""
    out, i, n = list(text), 0, len(text)
    while i < n:
        two = text[i:i + 2]
        if two == "//":
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif two == "/*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def opening_comment(text: str) -> str:
    """The comment a .cu file opens with: its list of versions and the idea of each."""
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("//") or (lines and not stripped):
            lines.append(line)
        elif stripped.startswith(("/*", "*")) or (lines and lines[0].strip().startswith("/*")
                                                  and "*/" not in "".join(lines)):
            lines.append(line)
        else:
            break
    return "\n".join(lines).strip()


_KERNEL_NAME = re.compile(r"\bvoid\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def kernels_in(text: str) -> list[tuple[str, str]]:
    """(name, source) of every __global__ function, with its template line and the comment
    right above it, in file order (the files are ordered by version)."""
    code = _blank_comments_and_strings(text)
    found = []
    for m in re.finditer(r"\b__global__\b", code):
        name = _KERNEL_NAME.search(code, m.end())
        if not name:
            continue
        body = code.find("{", name.end())
        semi = code.find(";", name.end())
        if body < 0 or (0 <= semi < body):
            continue  # a declaration
        depth, end = 0, body
        for end in range(body, len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        start = code.rfind("\n", 0, m.start()) + 1
        # include `template <...>` and the comment lines directly above the kernel
        lines_before = text[:start].splitlines(keepends=True)
        while lines_before and (lines_before[-1].strip().startswith(("//", "template", "*", "/*"))):
            start -= len(lines_before.pop())
        found.append((name.group(1), text[start:end + 1]))
    return found


def launchers_in(text: str) -> list[str]:
    """The extern "C" launchers a file defines or declares (not those named in comments)."""
    code = _blank_comments_and_strings(text)
    return [m.group(1) for m in re.finditer(r'\bextern\s+"C"\s+int\s+(levels_\w+)\s*\(', text)
            if code[m.start():m.start() + 6] == "extern"]


def _report_for(name: str, report: list[dict]) -> list[dict]:
    pattern = re.compile(rf"(^|[\s:]){re.escape(name)}\s*[<(]")
    return [k for k in report if pattern.search(k.get("kernel", k["mangled"]))]


def explain(component: str, device="cpu") -> str:
    """Per kernel file of `component`: the version ladder (the file's opening comment), the
    launchers, each kernel's source and its ptxas report for sm_90a (registers, shared
    memory, spills). Needs nvcc for the report, no GPU."""
    device = torch.device(device)
    if not has_kernels(component):
        return f"Level 5 has no {component} kernels yet"
    files = kernel_files(component)
    parts = [f"Level 5 (CUDA C++) — {component}: {', '.join(f.name for f in files) or 'no .cu file'} "
             f"in cuda_kernels/"]
    try:
        parts.append((_kernels(component).__doc__ or "").strip())
    except Exception as exc:  # noqa: BLE001 - the sources below are still worth showing
        parts.append(f"(importing cuda_kernels.{component} failed: {type(exc).__name__}: {exc})")
    nvcc_missing = build.nvcc_available()
    for f in files:
        text = f.read_text()
        parts += ["", f"# ==== cuda_kernels/{f.name} " + "=" * 50, opening_comment(text), ""]
        if nvcc_missing:
            report, note = [], f"ptxas report unavailable: {nvcc_missing}"
        else:
            try:
                report, note = build.ptxas_report(f), "ptxas report for sm_90a (H100)"
            except build.BuildError as exc:
                report, note = [], f"ptxas report unavailable, the file does not compile:\n{exc}"
        parts.append(f"launchers: {', '.join(launchers_in(text)) or '(none found)'}")
        parts.append(f"# {note}")
        shown = set()
        for name, source in kernels_in(text):
            parts += ["", f"# ---- kernel {name} " + "-" * 40, source]
            for k in _report_for(name, report):
                shown.add(k["mangled"])
                parts.append("  ptxas: " + build.format_ptxas([k])[0])
        rest = [k for k in report if k["mangled"] not in shown]
        if rest:
            parts += ["", "# other kernels ptxas compiled (instantiated from templates or helpers):"]
            parts += ["  ptxas: " + line for line in build.format_ptxas(rest)]
    if device.type == "cuda" and build.loaded():
        parts += ["", f"# built: {build.last_build()}"]
    return "\n".join(parts)


@autocasts("newton_schulz")
def newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    s, module = _NEWTON_SCHULZ(G, steps, coefficients, eps)
    return module.newton_schulz(G, s["steps"], s["a"], s["b"], s["c"], s["eps"])
