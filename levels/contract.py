"""The contract every level implements, and the validators every level calls first.

One signature per component, identical at all five levels:

    attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None)                    rope: (cos, sin) or (cos, sin, interleaved)
    layer_norm(x, weight, bias, eps=1e-5)
    rms_norm(x, weight, eps=1e-6)
    mlp(x, w1, b1, w2, b2)
    swiglu_mlp(x, w_gate, w_up, w_down)                 Llama's MLP: down(silu(gate) * up)
    lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)            -> (output, (h_T, c_T))
    conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False)
    rope(x, cos, sin, interleaved=False)
    newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7)
                                                       Muon's orthogonalization of G (rows, cols)
                                                       or of each G[i] of (batch, rows, cols);
                                                       forward only

Validation lives here, once, so that a wrong input fails the same way at every level
and *before* any kernel runs: a Triton or CUDA kernel that receives a bad shape does
not raise, it reads out of bounds and returns garbage. Every error names the component,
the argument, what was expected and what was given.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import threading

import torch

COMPONENTS = ("attention", "layer_norm", "mlp", "lstm", "conv_bn", "rms_norm", "rope",
              "swiglu_mlp", "newton_schulz")

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


def _tensors(component: str, named: dict[str, torch.Tensor], float32_group: tuple = (),
             why: str = "") -> torch.Tensor:
    """Type, dtype and device checks shared by all components; returns the first tensor.
    One dtype for every argument, except `float32_group`: those share one dtype of their own,
    the first tensor's or float32 beside a 16-bit first tensor (`why` says whose rule that is)."""
    first_name, first = None, None
    group_name, group = None, None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            _fail(component, name, "a torch.Tensor", type(t).__name__, TypeError)
        if t.dtype not in FLOAT_DTYPES:
            _fail(component, name, "a floating-point tensor (float16, bfloat16, float32 or float64)",
                  _describe(t), TypeError)
        if first is None:
            first_name, first = name, t
            continue
        if name in float32_group:
            if group is None:
                group_name, group = name, t
            elif t.dtype != group.dtype:
                _fail(component, name, f"of dtype {group.dtype} like '{group_name}' ({why})",
                      _describe(t), TypeError)
            mixed = first.dtype in (torch.float16, torch.bfloat16) and t.dtype == torch.float32
            if t.dtype != first.dtype and not mixed:
                _fail(component, name, f"of dtype {first.dtype} like '{first_name}', or float32 "
                      f"beside a 16-bit '{first_name}' ({why})", _describe(t), TypeError)
        elif t.dtype != first.dtype:
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


def _agreed(sizes: list[int]) -> int:
    """The size most of the tensors that carry it have (a tie: the first's, the tensor that
    defines it). A mismatch is then reported on the odd one out, against the size the others
    imply, never on the tensors that agree with each other against a size derived from it."""
    return max(sizes, key=sizes.count)


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

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
MAX_HEAD_DIM = 256  # the largest head size Levels 4 and 5 take (padded inside to a power of two)


