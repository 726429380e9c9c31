"""Conv2d then BatchNorm2d: eval mode (running statistics) and training mode (batch
statistics, running statistics updated in place with the unbiased variance)."""

import torch
import torch.nn.functional as F

from . import FWD, FWD_BWD, RESNET50, Shape, is_pow2, nbytes, randn, shrink, uniform

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
SCALING_DIM = "N"  # the batch
GRAPH_INPUTS = ("x",)
FUSED_ATEN = ("convolution", "_convolution", "convolution_backward", "mkldnn_convolution",
              "cudnn_convolution", "native_batch_norm", "_native_batch_norm_legit",
              "_native_batch_norm_legit_no_training", "native_batch_norm_backward",
              "cudnn_batch_norm")
NN_MODULES = ("ConvBN", "Conv2d", "BatchNorm2d")
# Timed as it is used: eval forward (inference, running statistics) against a goal, train
# forward+backward (batch statistics) reported.
SUITE_GOAL = {"eval": 1.0, "train": None}
NO_GOAL = {"train": "reported without a goal: conv_bn's goal is set on eval"}


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
    if x.shape[0] == 0:
        # A batch of 0 images, as torch's batch_norm: no statistics to normalize with or to
        # track (the running ones returned unchanged in training mode), zero gradients
        shape = (1, -1, 1, 1)
        extra = (running_mean, running_var) if training else ()
        return (y * bn_weight.reshape(shape) + bn_bias.reshape(shape), *extra)
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


# ---------------------------------------------------------------------------------------
# The model-shape suite
# ---------------------------------------------------------------------------------------

CONV_DIRECTIONS = (("eval", FWD), ("train", FWD_BWD))  # inference, and a training step
INFER = (("eval", FWD),)

MODEL_SHAPES = (
    Shape("resnet50-stem", "ResNet-50", RESNET50 + ": conv1, 7x7 stride 2, 3 -> 64, 224 -> 112; "
          "batch 32", dict(N=32, C_in=3, H=224, W=224, C_out=64, k=7, stride=2, padding=3,
                           channels_last=True), CONV_DIRECTIONS),
    Shape("resnet50-layer1-1x1", "ResNet-50", RESNET50 + ": layer1 1x1 reduce 256 -> 64 at 56x56; "
          "batch 32", dict(N=32, C_in=256, H=56, W=56, C_out=64, k=1, stride=1, padding=0,
                           channels_last=True), CONV_DIRECTIONS),
    Shape("resnet50-layer1-3x3", "ResNet-50", RESNET50 + ": layer1 3x3 64 -> 64 at 56x56; batch 32",
          dict(N=32, C_in=64, H=56, W=56, C_out=64, k=3, stride=1, padding=1, channels_last=True),
          CONV_DIRECTIONS),
    Shape("resnet50-layer2-3x3-stride2", "ResNet-50", RESNET50 + ": layer2 block 1 3x3 stride 2, "
          "128 -> 128, 56 -> 28; batch 32", dict(N=32, C_in=128, H=56, W=56, C_out=128, k=3,
                                                 stride=2, padding=1, channels_last=True),
          CONV_DIRECTIONS),
    Shape("resnet50-layer2-downsample-infer", "ResNet-50", RESNET50 + ": layer2 projection "
          "shortcut, 1x1 stride 2, 256 -> 512, 56 -> 28; inference batch 8 (Level 4 once measured "
          "0.14x cuDNN on a 1x1 256 -> 512 at 28x28, before its tiles followed the channels)",
          dict(N=8, C_in=256, H=56, W=56, C_out=512, k=1, stride=2, padding=0, channels_last=True),
          INFER),
    Shape("resnet50-layer3-3x3", "ResNet-50", RESNET50 + ": layer3 3x3 256 -> 256 at 14x14; batch "
          "32", dict(N=32, C_in=256, H=14, W=14, C_out=256, k=3, stride=1, padding=1,
                     channels_last=True), CONV_DIRECTIONS),
    Shape("resnet50-layer3-1x1", "ResNet-50", RESNET50 + ": layer3 1x1 reduce 1024 -> 256 at "
          "14x14; batch 32", dict(N=32, C_in=1024, H=14, W=14, C_out=256, k=1, stride=1,
                                  padding=0, channels_last=True), CONV_DIRECTIONS),
    Shape("resnet50-layer4-3x3", "ResNet-50", RESNET50 + ": layer4 3x3 512 -> 512 at 7x7; batch 32",
          dict(N=32, C_in=512, H=7, W=7, C_out=512, k=3, stride=1, padding=1, channels_last=True),
          CONV_DIRECTIONS),
    Shape("resnet50-layer4-1x1-infer", "ResNet-50", RESNET50 + ": layer4 1x1 expand 512 -> 2048 at "
          "7x7; inference, batch 1", dict(N=1, C_in=512, H=7, W=7, C_out=2048, k=1, stride=1,
                                          padding=0, channels_last=True), INFER),
)


