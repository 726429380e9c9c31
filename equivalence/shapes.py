"""The model-shape suite: the sizes real models call each component with.

One `bench` shape per component says how a kernel does where it was tuned; a user calls it
with whatever their model has: GPT-2's 768-wide rows, a 1000-token prompt, ResNet-50's 7x7
feature maps, a batch of one. Level 4 met its goals at its bench shapes and fell to 0.14x
of cuDNN at a ResNet-50 1x1 layer (issue 12). So this module lists, per component, shapes
taken from named models, each with where its numbers come from, and `levels bench --suite
models` (equivalence/bench/suite.py) times every level against the best library call at
each of them.

A shape's `sizes` are the shape parameters of the component's spec
(`equivalence/specs/<component>.py`, `make_args` conventions), so the spec builds its
arguments, FLOPs and minimum bytes exactly as for the presets:

    attention   B, H, N, D                 (q, k, v of shape (B, H, N, D))
    layer_norm  rows (leading dims), N     (x of shape (*rows, N))
    mlp         rows, K, hidden, N         (x (*rows, K) -> hidden -> N)
    lstm        B, T, I, H                 (batch_first x (B, T, I), hidden H)
    conv_bn     N, C_in, H, W, C_out, k, stride, padding, channels_last

`directions` says what is timed at a shape, as (variant, pass) pairs: the spec's variant
(attention "full"/"causal", conv_bn "eval"/"train", "default" elsewhere) and "fwd"
(inference: no autograd) or "fwd+bwd" (training: forward, then backward for every
differentiable input). Training shapes get both; inference shapes only the forward.
conv_bn is timed as it is used: eval forward (inference, running statistics) and train
forward+backward (batch statistics).

Every shape runs in bfloat16 on a GPU (what training and inference run there), except where
`dtype` says otherwise (the fp32 LSTM the issue's headline goal is about). Each has a
`tiny` twin (`Shape.tiny()`): the same structure scaled down (causal stays causal, a width
that is no power of two stays one, kernel size, stride and padding unchanged), so the whole
suite runs on a CPU in seconds: the tests and the CPU smoke run use the twins.

Where the numbers come from is said per shape (`source`); "train" batch sizes are common
micro-batches for one GPU, not the papers' global batches.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import torch

from levels.contract import COMPONENTS, VALIDATORS

from . import specs

FWD, FWD_BWD = "fwd", "fwd+bwd"
PASSES = (FWD, FWD_BWD)


@dataclass(frozen=True)
class Shape:
    component: str
    name: str  # unique in the suite, e.g. "gpt2-small-train"
    model: str  # the model it comes from, as a reader would name it
    source: str  # where the numbers come from
    sizes: dict  # the spec's shape parameters (make_args conventions)
    directions: tuple  # ((variant, pass), ...), see the module doc
    dtype: str = "bfloat16"  # on a GPU; the CPU smoke run uses float32
    tiny_sizes: dict = field(default_factory=dict)  # filled in by _shape(): see tiny_twin

    def tiny(self) -> dict:
        """The scaled-down twin's shape parameters (same structure, CPU-sized)."""
        return dict(self.tiny_sizes)

    def describe(self, tiny: bool = False) -> str:
        """The sizes (or the tiny twin's) in one line, e.g. 'B8 H12 N1024 D64 causal'."""
        s = self.tiny_sizes if tiny else self.sizes
        if self.component == "attention":
            causal = any(v == "causal" for v, _ in self.directions)
            return f"B{s['B']} H{s['H']} N{s['N']} D{s['D']}" + (" causal" if causal else "")
        if self.component == "layer_norm":
            return f"{'x'.join(map(str, s['rows']))} rows x {s['N']}"
        if self.component == "mlp":
            return f"M{math.prod(s['rows'])} {s['K']}->{s['hidden']}->{s['N']}"
        if self.component == "lstm":
            return f"B{s['B']} T{s['T']} I{s['I']} H{s['H']}"
        return (f"N{s['N']} {s['C_in']}->{s['C_out']} {s['k']}x{s['k']}"
                f"{'/' + str(s['stride']) if s['stride'] != 1 else ''} {s['H']}x{s['W']}")


# ---------------------------------------------------------------------------------------
# The tiny twins: every dimension divided down, the structure kept
# ---------------------------------------------------------------------------------------

