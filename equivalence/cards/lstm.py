"""LSTM, one layer, batch_first, gates i, f, g, o, parameters laid out as nn.LSTM's."""

import torch

from . import nbytes, randn, uniform

SIZES = {
    "tiny": dict(B=3, T=5, I=12, H=16),
    "small": dict(B=8, T=16, I=64, H=128),
    "bench": dict(B=8, T=64, I=256, H=512),
    "bench-large": dict(B=64, T=100, I=512, H=512),
}
VARIANTS = {"default": {}}
OUTPUTS = ("output", "h_T", "c_T")
DIFFERENTIABLE = ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")
MUTATED: dict = {}
STRIDED = {"x": "time_major", "h0": "last_every_other", "c0": "last_every_other",
           "w_ih": "transposed", "w_hh": "transposed", "b_ih": "every_other", "b_hh": "every_other"}


def make_args(shape, dtype, device, generator):
    B, T, I, H = shape["B"], shape["T"], shape["I"], shape["H"]
    bound = H ** -0.5  # nn.LSTM's own initialization range
    return dict(x=randn((B, T, I), generator, dtype, device),
                h0=randn((1, B, H), generator, dtype, device, scale=0.5),
                c0=randn((1, B, H), generator, dtype, device, scale=0.5),
                w_ih=uniform((4 * H, I), generator, dtype, device, -bound, bound),
                w_hh=uniform((4 * H, H), generator, dtype, device, -bound, bound),
                b_ih=uniform((4 * H,), generator, dtype, device, -bound, bound),
                b_hh=uniform((4 * H,), generator, dtype, device, -bound, bound))


def _sigmoid(z):
    return 1.0 / (1.0 + torch.exp(-z))


def reference(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    H = w_hh.shape[1]
    h, c = h0[0], c0[0]
    hs = []
    for t in range(x.shape[1]):
        z = x[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        i, f, g, o = _sigmoid(z[:, :H]), _sigmoid(z[:, H:2 * H]), torch.tanh(z[:, 2 * H:3 * H]), \
            _sigmoid(z[:, 3 * H:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs, dim=1), h[None], c[None]


def flops(args):
    B, T, I = args["x"].shape
    H = args["w_hh"].shape[1]
    fwd = 2 * B * T * (I + H) * 4 * H + 10 * B * T * H
    return {"fwd": fwd, "bwd": 2 * fwd}


def min_bytes(args):
    params = nbytes(*(args[k] for k in ("w_ih", "w_hh", "b_ih", "b_hh")))
    x = args["x"]
    out = x.shape[0] * x.shape[1] * args["w_hh"].shape[1] * x.element_size()
    states = 4 * nbytes(args["h0"])
    return {"fwd": nbytes(x) + params + out + states, "bwd": 2 * (nbytes(x) + params + out + states)}
