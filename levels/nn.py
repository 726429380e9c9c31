"""nn.Module wrappers: the components as layers, at any level.

    layer = levels.nn.LSTM.from_torch(torch_lstm, level="native")
    y = layer(x)
    layer.level = "triton"          # same weights, next rung of the ladder
    levels.nn.set_level(model, 3)   # every levels.nn layer inside a model
    layer.level = "auto"            # each call: the fastest level that passes the harness
                                    # for its shapes, dtype and device (levels/auto.py)

Parameters are named and shaped like torch's own modules, so weights load from them:
`from_torch(...)` copies a torch module, and `load_state_dict` accepts its state_dict
(MultiheadAttention, LayerNorm, RMSNorm, LSTM directly; MLP and ConvBN as `fc1.*`/`fc2.*` and
`conv.*`/`bn.*`). The forward pass is one call to the component of the chosen level.

`cuda_graph(module, *example_args)` (levels/cuda_graph.py, re-exported here) captures a
module's call as a CUDA graph and returns a module that replays it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import AUTO
from . import get as _get_level
from . import resolve as _resolve


def _level_name(value) -> str:
    """A level's name, or "auto"; raises ValueError naming the choices."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    return _resolve(value).name


class _Leveled(nn.Module):
    component: str = ""

    def __init__(self, level="native"):
        super().__init__()
        self.level = level

    @property
    def level(self) -> str:
        return self._level

    @level.setter
    def level(self, value) -> None:
        self._level = _level_name(value)
        # Resolved here, once, not in forward: levels.get imports a module, which
        # torch.compile cannot trace (one graph break per layer of a compiled model).
        module = _get_level(self._level)
        self._call = getattr(module, self.component)
        load_kernels = getattr(module, "load_kernels", None)
        if load_kernels is not None:  # a level that imports its kernels lazily: now, not traced
            load_kernels(self.component)

    def _fn(self):
        return self._call

    def extra_repr(self) -> str:
        return f"level={self._level!r}"


def set_level(model: nn.Module, level) -> nn.Module:
    """Switch every levels.nn layer inside `model` to `level` (or "auto"); returns `model`."""
    name = _level_name(level)
    for m in model.modules():
        if isinstance(m, _Leveled):
            m.level = name
    return model


def _require(cond: bool, what: str, got) -> None:
    if not cond:
        raise ValueError(f"from_torch: expected {what}; got {got}")


class LayerNorm(_Leveled):
    component = "layer_norm"

    def __init__(self, normalized_shape: int, eps: float = 1e-5, level="native", device=None, dtype=None):
        super().__init__(level)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(normalized_shape, device=device, dtype=dtype))

    def forward(self, x):
        return self._fn()(x, self.weight, self.bias, self.eps)

    @classmethod
    def from_torch(cls, m: nn.LayerNorm, level="native") -> "LayerNorm":
        _require(len(m.normalized_shape) == 1 and m.elementwise_affine and m.bias is not None,
                 "nn.LayerNorm over one dimension with weight and bias", m)
        new = cls(m.normalized_shape[0], m.eps, level, m.weight.device, m.weight.dtype)
        new.load_state_dict(m.state_dict())
        return new


class RMSNorm(_Leveled):
    """RMSNorm over the last dimension, as torch.nn.RMSNorm (a `weight`, no bias)."""

    component = "rms_norm"

    def __init__(self, normalized_shape: int, eps: float | None = None, level="native",
                 device=None, dtype=None):
        super().__init__(level)
        self.eps = eps  # None: torch.finfo(x.dtype).eps at each call, as nn.RMSNorm
        self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))

    def forward(self, x):
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return self._fn()(x, self.weight, eps)

    @classmethod
    def from_torch(cls, m: nn.RMSNorm, level="native") -> "RMSNorm":
        _require(len(m.normalized_shape) == 1 and m.elementwise_affine,
                 "nn.RMSNorm over one dimension with a weight", m)
        new = cls(m.normalized_shape[0], m.eps, level, m.weight.device, m.weight.dtype)
        new.load_state_dict(m.state_dict())
        return new


