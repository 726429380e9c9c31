"""The contract every level implements, and the validators every level calls first.

Five components, one signature each, identical at all five levels:

    attention(q, k, v, causal=False, scale=None)
    layer_norm(x, weight, bias, eps=1e-5)
    mlp(x, w1, b1, w2, b2)
    lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)            -> (output, (h_T, c_T))
    conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False)

Validation lives here, once, so that a wrong input fails the same way at every level
and *before* any kernel runs: a Triton or CUDA kernel that receives a bad shape does
not raise, it reads out of bounds and returns garbage. Every error names the component,
the argument, what was expected and what was given.
"""

from __future__ import annotations

import math
import numbers

import torch

COMPONENTS = ("attention", "layer_norm", "mlp", "lstm", "conv_bn")

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fail(component: str, arg: str, expected: str, got: object, exc=ValueError):
    raise exc(f"{component}: argument '{arg}' must be {expected}; got {got}")


def _describe(t: torch.Tensor) -> str:
    return f"a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"


def span(t: torch.Tensor) -> int:
    """How many elements apart t's first and last elements are in memory: the largest
    offset a kernel indexing t from its first element computes (0 for an empty tensor).
    A view can span far more than it holds (two rows 2**31 apart hold 2 rows)."""
    if t.numel() == 0:
        return 0
    return sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))


def require_device(component: str, name: str, t: torch.Tensor, device_type: str, why: str):
    """For a level whose kernels run on one kind of device only. The contract has already
    put every tensor argument on one device, so checking the first one checks them all;
    a kernel handed another device's pointer would read garbage or crash the process."""
    if t.device.type != device_type:
        _fail(component, name, f"a {device_type.upper()} tensor ({why})", _describe(t))


def require_32bit_offsets(component: str, level: str, tensors: dict, extents: dict | None = None):
    """For kernels that index with 32-bit offsets: every offset they compute must stay below
    2**31, or it wraps around and the kernel reads and writes someone else's memory.
    `tensors` are the caller's arguments (their spans count, see `span`); `extents` are the
    element counts of the contiguous intermediates the kernels allocate, keyed by the
    argument they grow with and what they are: {("x", "(M, hidden) activations"): M * hidden}."""
    limit = 2 ** 31
    for name, t in tensors.items():
        if span(t) >= limit:
            _fail(component, name, f"a tensor whose elements lie < 2**31 apart for {level}, whose "
                  f"kernels index with 32-bit offsets", f"{_describe(t)} with strides "
                  f"{tuple(t.stride())}, spanning {span(t)} elements")
    for (name, what), elements in (extents or {}).items():
        if elements > limit:
            _fail(component, name, f"small enough that the {what} fit 32-bit offsets for {level} "
                  f"(<= 2**31 elements)", f"{elements} elements")


def _tensors(component: str, named: dict[str, torch.Tensor]) -> torch.Tensor:
    """Type, dtype and device checks shared by all components; returns the first tensor."""
    first_name, first = None, None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            _fail(component, name, "a torch.Tensor", type(t).__name__, TypeError)
        if t.dtype not in FLOAT_DTYPES:
            _fail(component, name, "a floating-point tensor (float16, bfloat16, float32 or float64)",
                  _describe(t), TypeError)
        if first is None:
            first_name, first = name, t
            continue
        if t.dtype != first.dtype:
            _fail(component, name, f"of dtype {first.dtype} like '{first_name}' (no mixed dtypes)",
                  _describe(t), TypeError)
        if t.device != first.device:
            _fail(component, name, f"on device {first.device} like '{first_name}'", _describe(t))
    return first


def _rank(component: str, name: str, t: torch.Tensor, rank: int, layout: str):
    if t.dim() != rank:
        _fail(component, name, f"{rank}-D {layout}", _describe(t))


def _shape(component: str, name: str, t: torch.Tensor, shape: tuple, layout: str):
    if tuple(t.shape) != tuple(shape):
        _fail(component, name, f"of shape {layout} = {tuple(shape)}", _describe(t))


def _number(component: str, name: str, value, *, low=None, low_open=False, high=None, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(component, name, "a real number" + (" or None" if allow_none else ""),
              f"{type(value).__name__} {value!r}", TypeError)
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and value > high
    # Not finite is never meant: eps=inf or scale=inf turn every output into NaN or 0.
    if bad_low or bad_high or not math.isfinite(value):
        lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
        hi = "" if high is None else f"<= {high}"
        _fail(component, name, "a finite number " + " and ".join(s for s in (lo, hi) if s), value)


def _flag(component: str, name: str, value):
    if not isinstance(value, bool):
        _fail(component, name, "a bool", f"{type(value).__name__} {value!r}", TypeError)


def _int_pair(component: str, name: str, value, low: int) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in pair)):
        _fail(component, name, "an int or a pair of ints", repr(value), TypeError)
    if min(pair) < low:
        _fail(component, name, f"made of ints >= {low}", repr(value))
    return int(pair[0]), int(pair[1])