def tiny_twin(s):
    # spatial size / 8, but never below what the kernel needs once padded (and at least
    # 2x2 outputs, so training mode has batch statistics to compute)
    k, stride, pad = s["k"], s["stride"], s["padding"]
    least = max(k - 2 * pad, 1) + stride

    def side(n):
        small = max(shrink(n, 8), least)
        return small + 1 if is_pow2(small) and not is_pow2(n) else small
    return dict(s, N=min(s["N"], 2), C_in=shrink(s["C_in"], 16, low=3),
                C_out=shrink(s["C_out"], 16, low=4), H=side(s["H"]), W=side(s["W"]))


def describe(s, variants):
    return (f"N{s['N']} {s['C_in']}->{s['C_out']} {s['k']}x{s['k']}"
            f"{'/' + str(s['stride']) if s['stride'] != 1 else ''} {s['H']}x{s['W']}")


def libraries(device, dtype):
    """F.conv2d (cuDNN on a GPU) then F.batch_norm, eval or train."""
    from ..calls import Impl, differentiable

    def prepare(args):
        x, w, b = args["x"], args["conv_weight"], args["conv_bias"]

        def call():
            y = F.conv2d(x, w, b, stride=args["stride"], padding=args["padding"])
            return [F.batch_norm(y, args["running_mean"], args["running_var"], args["bn_weight"],
                                 args["bn_bias"], training=args["training"],
                                 momentum=args["momentum"], eps=args["eps"])]
        return call, differentiable("conv_bn", args)

    on_gpu = device.type == "cuda"
    # cuDNN's convolutions run fp32 in TF32 unless told not to (the default)
    return [Impl("F.conv2d+batch_norm (cuDNN)" if on_gpu else "F.conv2d+batch_norm", "library",
                 prepare, tf32=on_gpu and torch.backends.cudnn.allow_tf32)]


# ---------------------------------------------------------------------------------------
# levels explain
# ---------------------------------------------------------------------------------------

def _aten_ops(graph) -> list[str]:
    """The aten ops of a TorchScript graph, blocks and subgraphs included."""
    found = set()

    def walk(block):
        for node in block.nodes():
            if node.kind().startswith("aten::"):
                found.add(node.kind())
            for inner in node.blocks():
                walk(inner)
            if node.hasAttribute("Subgraph"):
                walk(node.g("Subgraph"))

    walk(graph)
    return sorted(found)


def explain(level, case, device):
    """At Level 2, in eval mode: what deployment does with a conv + BN, torch.jit.freeze
    folding the batch norm into the convolution's weights."""
    if level != "torchscript" or case.args["training"]:
        return []
    import levels

    a = case.args
    before, frozen = levels.get("torchscript").frozen_conv_bn(
        a["conv_weight"], a["conv_bias"], a["bn_weight"], a["bn_bias"], a["running_mean"],
        a["running_var"], a["stride"], a["padding"], a["eps"], return_unfrozen=True)
    inlined = before.inlined_graph if hasattr(before, "inlined_graph") else before.graph
    return [("torch.jit.freeze: batch norm folded into the convolution (inference deployment)",
             "nn.Sequential(Conv2d, BatchNorm2d).eval(), scripted: aten ops "
             + ", ".join(_aten_ops(inlined))
             + "\nafter torch.jit.freeze: aten ops " + ", ".join(_aten_ops(frozen.graph))
             + "\n(weights and statistics became constants: the folded weight is W * gamma / "
               "sqrt(var + eps).\n The level does the same fold per call, differentiably; see "
               "levels/torchscript.py.)\n\nfrozen graph:\n" + str(frozen.graph))]