class MLP(_Leveled):
    component = "mlp"

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 level="native", device=None, dtype=None):
        super().__init__(level)
        self.fc1 = nn.Linear(in_features, hidden_features, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden_features, out_features or in_features, device=device, dtype=dtype)

    def forward(self, x):
        return self._fn()(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)

    @classmethod
    def from_torch(cls, fc1: nn.Linear, fc2: nn.Linear, level="native") -> "MLP":
        """From the two linears of a Linear -> GELU -> Linear block."""
        _require(fc1.bias is not None and fc2.bias is not None, "two nn.Linear with biases", (fc1, fc2))
        new = cls(fc1.in_features, fc1.out_features, fc2.out_features, level, fc1.weight.device,
                  fc1.weight.dtype)
        new.fc1.load_state_dict(fc1.state_dict())
        new.fc2.load_state_dict(fc2.state_dict())
        return new


class SwiGLUMLP(_Leveled):
    """Llama's MLP: down(silu(gate(x)) * up(x)), three nn.Linear without biases, named as
    Hugging Face's LlamaMLP names them (gate_proj, up_proj, down_proj), so its state_dict loads."""

    component = "swiglu_mlp"

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 level="native", device=None, dtype=None):
        super().__init__(level)
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(in_features, hidden_features, **kw)
        self.up_proj = nn.Linear(in_features, hidden_features, **kw)
        self.down_proj = nn.Linear(hidden_features, out_features or in_features, **kw)

    def forward(self, x):
        return self._fn()(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)

    @classmethod
    def from_torch(cls, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear,
                   level="native") -> "SwiGLUMLP":
        """From the three bias-free linears of a SwiGLU block (LlamaMLP's)."""
        linears = (gate_proj, up_proj, down_proj)
        _require(all(m.bias is None for m in linears), "three nn.Linear without biases", linears)
        new = cls(gate_proj.in_features, gate_proj.out_features, down_proj.out_features, level,
                  gate_proj.weight.device, gate_proj.weight.dtype)
        for mine, theirs in zip((new.gate_proj, new.up_proj, new.down_proj), linears):
            mine.load_state_dict(theirs.state_dict())
        return new


class LSTM(_Leveled):
    """One layer, batch_first, parameters named as nn.LSTM's (weight_ih_l0, ...)."""

    component = "lstm"

    def __init__(self, input_size: int, hidden_size: int, level="native", device=None, dtype=None):
        super().__init__(level)
        self.input_size, self.hidden_size = input_size, hidden_size
        kw = dict(device=device, dtype=dtype)
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size, input_size, **kw))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size, hidden_size, **kw))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size, **kw))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size, **kw))
        bound = 1 / math.sqrt(hidden_size)  # nn.LSTM's initialization
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x, hx=None):
        if hx is None:
            zeros = x.new_zeros(1, x.shape[0], self.hidden_size) if x.dim() == 3 else None
            hx = (zeros, zeros)
        return self._fn()(x, hx[0], hx[1], self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0,
                          self.bias_hh_l0)

    @classmethod
    def from_torch(cls, m: nn.LSTM, level="native") -> "LSTM":
        _require(m.num_layers == 1 and not m.bidirectional and m.bias and m.proj_size == 0,
                 "a one-layer, one-direction nn.LSTM with biases and no projection", m)
        _require(m.batch_first, "nn.LSTM(batch_first=True) (levels.nn.LSTM is batch_first)", m)
        new = cls(m.input_size, m.hidden_size, level, m.weight_ih_l0.device, m.weight_ih_l0.dtype)
        new.load_state_dict(m.state_dict())
        return new