# ---------------------------------------------------------------------------------------
# One validator per component. Each returns the sizes a kernel launcher needs, so that a
# level never re-derives them (and never disagrees with the check about what they are).
# ---------------------------------------------------------------------------------------

def validate_attention(q, k, v, causal=False, scale=None) -> dict:
    c = "attention"
    _tensors(c, {"q": q, "k": k, "v": v})
    _rank(c, "q", q, 4, "(B, H, Nq, D)")
    _rank(c, "k", k, 4, "(B, H, Nk, D)")
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    _shape(c, "k", k, (B, H, Nk, D), "(B, H, Nk, D) matching q's B, H, D")
    _shape(c, "v", v, (B, H, Nk, D), "(B, H, Nk, D) matching k")
    if min(B, H, Nq, Nk, D) == 0:
        _fail(c, "q", "non-empty in every dimension", _describe(q))
    _flag(c, "causal", causal)
    if causal and Nq != Nk:
        _fail(c, "k", f"of the same length as q when causal=True (Nk == Nq == {Nq})", _describe(k))
    _number(c, "scale", scale, low=0, low_open=True, allow_none=True)
    return dict(B=B, H=H, Nq=Nq, Nk=Nk, D=D,
                scale=float(scale) if scale is not None else D ** -0.5)


def validate_layer_norm(x, weight, bias, eps=1e-5) -> dict:
    c = "layer_norm"
    _tensors(c, {"x": x, "weight": weight, "bias": bias})
    if x.dim() < 1 or x.shape[-1] == 0 or x.numel() == 0:
        _fail(c, "x", "a non-empty tensor of shape (..., N)", _describe(x))
    N = x.shape[-1]
    _shape(c, "weight", weight, (N,), "(N,) with N = x.shape[-1]")
    _shape(c, "bias", bias, (N,), "(N,) with N = x.shape[-1]")
    _number(c, "eps", eps, low=0, low_open=True)
    return dict(M=x.numel() // N, N=N)


def validate_mlp(x, w1, b1, w2, b2) -> dict:
    c = "mlp"
    _tensors(c, {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2})
    if x.dim() < 1 or x.numel() == 0:
        _fail(c, "x", "a non-empty tensor of shape (..., in_features)", _describe(x))
    _rank(c, "w1", w1, 2, "(hidden, in_features), as nn.Linear.weight")
    _rank(c, "w2", w2, 2, "(out_features, hidden), as nn.Linear.weight")
    K, Hd, O = x.shape[-1], w1.shape[0], w2.shape[0]
    _shape(c, "w1", w1, (Hd, K), "(hidden, in_features) with in_features = x.shape[-1]")
    _shape(c, "b1", b1, (Hd,), "(hidden,) with hidden = w1.shape[0]")
    _shape(c, "w2", w2, (O, Hd), "(out_features, hidden) with hidden = w1.shape[0]")
    _shape(c, "b2", b2, (O,), "(out_features,) with out_features = w2.shape[0]")
    if min(K, Hd, O) == 0:
        _fail(c, "w1", "non-empty", _describe(w1))
    return dict(M=x.numel() // K, K=K, hidden=Hd, N=O)


def validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh) -> dict:
    c = "lstm"
    _tensors(c, {"x": x, "h0": h0, "c0": c0, "w_ih": w_ih, "w_hh": w_hh, "b_ih": b_ih, "b_hh": b_hh})
    _rank(c, "x", x, 3, "(B, T, input_size) (batch_first)")
    B, T, I = x.shape
    if min(B, T, I) == 0:
        _fail(c, "x", "non-empty in every dimension", _describe(x))
    _rank(c, "w_hh", w_hh, 2, "(4*hidden, hidden), as nn.LSTM.weight_hh_l0")
    if w_hh.shape[0] % 4 or w_hh.shape[0] // 4 != w_hh.shape[1] or w_hh.shape[1] == 0:
        _fail(c, "w_hh", "of shape (4*hidden, hidden), gates stacked i, f, g, o", _describe(w_hh))
    Hd = w_hh.shape[1]
    _shape(c, "w_ih", w_ih, (4 * Hd, I), "(4*hidden, input_size) with input_size = x.shape[-1]")
    _shape(c, "b_ih", b_ih, (4 * Hd,), "(4*hidden,)")
    _shape(c, "b_hh", b_hh, (4 * Hd,), "(4*hidden,)")
    # Like nn.LSTM for a single layer, the initial state carries a leading layer axis of 1.
    _shape(c, "h0", h0, (1, B, Hd), "(1, B, hidden) as nn.LSTM's h_0")
    _shape(c, "c0", c0, (1, B, Hd), "(1, B, hidden) as nn.LSTM's c_0")
    return dict(B=B, T=T, I=I, H=Hd)


def validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                     stride=1, padding=0, eps=1e-5, momentum=0.1, training=False) -> dict:
    c = "conv_bn"
    named = {"x": x, "conv_weight": conv_weight, "bn_weight": bn_weight, "bn_bias": bn_bias,
             "running_mean": running_mean, "running_var": running_var}
    if conv_bias is not None:
        named["conv_bias"] = conv_bias
    _tensors(c, named)
    _rank(c, "x", x, 4, "(N, C_in, H, W)")
    _rank(c, "conv_weight", conv_weight, 4, "(C_out, C_in, kH, kW), as nn.Conv2d.weight")
    Nb, Cin, Hh, Ww = x.shape
    Cout, _, kH, kW = conv_weight.shape
    _shape(c, "conv_weight", conv_weight, (Cout, Cin, kH, kW),
           "(C_out, C_in, kH, kW) with C_in = x.shape[1] (groups are not supported)")
    if min(Nb, Cin, Hh, Ww, Cout, kH, kW) == 0:
        _fail(c, "x", "non-empty, with a non-empty conv_weight", _describe(x))
    for name, t in (("conv_bias", conv_bias), ("bn_weight", bn_weight), ("bn_bias", bn_bias),
                    ("running_mean", running_mean), ("running_var", running_var)):
        if t is not None:
            _shape(c, name, t, (Cout,), "(C_out,) with C_out = conv_weight.shape[0]")
    sh, sw = _int_pair(c, "stride", stride, 1)
    ph, pw = _int_pair(c, "padding", padding, 0)
    Ho = (Hh + 2 * ph - kH) // sh + 1
    Wo = (Ww + 2 * pw - kW) // sw + 1
    if Hh + 2 * ph < kH or Ww + 2 * pw < kW:
        _fail(c, "x", f"at least the kernel size ({kH}, {kW}) once padded by {(ph, pw)}", _describe(x))
    _number(c, "eps", eps, low=0, low_open=True)
    _number(c, "momentum", momentum, low=0, high=1)
    _flag(c, "training", training)
    if training and Nb * Ho * Wo < 2:
        # BatchNorm2d refuses this too: the unbiased running variance divides by n - 1.
        _fail(c, "x", "large enough for batch statistics in training mode (N*H_out*W_out >= 2)",
              _describe(x))
    stats = {"running_mean": running_mean, "running_var": running_var}
    for name, t in stats.items():
        if t.requires_grad:
            # torch's batch_norm refuses it too ("not differentiable with respect to
            # argument 'running_mean'"): the statistics are data, never parameters, and a
            # level would otherwise silently differ (one differentiates, another drops it).
            _fail(c, name, "a buffer that does not require grad (running statistics are not "
                  "differentiable)", f"{_describe(t)} with requires_grad=True")
    # Inside a torch.compile trace the overlap test (data pointers, storage offsets) cannot
    # be traced: every call would break the graph and recompile. The eager call of the same
    # arguments checks it; a compiled model checks it on its first, eager-validated layers.
    if training and not torch.compiler.is_compiling():
        _writable_buffers(c, stats, named)
    return dict(N=Nb, C_in=Cin, H=Hh, W=Ww, C_out=Cout, kH=kH, kW=kW, stride=(sh, sw),
                padding=(ph, pw), H_out=Ho, W_out=Wo)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b have an element in common. Exact for two 1-D views of one dtype (what
    running statistics are: two interleaved views of one buffer do not overlap); for any
    other pair, whether their byte ranges intersect (it may say yes for interleaved views)."""
    if a.device != b.device or a.device.type == "meta" or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    if a.dim() == 1 and b.dim() == 1 and a.dtype == b.dtype:
        def offsets(t):
            return {t.storage_offset() + i * t.stride(0) for i in range(t.shape[0])}
        return not offsets(a).isdisjoint(offsets(b))

    def byte_range(t):
        start = t.storage_offset() * t.element_size()
        return start, start + (span(t) + 1) * t.element_size()
    (a0, a1), (b0, b1) = byte_range(a), byte_range(b)
    return a0 < b1 and b0 < a1


def _writable_buffers(component: str, buffers: dict, named: dict):
    """Buffers a call updates in place (training-mode running statistics) must be writable
    element by element, and written by this call only through themselves."""
    for name, t in buffers.items():
        if t.numel() > 1 and t.stride(0) == 0:
            # an expanded view: every channel's statistic is one memory location
            _fail(component, name, "a buffer with one memory location per element (it is "
                  "updated in place)", f"{_describe(t)} with strides {tuple(t.stride())} "
                  f"(an expanded view: clone() it)")
        if t.is_inference() and not torch.is_inference_mode_enabled():
            _fail(component, name, "a buffer that can be updated in place here (it was created "
                  "under torch.inference_mode, and is read-only outside it)",
                  f"{_describe(t)} made in inference mode")
        for other, u in named.items():
            if other != name and _shares_memory(t, u):
                _fail(component, name, f"a buffer sharing no memory with '{other}' (it is updated "
                      f"in place, and '{other}' would change with it)",
                      f"{_describe(t)} overlapping '{other}'")


VALIDATORS = {
    "attention": validate_attention,
    "layer_norm": validate_layer_norm,
    "mlp": validate_mlp,
    "lstm": validate_lstm,
    "conv_bn": validate_conv_bn,
}
