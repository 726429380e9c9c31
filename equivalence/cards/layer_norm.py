"""LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias."""

import torch

from . import (BERT, CLIP, GPT2, LLAMA2, Shape, infer, nbytes, randn, rows_text, shrink, shrink_rows,
               train)

SIZES = {
    "tiny": dict(rows=(2, 5), N=129),  # leading dims > 1, a width that is no power of two
    "small": dict(rows=(4096,), N=1023),
    "bench": dict(rows=(16384,), N=4096),
}
VARIANTS = {"default": {}}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("x", "weight", "bias")
MUTATED: dict = {}
STRIDED = {"x": "row_padded", "weight": "every_other", "bias": "every_other"}
SCALING_DIM = "rows"  # the batch
GRAPH_INPUTS = ("x",)
RATE = "TB/s"  # it moves bytes rather than computing
FUSED_ATEN = ("native_layer_norm", "native_layer_norm_backward", "layer_norm")
NN_MODULES = ("LayerNorm",)
SUITE_GOAL = 1.0


def make_args(shape, dtype, device, generator):
    N = shape["N"]
    return dict(x=randn((*shape["rows"], N), generator, dtype, device, scale=2.0, shift=0.5),
                weight=randn((N,), generator, dtype, device, scale=0.5, shift=1.0),
                bias=randn((N,), generator, dtype, device, scale=0.5),
                eps=1e-5)