class MultiheadAttention(_Leveled):
    """Self/cross attention with input and output projections, batch_first, like
    nn.MultiheadAttention(batch_first=True) without dropout. The projections are plain
    F.linear at every level: the component under study is the attention core."""

    component = "attention"

    def __init__(self, model_dim: int, n_heads: int, bias: bool = True, level="native", device=None,
                 dtype=None):
        super().__init__(level)
        if model_dim % n_heads:
            raise ValueError(f"argument 'n_heads' must divide model_dim={model_dim}; got {n_heads}")
        self.model_dim, self.n_heads = model_dim, n_heads
        kw = dict(device=device, dtype=dtype)
        self.in_proj_weight = nn.Parameter(torch.empty(3 * model_dim, model_dim, **kw))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * model_dim, **kw)) if bias else None
        self.out_proj = nn.Linear(model_dim, model_dim, bias=bias, **kw)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def _heads(self, t):
        B, N, _ = t.shape
        return t.view(B, N, self.n_heads, self.model_dim // self.n_heads).transpose(1, 2)

    def _packed_qkv(self, x):
        """Self-attention: q, k and v from ONE GEMM against the whole in_proj_weight (as
        nn.MultiheadAttention does), returned as (B, H, N, D) views into its (B, N, 3, H, D)
        output: no copy. Three separate projections cost three GEMMs of a third of the width
        forward and backward, two extra adds of the input's gradient, and on a GPT step the
        host time of eight more operations per layer. Every level takes strided q, k and v
        (the contract); the unbind before the transposes makes the backward one `stack` of
        dq, dk and dv straight into the GEMM's gradient layout (unbinding after them would
        add a second copy)."""
        B, N, _ = x.shape
        qkv = nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.view(B, N, 3, self.n_heads, self.model_dim // self.n_heads).unbind(2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, query, key=None, value=None, causal: bool = False,
                causal_alignment: str = "top_left", kv_lens=None):
        """causal_alignment and kv_lens as the contract's attention takes them (levels.contract):
        where the causal diagonal sits when query and key lengths differ, and how many keys
        of each batch element are valid."""
        key = query if key is None else key
        value = key if value is None else value
        if key is query and value is query and query.dim() == 3:
            q, k, v = self._packed_qkv(query)
        else:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
            b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
            q = self._heads(nn.functional.linear(query, w_q, b_q))
            k = self._heads(nn.functional.linear(key, w_k, b_k))
            v = self._heads(nn.functional.linear(value, w_v, b_v))
        # the new arguments only where used: a level of yours written for (q, k, v, causal)
        # keeps working in the common case
        extra = {} if causal_alignment == "top_left" and kv_lens is None else dict(
            causal_alignment=causal_alignment, kv_lens=kv_lens)
        out = self._fn()(q, k, v, causal=causal, **extra)
        B, H, N, D = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, N, H * D))

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention, level="native") -> "MultiheadAttention":
        _require(m.batch_first and m._qkv_same_embed_dim and m.bias_k is None and not m.add_zero_attn
                 and m.dropout == 0.0,
                 "nn.MultiheadAttention(batch_first=True, dropout=0) without kdim/vdim, bias_k or "
                 "add_zero_attn", m)
        new = cls(m.embed_dim, m.num_heads, m.in_proj_bias is not None, level,
                  m.in_proj_weight.device, m.in_proj_weight.dtype)
        new.load_state_dict(m.state_dict())
        return new


class ConvBN(_Leveled):
    """Conv2d then BatchNorm2d. `conv` and `bn` hold the parameters and buffers (named as
    torch's, so their state_dicts load); the forward is one call to conv_bn at `level`,
    in training or eval mode as the module is."""

    component = "conv_bn"

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, eps: float = 1e-5, momentum: float = 0.1, level="native",
                 device=None, dtype=None):
        super().__init__(level)
        kw = dict(device=device, dtype=dtype)
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=bias, **kw)
        self.bn = nn.BatchNorm2d(out_channels, eps=eps, momentum=momentum, **kw)

    def forward(self, x):
        # Host time matters here: a CNN step calls this once per convolution. Each
        # `self.conv.weight` is two nn.Module.__getattr__ lookups, and `self.bn.num_batches_tracked
        # += 1` ends in nn.Module.__setattr__. Fetching the two submodules once and counting in
        # place (as nn.BatchNorm2d does) took the argument fetching and the count from 54 to
        # 21 us a call on the 2-core CI machine.
        conv, bn = self.conv, self.bn
        if self.training:
            bn.num_batches_tracked.add_(1)
        return self._fn()(x, conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean,
                          bn.running_var, stride=conv.stride, padding=conv.padding, eps=bn.eps,
                          momentum=bn.momentum, training=self.training)

    @classmethod
    def from_torch(cls, conv: nn.Conv2d, bn: nn.BatchNorm2d, level="native") -> "ConvBN":
        _require(conv.groups == 1 and conv.dilation == (1, 1) and conv.padding_mode == "zeros"
                 and isinstance(conv.padding, tuple),
                 "nn.Conv2d with groups=1, dilation=1 and numeric zero padding", conv)
        _require(bn.affine and bn.track_running_stats and bn.momentum is not None,
                 "nn.BatchNorm2d with affine=True, track_running_stats=True and a numeric momentum", bn)
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                  conv.bias is not None, bn.eps, bn.momentum, level, conv.weight.device,
                  conv.weight.dtype)
        new.conv.load_state_dict(conv.state_dict())
        new.bn.load_state_dict(bn.state_dict())
        new.train(bn.training)
        return new


