"""A GPT-style decoder built from levels.nn layers, and its plain-torch twin.

    tokens (B, T) -> token embedding + position embedding
                  -> n_layers x [ x + attn(ln1(x), causal) ; x + mlp(ln2(x)) ]   (pre-norm)
                  -> ln_f -> head (tied to the token embedding) -> logits (B, T, vocab)

The blocks are GPT-2's: pre-norm (the residual stream is never normalized, which keeps
deep stacks trainable without warm-up tricks), an MLP four times as wide with an erf GELU,
and causal self-attention. Dropout is left out: it would make the levels draw different
random masks, and then no two runs could follow the same loss curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .. import nn as lnn
from ._common import Leveled, positive, require


@dataclass(frozen=True)
class GPTConfig:
    vocab: int
    seq_len: int = 64          # the longest sequence: the number of position embeddings
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4
    tie_head: bool = True      # head.weight is the token embedding (GPT-2 does this)

    def __post_init__(self):
        for name in ("vocab", "seq_len", "d_model", "n_heads", "n_layers", "mlp_ratio"):
            positive(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"argument 'n_heads' must divide d_model={self.d_model}; "
                             f"got {self.n_heads}")


def _init_gpt2(model: nn.Module, cfg: GPTConfig) -> None:
    """GPT-2's initialization: N(0, 0.02) for every matrix and embedding, zero biases, and
    the two projections that write into the residual stream scaled by 1/sqrt(2 n_layers),
    so the stream's variance does not grow with depth."""
    residual = 0.02 / math.sqrt(2 * cfg.n_layers)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2:
            std = residual if name.endswith(("out_proj.weight", "fc2.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)
    # LayerNorm weights stay 1 (their default); they are 1-D and not named "bias"


# ---------------------------------------------------------------------------------------
# The plain-torch twin: what one writes with torch's own modules.
# ---------------------------------------------------------------------------------------

class TorchBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, cfg.n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.mlp_ratio * d)
        self.fc2 = nn.Linear(cfg.mlp_ratio * d, d)

    def forward(self, x):
        h = self.ln1(x)
        # is_causal=True with need_weights=False lets nn.MultiheadAttention drop the mask and
        # ask scaled_dot_product_attention for its causal flash kernel (the mask is still
        # required as an argument: is_causal is a hint)
        future = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        x = x + self.attn(h, h, h, attn_mask=future, need_weights=False, is_causal=True)[0]
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class TorchGPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(TorchBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        _init_gpt2(self, cfg)
        if cfg.tie_head:
            self.head.weight = self.tok.weight

    def forward(self, tokens):
        x = _embed(self.tok, self.pos, tokens, self.cfg)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _embed(tok: nn.Embedding, pos: nn.Embedding, tokens: torch.Tensor, cfg: GPTConfig):
    if tokens.dim() != 2 or tokens.shape[1] > cfg.seq_len:
        raise ValueError(f"argument 'tokens' must be (batch, T) with T <= seq_len={cfg.seq_len}; "
                         f"got shape {tuple(tokens.shape)}")
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    return tok(tokens) + pos(positions)


# ---------------------------------------------------------------------------------------
# The leveled model: the same computation, every component a levels.nn layer.
# ---------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, level="native"):
        super().__init__()
        d = cfg.d_model
        self.ln1 = lnn.LayerNorm(d, level=level)
        self.attn = lnn.MultiheadAttention(d, cfg.n_heads, level=level)
        self.ln2 = lnn.LayerNorm(d, level=level)
        self.mlp = lnn.MLP(d, cfg.mlp_ratio * d, level=level)

    def forward(self, x):
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.mlp(self.ln2(x))


class GPT(Leveled):
    """GPT-style decoder. The embeddings and the head are plain torch at every level: a
    lookup and one GEMM are no component of the ladder (see levels.models)."""

    def __init__(self, cfg: GPTConfig, level="native"):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, level) for _ in range(cfg.n_layers))
        self.ln_f = lnn.LayerNorm(cfg.d_model, level=level)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        _init_gpt2(self, cfg)
        if cfg.tie_head:
            self.head.weight = self.tok.weight

    def forward(self, tokens):
        x = _embed(self.tok, self.pos, tokens, self.cfg)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    @classmethod
    def from_torch(cls, twin: TorchGPT, level="native") -> "GPT":
        """The leveled model with `twin`'s weights (copies: training one leaves the other)."""
        require(isinstance(twin, TorchGPT), "a levels.models.TorchGPT", type(twin).__name__)
        p = twin.tok.weight
        model = cls(twin.cfg, level).to(device=p.device, dtype=p.dtype)
        with torch.no_grad():
            model.tok.load_state_dict(twin.tok.state_dict())
            model.pos.load_state_dict(twin.pos.state_dict())
            model.ln_f.load_state_dict(twin.ln_f.state_dict())
            model.head.load_state_dict(twin.head.state_dict())  # tied: the same tensor again
            for ours, theirs in zip(model.blocks, twin.blocks):
                ours.ln1.load_state_dict(theirs.ln1.state_dict())
                ours.ln2.load_state_dict(theirs.ln2.state_dict())
                ours.attn.load_state_dict(lnn.MultiheadAttention.from_torch(theirs.attn).state_dict())
                ours.mlp.fc1.load_state_dict(theirs.fc1.state_dict())
                ours.mlp.fc2.load_state_dict(theirs.fc2.state_dict())
        return model