def validate_attention(q, k, v, causal=False, scale=None, causal_alignment="top_left",
                       kv_lens=None, rope=None) -> dict:
    """q (B, H, Nq, D); k, v (B, H_kv, Nk, D) with H_kv dividing H (grouped-query attention:
    query head h reads key/value head h // (H // H_kv); H_kv = 1 is multi-query attention).

    causal_alignment says where the causal diagonal sits when Nq != Nk: "top_left" (query i
    sees keys j <= i, as PyTorch's is_causal) or "bottom_right" (j <= i + L - Nq with L the
    number of keys: the last query sees every key, as decoding with a KV cache needs). The
    two agree when Nq == Nk. kv_lens: None, or a (B,) int32/int64 tensor on q's device:
    batch element b has kv_lens[b] valid keys (key j is seen only if j < kv_lens[b]; a value
    outside [0, Nk] counts as the nearest end of that range: a validator reads no values).
    With kv_lens, bottom_right aligns to each element's own length. A query that sees no key
    at all (a length of 0, or bottom_right with more queries than keys) outputs 0 and gets
    zero gradients, as PyTorch's SDPA does for a fully masked row. Empty tensors (B, Nq or
    Nk of 0) are accepted, as PyTorch accepts them.

    rope: None, or rotary position embeddings applied to q and k before the scores, as
    `(cos, sin)` or `(cos, sin, interleaved)`: the tables `rope` takes, (P, D/2) in q's dtype
    and device, any strides, not requiring grad; pairs (i, i + D/2), or (2i, 2i + 1) with
    interleaved=True. Keys sit at positions 0..Nk-1, queries at i + off, off = Nk - Nq when
    causal_alignment is "bottom_right" (the queries are the last Nq positions: decoding), else
    0, whether causal or not, and with kv_lens too (the positions follow Nk, not each
    element's length); so P >= max(Nk, Nq + off). The result is attention(rope(q), rope(k), v); v is never
    rotated, and the gradients of q and k are those of the rotated tensors rotated back. The
    verdict carries rope_cos, rope_sin, rope_interleaved and rope_offset (None, None, False
    and 0 without rope)."""
    c = "attention"
    _tensors(c, {"q": q, "k": k, "v": v})
    _rank(c, "q", q, 4, "(B, H, Nq, D)")
    _rank(c, "k", k, 4, "(B, H_kv, Nk, D)")
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _shape(c, "k", k, (B, Hkv, Nk, D), "(B, H_kv, Nk, D) matching q's B and D")
    _shape(c, "v", v, (B, Hkv, Nk, D), "(B, H_kv, Nk, D) matching k")
    if H == 0 or D == 0:
        _fail(c, "q", "of at least one head (H >= 1) and a head dimension D >= 1", _describe(q))
    if Hkv == 0 or H % Hkv:
        _fail(c, "k", f"of H_kv heads with H_kv dividing q's H = {H} (grouped-query attention: "
              f"H_kv = H for multi-head, 1 for multi-query)", _describe(k))
    _flag(c, "causal", causal)
    if not isinstance(causal_alignment, str) or causal_alignment not in CAUSAL_ALIGNMENTS:
        _fail(c, "causal_alignment", f"one of {', '.join(map(repr, CAUSAL_ALIGNMENTS))}",
              repr(causal_alignment), TypeError if not isinstance(causal_alignment, str) else ValueError)
    if kv_lens is not None:
        if not isinstance(kv_lens, torch.Tensor):
            _fail(c, "kv_lens", "None or a torch.Tensor of shape (B,)", type(kv_lens).__name__,
                  TypeError)
        if kv_lens.dtype not in (torch.int32, torch.int64):
            _fail(c, "kv_lens", "an int32 or int64 tensor (the number of valid keys per batch "
                  "element)", _describe(kv_lens), TypeError)
        _shape(c, "kv_lens", kv_lens, (B,), "(B,) with B = q.shape[0]")
        if kv_lens.device != q.device:
            _fail(c, "kv_lens", f"on device {q.device} like 'q'", _describe(kv_lens))
        if kv_lens.requires_grad:
            _fail(c, "kv_lens", "a tensor that does not require grad", _describe(kv_lens))
    _number(c, "scale", scale, low=0, low_open=True, allow_none=True)
    cos, sin, interleaved, offset = _attention_rope(q, Nq, Nk, D, causal_alignment, rope)
    return dict(B=B, H=H, H_kv=Hkv, group=H // Hkv, Nq=Nq, Nk=Nk, D=D,
                bottom_right=bool(causal) and causal_alignment == "bottom_right",
                scale=float(scale) if scale is not None else D ** -0.5,
                rope_cos=cos, rope_sin=sin, rope_interleaved=interleaved, rope_offset=offset)


def _attention_rope(q, Nq: int, Nk: int, D: int, causal_alignment: str, rope) -> tuple:
    """attention's `rope` argument checked: (cos, sin, interleaved, offset), or
    (None, None, False, 0) without it. The tables obey the rope component's rules (one angle
    per pair, data not parameters), but may hold more positions than the call uses: a slice
    of a table precomputed for the longest context is the common case."""
    c = "attention"
    if rope is None:
        return None, None, False, 0
    if not isinstance(rope, (tuple, list)) or len(rope) not in (2, 3):
        _fail(c, "rope", "None, (cos, sin) or (cos, sin, interleaved)",
              f"{type(rope).__name__} {rope!r}" if not isinstance(rope, (tuple, list)) else
              f"a {type(rope).__name__} of {len(rope)} items", TypeError)
    cos, sin = rope[0], rope[1]
    interleaved = rope[2] if len(rope) == 3 else False
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            _fail(c, "rope", f"(cos, sin[, interleaved]) with {name} a torch.Tensor",
                  f"{name} of type {type(t).__name__}", TypeError)
        if t.dtype != q.dtype:
            _fail(c, "rope", f"tables of q's dtype {q.dtype} (the rotation rounds to it, as "
                  f"rope does)", f"{name}: {_describe(t)}", TypeError)
        if t.device != q.device:
            _fail(c, "rope", f"tables on q's device {q.device}", f"{name}: {_describe(t)}")
    if not isinstance(interleaved, bool):
        _fail(c, "rope", "(cos, sin, interleaved) with interleaved a bool",
              f"interleaved = {type(interleaved).__name__} {interleaved!r}", TypeError)
    if D % 2:
        _fail(c, "rope", "given only with an even head dimension D (rotary embeddings turn pairs "
              "of features)", f"q: {_describe(q)}")
    offset = Nk - Nq if causal_alignment == "bottom_right" else 0
    if offset < 0:
        _fail(c, "rope", "given with causal_alignment='bottom_right' only where Nq <= Nk (the "
              "queries are the last Nq of the Nk positions)", f"Nq = {Nq} queries, Nk = {Nk} keys")
    positions = max(Nk, Nq + offset)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[1] != D // 2:
            _fail(c, "rope", f"tables of shape (P, D/2) = (P, {D // 2}), one angle per position "
                  f"and pair of q's D = {D}", f"{name}: {_describe(t)}")
        if t.shape[0] < positions:
            _fail(c, "rope", f"tables of at least {positions} positions (keys at 0..{Nk - 1}, "
                  f"queries at {offset}..{offset + Nq - 1})", f"{name}: {_describe(t)}")
        if t.requires_grad:
            _fail(c, "rope", "tables that do not require grad (attention differentiates q, k "
                  "and v only; build the tables under torch.no_grad() or pass .detach())",
                  f"{name}: {_describe(t)} with requires_grad=True")
    return cos, sin, interleaved, offset