def reference(x, weight, bias, eps=1e-5):
    mean = x.sum(dim=-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(dim=-1, keepdim=True) / x.shape[-1]  # biased, as nn.LayerNorm
    return ((x - mean) / torch.sqrt(var + eps) * weight + bias,)


def zero_gradient_scales(args, upstream, grads):
    # Width 1: x - mean(x) is exactly 0, the output is `bias` whatever x is, and grad x is
    # exactly zero. Measure it against the size it has before that cancellation,
    # rstd * weight * dy with rstd = 1/sqrt(eps).
    if args["x"].shape[-1] != 1:
        return {}
    return {"x": upstream[0] * args["weight"] / args["eps"] ** 0.5}


def flops(args):
    n = args["x"].numel()
    return {"fwd": 8 * n, "bwd": 12 * n}


def min_bytes(args):
    x, w, b = args["x"], args["weight"], args["bias"]
    # forward: read x, write y; backward: read x and dy, write dx (weights are noise)
    return {"fwd": 2 * nbytes(x) + nbytes(w, b), "bwd": 3 * nbytes(x) + 3 * nbytes(w, b)}


# ---------------------------------------------------------------------------------------
# The model-shape suite
# ---------------------------------------------------------------------------------------

MODEL_SHAPES = (
    Shape("gpt2-small-train", "GPT-2 small", GPT2 + "; batch 8 x 1024 tokens",
          dict(rows=(8, 1024), N=768), train()),
    Shape("gpt2-medium-train", "GPT-2 medium", GPT2 + "; batch 4 x 1024 tokens",
          dict(rows=(4, 1024), N=1024), train()),
    Shape("gpt2-xl-train", "GPT-2 XL", GPT2 + " (n_embd=1600: no power of two); batch 2 x 1024 "
          "tokens", dict(rows=(2, 1024), N=1600), train()),
    Shape("llama2-7b-train", "Llama 2 7B", LLAMA2 + "; Llama normalizes with RMSNorm: this is "
          "LayerNorm at its width, 4096 tokens", dict(rows=(1, 4096), N=4096), train()),
    Shape("llama2-7b-decode", "Llama 2 7B", LLAMA2 + "; one decoding step for a batch of 8 "
          "sequences: 8 rows, all per-call overhead", dict(rows=(8, 1), N=4096), infer()),
    Shape("bert-base-train", "BERT-base", BERT + "; batch 32 x 512 tokens",
          dict(rows=(32, 512), N=768), train()),
    Shape("clip-text-inference", "CLIP text", CLIP + "; 128 prompts x 77 tokens",
          dict(rows=(128, 77), N=512), infer()),
)


def tiny_twin(s):
    return dict(rows=shrink_rows(s["rows"]), N=shrink(s["N"], 16, low=8))


def describe(s, variants):
    return f"{rows_text(s['rows'])} rows x {s['N']}"


def libraries(device, dtype):
    """F.layer_norm, eager: one fused ATen kernel (torch.compile is a level of ours, not the
    library baseline)."""
    import torch.nn.functional as F

    from ..calls import Impl

    def prepare(args):
        x, w, b, eps = args["x"], args["weight"], args["bias"], args["eps"]
        return (lambda: [F.layer_norm(x, (x.shape[-1],), w, b, eps)]), [x, w, b]

    return [Impl("F.layer_norm", "library", prepare)]


# The kernel's speed at a large problem, measured on an H100 (reports/h100-bench.json,
# bfloat16: forward 16384x4096, 0.98x copy bandwidth): what turns "the host needs T us per
# call" into "the kernel needs longer than that above this size". An estimate: a kernel
# reaches this rate only at large sizes.
H100_TBPS = 2.82


def kernel_dominates_above(host_us: float, source: str) -> str:
    moved = host_us * 1e-6 * H100_TBPS * 1e12  # bytes: read x, write y
    rows = moved / (2 * 2 * 4096)  # bfloat16 rows of 4096, read once and written once
    return (f"at {H100_TBPS} TB/s ({source}) {host_us:.0f} µs moves {moved / 1e6:.0f} MB: a "
            f"layer_norm of about {rows:,.0f} rows of 4096 (x read, y written)")


# ---------------------------------------------------------------------------------------
# The host probe (equivalence/commands/host_probe.py): where a tiny Level 4 call's
# microseconds go. `rec` is the probe's recorder: rec.host(key, fn) times a call with the
# GPU's queue drained per batch, rec.cpu(key, fn) a host-only call, rec.gpu_time(fn) the
# GPU's own time for the whole call; rec.host(..., jit_launches=True) is timed with every
# launch through kernel[grid] (in a process started with LEVELS_TRITON_FAST_LAUNCH=0);
# rec.wants(key) says whether a key is asked for. Keys are those of the recorded
# reports/h100-host-probe.json.
# ---------------------------------------------------------------------------------------

PROBE_SHAPES = "x (4, 37, 64), weight (64,), bias (64,), bfloat16: 148 rows of 64"


def _probe_inputs(device):
    x = torch.randn(4, 37, 64, device=device, dtype=torch.bfloat16)
    w = torch.randn(64, device=device, dtype=torch.bfloat16)
    b = torch.randn(64, device=device, dtype=torch.bfloat16)
    return x, w, b


def host_probe(rec, device) -> None:
    """Every piece of levels.triton.layer_norm at 148 rows of 64 (group "layer_norm")."""
    import torch.nn.functional as F
    from triton.runtime import driver

    import levels.triton as L4
    from levels.contract import validate_layer_norm
    from triton_kernels import launch as tlaunch
    from triton_kernels import layer_norm as tln

    x, w, b = _probe_inputs(device)
    rec.host("eager F.layer_norm", lambda: F.layer_norm(x, (64,), w, b, 1e-5))
    with torch.no_grad():
        rec.host("eager F.layer_norm no_grad", lambda: F.layer_norm(x, (64,), w, b, 1e-5))
        rec.host("L4 levels.triton.layer_norm no_grad", lambda: L4.layer_norm(x, w, b, 1e-5))
    rec.host("L4 levels.triton.layer_norm", lambda: L4.layer_norm(x, w, b, 1e-5))
    rec.cpu("validate_layer_norm", lambda: validate_layer_norm(x, w, b, 1e-5))
    rec.cpu("_on_kernel_device", lambda: L4._on_kernel_device("layer_norm", "x", x))
    rec.host("tln.layer_norm (after validation)", lambda: tln.layer_norm(x, w, b, 1e-5))
    rec.host("_LayerNorm.apply", lambda: tln._LayerNorm.apply(x, w, b, 1e-5))
    x2 = x.reshape(-1, 64)
    M, N = x2.shape
    y = torch.empty_like(x2)
    stats = torch.empty((2, M), device=device)
    BM, BN, nw = tln._tiling(N)
    g = (-(-M // BM),)
    args = (x2, w, b, y, stats, M, N, x2.stride(0), y.stride(0), 1e-5)
    kernel = tlaunch.jit_of(tln.layer_norm_fwd_kernel)

    def jit_launch():
        return kernel[g](*args, BLOCK_M=BM, BLOCK_N=BN, STATS=True, num_warps=nw)

    rec.host("JIT launch only", jit_launch)
    rec.host("fast launch only", lambda: tlaunch.launch(kernel, g, *args, BLOCK_M=BM, BLOCK_N=BN,
                                                          STATS=True, num_warps=nw))
    with torch.no_grad():
        rec.host("L4 levels.triton.layer_norm no_grad, fast launch OFF",
                 lambda: L4.layer_norm(x, w, b, 1e-5), jit_launches=True)
    rec.cpu("3x torch.empty", lambda: (torch.empty((M, N), device=device, dtype=x.dtype),
                                       torch.empty((M,), device=device, dtype=torch.float32),
                                       torch.empty((M,), device=device, dtype=torch.float32)))
    rec.cpu("1x torch.empty", lambda: torch.empty((M, N), device=device, dtype=x.dtype))
    rec.cpu("empty_like", lambda: torch.empty_like(x2))
    rec.cpu("x.reshape", lambda: x.reshape(-1, 64))
    rec.cpu("w.contiguous", lambda: w.contiguous())
    rec.cpu("torch.is_grad_enabled", lambda: torch.is_grad_enabled())
    rec.cpu("x.data_ptr", lambda: x.data_ptr())
    rec.cpu("x.stride(0)", lambda: x2.stride(0))
    rec.cpu("x.shape", lambda: x.shape)
    rec.cpu("torch.cuda.current_stream", lambda: torch.cuda.current_stream())
    rec.cpu("driver get_current_device", lambda: driver.active.get_current_device())
    # The compiled kernel's own launcher, without the JIT's binding, specialization and lookup
    if rec.wants("driver get_current_stream", "CompiledKernel[grid](...) all args", "ck.run raw",
                 "ck.run raw maxerr"):
        try:
            d0 = driver.active.get_current_device()
            rec.cpu("driver get_current_stream", lambda: driver.active.get_current_stream(d0))
            ck = jit_launch()
            full = (*args, BM, BN)
            rec.host("CompiledKernel[grid](...) all args", lambda: ck[(g[0], 1, 1)](*full))
            stream = driver.active.get_current_stream(d0)
            fn, pm, run = ck.function, ck.packed_metadata, ck.run

            def raw():
                run(g[0], 1, 1, stream, fn, pm, None, None, None, *full)

            rec.host("ck.run raw", raw)
            if rec.wants("ck.run raw maxerr"):
                y.fill_(float("nan"))
                raw()
                torch.cuda.synchronize()
                ref = F.layer_norm(x2.float(), (64,), w.float(), b.float(), 1e-5)
                rec.put("ck.run raw maxerr", float((y.float() - ref).abs().max()))
        except Exception as exc:  # noqa: BLE001 - Triton's CompiledKernel API moves
            rec.failed("ck.run raw", exc)
    rec.gpu_time(lambda: L4.layer_norm(x, w, b, 1e-5))


def host_probe_backward(rec, device) -> None:
    """Forward + backward of the same call (group "layer_norm_bwd", shared with attention's
    card, which times its own no_grad call there)."""
    import torch.nn.functional as F

    import levels.triton as L4

    xg, wg, bg = (t.requires_grad_() for t in _probe_inputs(device))
    dy = torch.randn_like(xg)

    def eager_fwd_bwd():
        F.layer_norm(xg, (64,), wg, bg, 1e-5).backward(dy)

    def l4_fwd_bwd():
        L4.layer_norm(xg, wg, bg, 1e-5).backward(dy)

    rec.host("eager fwd+bwd", eager_fwd_bwd, batch=20)
    rec.host("L4 fwd+bwd", l4_fwd_bwd, batch=20)
    rec.host("L4 fwd+bwd, fast launch OFF", l4_fwd_bwd, batch=20, jit_launches=True)


# How the pieces of one call add up, as `levels explain --level triton` shows them: rows are
# (name, what it is, keys[, group]) with keys one measurement, (a, b, ...) for a - b - ...,
# or ("2x", key); group: where the keys were measured, if not in this component's own.
HOST_PROBE_LAYOUT = dict(
    call="levels.triton.layer_norm(x, weight, bias) under torch.no_grad()",
    shapes=PROBE_SHAPES,
    total=("the Level 4 call", "levels.triton.layer_norm: all the above",
           ("L4 levels.triton.layer_norm no_grad",)),
    eager=("eager F.layer_norm (yardstick)", "one C++ call: checks, 1 alloc, 1 launch",
           ("eager F.layer_norm no_grad",)),
    pieces=(
        ("validate_layer_norm", "contract checks in Python (eager: in C++)", ("validate_layer_norm",)),
        ("_on_kernel_device", "tensors where the kernel can read them?", ("_on_kernel_device",)),
        ("3 allocations: y, mean, rstd", "dispatcher + caching allocator, each", ("3x torch.empty",)),
        ("launch (triton_kernels/launch.py)", "our cache key, then the compiled launcher",
         ("fast launch only",)),
    ),
    rest="Python glue: calls, contiguous, tiling",
    alternatives=(
        ("launch through kernel[grid]", "Triton's JIT binds, specializes each arg", ("JIT launch only",)),
        ("compiled launcher alone (ck.run)", "the floor of a launch from Python", ("ck.run raw",)),
        ("the call, direct launches off", "every launch through kernel[grid]",
         ("L4 levels.triton.layer_norm no_grad, fast launch OFF",)),
        ("autograd.Function.apply", "when grad is on: node, ctx, saved tensors",
         ("_LayerNorm.apply", "tln.layer_norm (after validation)")),
        ("Level 4 forward + backward", "fwd + bwd launches, autograd; eager: next",
         ("L4 fwd+bwd",), "layer_norm_bwd"),
        ("eager forward + backward", "F.layer_norm(x, w, b).backward(dy)",
         ("eager fwd+bwd",), "layer_norm_bwd"),
    ),
)

HOST_PROBE = {"kernel_dominates_above": kernel_dominates_above,
              "measure": {"layer_norm": host_probe, "layer_norm_bwd": host_probe_backward},
              "layout": HOST_PROBE_LAYOUT}
