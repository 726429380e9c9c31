"""A Llama-style decoder built from levels.nn layers, and its plain-torch twin.

    tokens (B, T) -> token embedding
                  -> n_layers x [ x + attn(rms1(x)) ; x + swiglu(rms2(x)) ]      (pre-norm)
                  -> rms_f -> head (tied to the token embedding) -> logits (B, T, vocab)

    attn: q, k, v projections without biases (k and v with n_kv_heads heads: grouped-query
          attention), causal attention with rotary position embeddings of q and k fused in
          (attention's rope=), o projection
    swiglu: down(silu(gate(x)) * up(x))

What it has that the GPT has not, and why models moved to it (Llama 1-3, Mistral, Qwen2):
- RMSNorm: no mean to subtract, no bias: one reduction per row instead of two, the same
  training stability in practice.
- Rotary embeddings instead of learned positions: the position is a rotation of q and k, so
  a score q.k depends on the distance between the tokens alone, and no table of positions
  bounds the length the model can be run at.
- SwiGLU: a gated MLP (three matrices at 2/3 of the width keep the parameter count of a
  4x GELU MLP), measured better per FLOP in Shazeer's "GLU variants" paper.
- Grouped-query attention: n_heads query heads share n_kv_heads key/value heads, so the
  KV cache a decoder keeps shrinks by n_heads / n_kv_heads at almost no loss in quality.
No biases anywhere, and no dropout (as in the GPT: the levels must draw no random masks).

Components run at the level: rms_norm, attention (grouped-query, with rope=), swiglu_mlp. The
rotation is attention's: Levels 1-3 turn q and k before the scores, Levels 4 and 5 turn each
tile in registers as they load it (no rotated copy of q and k in memory, forward or
backward). The projections q/k/v/o, the embedding and the head are plain torch at every
level, as in the GPT; the rope tables are built once per sequence length (RotaryTables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .. import nn as lnn
from ._common import Leveled, positive, require


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    seq_len: int = 64          # the longest sequence the model is trained at
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2        # grouped-query attention: n_heads / n_kv_heads query heads per K/V head
    n_layers: int = 2
    hidden: int | None = None  # the SwiGLU width; None: Llama's rule (below)
    rope_base: float = 10000.0
    eps: float = 1e-5
    tie_head: bool = True

    def __post_init__(self):
        for name in ("vocab", "seq_len", "d_model", "n_heads", "n_kv_heads", "n_layers"):
            positive(name, getattr(self, name))
        if self.hidden is not None:
            positive("hidden", self.hidden)
        if self.d_model % self.n_heads:
            raise ValueError(f"argument 'n_heads' must divide d_model={self.d_model}; got {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"argument 'n_kv_heads' must divide n_heads={self.n_heads}; "
                             f"got {self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model / n_heads (the head size) must be even for rotary embeddings; "
                             f"got {self.d_model} / {self.n_heads} = {self.d_model // self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def mlp_hidden(self) -> int:
        """Llama's rule: 2/3 of 4 d_model (three matrices at that width hold the parameters of
        two at 4 d_model), rounded up to a multiple of 8 here (Llama rounds to 256 at its sizes)."""
        if self.hidden is not None:
            return self.hidden
        return -(-(8 * self.d_model // 3) // 8) * 8


def _assemble(model: nn.Module, cfg, blocks, norm_f: nn.Module) -> None:
    """The parts both models share around their blocks: token embedding, the blocks, the
    final norm, the head (tied to the embedding when cfg.tie_head), Llama's initialization."""
    model.cfg = cfg
    model.tok = nn.Embedding(cfg.vocab, cfg.d_model)
    model.blocks = nn.ModuleList(blocks)
    model.norm_f = norm_f
    model.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
    _init_llama(model, cfg)
    if cfg.tie_head:
        model.head.weight = model.tok.weight


def _init_llama(model: nn.Module, cfg: LlamaConfig) -> None:
    """N(0, 0.02) for every matrix and the embedding; the projections that write into the
    residual stream (o_proj, down_proj) scaled by 1/sqrt(2 n_layers), as GPT-2 does, so its
    variance does not grow with depth. RMSNorm weights stay 1."""
    residual = 0.02 / math.sqrt(2 * cfg.n_layers)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, 0.0, residual if name.endswith(("o_proj.weight", "down_proj.weight"))
                            else 0.02)


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    B, N, width = t.shape
    return t.view(B, N, heads, width // heads).transpose(1, 2)


def _check_tokens(tokens: torch.Tensor, cfg: LlamaConfig) -> None:
    if tokens.dim() != 2 or tokens.shape[1] > cfg.seq_len:
        raise ValueError(f"argument 'tokens' must be (batch, T) with T <= seq_len={cfg.seq_len}; "
                         f"got shape {tuple(tokens.shape)}")


# ---------------------------------------------------------------------------------------
# The plain-torch twin: what one writes with torch's own modules (as Hugging Face's
# LlamaForCausalLM computes it: half-split rotary pairs, SDPA with enable_gqa).
# ---------------------------------------------------------------------------------------

def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _projections(module: nn.Module, cfg: LlamaConfig) -> None:
    """q, k, v and o, without biases; k and v with n_kv_heads heads."""
    d, hd = cfg.d_model, cfg.head_dim
    module.cfg = cfg
    module.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=False)
    module.k_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
    module.v_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
    module.o_proj = nn.Linear(cfg.n_heads * hd, d, bias=False)