def validate_layer_norm(x, weight, bias, eps=1e-5) -> dict:
    c = "layer_norm"
    _tensors(c, {"x": x, "weight": weight, "bias": bias})
    # No rows at all (a batch of 0) is fine, as for F.layer_norm: an empty y, zero gradients
    # of weight and bias. Rows of no element are not: there is nothing to normalize.
    if x.dim() < 1 or x.shape[-1] == 0:
        _fail(c, "x", "a tensor of shape (..., N) with N >= 1", _describe(x))
    N = x.shape[-1]
    lengths = [N] + [t.shape[0] for t in (weight, bias) if t.dim() == 1]
    if _agreed(lengths) != N:  # weight and bias agree, x does not: x is the odd one out
        _fail(c, "x", f"of shape (..., N) with N = {_agreed(lengths)}, the length of weight and bias",
              _describe(x))
    _shape(c, "weight", weight, (N,), "(N,) with N = x.shape[-1]")
    _shape(c, "bias", bias, (N,), "(N,) with N = x.shape[-1]")
    _number(c, "eps", eps, low=0, low_open=True)
    return dict(M=x.numel() // N, N=N)


def validate_rms_norm(x, weight, eps=1e-6) -> dict:
    c = "rms_norm"
    _tensors(c, {"x": x, "weight": weight})
    # A batch of 0 rows is computed, as F.rms_norm does (an empty y, a zero weight gradient);
    # rows of no element are not: there is nothing to normalize.
    if x.dim() < 1 or x.shape[-1] == 0:
        _fail(c, "x", "a tensor of shape (..., N) with N >= 1", _describe(x))
    N = x.shape[-1]
    if weight.dim() == 1 and weight.shape[0] != N:  # one length each: x's defines N
        _fail(c, "weight", f"of shape (N,) with N = x.shape[-1] = {N}", _describe(weight))
    _shape(c, "weight", weight, (N,), "(N,) with N = x.shape[-1]")
    _number(c, "eps", eps, low=0, low_open=True)
    return dict(M=x.numel() // N, N=N)


def validate_mlp(x, w1, b1, w2, b2) -> dict:
    c = "mlp"
    _tensors(c, {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2})
    # A batch of 0 rows is computed, as F.linear does (an empty output, zero weight and bias
    # gradients); layers of no width are not (in_features, hidden or out_features of 0).
    if x.dim() < 1:
        _fail(c, "x", "a tensor of shape (..., in_features)", _describe(x))
    _rank(c, "w1", w1, 2, "(hidden, in_features), as nn.Linear.weight")
    _rank(c, "w2", w2, 2, "(out_features, hidden), as nn.Linear.weight")
    # The hidden size as most of w1, b1 and w2 have it: a transposed w1 is then reported
    # against the shape the others imply, not one derived from itself.
    K, O = x.shape[-1], w2.shape[0]
    sizes = [w1.shape[0], w2.shape[1]] + ([b1.shape[0]] if b1.dim() == 1 else [])
    Hd = max(sizes, key=sizes.count)
    if tuple(w1.shape) == (K, Hd) and K != Hd:
        _fail(c, "w1", f"of shape (hidden, in_features) = {(Hd, K)}, as nn.Linear.weight stores it "
              f"(it looks transposed: pass w1.t(), or the linear layer's .weight)", _describe(w1))
    _shape(c, "w1", w1, (Hd, K), "(hidden, in_features) with in_features = x.shape[-1]")
    _shape(c, "b1", b1, (Hd,), "(hidden,) with hidden = w1.shape[0]")
    _shape(c, "w2", w2, (O, Hd), "(out_features, hidden) with hidden = w1.shape[0]")
    _shape(c, "b2", b2, (O,), "(out_features,) with out_features = w2.shape[0]")
    if min(K, Hd, O) == 0:
        _fail(c, "w1", "non-empty", _describe(w1))
    return dict(M=x.numel() // K, K=K, hidden=Hd, N=O)


def validate_swiglu_mlp(x, w_gate, w_up, w_down) -> dict:
    c = "swiglu_mlp"
    _tensors(c, {"x": x, "w_gate": w_gate, "w_up": w_up, "w_down": w_down})
    # A batch of 0 rows is computed, as F.linear does (an empty output, zero weight
    # gradients); layers of no width are not.
    if x.dim() < 1:
        _fail(c, "x", "a tensor of shape (..., in_features)", _describe(x))
    for name, t, layout in (("w_gate", w_gate, "(hidden, in_features)"),
                            ("w_up", w_up, "(hidden, in_features)"),
                            ("w_down", w_down, "(out_features, hidden)")):
        _rank(c, name, t, 2, layout + ", as nn.Linear.weight")
    # in_features and hidden as most of the tensors that carry them have them: the one
    # argument that disagrees is reported against the sizes the others imply.
    K = _agreed([x.shape[-1], w_gate.shape[1], w_up.shape[1]])
    if x.shape[-1] != K:
        _fail(c, "x", f"of shape (..., in_features) with in_features = {K}, as w_gate and w_up "
              f"have it", _describe(x))
    Hd = _agreed([w_gate.shape[0], w_up.shape[0], w_down.shape[1]])
    O = w_down.shape[0]
    for name, t in (("w_gate", w_gate), ("w_up", w_up)):
        if tuple(t.shape) == (K, Hd) and K != Hd:
            _fail(c, name, f"of shape (hidden, in_features) = {(Hd, K)}, as nn.Linear.weight stores "
                  f"it (it looks transposed: pass {name}.t(), or the linear layer's .weight)",
                  _describe(t))
        _shape(c, name, t, (Hd, K), "(hidden, in_features) (hidden: as the other weights "
               "have it; in_features: x.shape[-1])")
    _shape(c, "w_down", w_down, (O, Hd), "(out_features, hidden) (hidden: as w_gate and w_up "
           "have it)")
    if min(K, Hd, O) == 0:
        _fail(c, "w_gate" if min(K, Hd) == 0 else "w_down", "non-empty",
              _describe(w_gate if min(K, Hd) == 0 else w_down))
    return dict(M=x.numel() // K, K=K, hidden=Hd, N=O)


def validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh) -> dict:
    c = "lstm"
    _tensors(c, {"x": x, "h0": h0, "c0": c0, "w_ih": w_ih, "w_hh": w_hh, "b_ih": b_ih, "b_hh": b_hh})
    _rank(c, "x", x, 3, "(B, T, input_size) (batch_first)")
    B, T, I = x.shape
    # A batch of 0 sequences is computed, as nn.LSTM does (empty outputs and final states,
    # zero weight gradients); no time steps is refused, as nn.LSTM refuses it ("Expected
    # sequence length to be larger than 0"), and so are inputs of no feature.
    if T == 0 or I == 0:
        _fail(c, "x", "of shape (B, T, input_size) with T >= 1 time steps (as nn.LSTM) and "
              "input_size >= 1", _describe(x))
    _rank(c, "w_hh", w_hh, 2, "(4*hidden, hidden), as nn.LSTM.weight_hh_l0")
    if w_hh.shape[0] % 4 or w_hh.shape[0] // 4 != w_hh.shape[1] or w_hh.shape[1] == 0:
        _fail(c, "w_hh", "of shape (4*hidden, hidden), gates stacked i, f, g, o", _describe(w_hh))
    # hidden and B as most of the tensors that carry them have them (w_hh and x first)
    hiddens = [w_hh.shape[1]] + [t.shape[0] // 4 for t in (w_ih, b_ih, b_hh)
                                 if t.dim() >= 1 and t.shape[0] % 4 == 0]
    hiddens += [t.shape[-1] for t in (h0, c0) if t.dim() == 3]
    Hd = _agreed(hiddens)
    if Hd != w_hh.shape[1]:
        _fail(c, "w_hh", f"of shape (4*hidden, hidden) = {(4 * Hd, Hd)}, with hidden = {Hd} as w_ih, "
              f"the biases, h0 and c0 have it", _describe(w_hh))
    batches = [B] + [t.shape[1] for t in (h0, c0) if t.dim() == 3]
    if _agreed(batches) != B:
        _fail(c, "x", f"of shape (B, T, input_size) with B = {_agreed(batches)} as h0 and c0 have it "
              f"(batch_first)", _describe(x))
    _shape(c, "w_ih", w_ih, (4 * Hd, I), "(4*hidden, input_size) with input_size = x.shape[-1]")
    _shape(c, "b_ih", b_ih, (4 * Hd,), "(4*hidden,)")
    _shape(c, "b_hh", b_hh, (4 * Hd,), "(4*hidden,)")
    # Like nn.LSTM for a single layer, the initial state carries a leading layer axis of 1.
    _shape(c, "h0", h0, (1, B, Hd), "(1, B, hidden) as nn.LSTM's h_0")
    _shape(c, "c0", c0, (1, B, Hd), "(1, B, hidden) as nn.LSTM's c_0")
    return dict(B=B, T=T, I=I, H=Hd)


# Mixed precision as nn.BatchNorm2d under torch.autocast: these may be float32 beside a
# 16-bit x (the normalization is computed in float32 at every level).
BATCH_NORM_TENSORS = ("bn_weight", "bn_bias", "running_mean", "running_var")


def validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                     stride=1, padding=0, eps=1e-5, momentum=0.1, training=False) -> dict:
    c = "conv_bn"
    named = {"x": x, "conv_weight": conv_weight, "bn_weight": bn_weight, "bn_bias": bn_bias,
             "running_mean": running_mean, "running_var": running_var}
    if conv_bias is not None:
        named["conv_bias"] = conv_bias
    _tensors(c, named, BATCH_NORM_TENSORS, "BatchNorm's weights and running statistics share "
             "one dtype: x's, or float32 as nn.BatchNorm2d keeps them under torch.autocast")
    _rank(c, "x", x, 4, "(N, C_in, H, W)")
    _rank(c, "conv_weight", conv_weight, 4, "(C_out, C_in, kH, kW), as nn.Conv2d.weight")
    Nb, Cin, Hh, Ww = x.shape
    Cout, _, kH, kW = conv_weight.shape
    _shape(c, "conv_weight", conv_weight, (Cout, Cin, kH, kW),
           "(C_out, C_in, kH, kW) with C_in = x.shape[1] (groups are not supported)")
    # A batch of 0 images is computed, as F.conv2d and F.batch_norm do, in both modes: an
    # empty output, zero parameter gradients, running statistics left as they are (torch's
    # batch_norm returns before it updates them). Channels or images of no pixel are not.
    if min(Cin, Hh, Ww, Cout, kH, kW) == 0:
        _fail(c, "x", "of shape (N, C_in, H, W) with C_in, H, W >= 1, with a conv_weight of no "
              "empty dimension", _describe(x))
    channels = [Cout] + [t.shape[0] for t in (conv_bias, bn_weight, bn_bias, running_mean, running_var)
                         if t is not None and t.dim() == 1]
    if _agreed(channels) != Cout:  # the per-channel vectors agree, conv_weight does not
        _fail(c, "conv_weight", f"of shape (C_out, C_in, kH, kW) = {(_agreed(channels), Cin, kH, kW)}, "
              f"with C_out the length of its bias and of BatchNorm's weights and statistics",
              _describe(conv_weight))
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
    if training and Nb * Ho * Wo == 1:
        # BatchNorm2d refuses this too: the unbiased running variance divides by n - 1.
        # (No value at all, a batch of 0, torch computes: see above.)
        _fail(c, "x", "large enough for batch statistics in training mode (N*H_out*W_out >= 2, "
              "or N = 0)", _describe(x))
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


def validate_rope(x, cos, sin, interleaved=False) -> dict:
    """x (B, H, N, D) as attention takes q and k; cos and sin (N, D/2): one angle per position
    and pair, shared by every batch element and head. Pairs are (i, i + D/2) (half-split, as
    GPT-NeoX and HF Llama) or (2i, 2i + 1) (interleaved=True, as the RoPE paper and Meta's
    Llama). The tables are data, not parameters: rope differentiates x only."""
    c = "rope"
    _tensors(c, {"x": x, "cos": cos, "sin": sin})
    _rank(c, "x", x, 4, "(B, H, N, D), as attention's q and k")
    B, H, N, D = x.shape
    # No batch element, head or position (B, H or N of 0) is computed, as torch's element-
    # wise ops do: an empty result. A head dimension of 0 has no pair to rotate.
    if D % 2 or D == 0:
        _fail(c, "x", "of shape (B, H, N, D) with D even and >= 2 (rope rotates pairs of "
              "features)",
              _describe(x))
    _rank(c, "cos", cos, 2, "(N, D/2): one table for every batch element and head")
    _rank(c, "sin", sin, 2, "(N, D/2): one table for every batch element and head")
    lengths = [N] + [t.shape[0] for t in (cos, sin)]
    if _agreed(lengths) != N:  # cos and sin agree, x does not: x is the odd one out
        _fail(c, "x", f"of shape (B, H, N, D) with N = {_agreed(lengths)}, the length of cos and "
              f"sin", _describe(x))
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) == (N, D):
            _fail(c, name, f"of shape (N, D/2) = {(N, D // 2)}, one angle per pair (an HF-style "
                  f"(N, D) table repeats its halves: pass {name}[:, :D // 2])", _describe(t))
        if t.shape[0] == N and 0 < 2 * t.shape[1] < D:
            _fail(c, name, f"of shape (N, D/2) = {(N, D // 2)}: partial rotary embeddings "
                  f"(rotary_dim < D, GPT-NeoX's rotary_pct) are not supported; rotate "
                  f"x[..., :rotary_dim] and concatenate the rest", _describe(t))
        _shape(c, name, t, (N, D // 2), "(N, D/2) with N, D = x.shape[2], x.shape[3]")
        if t.requires_grad:
            _fail(c, name, "a table that does not require grad (rope differentiates x only; "
                  "build the tables under torch.no_grad() or pass .detach())",
                  f"{_describe(t)} with requires_grad=True")
    _flag(c, "interleaved", interleaved)
    return dict(B=B, H=H, N=N, D=D)


MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic (Muon, 2024)


def validate_newton_schulz(G, steps=5, coefficients=MUON_COEFFICIENTS, eps=1e-7) -> dict:
    """G (rows, cols): a 2-D matrix (Muon flattens a conv weight to (out, in*kh*kw) first),
    or (batch, rows, cols): a batch of same-shape matrices, each orthogonalized on its own
    (its own norm; the batch iterated on G.mT when rows > cols), what an optimizer step does
    to every parameter of one shape in one call. An empty batch (batch = 0) gives an empty
    result and launches nothing; an empty matrix (rows or cols 0) is refused.
    Returns X ~ U V^T of G's SVD (singular values pushed into Muon's band, about
    [0.68, 1.2]) by `steps` quintic iterations X <- aX + (bA + cA^2)X, A = XX^T, on
    X0 = G / (||G||_F + eps), run on G's transpose when rows > cols (so A is the smaller
    Gram matrix) and in G's dtype: Muon passes bfloat16.

    Forward only: Muon orthogonalizes gradients (momentum buffers) under no_grad, and no
    level differentiates it, so a G that requires grad is refused (a level that silently
    returned a result without a graph would drop the user's gradient)."""
    c = "newton_schulz"
    _tensors(c, {"G": G})
    if G.dim() not in (2, 3):
        _fail(c, "G", "2-D (rows, cols): one parameter's gradient as a matrix, or 3-D "
              "(batch, rows, cols): a batch of same-shape matrices", _describe(G))
    if G.shape[-2] == 0 or G.shape[-1] == 0:
        _fail(c, "G", "made of non-empty matrices (rows >= 1 and cols >= 1; only the batch "
              "may be 0)", _describe(G))
    if G.requires_grad:
        _fail(c, "G", "a tensor that does not require grad (Newton-Schulz has no backward: "
              "Muon runs it on gradients under torch.no_grad(); pass G.detach())",
              f"{_describe(G)} with requires_grad=True")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        _fail(c, "steps", "an int >= 0", f"{type(steps).__name__} {steps!r}",
              ValueError if isinstance(steps, int) and not isinstance(steps, bool) else TypeError)
    if not isinstance(coefficients, (tuple, list)) or len(coefficients) != 3:
        _fail(c, "coefficients", "a tuple (a, b, c) of three real numbers",
              repr(coefficients), TypeError)
    for name, value in zip(("coefficients[0]", "coefficients[1]", "coefficients[2]"), coefficients):
        _number(c, name, value)
    _number(c, "eps", eps, low=0, low_open=True)
    rows, cols = G.shape[-2:]
    batch = G.shape[0] if G.dim() == 3 else 1
    a, b, c_ = (float(v) for v in coefficients)
    return dict(batch=batch, M=min(rows, cols), N=max(rows, cols), transposed=rows > cols,
                steps=steps, a=a, b=b, c=c_, eps=float(eps))


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


# ---------------------------------------------------------------------------------------
# Validating once per argument signature
# ---------------------------------------------------------------------------------------
#
# A validator reads shapes, strides, dtypes, devices and flags, never values, so its verdict
# is the same for every call whose arguments agree on those: a training loop calls each
# layer with one signature thousands of times. Levels 4 and 5 therefore validate the first
# call of a signature (the contract's checks and their own) and keep the verdict, the sizes
# and their launch plan in a `Plans` table; later calls pay for the key alone (about a
# microsecond on a fast host, against 4-23 us for the validators and the level's checks on
# the H100's). A bad input is never stored: it raises before anything is kept, and its
# signature differs from every good one in something the validator looked at, so it
# raises again, with the same message, at every call (tests/test_validation_cache.py
# replays the whole bad-input catalogue on a warm table).

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_SCALARS = (int, float, bool, str, type(None))


def signature(args: tuple) -> tuple | None:
    """What a validator can see of `args`: each tensor's shape, strides, dtype, device,
    requires_grad and 16-byte alignment (a launch plan depends on it), every other argument
    by type and value, a tuple's items each as such (attention's rope=(cos, sin, flag)). None when a call must not be served from a table: while torch.compile
    or torch.export trace (the validator is traced instead, and guards do the caching), for
    tensor subclasses (fake and functional tensors have other rules), and for arguments that
    are not plain values (a list of strides, say). Inside `one_call`, a tensor's part is read
    once per call (see there)."""
    if torch.compiler.is_compiling():
        return None
    memo = _CALL.memo
    key = []
    for a in args:
        cls = a.__class__
        if cls in _PLAIN_TENSORS:
            key.append(_tensor_key(a, memo))
        elif cls in _SCALARS:
            key.append((cls, a))
        elif cls is tuple:  # attention's rope: (cos, sin[, interleaved])
            inner = []
            for b in a:
                if b.__class__ in _PLAIN_TENSORS:
                    inner.append(_tensor_key(b, memo))
                elif b.__class__ in _SCALARS:
                    inner.append((b.__class__, b))
                else:
                    return None
            key.append((cls, tuple(inner)))
        else:
            return None
    return tuple(key)


def _tensor_key(a: torch.Tensor, memo: dict | None) -> tuple:
    if memo is not None:
        seen = memo.get(id(a))
        if seen is not None and seen[0] is a:
            return seen[1]
    k = (a.shape, a.stride(), a.dtype, a.device, a.requires_grad, a.data_ptr() & 15)
    if memo is not None:
        memo[id(a)] = (a, k)  # the tensor held: its id cannot be reused during the call
    return k


class _Call(threading.local):
    memo = None


_CALL = _Call()


def one_call(fn):
    """Decorator for a level's function whose call computes the signature of the same
    tensors twice: Level 4 validates through `Plans` and then looks its launches up in the
    replay's table (triton_kernels/replay.py), each keyed by `signature`. Reading a tensor's
    shape, strides, dtype, device, requires_grad and address costs ~1.5 us on the 2-core CI
    machine, 20 us for conv_bn's twelve arguments, and a CNN's step makes nine such calls;
    with the table the two lookups took 24 us instead of 41 there (docs/levels.md has the
    whole CNN's host time before and after). Inside the call each tensor's part is read once
    and reused (kept by the tensor's identity, the tensor held so that its id cannot be
    reused); the table is dropped when the call returns, so a later call reads every tensor
    afresh: a tensor's metadata can change between calls (requires_grad_, resize_, set_), not
    within one, where only the level's own code runs between the two lookups. Thread-local:
    two threads' calls never share it."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        # Under torch.compile nothing is looked up (signature is None there), and Dynamo
        # would have to trace the thread-local: it stays out of the trace.
        if torch.compiler.is_compiling() or _CALL.memo is not None:  # or: the outer call's table
            return fn(*args, **kwargs)
        _CALL.memo = {}
        try:
            return fn(*args, **kwargs)
        finally:
            _CALL.memo = None
    return call


class Plans(dict):
    """signature -> what `build(*args)` returned for the first call with that signature.

    `build` validates (raising on a bad input, which stores nothing) and returns what the
    level needs on every call (sizes, the copies to make, tiles). `extra(*args)` names what
    else a verdict depends on that a signature does not hold (the addresses of buffers a call
    updates in place, whose aliasing the contract checks). The table starts over past
    `limit` signatures: a process that sees ever new shapes pays validation, never memory."""

    def __init__(self, build, extra=None, limit: int = 4096):
        super().__init__()
        self.build, self.extra, self.limit = build, extra, limit

    def __call__(self, *args):
        key = signature(args)
        if key is not None and self.extra is not None:
            key = (key, self.extra(*args))
        plan = self.get(key) if key is not None else None
        if plan is None:
            plan = self.build(*args)
            if key is not None:
                if len(self) >= self.limit:
                    self.clear()
                self[key] = plan
        return plan


def conv_bn_buffers(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                    stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    """`Plans.extra` for conv_bn: in training mode the running statistics are written in
    place, and the contract checks that they alias no other argument and are writable here
    (`_writable_buffers`): that depends on every tensor's address and on whether the buffers
    were made in inference mode, so those join the key. (Addresses, shapes and strides fix
    each tensor's byte range; two tensors' overlap is decided by their byte ranges alone.)

    Only the statistics' own addresses are keyed. Another argument can overlap them only
    inside their storage (`_shares_memory` decides by storage first), so its address joins
    the key only when it lies there, and otherwise `False` does. x is new memory every
    step, and under torch.autocast so is each cast weight: keyed by address, 14-16% of a
    CNN's calls under --amp missed the table on an H100 and validated again (the caching
    allocator does not return the same blocks every step once several models share it;
    reports/amp-host-path/)."""
    if not training:
        return None
    stats = (running_mean.untyped_storage().data_ptr(), running_var.untyped_storage().data_ptr())
    return (running_mean.data_ptr(), running_var.data_ptr(),
            tuple(t.data_ptr() if t.untyped_storage().data_ptr() in stats else False
                  for t in (x, conv_weight, conv_bias, bn_weight, bn_bias) if t is not None),
            running_mean.is_inference(), running_var.is_inference(),
            torch.is_inference_mode_enabled())


# ---------------------------------------------------------------------------------------
# Mixed precision: the same casts as torch's own operators under torch.autocast
# ---------------------------------------------------------------------------------------
#
# Under `torch.autocast(device_type, dtype)` torch casts an operator's floating-point
# arguments before it runs: matrix products and convolutions to the autocast dtype
# (F.linear, SDPA, F.conv2d, nn.LSTM), normalizations that need range to float32
# (F.layer_norm). A model of fp32 parameters then computes in bf16 or fp16 where that is
# safe. Our five functions are no torch operators, so autocast cannot see them: `autocasts`
# applies the rule of the torch operator each one replaces, before the contract sees the
# arguments, at every level alike (so the levels still compute one function, now of the
# cast arguments; autograd carries the gradients back through the casts to fp32 parameters).
# Inside the call autocast is off: the level's own torch ops see one dtype, as outside it.

LOW_PRECISION, FLOAT32 = "the autocast dtype", "float32"
AUTOCAST = {  # component -> (what its arguments are cast to, which arguments)
    # as F.scaled_dot_product_attention; rope's tables with q and k (as the rope component)
    "attention": (LOW_PRECISION, ("q", "k", "v", "rope")),
    "layer_norm": (FLOAT32, ("x", "weight", "bias")),  # as F.layer_norm
    "mlp": (LOW_PRECISION, ("x", "w1", "b1", "w2", "b2")),  # as F.linear
    "swiglu_mlp": (LOW_PRECISION, ("x", "w_gate", "w_up", "w_down")),  # as F.linear
    # as nn.LSTM (cuDNN's RNN on a GPU, oneDNN's on a CPU)
    "lstm": (LOW_PRECISION, ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")),
    # as F.conv2d; BatchNorm's weights and running statistics keep their dtype (float32), as
    # nn.BatchNorm2d's do under autocast: the contract takes them in float32 beside a
    # 16-bit x, and every level computes the normalization in float32
    "conv_bn": (LOW_PRECISION, ("x", "conv_weight", "conv_bias")),
    # as F.rms_norm under CUDA autocast from torch 2.12 (its fp32 list; CPU autocast leaves
    # rms_norm alone): one rule on every device, the one of the GPUs models train on
    "rms_norm": (FLOAT32, ("x", "weight")),
    "rope": (LOW_PRECISION, ("x", "cos", "sin")),  # q, k come from F.linear in that dtype
    "newton_schulz": (LOW_PRECISION, ("G",)),  # five iterations of torch.matmul
}


@functools.lru_cache(maxsize=None)
def _cast_positions(component: str) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument of `component` that autocast casts (AUTOCAST), in
    the contract's order (its validator's signature)."""
    order = tuple(inspect.signature(VALIDATORS[component]).parameters)
    names = AUTOCAST[component][1]
    return tuple((i, name) for i, name in enumerate(order) if name in names)


def autocast_dtype(component: str, device: torch.device) -> torch.dtype | None:
    """The dtype `component`'s arguments are cast to now on `device`; None if autocast is
    off there."""
    if not torch.is_autocast_enabled(device.type):
        return None
    target, _ = AUTOCAST[component]
    return torch.float32 if target == FLOAT32 else torch.get_autocast_dtype(device.type)


def _cast(value, dtype):
    """value in dtype if it is a floating-point tensor (or a tuple of them: attention's rope
    (cos, sin[, flag])); anything else as it is, for the contract to refuse by name."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, tuple):
        return tuple(_cast(v, dtype) for v in value)
    return value


def autocast_args(component: str, args: tuple, kwargs: dict) -> tuple[tuple, dict, str] | None:
    """(args, kwargs, device type) with the casts of AUTOCAST, or None when autocast is off for
    the device of the call's first tensor. Only floating-point tensors are cast (a bad argument
    stays what it was, for the contract to refuse by name). Only the arguments AUTOCAST names
    are looked at, by their positions in the contract (_cast_positions): a conv_bn call has 12
    arguments and 3 to cast, and a loop over all 12 cost 7.9 us of a 2-core CI machine's time
    per call (3-4 us now, most of it torch's own autocast queries)."""
    first = args[0] if args and isinstance(args[0], torch.Tensor) else next(
        (a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
    if first is None:
        return None
    dtype = autocast_dtype(component, first.device)
    if dtype is None:
        return None
    args = list(args)
    for i, name in _cast_positions(component):
        if i < len(args):
            args[i] = _cast(args[i], dtype)
        elif name in kwargs:
            kwargs = dict(kwargs)
            kwargs[name] = _cast(kwargs[name], dtype)
    return tuple(args), kwargs, first.device.type


def autocasts(component: str):
    """Decorator for a level's `component` function: under torch.autocast its arguments are
    cast as torch casts those of the operator it replaces (AUTOCAST), then the function runs
    with autocast off. Outside autocast it costs one check (a few hundred nanoseconds).

    Autocast is switched off for the call by its flag, not by `with torch.autocast(...,
    enabled=False)`: that context manager is Python and costs ~3 µs a call on a laptop core,
    a tenth of a whole Level 4 call's host time; the flag costs 0.3 µs. Under torch.compile
    the context manager stays (Dynamo traces it; it does not trace the flag's setter)."""
    def decorate(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if torch._C._is_any_autocast_enabled():
                cast = autocast_args(component, args, kwargs)
                if cast is not None:
                    args, kwargs, device_type = cast
                    if torch.compiler.is_compiling():
                        with torch.autocast(device_type, enabled=False):
                            return fn(*args, **kwargs)
                    torch.set_autocast_enabled(device_type, False)
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        torch.set_autocast_enabled(device_type, True)
            return fn(*args, **kwargs)
        call.autocast = AUTOCAST[component]
        return call
    return decorate


VALIDATORS = {
    "attention": validate_attention,
    "layer_norm": validate_layer_norm,
    "mlp": validate_mlp,
    "lstm": validate_lstm,
    "conv_bn": validate_conv_bn,
    "rms_norm": validate_rms_norm,
    "rope": validate_rope,
    "swiglu_mlp": validate_swiglu_mlp,
    "newton_schulz": validate_newton_schulz,
}