def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _shrink(n: int, factor: int, low: int = 1) -> int:
    """n / factor, at least `low`; a size that is no power of two stays none (the masked
    edges are what an odd size tests), a power of two stays one."""
    small = max(low, round(n / factor))
    if _is_pow2(n):
        return max(low, 1 << (small.bit_length() - 1))  # the power of two at or below
    if _is_pow2(small) and small > 1:
        small += 1
    return small


def tiny_twin(component: str, sizes: dict) -> dict:
    """The CPU-sized twin of a shape: batch-like dimensions capped or divided by 8, widths
    and token counts by 16, attention's sequence by 32, images by 8; every structural
    parameter (kernel size, stride, padding, layout, whether a size is a power of two)
    unchanged."""
    s = dict(sizes)
    if component == "attention":
        # D 64 -> 16 and 128 -> 32: both stay head dimensions Level 4 supports (16..128)
        return dict(B=min(s["B"], 2), H=min(s["H"], 2), N=_shrink(s["N"], 32, low=3),
                    D=max(16, s["D"] // 4))
    if component == "layer_norm":
        rows = tuple(min(r, 2) for r in s["rows"][:-1]) + (_shrink(s["rows"][-1], 16),)
        return dict(rows=rows, N=_shrink(s["N"], 16, low=8))
    if component == "mlp":
        rows = tuple(min(r, 2) for r in s["rows"][:-1]) + (_shrink(s["rows"][-1], 16),)
        return dict(rows=rows, K=_shrink(s["K"], 16, low=8), hidden=_shrink(s["hidden"], 16, low=8),
                    N=_shrink(s["N"], 16, low=8))
    if component == "lstm":
        return dict(B=_shrink(s["B"], 8), T=_shrink(s["T"], 16, low=2), I=_shrink(s["I"], 16, low=4),
                    H=_shrink(s["H"], 16, low=4))
    if component == "conv_bn":
        # spatial size / 8, but never below what the kernel needs once padded (and at least
        # 2x2 outputs, so training mode has batch statistics to compute)
        k, stride, pad = s["k"], s["stride"], s["padding"]
        least = max(k - 2 * pad, 1) + stride

        def side(n):
            small = max(_shrink(n, 8), least)
            return small + 1 if _is_pow2(small) and not _is_pow2(n) else small
        return dict(s, N=min(s["N"], 2), C_in=_shrink(s["C_in"], 16, low=3),
                    C_out=_shrink(s["C_out"], 16, low=4), H=side(s["H"]), W=side(s["W"]))
    raise ValueError(f"argument 'component' must be one of {', '.join(COMPONENTS)}; "
                     f"got {component!r}")


def _shape(component, name, model, source, sizes, directions, **kw) -> Shape:
    return Shape(component, name, model, source, sizes, tuple(directions),
                 tiny_sizes=tiny_twin(component, sizes), **kw)


def _train(variant="default"):
    return ((variant, FWD), (variant, FWD_BWD))


def _infer(variant="default"):
    return ((variant, FWD),)


CONV_DIRECTIONS = (("eval", FWD), ("train", FWD_BWD))  # inference, and a training step

# ---------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------

# Model dimensions, each from the model's published configuration:
GPT2 = "HF transformers GPT2Config (openai-community/gpt2*): n_embd, n_head, n_positions=1024"
LLAMA2 = ("Llama 2 7B (Touvron et al. 2023; HF meta-llama/Llama-2-7b: hidden_size=4096, "
          "num_attention_heads=32, intermediate_size=11008, max_position_embeddings=4096)")
BERT = "BERT-base (Devlin et al. 2018): hidden 768, 12 heads, intermediate 3072, max 512 positions"
CLIP = ("CLIP ViT-B/32 text encoder (Radford et al. 2021; HF CLIPTextConfig): width 512, 8 heads, "
        "intermediate 2048, context 77 tokens, causal mask")
VIT = ("ViT-B/16 (Dosovitskiy et al. 2020): hidden 768, 12 heads, MLP 3072; 224/16 = 14x14 "
       "patches + [CLS] = 197 tokens")
WHISPER = ("Whisper base (Radford et al. 2022; HF WhisperConfig): d_model 512, 8 heads, encoder "
           "1500 positions (30 s of audio)")
RESNET50 = ("ResNet-50 v1.5 (He et al. 2016, Table 1; torchvision resnet50: the stride on the 3x3 "
            "of each stage's first block) at 224x224")

SHAPES: dict[str, tuple[Shape, ...]] = {
    "attention": (
        _shape("attention", "gpt2-small-train", "GPT-2 small", GPT2 + " (768 = 12 heads x 64)",
               dict(B=8, H=12, N=1024, D=64), _train("causal")),
        _shape("attention", "gpt2-medium-train", "GPT-2 medium", GPT2 + " (1024 = 16 heads x 64)",
               dict(B=4, H=16, N=1024, D=64), _train("causal")),
        _shape("attention", "llama2-7b-train", "Llama 2 7B", LLAMA2 + "; 4096 = 32 heads x 128, "
               "one 4096-token sequence per micro-batch", dict(B=1, H=32, N=4096, D=128),
               _train("causal")),
        _shape("attention", "llama2-7b-prefill", "Llama 2 7B", LLAMA2 + "; inference: a "
               "1000-token prompt (N no power of two)", dict(B=1, H=32, N=1000, D=128),
               _infer("causal")),
        _shape("attention", "bert-base-train", "BERT-base", BERT + "; fine-tuning batch 32 at 512, "
               "bidirectional", dict(B=32, H=12, N=512, D=64), _train("full")),
        _shape("attention", "vit-b16-train", "ViT-B/16", VIT + "; batch 64, bidirectional",
               dict(B=64, H=12, N=197, D=64), _train("full")),
        _shape("attention", "whisper-base-encoder", "Whisper base", WHISPER + "; inference batch 8",
               dict(B=8, H=8, N=1500, D=64), _infer("full")),
        _shape("attention", "clip-text-inference", "CLIP text", CLIP + "; a batch of 128 prompts",
               dict(B=128, H=8, N=77, D=64), _infer("causal")),
    ),
    "layer_norm": (
        _shape("layer_norm", "gpt2-small-train", "GPT-2 small", GPT2 + "; batch 8 x 1024 tokens",
               dict(rows=(8, 1024), N=768), _train()),
        _shape("layer_norm", "gpt2-medium-train", "GPT-2 medium", GPT2 + "; batch 4 x 1024 tokens",
               dict(rows=(4, 1024), N=1024), _train()),
        _shape("layer_norm", "gpt2-xl-train", "GPT-2 XL", GPT2 + " (n_embd=1600: no power of two); "
               "batch 2 x 1024 tokens", dict(rows=(2, 1024), N=1600), _train()),
        _shape("layer_norm", "llama2-7b-train", "Llama 2 7B", LLAMA2 + "; Llama normalizes with "
               "RMSNorm: this is LayerNorm at its width, 4096 tokens", dict(rows=(1, 4096), N=4096),
               _train()),
        _shape("layer_norm", "llama2-7b-decode", "Llama 2 7B", LLAMA2 + "; one decoding step for a "
               "batch of 8 sequences: 8 rows, all per-call overhead", dict(rows=(8, 1), N=4096),
               _infer()),
        _shape("layer_norm", "bert-base-train", "BERT-base", BERT + "; batch 32 x 512 tokens",
               dict(rows=(32, 512), N=768), _train()),
        _shape("layer_norm", "clip-text-inference", "CLIP text", CLIP + "; 128 prompts x 77 tokens",
               dict(rows=(128, 77), N=512), _infer()),
    ),
    "mlp": (
        _shape("mlp", "gpt2-small-train", "GPT-2 small", GPT2 + "; MLP 768 -> 3072 -> 768, batch 8 "
               "x 1024 tokens", dict(rows=(8, 1024), K=768, hidden=3072, N=768), _train()),
        _shape("mlp", "gpt2-medium-train", "GPT-2 medium", GPT2 + "; MLP 1024 -> 4096 -> 1024, "
               "batch 4 x 1024", dict(rows=(4, 1024), K=1024, hidden=4096, N=1024), _train()),
        _shape("mlp", "gpt2-small-prefill", "GPT-2 small", GPT2 + "; inference on a 1000-token "
               "prompt (issue 12 measured Level 4 at 0.17x cuBLAS here)",
               dict(rows=(1, 1000), K=768, hidden=3072, N=768), _infer()),
        _shape("mlp", "llama2-7b-train", "Llama 2 7B", LLAMA2 + "; Llama's MLP is SwiGLU (gate and "
               "up 4096 -> 11008, down 11008 -> 4096): here the same two GEMM shapes around a GELU, "
               "one 4096-token sequence", dict(rows=(1, 4096), K=4096, hidden=11008, N=4096),
               _train()),
        _shape("mlp", "llama2-7b-decode", "Llama 2 7B", LLAMA2 + "; one decoding step for 8 "
               "sequences: M = 8, reading 180 MB of weights per call (a bandwidth problem)",
               dict(rows=(8, 1), K=4096, hidden=11008, N=4096), _infer()),
        _shape("mlp", "vit-b16-train", "ViT-B/16", VIT + "; batch 64 x 197 tokens: M = 12608, no "
               "multiple of 128", dict(rows=(64, 197), K=768, hidden=3072, N=768), _train()),
        _shape("mlp", "clip-text-inference", "CLIP text", CLIP + "; 128 prompts x 77 tokens",
               dict(rows=(128, 77), K=512, hidden=2048, N=512), _infer()),
    ),
    "lstm": (
        _shape("lstm", "zaremba-medium-train", "PTB medium LSTM LM",
               "Zaremba, Sutskever, Vinyals 2014 'Recurrent Neural Network Regularization', medium: "
               "650 units, unrolled 35 steps, batch 20", dict(B=20, T=35, I=650, H=650), _train()),
        _shape("lstm", "zaremba-medium-score", "PTB medium LSTM LM",
               "the same model at inference: one 35-token sequence (batch 1)",
               dict(B=1, T=35, I=650, H=650), _infer()),
        _shape("lstm", "awd-lstm-train", "AWD-LSTM",
               "Merity et al. 2017, salesforce/awd-lstm-lm defaults: embeddings 400, hidden 1150, "
               "bptt 70, batch 80; the last layer maps 1150 -> 400 (hidden 400)",
               dict(B=80, T=70, I=1150, H=400), _train()),
        _shape("lstm", "gnmt-train", "GNMT",
               "Wu et al. 2016 (Google NMT): LSTM layers of 1024 units, batch 128; 50-token sentences",
               dict(B=128, T=50, I=1024, H=1024), _train()),
        _shape("lstm", "las-listener-train", "Listen, Attend and Spell",
               "Chan et al. 2016: pyramidal BLSTM listener, 256 units per direction; each layer "
               "reads two consecutive frames of the layer below (2 x 2 x 256 = 1024); 250 frames, "
               "batch 32", dict(B=32, T=250, I=1024, H=256), _train()),
        _shape("lstm", "headline-fp32", "512-unit LM layer (issue 12 headline)",
               "equivalence/specs/lstm.py 'bench': 256-dim embeddings, 512 units, batch 8, 64 steps; "
               "issue 12's goal 'LSTM fp32 >= 1.0x cuDNN' is at this shape, in float32",
               dict(B=8, T=64, I=256, H=512), _train(), dtype="float32"),
    ),
    "conv_bn": (
        _shape("conv_bn", "resnet50-stem", "ResNet-50", RESNET50 + ": conv1, 7x7 stride 2, 3 -> 64, "
               "224 -> 112; batch 32", dict(N=32, C_in=3, H=224, W=224, C_out=64, k=7, stride=2,
                                            padding=3, channels_last=True), CONV_DIRECTIONS),
        _shape("conv_bn", "resnet50-layer1-1x1", "ResNet-50", RESNET50 + ": layer1 1x1 reduce "
               "256 -> 64 at 56x56; batch 32", dict(N=32, C_in=256, H=56, W=56, C_out=64, k=1,
                                                   stride=1, padding=0, channels_last=True),
               CONV_DIRECTIONS),
        _shape("conv_bn", "resnet50-layer1-3x3", "ResNet-50", RESNET50 + ": layer1 3x3 64 -> 64 at "
               "56x56; batch 32", dict(N=32, C_in=64, H=56, W=56, C_out=64, k=3, stride=1,
                                       padding=1, channels_last=True), CONV_DIRECTIONS),
        _shape("conv_bn", "resnet50-layer2-3x3-stride2", "ResNet-50", RESNET50 + ": layer2 block 1 "
               "3x3 stride 2, 128 -> 128, 56 -> 28; batch 32",
               dict(N=32, C_in=128, H=56, W=56, C_out=128, k=3, stride=2, padding=1,
                    channels_last=True), CONV_DIRECTIONS),
        _shape("conv_bn", "resnet50-layer2-downsample-infer", "ResNet-50", RESNET50 + ": layer2 "
               "projection shortcut, 1x1 stride 2, 256 -> 512, 56 -> 28; inference batch 8 (issue "
               "12 measured Level 4 at 0.14x cuDNN on a 1x1 256 -> 512 at 28x28)",
               dict(N=8, C_in=256, H=56, W=56, C_out=512, k=1, stride=2, padding=0,
                    channels_last=True), (("eval", FWD),)),
        _shape("conv_bn", "resnet50-layer3-3x3", "ResNet-50", RESNET50 + ": layer3 3x3 256 -> 256 "
               "at 14x14; batch 32", dict(N=32, C_in=256, H=14, W=14, C_out=256, k=3, stride=1,
                                         padding=1, channels_last=True), CONV_DIRECTIONS),
        _shape("conv_bn", "resnet50-layer3-1x1", "ResNet-50", RESNET50 + ": layer3 1x1 reduce "
               "1024 -> 256 at 14x14; batch 32", dict(N=32, C_in=1024, H=14, W=14, C_out=256, k=1,
                                                     stride=1, padding=0, channels_last=True),
               CONV_DIRECTIONS),
        _shape("conv_bn", "resnet50-layer4-3x3", "ResNet-50", RESNET50 + ": layer4 3x3 512 -> 512 "
               "at 7x7; batch 32", dict(N=32, C_in=512, H=7, W=7, C_out=512, k=3, stride=1,
                                       padding=1, channels_last=True), CONV_DIRECTIONS),
        _shape("conv_bn", "resnet50-layer4-1x1-infer", "ResNet-50", RESNET50 + ": layer4 1x1 expand "
               "512 -> 2048 at 7x7; inference, batch 1", dict(N=1, C_in=512, H=7, W=7, C_out=2048,
                                                            k=1, stride=1, padding=0,
                                                            channels_last=True), (("eval", FWD),)),
    ),
}


def shapes(components=None, patterns=None) -> list[Shape]:
    """The suite's shapes, in order: all, or those of `components` whose name matches one
    of `patterns` (shell-style, e.g. "gpt2-*", or a "component/name" pattern)."""
    comps = list(components or COMPONENTS)
    for c in comps:
        if c not in SHAPES:
            raise ValueError(f"argument 'components' must name components of "
                             f"{', '.join(COMPONENTS)}; got {c!r}")
    chosen = [s for c in comps for s in SHAPES[c]]
    if patterns:
        chosen = [s for s in chosen if any(fnmatch.fnmatchcase(s.name, p) or
                                           fnmatch.fnmatchcase(f"{s.component}/{s.name}", p)
                                           for p in patterns)]
        if not chosen:
            names = ", ".join(f"{s.component}/{s.name}" for c in comps for s in SHAPES[c])
            raise ValueError(f"argument 'shapes' matched no shape of the suite; got "
                             f"{', '.join(patterns)}; the shapes are: {names}")
    return chosen


def get(component: str, name: str) -> Shape:
    for s in SHAPES.get(component, ()):
        if s.name == name:
            return s
    raise ValueError(f"no shape {name!r} for {component!r}; the {component} shapes are: "
                     f"{', '.join(s.name for s in SHAPES.get(component, ()))}")


def make_args(shape: Shape, variant: str, dtype, device, seed: int, tiny: bool = False) -> dict:
    """The component's keyword arguments at this shape (or its tiny twin), drawn by its spec."""
    sizes = shape.tiny() if tiny else shape.sizes
    return specs.get(shape.component).case(sizes, variant, dtype, device, seed).args


def fake_args(shape: Shape, variant: str, tiny: bool = False) -> dict:
    """The same arguments as shape-only tensors: made by the spec under FakeTensorMode on the
    meta device, so a 180 MB weight costs nothing. Enough for the contract's validator and
    the spec's FLOPs and bytes, which read shapes and strides only."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = getattr(torch, shape.dtype)
    with FakeTensorMode():
        return make_args(shape, variant, dtype, torch.device("meta"), seed=0, tiny=tiny)


def validate(shape: Shape, tiny: bool = False) -> dict:
    """Run the contract's validator on every direction's arguments (without allocating
    them): a shape the contract refuses would only fail on the GPU. Returns
    {variant: the validator's sizes}."""
    out = {}
    for variant, _ in shape.directions:
        out[variant] = VALIDATORS[shape.component](**fake_args(shape, variant, tiny))
    return out


__all__ = ["FWD", "FWD_BWD", "PASSES", "SHAPES", "Shape", "fake_args", "get", "make_args", "shapes",
           "tiny_twin", "validate"]
