"""The model-shape suite: the sizes real models call each component with.

One `bench` shape per component says how a kernel does where it was tuned; a user calls it
with whatever their model has: GPT-2's 768-wide rows, a 1000-token prompt, ResNet-50's 7x7
feature maps, a batch of one. Level 4 met its goals at its bench shapes and once fell to
0.14x of cuDNN at a ResNet-50 1x1 layer. So each card lists shapes taken from named models
(MODEL_SHAPES), each with where its numbers come from, and `levels bench --suite models`
(equivalence/commands/bench/suite.py) times every level against the best library call at
each of them; this module puts the cards' lists together and draws a shape's arguments.

A shape's `sizes` are the shape parameters of the component's card
(`equivalence/cards/<component>.py`, `make_args` conventions), so the card builds its
arguments, FLOPs and minimum bytes exactly as for the presets:

    attention   B, H, N, D                 (q, k, v of shape (B, H, N, D))
    layer_norm  rows (leading dims), N     (x of shape (*rows, N))
    mlp         rows, K, hidden, N         (x (*rows, K) -> hidden -> N)
    lstm        B, T, I, H                 (batch_first x (B, T, I), hidden H)
    conv_bn     N, C_in, H, W, C_out, k, stride, padding, channels_last

`directions` says what is timed at a shape, as (variant, pass) pairs: the card's variant
(attention "full"/"causal", conv_bn "eval"/"train", "default" elsewhere) and "fwd"
(inference: no autograd) or "fwd+bwd" (training: forward, then backward for every
differentiable input). Training shapes get both; inference shapes only the forward.
conv_bn is timed as it is used: eval forward (inference, running statistics) and train
forward+backward (batch statistics).

Every shape runs in bfloat16 on a GPU (what training and inference run there), except where
`dtype` says otherwise (the fp32 LSTM the fp32 goal is about). Each has a
`tiny` twin (`Shape.tiny()`, the card's tiny_twin): the same structure scaled down (causal stays causal, a width
that is no power of two stays one, kernel size, stride and padding unchanged), so the whole
suite runs on a CPU in seconds: the tests and the CPU smoke run use the twins.

Where the numbers come from is said per shape (`source`); "train" batch sizes are common
micro-batches for one GPU, not the papers' global batches.
"""

from __future__ import annotations

import fnmatch
import functools

import torch

from levels.contract import COMPONENTS, VALIDATORS

from . import cards
from .cards import FWD, FWD_BWD, PASSES, Shape


@functools.cache
def _all() -> dict[str, tuple[Shape, ...]]:
    return {c: cards.get(c).model_shapes for c in COMPONENTS}


def __getattr__(name: str):
    # SHAPES, {component: its shapes}, read from the cards on first use: a card imports this
    # package's cards module, so building it at import could run into a card half imported
    if name == "SHAPES":
        return _all()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tiny_twin(component: str, sizes: dict) -> dict:
    """The CPU-sized twin of a shape (the card's tiny_twin): every structural parameter
    (kernel size, stride, padding, layout, whether a size is a power of two) unchanged."""
    return cards.get(component).tiny_twin(sizes)


def shapes(components=None, patterns=None) -> list[Shape]:
    """The suite's shapes, in order: all, or those of `components` whose name matches one
    of `patterns` (shell-style, e.g. "gpt2-*", or a "component/name" pattern)."""
    every = _all()
    comps = list(components or COMPONENTS)
    for c in comps:
        if c not in every:
            raise ValueError(f"argument 'components' must name components of "
                             f"{', '.join(COMPONENTS)}; got {c!r}")
    chosen = [s for c in comps for s in every[c]]
    if patterns:
        chosen = [s for s in chosen if any(fnmatch.fnmatchcase(s.name, p) or
                                           fnmatch.fnmatchcase(f"{s.component}/{s.name}", p)
                                           for p in patterns)]
        if not chosen:
            names = ", ".join(f"{s.component}/{s.name}" for c in comps for s in every[c])
            raise ValueError(f"argument 'shapes' matched no shape of the suite; got "
                             f"{', '.join(patterns)}; the shapes are: {names}")
    return chosen


def get(component: str, name: str) -> Shape:
    found = _all().get(component, ())
    for s in found:
        if s.name == name:
            return s
    raise ValueError(f"no shape {name!r} for {component!r}; the {component} shapes are: "
                     f"{', '.join(s.name for s in found)}")


def make_args(shape: Shape, variant: str, dtype, device, seed: int, tiny: bool = False) -> dict:
    """The component's keyword arguments at this shape (or its tiny twin), drawn by its card."""
    sizes = shape.tiny() if tiny else shape.sizes
    return cards.get(shape.component).case(sizes, variant, dtype, device, seed).args


def fake_args(shape: Shape, variant: str, tiny: bool = False) -> dict:
    """The same arguments as shape-only tensors: made by the card under FakeTensorMode on the
    meta device, so a 180 MB weight costs nothing. Enough for the contract's validator and
    the card's FLOPs and bytes, which read shapes and strides only."""
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
