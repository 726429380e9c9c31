"""Conv2d then BatchNorm2d: eval mode (running statistics) and training mode (batch
statistics, running statistics updated in place with the unbiased variance)."""

import torch
import torch.nn.functional as F

from . import nbytes, randn, uniform

SIZES = {
    "tiny": dict(N=2, C_in=3, H=9, W=11, C_out=5, k=3, stride=2, padding=1),
    "small": dict(N=8, C_in=16, H=32, W=32, C_out=32, k=3, stride=1, padding=1),
    "bench": dict(N=32, C_in=128, H=64, W=64, C_out=256, k=3, stride=1, padding=1,
                  channels_last=True),
}
VARIANTS = {"eval": dict(training=False), "train": dict(training=True)}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("x", "conv_weight", "conv_bias", "bn_weight", "bn_bias")
MUTATED = {"train": ("running_mean", "running_var")}
# channels_last activations and weights (what model.to(memory_format=torch.channels_last)
# gives), every per-channel vector a stride-2 view: the running statistics too, so the
# in-place update must write through the view and nowhere between its elements.
STRIDED = {"x": "channels_last", "conv_weight": "channels_last", "conv_bias": "every_other",
           "bn_weight": "every_other", "bn_bias": "every_other", "running_mean": "every_other",
           "running_var": "every_other"}


def zero_gradient_scales(args, upstream, grads):
    # In training mode the batch mean absorbs the conv bias: its gradient is exactly zero.
    # A relative error against zero means nothing, so it is measured against the size of
    # the gradient it would have had (grad bn_bias: the same per-channel sum of upstream).
    if args["training"] and "conv_bias" in grads:
        return {"conv_bias": grads["bn_bias"]}
    return {}


def make_args(shape, dtype, device, generator):
    N, Ci, H, W, Co, k = (shape[n] for n in ("N", "C_in", "H", "W", "C_out", "k"))
    x = randn((N, Ci, H, W), generator, dtype, device)
    w = randn((Co, Ci, k, k), generator, dtype, device, scale=(Ci * k * k) ** -0.5)
    if shape.get("channels_last"):
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    return dict(x=x, conv_weight=w,
                conv_bias=randn((Co,), generator, dtype, device, scale=0.5),
                bn_weight=uniform((Co,), generator, dtype, device, 0.5, 1.5),
                bn_bias=randn((Co,), generator, dtype, device, scale=0.5),
                running_mean=randn((Co,), generator, dtype, device, scale=0.5),
                running_var=uniform((Co,), generator, dtype, device, 0.5, 2.0),
                stride=shape["stride"], padding=shape["padding"], eps=1e-5, momentum=0.1,
                training=False)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv2d(x, w, b, stride, padding):
    # Direct definition: out[n, o, y, x] = b[o] + sum_{c, i, j} w[o, c, i, j] *
    # xpad[n, c, y*sh + i, x*sw + j], one kernel offset (i, j) at a time.
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    kH, kW = w.shape[2:]
    xp = F.pad(x, (pw, pw, ph, ph))
    Ho = (xp.shape[2] - kH) // sh + 1
    Wo = (xp.shape[3] - kW) // sw + 1
    out = 0
    for i in range(kH):
        for j in range(kW):
            patch = xp[:, :, i:i + sh * (Ho - 1) + 1:sh, j:j + sw * (Wo - 1) + 1:sw]
            out = out + torch.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out if b is None else out + b[None, :, None, None]


def reference(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
              stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    y = _conv2d(x, conv_weight, conv_bias, stride, padding)
    if not training:
        mean, var = running_mean, running_var
        extra = ()
    else:
        n = y.numel() // y.shape[1]
        mean = y.sum(dim=(0, 2, 3)) / n
        var = ((y - mean[None, :, None, None]) ** 2).sum(dim=(0, 2, 3)) / n
        new_mean = (1 - momentum) * running_mean + momentum * mean.detach()
        new_var = (1 - momentum) * running_var + momentum * var.detach() * n / (n - 1)
        extra = (new_mean, new_var)
    out = (y - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + eps)
    return (out * bn_weight[None, :, None, None] + bn_bias[None, :, None, None], *extra)


def flops(args):
    x, w = args["x"], args["conv_weight"]
    N, Ci, H, W = x.shape
    Co, _, kH, kW = w.shape
    (sh, sw), (ph, pw) = _pair(args["stride"]), _pair(args["padding"])
    Ho, Wo = (H + 2 * ph - kH) // sh + 1, (W + 2 * pw - kW) // sw + 1
    fwd = 2 * N * Co * Ho * Wo * Ci * kH * kW + 4 * N * Co * Ho * Wo
    return {"fwd": fwd, "bwd": 2 * fwd}


def min_bytes(args):
    x, w = args["x"], args["conv_weight"]
    N, _, H, W = x.shape
    (sh, sw), (ph, pw) = _pair(args["stride"]), _pair(args["padding"])
    Ho = (H + 2 * ph - w.shape[2]) // sh + 1
    Wo = (W + 2 * pw - w.shape[3]) // sw + 1
    out = N * w.shape[0] * Ho * Wo * x.element_size()
    return {"fwd": nbytes(x, w) + out, "bwd": 2 * (nbytes(x, w) + out)}
