"""A character language model on stacked LSTMs, from levels.nn layers, and its plain-torch twin.

    tokens (B, T) -> embedding -> LSTM layer 1 -> ... -> LSTM layer L -> LayerNorm -> head

The twin stacks the layers inside one `nn.LSTM(num_layers=L)`: on a GPU that is cuDNN's
multi-layer kernel, the baseline a hand-written recurrence has to beat. `levels.nn.LSTM`
is one layer (the ladder's component), so the leveled model is a list of them; the
weights of layer k of the twin (`weight_ih_l{k}`, ...) become layer k's `weight_ih_l0`.
Every sequence starts from zero state: the batches are independent windows of text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import nn as lnn
from ._common import Leveled, positive, require


@dataclass(frozen=True)
class LSTMConfig:
    vocab: int
    embed: int = 64
    hidden: int = 128
    n_layers: int = 2

    def __post_init__(self):
        for name in ("vocab", "embed", "hidden", "n_layers"):
            positive(name, getattr(self, name))


class TorchLSTMLM(nn.Module):
    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.embed)
        self.lstm = nn.LSTM(cfg.embed, cfg.hidden, num_layers=cfg.n_layers, batch_first=True)
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.head(self.norm(h))


class LSTMLM(Leveled):
    def __init__(self, cfg: LSTMConfig, level="native"):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.embed)
        self.layers = nn.ModuleList(lnn.LSTM(cfg.embed if k == 0 else cfg.hidden, cfg.hidden, level=level)
                                    for k in range(cfg.n_layers))
        self.norm = lnn.LayerNorm(cfg.hidden, level=level)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x, _ = layer(x)
        return self.head(self.norm(x))

    @classmethod
    def from_torch(cls, twin: TorchLSTMLM, level="native") -> "LSTMLM":
        """The leveled model with `twin`'s weights (copies)."""
        require(isinstance(twin, TorchLSTMLM), "a levels.models.TorchLSTMLM", type(twin).__name__)
        m = twin.lstm
        require(m.batch_first and m.bias and not m.bidirectional and m.proj_size == 0
                and m.dropout == 0.0,
                "nn.LSTM(batch_first=True) with biases, one direction, no projection, no dropout", m)
        p = twin.embed.weight
        model = cls(twin.cfg, level).to(device=p.device, dtype=p.dtype)
        with torch.no_grad():
            model.embed.load_state_dict(twin.embed.state_dict())
            model.norm.load_state_dict(twin.norm.state_dict())
            model.head.load_state_dict(twin.head.state_dict())
            for k, layer in enumerate(model.layers):
                layer.load_state_dict({f"{name}_l0": getattr(m, f"{name}_l{k}")
                                       for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
        return model