def _qkv(module: nn.Module, x: torch.Tensor) -> tuple:
    cfg = module.cfg
    return (_split_heads(module.q_proj(x), cfg.n_heads), _split_heads(module.k_proj(x), cfg.n_kv_heads),
            _split_heads(module.v_proj(x), cfg.n_kv_heads))


def _merge_heads(module: nn.Module, out: torch.Tensor) -> torch.Tensor:
    B, H, N, D = out.shape
    return module.o_proj(out.transpose(1, 2).reshape(B, N, H * D))


class TorchAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        hd = cfg.head_dim
        _projections(self, cfg)
        inv_freq = cfg.rope_base ** -(torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, x):
        cfg = self.cfg
        q, k, v = _qkv(self, x)
        positions = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)
        angles = torch.outer(positions, self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)  # half-split: pair i with i + D/2
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=cfg.n_kv_heads != cfg.n_heads)
        return _merge_heads(self, out)


class TorchBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        d, h = cfg.d_model, cfg.mlp_hidden
        self.attn_norm = nn.RMSNorm(d, eps=cfg.eps)
        self.attn = TorchAttention(cfg)
        self.mlp_norm = nn.RMSNorm(d, eps=cfg.eps)
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TorchLlama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        _assemble(self, cfg, (TorchBlock(cfg) for _ in range(cfg.n_layers)),
                  nn.RMSNorm(cfg.d_model, eps=cfg.eps))

    def forward(self, tokens):
        return _decode(self, tokens)


def _decode(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Both models' forward: embed, the blocks, the final norm, the tied head."""
    _check_tokens(tokens, model.cfg)
    x = model.tok(tokens)
    for block in model.blocks:
        x = block(x)
    return model.head(model.norm_f(x))


# ---------------------------------------------------------------------------------------
# The leveled model: the same computation, every component a levels.nn layer.
# ---------------------------------------------------------------------------------------

class Attention(lnn._Leveled):
    """Grouped-query causal attention with rotary embeddings: the projections are plain
    F.linear; the attention core runs at the level with the rotation fused in (rope=, its
    tables from a levels.nn.RotaryTables). K and V keep their n_kv_heads heads: Levels 4 and 5
    read each K/V head for its whole group of query heads, no copy of K and V per query head."""

    component = "attention"

    def __init__(self, cfg: LlamaConfig, level="native"):
        super().__init__(level)
        _projections(self, cfg)
        self.rotary = lnn.RotaryTables(cfg.head_dim, cfg.rope_base, interleaved=False)

    def forward(self, x):
        q, k, v = _qkv(self, x)
        rope = self.rotary.rope(x.shape[1], q.dtype, q.device)
        return _merge_heads(self, self._fn()(q, k, v, causal=True, rope=rope))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, level="native"):
        super().__init__()
        d = cfg.d_model
        self.attn_norm = lnn.RMSNorm(d, cfg.eps, level=level)
        self.attn = Attention(cfg, level)
        self.mlp_norm = lnn.RMSNorm(d, cfg.eps, level=level)
        self.mlp = lnn.SwiGLUMLP(d, cfg.mlp_hidden, level=level)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(Leveled):
    """Llama-style decoder. The embedding and the head are plain torch at every level (a
    lookup and one GEMM are no component of the ladder; see levels.models)."""

    def __init__(self, cfg: LlamaConfig, level="native"):
        super().__init__()
        _assemble(self, cfg, (Block(cfg, level) for _ in range(cfg.n_layers)),
                  lnn.RMSNorm(cfg.d_model, cfg.eps, level=level))

    def forward(self, tokens):
        return _decode(self, tokens)

    @classmethod
    def from_torch(cls, twin: TorchLlama, level="native") -> "Llama":
        """The leveled model with `twin`'s weights (copies: training one leaves the other)."""
        require(isinstance(twin, TorchLlama), "a levels.models.TorchLlama", type(twin).__name__)
        p = twin.tok.weight
        model = cls(twin.cfg, level).to(device=p.device, dtype=p.dtype)
        with torch.no_grad():
            model.tok.load_state_dict(twin.tok.state_dict())
            model.norm_f.load_state_dict(twin.norm_f.state_dict())
            model.head.load_state_dict(twin.head.state_dict())  # tied: the same tensor again
            for ours, theirs in zip(model.blocks, twin.blocks):
                ours.attn_norm.load_state_dict(theirs.attn_norm.state_dict())
                ours.mlp_norm.load_state_dict(theirs.mlp_norm.state_dict())
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(ours.attn, name).load_state_dict(getattr(theirs.attn, name).state_dict())
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(ours.mlp, name).load_state_dict(getattr(theirs, name).state_dict())
        return model
