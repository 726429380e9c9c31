"""One card per component: everything the harness and the commands know about it.

A card is a module, `equivalence/cards/<component>.py`, found by the component's name (the
names are levels.contract.COMPONENTS). Like PyTorch's OpInfo entries, it is the one place a
component is described; shared code asks the card and never branches on a name.

What the harness needs (every card defines these):

    SIZES          preset name -> shape parameters: 'tiny' (tests, interpreters),
                   'small' (CPU runs), 'bench' (the GPU), sometimes more
    VARIANTS       variant name -> non-tensor keyword arguments (causal, training, ...)
    OUTPUTS        names of the flattened outputs, in order
    DIFFERENTIABLE the arguments whose gradients are checked; () for a forward-only component
                   (newton_schulz: Muon runs it under no_grad, its contract refuses a G that
                   requires grad), whose backward is then neither run nor timed
    STRIDED        argument -> how the `strided` layout stores it (see LAYOUT_KINDS); a card
                   may instead define strided(args) -> args itself (attention: q, k, v
                   sliced from one packed (B, N, 3, H, D) buffer)
    make_args(shape, dtype, device, generator) -> dict of arguments, in signature order
    reference(**args) -> tuple of float64 outputs, written from the math (never by
                   calling a level), then the new values of the MUTATED buffers
    flops(args) / min_bytes(args) -> {'fwd': ..., 'bwd': ...} for one call
    SCALING_DIM    the shape parameter `levels profile --scaling` stretches (the dimension
                   a user grows first: attention's sequence, the others' batch)
    GRAPH_INPUTS   the arguments a layer takes per call (its activations); the other tensors
                   are its parameters, or buffers if the call updates them (`levels bench
                   --overhead` captures the component as such a layer in a CUDA graph)
    libraries(device, dtype) -> [equivalence.calls.Impl]: the library calls a level is timed
                   against (the suite times each where it runs; the fastest is the baseline;
                   `levels bench --overhead` the first, or eager(device, dtype) if the card
                   has one: the call a user writes without thinking of backends)

What the harness may use (defaults in brackets):

    MUTATED        variant -> buffers the call updates in place, checked like outputs [{}]
    VARIANT_SHAPES variant -> shape parameters it adds to (or overrides in) every preset, for
                   make_args: a variant that is also a shape (attention's grouped-query
                   and decoding cases: fewer K/V heads, fewer queries than keys) [{}]
    zero_gradient_scales(args, upstream, grads) -> {input: tensor}: for inputs whose
                   gradient is exactly zero on these arguments, the tensor whose norm the
                   level's (rounding-sized) gradient is measured against instead [none]
    RATE           "TFLOP/s" or "TB/s": the rate that says how a level does on it; TB/s for
                   a component that moves bytes rather than computing ["TFLOP/s"]
    MODEL_SHAPES   the shapes real models call it with (Shape, below) for `levels bench
                   --suite models`, with tiny_twin(sizes) (the CPU-sized twin: same
                   structure) and describe(sizes, variants) (one line) [()]
    SUITE_GOAL     the suite's goal on the geometric mean of a level's ratios to the best
                   library call: a number, or {variant: number or None} to set it per
                   variant, with NO_GOAL {variant: why not} [None]
    eager(device, dtype) -> Impl: the library call `levels bench --overhead` measures a
                   level against [the first of libraries]
    FUSED_ATEN     ATen ops that compute the whole component in one call: a kernel level
                   that dispatches one has not written the kernel (`levels grade`) [()]
    NN_MODULES     class names of its layers (levels.nn's and torch's twins): `levels train
                   --breakdown` charges their time to the component [()]
    SOLUTION_FILES level -> the file (or files) that hold its solution regions at that level,
                   where it is not the level's usual one (`levels assignment build`) [{}]
    SAME_ALGORITHM_AS  components whose solutions are this one's nearly line for line
                   (rms_norm's kernels are layer_norm's without the mean): an assignment of
                   either hides the other's solution regions too (`levels assignment build`;
                   one card names it, the relation goes both ways) [()]
    TOLERANCE      dtype -> the bound of that dtype for this component, where its math is
                   an iteration whose roundings compound (newton_schulz: 15 rounded GEMMs,
                   small singular values amplified 3.4x a step); each says its measurement
                   [the bounds of equivalence/tolerances.py]
    properties(args, outputs) -> [(what, ok, problem)]: checks of a level's outputs beyond
                   the distance to the reference (newton_schulz: its singular values lie in
                   Muon's band) [none]
    explain(level, case, device) -> [(title, body)]: sections `levels explain` adds for
                   this component at `level` [none]
    host_path_note(level) -> str: what `levels explain`'s host-path section (Levels 4 and 5)
                   adds about a whole model built around this component, from the reports
                   that recorded it (the LSTM LM) ["": the GPT's step, told for every card]
    HOST_PROBE     what `levels explain --level triton` says about the host time of one small
                   call: kernel_dominates_above(host_us, source) (from what size the kernel's time
                   outweighs the host's), fix_note(rows, raw) (a fix of its own), recorded
                   (keys of a whole call measured in reports/h100-host-probe.json), measure
                   {group: fn(rec, device)} (the measurements, into the probe's recorder; a
                   group of the recorded file may gather several cards'), layout (how the
                   pieces of the call add up: plain data, see cards/layer_norm.py) [none]

`Card` wraps such a module with these defaults and the generic parts (sizes and variants by
name, seeding, layouts); `get(component)` returns it.

Layouts. A level receives whatever tensors a user has, and a user's tensors are often views:
a bias sliced from a fused parameter buffer, a weight stored transposed, activations sliced
from a bigger buffer, channels_last images, q/k/v cut out of one projection. Every case is
therefore run in two layouts: `contiguous` (fresh tensors) and `strided` (the same values,
every tensor argument a view). The memory a strided view does not cover is filled with NaN,
so a kernel that reads between the elements (indexing as if the stride were 1) computes NaN
and fails, and `check` verifies that those bytes are unchanged after the call, so a kernel
that writes between them fails too. Around a buffer the call updates in place the filler
is a finite sentinel (GAP_SENTINEL) instead: arithmetic on a NaN can give back the very
same NaN bytes, which would hide a write; on a sentinel it cannot.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from dataclasses import dataclass, field
from types import ModuleType

import torch

from levels.contract import COMPONENTS


LAYOUTS = ("contiguous", "strided")


@dataclass(frozen=True)
class Case:
    """One concrete call: a component at a size, variant and layout, with fresh inputs."""
    component: str
    size: str
    variant: str
    args: dict
    differentiable: tuple[str, ...]
    mutated: tuple[str, ...]
    outputs: tuple[str, ...]
    layout: str = "contiguous"  # "strided": every tensor argument is a view (see above)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.tensors().values())).dtype

    @property
    def n_returned(self) -> int:
        """How many of `outputs` the call returns (the rest are buffers it updates)."""
        return len(self.outputs) - len(self.mutated)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.args.items() if isinstance(v, torch.Tensor)}

    def shapes(self) -> dict[str, tuple]:
        return {k: tuple(v.shape) for k, v in self.tensors().items()}


REQUIRED = ("SIZES", "VARIANTS", "OUTPUTS", "DIFFERENTIABLE", "make_args", "reference", "flops",
            "min_bytes", "SCALING_DIM", "GRAPH_INPUTS", "libraries")


class Card:
    """A card module with the generic parts and the defaults of the optional entries."""

    def __init__(self, module: ModuleType):
        self.name = module.__name__.rsplit(".", 1)[1]
        self.module = module
        missing = [entry for entry in REQUIRED if not hasattr(module, entry)]
        if not hasattr(module, "STRIDED") and not hasattr(module, "strided"):
            missing.append("STRIDED (or strided)")
        if missing:
            raise TypeError(f"the card {module.__name__} lacks {', '.join(missing)} "
                            f"(docs/adding-a-component.md lists what a card holds)")
        self.sizes: dict[str, dict] = module.SIZES
        self.variants: dict[str, dict] = module.VARIANTS
        self.outputs: tuple[str, ...] = tuple(module.OUTPUTS)
        self.differentiable: tuple[str, ...] = tuple(module.DIFFERENTIABLE)
        self.scaling_dim: str = module.SCALING_DIM
        self.graph_inputs: tuple[str, ...] = tuple(module.GRAPH_INPUTS)
        self.rate: str = getattr(module, "RATE", "TFLOP/s")
        self.fused_aten: tuple[str, ...] = tuple(getattr(module, "FUSED_ATEN", ()))
        self.nn_modules: tuple[str, ...] = tuple(getattr(module, "NN_MODULES", ()))
        self.solution_files: dict = dict(getattr(module, "SOLUTION_FILES", {}))
        self.same_algorithm_as: tuple[str, ...] = tuple(getattr(module, "SAME_ALGORITHM_AS", ()))
        self.host_probe: dict = dict(getattr(module, "HOST_PROBE", {}))

    def __repr__(self) -> str:
        return f"<card {self.name}>"

    def mutated(self, variant: str) -> tuple[str, ...]:
        return tuple(getattr(self.module, "MUTATED", {}).get(variant, ()))

    @property
    def buffers(self) -> tuple[str, ...]:
        """The arguments some variant updates in place: a layer's buffers, not parameters."""
        return tuple(dict.fromkeys(b for v in self.variants for b in self.mutated(v)))

    def case(self, size: str | dict, variant: str, dtype: torch.dtype, device, seed: int,
             layout: str = "contiguous") -> Case:
        """Fresh random inputs for a size preset (or a dict of shape parameters), variant and
        layout. Both layouts hold the same values for the same seed."""
        if isinstance(size, dict):
            shape, size = size, "custom"
        elif size in self.sizes:
            shape = self.sizes[size]
        else:
            raise ValueError(f"argument 'size' must be one of {sorted(self.sizes)} for {self.name} "
                             f"(or a dict of shape parameters); got {size!r}")
        if variant not in self.variants:
            raise ValueError(f"argument 'variant' must be one of {sorted(self.variants)} for "
                             f"{self.name}; got {variant!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"argument 'layout' must be one of {', '.join(LAYOUTS)}; got {layout!r}")
        generator = torch.Generator(device="cpu").manual_seed(seed)
        shape = {**shape, **getattr(self.module, "VARIANT_SHAPES", {}).get(variant, {})}
        args = self.module.make_args(shape, dtype, torch.device(device), generator)
        args.update(self.variants[variant])
        if layout == "strided":
            args = self.strided(args, self.mutated(variant))
        return self.case_from_args(args, size, layout, variant)

    def strided(self, args: dict, mutated=()) -> dict:
        """The same values with every tensor argument a view (the card's STRIDED kinds)."""
        own = getattr(self.module, "strided", None)
        if own is not None:
            return own(dict(args))
        kinds = self.module.STRIDED
        return {name: as_view(value, kinds[name], GAP_SENTINEL if name in mutated else float("nan"))
                if isinstance(value, torch.Tensor) else value for name, value in args.items()}

    def case_from_args(self, args: dict, size: str = "custom", layout: str | None = None,
                       variant: str | None = None) -> Case:
        """A case made of arguments you choose (any shapes, strides or layouts). The variant,
        unless given, follows from the flags in `args` (a missing bool flag counts as False):
        of the variants whose flags all match, the one with the most flags."""
        def matches(flags):
            return all((bool(args.get(k, False)) if isinstance(v, bool) else args.get(k)) == v
                       for k, v in flags.items())
        if variant is None:
            found = [(len(flags), -i, name) for i, (name, flags) in enumerate(self.variants.items())
                     if matches(flags)]
            variant = max(found)[2] if found else None
        if variant is None:
            raise ValueError(f"{self.name}: the arguments match no variant of {sorted(self.variants)}")
        mutated = self.mutated(variant)
        differentiable = tuple(n for n in self.differentiable if isinstance(args.get(n), torch.Tensor))
        if layout is None:
            contiguous = all(t.is_contiguous() for t in args.values() if isinstance(t, torch.Tensor))
            layout = "contiguous" if contiguous else "strided"
        return Case(self.name, size, variant, dict(args), differentiable, mutated,
                    self.outputs + mutated, layout)

    def tolerance(self, dtype: torch.dtype, default: float) -> float:
        return getattr(self.module, "TOLERANCE", {}).get(dtype, default)

    def properties(self, args: dict, outputs: list) -> list[tuple[str, bool, str]]:
        fn = getattr(self.module, "properties", None)
        return [] if fn is None else list(fn(args, outputs))

    def zero_gradient_scales(self, args: dict, upstream, grads: dict) -> dict:
        fn = getattr(self.module, "zero_gradient_scales", None)
        return {} if fn is None else {k: v.detach() for k, v in fn(args, upstream, grads).items()}

    def reference(self, args: dict) -> tuple[torch.Tensor, ...]:
        return tuple(self.module.reference(**args))

    def flops(self, args: dict) -> dict[str, int]:
        return self.module.flops(args)

    def min_bytes(self, args: dict) -> dict[str, int]:
        return self.module.min_bytes(args)

    # -- the model-shape suite ------------------------------------------------------------

    @functools.cached_property
    def model_shapes(self) -> tuple[Shape, ...]:
        """MODEL_SHAPES, each with this component's name and its tiny twin filled in."""
        return tuple(dataclasses.replace(s, component=self.name, tiny_sizes=self.tiny_twin(s.sizes))
                     for s in getattr(self.module, "MODEL_SHAPES", ()))

    def tiny_twin(self, sizes: dict) -> dict:
        return self.module.tiny_twin(dict(sizes))

    def describe(self, sizes: dict, variants) -> str:
        return self.module.describe(sizes, set(variants))

    def goal(self, variant: str) -> float | None:
        """The suite's goal for a level's ratios at this variant (None: reported only)."""
        goal = getattr(self.module, "SUITE_GOAL", None)
        return goal.get(variant) if isinstance(goal, dict) else goal

    def goal_group(self, variant: str) -> str:
        """What a goal is set on: the component, or the component and a variant where the
        card sets goals per variant (conv_bn: 'conv_bn eval')."""
        return f"{self.name} {variant}" if isinstance(getattr(self.module, "SUITE_GOAL", None),
                                                       dict) else self.name

    def no_goal(self, variant: str) -> str:
        return getattr(self.module, "NO_GOAL", {}).get(variant, "")

    def libraries(self, device, dtype) -> list:
        return list(self.module.libraries(torch.device(device), dtype))

    def eager(self, device, dtype):
        own = getattr(self.module, "eager", None)
        return own(torch.device(device), dtype) if own else self.libraries(device, dtype)[0]

    # -- the other commands -----------------------------------------------------------------

    def explain(self, level: str, case: Case, device) -> list[tuple[str, str]]:
        own = getattr(self.module, "explain", None)
        return [] if own is None else list(own(level, case, device))

    def host_path_note(self, level: str) -> str:
        own = getattr(self.module, "host_path_note", None)
        return "" if own is None else own(level)


# ---------------------------------------------------------------------------------------
# Model shapes: the sizes real models call a component with (`levels bench --suite models`)
# ---------------------------------------------------------------------------------------

FWD, FWD_BWD = "fwd", "fwd+bwd"
PASSES = (FWD, FWD_BWD)


@dataclass(frozen=True)
class Shape:
    """One shape of the suite. `sizes` are the card's shape parameters (make_args
    conventions), so the card builds its arguments, FLOPs and minimum bytes as for the
    presets. `directions` says what is timed there, as (variant, pass) pairs: "fwd"
    (inference: no autograd) or "fwd+bwd" (training). Every shape runs in bfloat16 on a GPU
    except where `dtype` says otherwise; `source` says where its numbers come from."""
    name: str  # unique in the suite, e.g. "gpt2-small-train"
    model: str  # the model it comes from, as a reader would name it
    source: str
    sizes: dict
    directions: tuple
    dtype: str = "bfloat16"  # on a GPU; the CPU smoke run uses float32
    component: str = ""  # filled in by the card
    tiny_sizes: dict = field(default_factory=dict)  # the card's tiny_twin of `sizes`

    def tiny(self) -> dict:
        """The scaled-down twin's shape parameters (same structure, CPU-sized)."""
        return dict(self.tiny_sizes)

    def describe(self, tiny: bool = False) -> str:
        """The sizes (or the tiny twin's) in one line, e.g. 'B8 H12 N1024 D64 causal'."""
        return get(self.component).describe(self.tiny_sizes if tiny else self.sizes,
                                            {v for v, _ in self.directions})


def train(variant="default") -> tuple:
    """A training shape's directions: the forward alone and forward+backward."""
    return ((variant, FWD), (variant, FWD_BWD))


def infer(variant="default") -> tuple:
    """An inference shape's direction: the forward alone."""
    return ((variant, FWD),)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def shrink(n: int, factor: int, low: int = 1) -> int:
    """n / factor, at least `low`; a size that is no power of two stays none (the masked
    edges are what an odd size tests), a power of two stays one."""
    small = max(low, round(n / factor))
    if is_pow2(n):
        return max(low, 1 << (small.bit_length() - 1))  # the power of two at or below
    if is_pow2(small) and small > 1:
        small += 1
    return small


def shrink_rows(rows: tuple) -> tuple:
    """Leading "rows" dimensions of a tiny twin: the outer ones capped at 2, the last / 16."""
    return tuple(min(r, 2) for r in rows[:-1]) + (shrink(rows[-1], 16),)


def rows_text(rows: tuple) -> str:
    return "x".join(map(str, rows))


def prod(values) -> int:
    return math.prod(values)


# Model dimensions, each from the model's published configuration (shared by several cards):
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


def randn(shape, generator, dtype, device, scale=1.0, shift=0.0) -> torch.Tensor:
    """Draw on the CPU in float32 (same numbers on every device), then cast and move."""
    t = torch.randn(shape, generator=generator, dtype=torch.float32) * scale + shift
    return t.to(device=device, dtype=dtype)


def uniform(shape, generator, dtype, device, low, high) -> torch.Tensor:
    t = torch.rand(shape, generator=generator, dtype=torch.float32) * (high - low) + low
    return t.to(device=device, dtype=dtype)


# How the `strided` layout stores one argument. Each kind is a layout users really pass.
LAYOUT_KINDS = {
    "every_other": "a 1-D view with stride 2 (one parameter of a fused, interleaved buffer)",
    "last_every_other": "stride 2 along the last dimension",
    "transposed": "a 2-D weight stored column-major (w.t() of a contiguous tensor)",
    "row_padded": "rows sliced out of a wider buffer (row stride > width, offset 1)",
    "time_major": "(B, T, I) as a permuted view of a (T, B, I) buffer",
    "channels_last": "a 4-D tensor in torch.channels_last",
}


# Between the elements of a strided buffer that a call updates in place (exact in fp16/bf16).
GAP_SENTINEL = -4096.0


def as_view(t: torch.Tensor, kind: str, gap: float = float("nan")) -> torch.Tensor:
    """A view laid out as LAYOUT_KINDS[kind] holding exactly t's values, `gap` in the
    memory around it (NaN: reading there poisons the result)."""
    def _gapped(shape, dtype, device):
        return torch.full(shape, gap, dtype=dtype, device=device)

    if kind not in LAYOUT_KINDS:
        raise ValueError(f"unknown layout kind {kind!r}; one of {sorted(LAYOUT_KINDS)}")
    view = None
    if kind == "every_other" and t.dim() == 1:
        view = _gapped((2 * t.numel(),), t.dtype, t.device)[::2]
    elif kind == "last_every_other":
        view = _gapped((*t.shape[:-1], 2 * t.shape[-1]), t.dtype, t.device)[..., ::2]
    elif kind == "transposed":
        view = _gapped(tuple(reversed(t.shape)), t.dtype, t.device).t()
    elif kind == "row_padded":
        view = _gapped((*t.shape[:-1], t.shape[-1] + 3), t.dtype, t.device)[..., 1:t.shape[-1] + 1]
    elif kind == "time_major":
        view = _gapped((t.shape[1], t.shape[0], *t.shape[2:]), t.dtype, t.device).transpose(0, 1)
    elif kind == "channels_last" and t.dim() == 4:
        view = torch.empty_like(t, memory_format=torch.channels_last)
    if view is None or tuple(view.shape) != tuple(t.shape):
        raise ValueError(f"layout kind {kind!r} does not apply to a tensor of shape {tuple(t.shape)}")
    return view.copy_(t)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def names() -> tuple[str, ...]:
    """Every component with a card: the contract's, in its order."""
    return tuple(COMPONENTS)


@functools.cache
def get(component: str) -> Card:
    """The card of `component` (equivalence/cards/<component>.py)."""
    if component not in COMPONENTS:
        raise ValueError(f"argument 'component' must be one of {', '.join(COMPONENTS)}; "
                         f"got {component!r}")
    return Card(importlib.import_module(f"{__name__}.{component}"))


__all__ = ["FWD", "FWD_BWD", "LAYOUTS", "LAYOUT_KINDS", "PASSES", "Card", "Case", "Shape", "as_view",
           "get", "infer", "names", "nbytes", "randn", "train", "uniform"]