class RotaryTables(nn.Module):
    """The cos and sin tables of rotary embeddings for head size `dim`: pair i of position n
    turned by n * base**(-2i/dim). Built from `inv_freq` (a buffer, not saved in a
    state_dict, as in HF transformers) for the positions a call asks for, and reused while
    the positions, dtype and device stay the same. No computation at any level, so not a
    leveled layer: `RotaryEmbedding` rotates q and k with its tables, and attention takes
    them fused (`attention(q, k, v, causal, rope=tables.rope(n, dtype, device))`, as
    levels.models.Llama does). interleaved=False pairs features (i, i + dim/2) as GPT-NeoX and
    HF Llama do; True pairs (2i, 2i + 1) as Meta's Llama."""

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False, device=None):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2:
            raise ValueError(f"argument 'dim' must be a positive even int (the head size); got {dim!r}")
        if not base > 1:
            raise ValueError(f"argument 'base' must be > 1; got {base!r}")
        self.dim, self.base, self.interleaved = dim, float(base), bool(interleaved)
        # in float64, then float32: base**(-2i/dim) itself is exact to float32's rounding
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        self.register_buffer("inv_freq", (self.base ** -exponents).float().to(device),
                             persistent=False)
        self._tables_key, self._tables = None, None

    def tables(self, n: int, offset: int, dtype: torch.dtype, device) -> tuple:
        """(cos, sin), each (n, dim/2) in `dtype`, for positions offset .. offset + n - 1.
        The angles are float32 products of the position and the frequency, as HF computes
        them, then rounded to `dtype` (the contract takes tables in x's dtype)."""
        compiling = torch.compiler.is_compiling()  # traced: the tables are the graph's, no cache
        # (and asked first: Dynamo breaks the graph on data_ptr(), which the cache key reads)
        key = None if compiling else (n, offset, dtype, torch.device(device), self.inv_freq.data_ptr())
        if compiling or key != self._tables_key:
            positions = torch.arange(offset, offset + n, device=device, dtype=torch.float32)
            angles = torch.outer(positions, self.inv_freq.to(device))
            tables = (angles.cos().to(dtype), angles.sin().to(dtype))
            if compiling:
                return tables
            self._tables, self._tables_key = tables, key
        return self._tables

    def rope(self, n: int, dtype: torch.dtype, device) -> tuple:
        """attention's rope= for n positions from 0: (cos, sin, interleaved). With queries
        after a cache (bottom-right), n is the number of keys: attention places the queries."""
        cos, sin = self.tables(n, 0, dtype, device)
        return cos, sin, self.interleaved

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}, interleaved={self.interleaved}"


class RotaryEmbedding(_Leveled):
    """Rotary position embeddings for q and k of shape (B, H, N, D), D = `dim`, with the
    tables of a `RotaryTables` (its arguments, attributes and `tables`), built for the
    positions of each call, `offset` onwards (decoding: the position of the first new
    token). q and k may have different head counts (grouped-query attention): one table
    serves both. To rotate inside attention instead (no rotated q and k in memory), pass
    attention `rope=` (see RotaryTables)."""

    component = "rope"

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False, level="native",
                 device=None):
        super().__init__(level)
        self.rotary = RotaryTables(dim, base, interleaved, device)
        self.dim, self.base, self.interleaved = dim, self.rotary.base, self.rotary.interleaved

    @property
    def inv_freq(self) -> torch.Tensor:
        return self.rotary.inv_freq

    def tables(self, n: int, offset: int, dtype: torch.dtype, device) -> tuple:
        return self.rotary.tables(n, offset, dtype, device)

    def forward(self, q, k, offset: int = 0):
        cos, sin = self.tables(q.shape[-2], offset, q.dtype, q.device)
        rope = self._fn()
        return rope(q, cos, sin, self.interleaved), rope(k, cos, sin, self.interleaved)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, base={self.base:g}, interleaved={self.interleaved}, "
                f"{super().extra_repr()}")


from .cuda_graph import GraphedModule, cuda_graph  # noqa: E402 - levels.nn.cuda_graph, after _Leveled

__all__ = ["ConvBN", "GraphedModule", "LSTM", "LayerNorm", "MLP", "MultiheadAttention", "RMSNorm",
           "RotaryEmbedding", "RotaryTables", "SwiGLUMLP", "cuda_graph", "set_level"]
