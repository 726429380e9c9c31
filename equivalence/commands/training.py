"""`levels train`: a whole model trained at every level, from the same weights on the same batches.

    levels train --model gpt --preset tiny --level all      # every level that runs here
    levels train --model lstm --preset gpu --level native,triton --steps 50
    torchrun --nproc_per_node 2 -m equivalence.train --model gpt --preset gpu --level triton

A component that is 1.5x faster does not make a model 1.5x faster (Amdahl), and "the levels
compute the same function" is most convincing when a whole model, trained at each level,
follows the same loss curve. This command measures both.

One run per level (and per baseline): the model of `levels.models` built from one plain-torch
twin (`Model.from_torch`), so every run starts from the very same weights; the same list of
batches, in the same order (`levels.models.data`, made up front: no data work inside a timed
step); the same optimizer (Adam, gradient norm clipped at 1). A level that cannot run the
model here is listed with the reason `levels.status` gives for the first component it lacks,
never replaced by another. Baselines (`--baseline`): `torch`, the twin itself (nn.LSTM:
cuDNN on a GPU; nn.MultiheadAttention: SDPA's fused kernels), and `native-compiled`, the
whole Level 1 model under one torch.compile. `--compile` compiles the whole model of every
run (and counts Dynamo's graph breaks: where a level's kernels were not captured).

Printed: a progress bar with the loss and tokens/s (images/s for the CNN) while a run trains,
then one table; nothing else (what libraries print goes to `train-<model>-<preset>.log`).
Written to `--out`: `train-<model>-<preset>.json` (configuration, data, every step's loss and time per run,
throughput, agreement, versions, device, date) and `.png` (the loss curves overlaid; each
run's distance from the reference curve against the bounds; throughput per run).

Agreement (`agreement`): the reference is Level 1 (`native`). For the first EARLY_STEPS steps
every run's loss must be within the harness's dtype bound of the reference's, relatively
(equivalence/tolerances.py: 1e-5 in float32): same weights and batches, and only a few
updates, so what separates two runs is rounding, as in one component's check. After that,
within DRIFT_BOUNDS: training is chaotic, a difference of one rounding grows by some factor
each step until the trajectories are merely statistically alike; the looser bound asks that
they stay the same training (measured in float32 on the CPU at the tiny presets' sizes, 200
steps, native vs torchscript vs plain torch: at most 7e-5 (the GPT), 140x below 1e-2). The
bf16 bounds (3.1e-2 early, 5e-2 later) are reasoned, not yet measured: bf16 rounds 2**16
times coarser, and its parameters take Adam's updates in bf16 too. A kernel error shows in
the first steps, where the tight bound holds.

Throughput is the median step time after WARMUP steps (the first steps compile, JIT, autotune
and warm allocators; the first step's time is reported on its own). Each step ends with
`loss.item()`, which waits for the device, so the clock measures the finished step. Triton's
CPU interpreter (Level 4 without a GPU) runs at the `tiny` preset only and is marked: an
emulation's speed says nothing about the kernels.

Distributed: under `torchrun` (WORLD_SIZE > 1) every run is wrapped in
DistributedDataParallel (NCCL on GPUs, gloo on CPUs); each process takes its slice of the
same global batch, so 2 processes of batch B see what one process of batch 2B sees. Rank 0
prints and writes; losses are averaged over the processes.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import levels
from levels import models
from levels.models import data

from . import environment
from .tolerances import tolerance

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_RAN = 0, 1, 2, 3  # equivalence.cli's codes

MODELS = ("gpt", "lstm", "cnn")
PRESET_NAMES = ("tiny", "small", "gpu")
BASELINES = ("torch", "native-compiled")
REFERENCE = "native"
EARLY_STEPS = 5
# Relative difference of a later step's loss from the reference's (see the module doc).
DRIFT_BOUNDS = {torch.float32: 1e-2, torch.bfloat16: 5e-2, torch.float16: 5e-2}
WARMUP = 3
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}

# Each preset: the model's configuration, the batch (per process), the sequence length or
# image size, the steps, Adam's learning rate, the dtype and the number of validation batches.
#   tiny   every level in under a minute on a 2-core CPU, Triton's interpreter included:
#          its cost is per program and loop iteration, so widths and batches are minimal
#          (measured there: ~0.1-0.7 s per component call, ~1.5 s per ConvBN call)
#   small  a real CPU run (Levels 1-3; the interpreter is refused)
#   gpu    realistic sizes, bf16: GPT-2 small (768 wide, 12 heads, 12 layers, 1024 tokens),
#          an LSTM LM of hidden 1024 at batch 64, a ResNet-ish CNN on 64x64 images. The LSTM's
#          windows are 64 tokens: Level 3 compiles the time loop in graphs of a few steps
#          (levels/compiled.py LSTM_CHUNK; the whole loop took 47 s at T=64 on the H100); its
#          embedding is as wide as its hidden state so that both layers have one shape (one
#          compile, not two)
# A 16-bit dtype means the parameters themselves are 16-bit (Adam's state too), with no fp32
# master copy: the contract takes one dtype for all arguments of a component, so autocast
# (fp32 weights, bf16 activations) would be refused by every level alike. For the tens of
# steps of a benchmark that trains well enough; the loss itself is always computed in fp32.
PRESETS = {
    "tiny": {
        "gpt": dict(config=dict(d_model=32, n_heads=2, n_layers=1, seq_len=16), batch=2, seq_len=16,
                    steps=10, lr=3e-3, dtype="float32", eval_batches=1),
        "lstm": dict(config=dict(embed=16, hidden=16, n_layers=2), batch=2, seq_len=12,
                     steps=10, lr=1e-2, dtype="float32", eval_batches=1),
        "cnn": dict(config=dict(widths=(8,), strides=(2,)), batch=2, image=8,
                    steps=6, lr=3e-3, dtype="float32", eval_batches=1),
    },
    "small": {
        "gpt": dict(config=dict(d_model=128, n_heads=4, n_layers=4, seq_len=128), batch=8,
                    seq_len=128, steps=100, lr=1e-3, dtype="float32", eval_batches=8),
        "lstm": dict(config=dict(embed=64, hidden=256, n_layers=2), batch=16, seq_len=64,
                     steps=100, lr=3e-3, dtype="float32", eval_batches=8),
        "cnn": dict(config=dict(widths=(16, 32, 64), strides=(1, 2, 2)), batch=32, image=32,
                    steps=100, lr=3e-3, dtype="float32", eval_batches=8),
    },
    "gpu": {
        "gpt": dict(config=dict(d_model=768, n_heads=12, n_layers=12, seq_len=1024), batch=8,
                    seq_len=1024, steps=50, lr=3e-4, dtype="bfloat16", eval_batches=4),
        "lstm": dict(config=dict(embed=1024, hidden=1024, n_layers=2), batch=64, seq_len=64,
                     steps=50, lr=1e-3, dtype="bfloat16", eval_batches=4),
        "cnn": dict(config=dict(widths=(64, 128, 256), strides=(1, 2, 2)), batch=128, image=64,
                    steps=50, lr=1e-3, dtype="bfloat16", eval_batches=4),
    },
}


# ---------------------------------------------------------------------------------------
# What one training run records
# ---------------------------------------------------------------------------------------

@dataclass
class Run:
    name: str                       # a level's name, or a baseline's
    kind: str                       # "level" or "baseline"
    status: str = "ok"              # ok | skip | error
    reason: str = ""
    interpreted: bool = False       # Triton's CPU interpreter: an emulation, not a speed
    whole_model_compiled: bool = False
    losses: list = field(default_factory=list)
    step_s: list = field(default_factory=list)
    val_loss: float | None = None
    graph_breaks: int | None = None
    aliased_gradients: list = field(default_factory=list)  # pairs of parameters sharing a .grad
    breakdown: dict | None = None   # --breakdown: ms per step by layer type (equivalence.breakdown)

    def timing(self, items_per_step: int) -> dict | None:
        """First step, steady-state median and p20/p80 (after WARMUP steps), items/s."""
        if not self.step_s:
            return None
        warm = self.step_s[min(WARMUP, len(self.step_s) - 1):]
        q = statistics.quantiles(warm, n=5, method="inclusive") if len(warm) > 1 else [warm[0]] * 4
        median = statistics.median(warm)
        return {"first_step_s": self.step_s[0], "median_step_ms": median * 1e3,
                "p20_step_ms": q[0] * 1e3, "p80_step_ms": q[3] * 1e3, "steps_timed": len(warm),
                "items_per_s": items_per_step / median}

    def to_dict(self, items_per_step: int) -> dict:
        return {**asdict(self), "timing": self.timing(items_per_step)}


# ---------------------------------------------------------------------------------------
# Models and data of a preset
# ---------------------------------------------------------------------------------------

def preset(model: str, name: str) -> dict:
    if model not in MODELS:
        raise ValueError(f"argument '--model' must be one of {', '.join(MODELS)}; got {model!r}")
    if name not in PRESETS:
        raise ValueError(f"argument '--preset' must be one of {', '.join(PRESET_NAMES)}; got {name!r}")
    return copy.deepcopy(PRESETS[name][model])


def build_twin(model: str, config: dict, vocab: int | None):
    """The plain-torch model, its weights drawn on the CPU (the same on every device)."""
    if model == "gpt":
        return models.TorchGPT(models.GPTConfig(vocab=vocab, **config))
    if model == "lstm":
        return models.TorchLSTMLM(models.LSTMConfig(vocab=vocab, **config))
    return models.TorchResNet(models.CNNConfig(classes=data.CLASSES, **config))


LEVELED = {"gpt": models.GPT, "lstm": models.LSTMLM, "cnn": models.ResNet}


def make_data(model: str, p: dict, seed: int, rank: int = 0, world: int = 1):
    """(training batches, validation batches, items per step and process, unit, description)."""
    if model == "cnn":
        train = data.grating_batches(p["batch"], p["image"], p["steps"], seed, rank=rank, world=world)
        val = data.grating_eval_batches(p["batch"], p["image"], p["eval_batches"], seed)
        about = {"source": "oriented gratings in noise, generated in code (levels.models.data)",
                 "classes": data.CLASSES, "noise_std": data.NOISE, "image": p["image"], "seed": seed}
        return train, val, p["batch"], "images/s", about, None
    corpus = data.stdlib_corpus()
    train = data.text_batches(corpus.train, p["batch"], p["seq_len"], p["steps"], seed, rank, world)
    val = data.text_eval_batches(corpus.val, p["batch"], p["seq_len"], p["eval_batches"])
    return train, val, p["batch"] * p["seq_len"], "tokens/s", corpus.describe(), corpus.vocab_size


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # in float32 whatever the model's dtype: a bf16 log-softmax over the vocabulary would
    # round the very number every curve is compared on
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


# ---------------------------------------------------------------------------------------
# Which runs can run here
# ---------------------------------------------------------------------------------------

def unavailable(model: str, level: str, device: torch.device, preset_name: str,
                compile_model: bool = False) -> str | None:
    """Why `level` cannot train `model` on `device` at `preset_name` (compiled whole if
    `compile_model`), or None."""
    for component in models.COMPONENTS[model]:
        reason = levels.status(level, device, component)
        if reason:
            return f"{component}: {reason}"
    if level == "triton" and _triton_interpreted():
        if preset_name != "tiny":
            return ("Triton runs in its CPU interpreter here (TRITON_INTERPRET=1), an emulation far "
                    "too slow for this preset: use --preset tiny, or a GPU")
        if compile_model:
            return ("torch.compile cannot trace Triton's CPU interpreter (NumPy under the kernels); "
                    "Level 4 under --compile needs a GPU")
    return None


def _triton_interpreted() -> bool:
    try:
        return bool(levels.get("triton").INTERPRETED)
    except Exception:  # noqa: BLE001 - no Level 4 here at all: levels.status says why
        return False


def resolve_levels(value: str | None) -> list[str]:
    if value is None or value.strip().lower() == "all":
        return list(levels.LEVEL_NAMES)
    names = []
    for item in value.split(","):
        if item.strip():
            name = levels.resolve(item.strip()).name  # ValueError names the choices
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError(f"argument '--level' must be 'all' or level names/numbers; got {value!r}")
    return names


def resolve_baselines(value: str | None) -> list[str]:
    if value is None or value.strip().lower() == "none":
        return []
    names = [v.strip() for v in value.split(",") if v.strip()]
    for name in names:
        if name not in BASELINES:
            raise ValueError(f"argument '--baseline' must be 'none' or a comma-separated list of "
                             f"{', '.join(BASELINES)}; got {name!r}")
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------------------------
# Distributed: torchrun sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT
# ---------------------------------------------------------------------------------------

def world() -> tuple[int, int, int]:
    """(world size, rank, local rank) from torchrun's environment; (1, 0, 0) without it."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return size, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))


def init_distributed(device: torch.device) -> torch.device:
    """Join torchrun's process group (NCCL on GPUs, gloo on CPUs); the device this process
    trains on (GPU number LOCAL_RANK: one GPU per process)."""
    import torch.distributed as dist

    _, _, local = world()
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


# ---------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------

def _graph_breaks() -> int:
    from torch._dynamo.utils import counters
    return sum(counters["graph_break"].values())


def prepare_model(model: str, twin, run: Run, device, compile_mode: str):
    """(what a run trains, the model inside it): a copy of the twin, or the leveled model with
    its weights; wrapped in DistributedDataParallel under torchrun, compiled whole if asked."""
    if run.name == "torch":
        inner = copy.deepcopy(twin)
    else:
        inner = LEVELED[model].from_torch(twin, REFERENCE if run.name == "native-compiled" else run.name)
    if model == "cnn" and device.type == "cuda":
        # channels_last: the layout cuDNN's and Level 4's bf16 convolutions run fastest in
        inner = inner.to(memory_format=torch.channels_last)
    net = inner
    size, _, _ = world()
    if size > 1:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    if run.whole_model_compiled:
        net = torch.compile(net, mode=compile_mode)
    return net, inner


def aliased_gradients(model) -> list[tuple[str, str]]:
    """Pairs of distinct parameters whose .grad is one tensor's memory. Autograd gives every
    parameter a gradient of its own; a level whose backward hands one tensor to two
    parameters breaks every in-place gradient operation (clipping, loss scaling), which then
    applies twice to it. (Tied weights are one parameter, listed once: not a pair.)"""
    seen, pairs = {}, []
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        key = (p.grad.untyped_storage().data_ptr(), p.grad.storage_offset())
        if key in seen:
            pairs.append((seen[key], name))
        seen.setdefault(key, name)
    return pairs


def train_run(net, inner, batches, val_batches, lr: float, on_step=None, aliased=None):
    """Train `net` on `batches`, then evaluate `inner` (the model inside `net`) on
    `val_batches`; returns (losses, seconds per step, validation loss). `aliased`, a list,
    receives the pairs of parameters that share one gradient tensor after the first backward."""
    import torch.distributed as dist

    size, _, _ = world()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    losses, step_s = [], []
    for step, (x, y) in enumerate(batches):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(net(x), y)
        loss.backward()
        if step == 0 and aliased is not None:  # once: a property of the level's backward
            aliased.extend(aliased_gradients(inner))
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        value = loss.detach().clone()
        if size > 1:
            dist.all_reduce(value)
            value = value / size
        losses.append(value.item())  # waits for the device: the step is done when the clock stops
        step_s.append(time.perf_counter() - start)
        if on_step:
            on_step(step, losses[-1], step_s[-1])
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"the loss is {losses[-1]} at step {step}")
    # Validation with autograd on but no backward: Level 3 compiled its graphs with grad
    # enabled, and under no_grad it would compile them all again for one evaluation. On the
    # model inside: DistributedDataParallel expects a backward after every forward with
    # grad on (its second forward would raise), and every process has the whole model.
    inner.eval()
    total = 0.0
    for x, y in val_batches:
        total += loss_of(inner(x), y).item()
    inner.train()
    return losses, step_s, total / max(len(val_batches), 1)


# ---------------------------------------------------------------------------------------
# Agreement of the loss curves
# ---------------------------------------------------------------------------------------

def _breakdown(net, inner, run: Run, batches, lr: float, world_size: int) -> dict:
    """This run's step time by layer type (see equivalence.breakdown), or why there is none."""
    from .breakdown import breakdown

    if world_size > 1:
        return {"skipped": "one process at a time: rerun without torchrun"}
    if run.whole_model_compiled:
        return {"skipped": "the whole model is compiled: the layer hooks would break its graph"}
    if run.interpreted:
        return {"skipped": "Triton's CPU interpreter is an emulation, not a speed"}
    return breakdown(net, inner, (batches * 4)[:4], loss_of, lr)  # a short run's batches again


def model_uses_tf32(model: str, level: str, device, dtype: torch.dtype) -> bool:
    """Whether `level` runs any of `model`'s float32 components in TF32 on `device` (each
    level says so itself, as for the harness: e.g. cuDNN's fp32 convolutions by default)."""
    return any(levels.get(level).uses_tf32(c, torch.device(device), dtype) for c in models.COMPONENTS[model])


def agreement(runs: list[Run], dtype: torch.dtype, reference: str = REFERENCE,
              early_steps: int = EARLY_STEPS, tf32: frozenset = frozenset()) -> dict:
    """Every finished run's loss curve against the reference run's, step by step:
    |loss - loss_ref| / |loss_ref| <= tolerance(dtype) for the first `early_steps` steps,
    <= DRIFT_BOUNDS[dtype] after (see the module doc). `tf32`: the runs whose float32 math
    runs in TF32; a pair with one of them in it gets the harness's TF32 bound early on.
    Returns the bounds and, per run, its early bound, the worst difference in each window
    and whether both held."""
    early_bound, drift_bound = tolerance(dtype), DRIFT_BOUNDS[dtype]
    done = {r.name: r for r in runs if r.status == "ok"}
    report = {"reference": reference, "early_steps": early_steps, "early_bound": early_bound,
              "drift_bound": drift_bound, "runs": {}}
    if reference not in done:
        report["note"] = f"no agreement: the reference run {reference!r} did not run"
        return report
    ref = done[reference].losses
    for name, run in done.items():
        if name == reference:
            continue
        bound = tolerance(dtype, tf32=bool({name, reference} & tf32))
        n = min(len(ref), len(run.losses))
        rel = [abs(a - b) / abs(b) for a, b in zip(run.losses[:n], ref[:n])]
        early, later = rel[:early_steps], rel[early_steps:]
        worst_early = max(early, default=0.0)
        worst_later = max(later, default=None)
        passed = worst_early <= bound and (worst_later is None or worst_later <= drift_bound)
        report["runs"][name] = {"rel_diff": rel, "early_bound": bound, "worst_early": worst_early,
                                "worst_later": worst_later, "passed": passed}
    return report


# ---------------------------------------------------------------------------------------
# The whole comparison
# ---------------------------------------------------------------------------------------

def train(model: str = "gpt", level_names=("native",), baselines=("torch",), preset_name: str = "tiny",
          steps: int | None = None, device=None, dtype: str | None = None, seed: int = 0,
          batch: int | None = None, compile_model: bool = False, compile_mode: str | None = None,
          on_run=None, on_step=None, breakdown: bool = False) -> dict:
    """Train `model` at each of `level_names` (and each baseline) from the same weights on the
    same batches; returns the report `levels train` writes. Progress callbacks:
    on_run(run, phase, steps, items_per_step) with phase "start" before a run (or its skip) and
    "done" after it; on_step(run, step, loss, seconds, items_per_step) after each step."""
    from .compare import CompileMode, resolve_compile_mode

    p = preset(model, preset_name)
    device = torch.device(device) if device is not None else environment.default_device()
    if preset_name == "gpu" and device.type != "cuda":
        raise ValueError("argument '--preset': 'gpu' needs a CUDA device (its sizes take hours on "
                         "a CPU); use --preset tiny or small here")
    for name, value in (("steps", steps), ("batch", batch)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"argument '--{name}' must be a positive int; got {value!r}")
    p["steps"] = steps or p["steps"]
    p["batch"] = batch or p["batch"]
    dtype_name = dtype or p["dtype"]
    if dtype_name not in DTYPES:
        raise ValueError(f"argument '--dtype' must be one of {', '.join(DTYPES)}; got {dtype_name!r}")
    torch_dtype = DTYPES[dtype_name]
    size, rank, _ = world()
    if size > 1:
        device = init_distributed(device)

    mode = resolve_compile_mode(compile_mode)
    train_batches, val_batches, items, unit, about, vocab = make_data(model, p, seed, rank, size)
    fmt = torch.channels_last if (model == "cnn" and device.type == "cuda") else torch.contiguous_format

    def to_device(pairs):
        return [(x.to(device=device, dtype=torch_dtype if x.is_floating_point() else None,
                      memory_format=fmt if x.dim() == 4 else torch.preserve_format), y.to(device))
                for x, y in pairs]

    train_batches, val_batches = to_device(train_batches), to_device(val_batches)
    torch.manual_seed(seed)
    twin = build_twin(model, p["config"], vocab).to(device=device, dtype=torch_dtype)

    runs = [Run(n, "level") for n in level_names] + [Run(n, "baseline") for n in baselines]
    for run in runs:
        run.whole_model_compiled = compile_model or run.name == "native-compiled"
        run.interpreted = run.name == "triton" and _triton_interpreted()
        level = REFERENCE if run.name == "native-compiled" else (None if run.kind == "baseline" else run.name)
        reason = unavailable(model, level, device, preset_name, compile_model) if level else None
        if reason:
            run.status, run.reason = "skip", reason
    names = [r.name for r in runs]
    items_per_step = items * size
    with CompileMode(mode if "compile" in names else None, device):
        for run in runs:
            if on_run:
                on_run(run, "start", p["steps"], items_per_step)
            if run.status == "skip":
                continue
            breaks = None
            if run.whole_model_compiled:
                # Each compiled run from an empty Dynamo cache: its graph breaks and its first
                # step are its own, not the leftovers of the run before (Level 3's functions
                # compile again in it, as they would in a fresh process)
                torch._dynamo.reset()
                breaks = _graph_breaks()
            try:
                net, inner = prepare_model(model, twin, run, device, mode)
                run.losses, run.step_s, run.val_loss = train_run(
                    net, inner, train_batches, val_batches, p["lr"],
                    on_step=(lambda s, loss, sec, run=run: on_step(run, s, loss, sec, items_per_step))
                    if on_step else None, aliased=run.aliased_gradients)
                if breakdown:
                    run.breakdown = _breakdown(net, inner, run, train_batches, p["lr"], size)
            except Exception as exc:  # noqa: BLE001 - a level that raises is a result, reported
                traceback.print_exc()  # into the log (the command sends library output there)
                run.status, run.reason = "error", f"{type(exc).__name__}: {exc}"[:2000]
            if breaks is not None:
                run.graph_breaks = _graph_breaks() - breaks
            net = inner = None  # this run's model and optimizer state go before the next is built
            if on_run:
                on_run(run, "done", p["steps"], items_per_step)
    return {
        "settings": {"model": model, "preset": preset_name, "config": p["config"], "batch": p["batch"],
                     "seq_len": p.get("seq_len"), "image": p.get("image"), "steps": p["steps"],
                     "lr": p["lr"], "optimizer": "Adam, gradient norm clipped at 1.0",
                     "dtype": str(torch_dtype).removeprefix("torch."), "device": str(device),
                     "seed": seed, "levels": list(level_names), "baselines": list(baselines),
                     "compile_model": compile_model, "compile_mode": mode, "world_size": size,
                     "ddp_backend": ("nccl" if device.type == "cuda" else "gloo") if size > 1 else None,
                     "warmup_steps": WARMUP, "items_per_step": items_per_step, "unit": unit,
                     "breakdown": breakdown},
        "data": about,
        "environment": environment.describe(device),
        "runs": [r.to_dict(items_per_step) for r in runs],
        "agreement": agreement(runs, torch_dtype, tf32=frozenset(
            r.name for r in runs if r.status == "ok"
            and model_uses_tf32(model, REFERENCE if r.kind == "baseline" else r.name, device, torch_dtype))),
    }


def exit_code(report: dict) -> int:
    runs = report["runs"]
    if not any(r["status"] == "ok" for r in runs):
        return EXIT_NOTHING_RAN
    failed = any(r["status"] == "error" for r in runs)
    failed |= any(not a["passed"] for a in report["agreement"]["runs"].values())
    return EXIT_FAILED if failed else EXIT_OK


# ---------------------------------------------------------------------------------------
# Files: JSON and the picture
# ---------------------------------------------------------------------------------------

def paths(report: dict, out_dir) -> tuple[Path, Path]:
    s = report["settings"]
    stem = Path(out_dir) / f"train-{s['model']}-{s['preset']}"
    return stem.with_suffix(".json"), stem.with_suffix(".png")


def save(report: dict, out_dir) -> tuple[Path, Path]:
    json_path, png_path = paths(report, out_dir)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, png_path)
    return json_path, png_path


def _label(run: dict) -> str:
    name = run["name"]
    try:
        label = f"{levels.resolve(name).number} {name}" if run["kind"] == "level" else name
    except ValueError:
        label = name
    if run["interpreted"]:
        label += " (interpreter)"
    if run["whole_model_compiled"] and name != "native-compiled":
        label += " +compile"
    return label


def _rate(value: float) -> str:
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def plot(report: dict, path) -> Path:
    """Three panels: the loss curves overlaid; each run's relative distance from the
    reference curve per step, with the early and drift bounds; throughput per run."""
    from .plots import LEVEL_COLORS, _pyplot

    plt = _pyplot()
    s, agree = report["settings"], report["agreement"]
    done = [r for r in report["runs"] if r["status"] == "ok"]
    colors = {**LEVEL_COLORS, "torch": "#222222", "native-compiled": "#DA8BC3"}
    fig, (ax_loss, ax_diff, ax_rate) = plt.subplots(1, 3, figsize=(16, 5), layout="constrained")

    styles = ["-", "--", "-.", ":"]
    for i, r in enumerate(done):
        ax_loss.plot(range(len(r["losses"])), r["losses"], styles[i % 4], color=colors.get(r["name"]),
                     label=_label(r), lw=1.4, alpha=0.9)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (cross-entropy, nats)")
    ax_loss.set_title("loss curves: same weights, same batches (equal curves overlap)", fontsize=10)
    ax_loss.legend(fontsize=8)
    ax_loss.grid(alpha=0.3)

    floor = 1e-9  # identical losses (a difference of 0) drawn at the bottom of the log axis
    for r in done:
        diff = agree["runs"].get(r["name"])
        if diff:
            ax_diff.plot([max(d, floor) for d in diff["rel_diff"]], ".-", color=colors.get(r["name"]),
                         label=_label(r) + ("" if diff["passed"] else ": FAIL"), lw=1, ms=3)
    k = agree["early_steps"]
    ax_diff.axvspan(-0.5, k - 0.5, color="#eeeeee", zorder=0)
    ax_diff.hlines(agree["early_bound"], -0.5, k - 0.5, color="red", ls="--", lw=1,
                   label=f"first {k} steps: dtype bound {agree['early_bound']:g}")
    tf32 = {a["early_bound"] for a in agree["runs"].values()} - {agree["early_bound"]}
    for bound in tf32:  # a pair in which one run's fp32 math is TF32 (cuDNN's convolutions...)
        ax_diff.hlines(bound, -0.5, k - 0.5, color="orange", ls="--", lw=1,
                       label=f"first {k} steps, with TF32: {bound:g}")
    ax_diff.axhline(agree["drift_bound"], color="darkred", ls=":", lw=1,
                    label=f"later: drift bound {agree['drift_bound']:g}")
    ax_diff.set_yscale("log")
    ax_diff.set_ylim(floor / 2, max(1.0, agree["drift_bound"] * 5))
    ax_diff.set_xlabel("step")
    ax_diff.set_ylabel(f"|loss − loss({agree['reference']})| / loss({agree['reference']})")
    ax_diff.set_title(f"distance from {agree['reference']}'s curve (0 drawn at {floor:g})", fontsize=10)
    ax_diff.legend(fontsize=7)
    ax_diff.grid(alpha=0.3, which="major")

    unit = s["unit"]
    base = next((r for r in done if r["name"] == REFERENCE), None)
    ys = list(range(len(done)))
    for y, r in zip(ys, done):
        rate = r["timing"]["items_per_s"]
        ax_rate.barh(y, rate, color=colors.get(r["name"], "#999999"),
                     hatch="//" if r["interpreted"] else None, alpha=0.5 if r["interpreted"] else 1)
        note = f" {_rate(rate)} {unit}"
        if r["interpreted"]:
            note += "  (CPU emulation: not a speed)"
        elif base and r is not base:
            note += f"  {rate / base['timing']['items_per_s']:.2f}× native"
        ax_rate.text(rate, y, note, va="center", fontsize=8)
    skipped = [r for r in report["runs"] if r["status"] != "ok"]
    ax_rate.set_yticks(ys, [_label(r) for r in done], fontsize=8)
    ax_rate.invert_yaxis()
    ax_rate.set_xscale("log")
    if done:
        rates = [r["timing"]["items_per_s"] for r in done]
        ax_rate.set_xlim(min(rates) / 2, max(rates) * 12)  # room for the labels
    ax_rate.set_xlabel(f"throughput, {unit} (median step after {s['warmup_steps']} warm-up steps; log)")
    ax_rate.set_title("training throughput per run", fontsize=10)
    if skipped:
        ax_rate.text(0.01, 0.01, "not run: " + "; ".join(f"{r['name']} ({r['status']})" for r in skipped),
                     transform=ax_rate.transAxes, fontsize=7, color="gray", va="bottom", wrap=True)
    env = report["environment"]
    where = env.get("gpu") or f"CPU, {env.get('cpu_threads')} threads"
    ddp = f", {s['world_size']} processes (DDP)" if s["world_size"] > 1 else ""
    fig.suptitle(f"levels train: {s['model']} ({s['preset']} preset), {s['dtype']}, {where}, "
                 f"torch {env.get('torch')}, {s['steps']} steps of {s['items_per_step']} "
                 f"{unit.split('/')[0]}{ddp}", fontsize=11, fontweight="bold")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------

EXIT_HELP = """\
exit codes:
  0: every run that could run here trained, and every loss curve agrees with native's
  1: a run raised, or a curve left its bound
  2: bad arguments
  3: nothing could run here (e.g. --device cuda without a GPU)
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="train a whole model at every level: same loss curve, end-to-end speed",
        description="Train a GPT, an LSTM language model or a ResNet-style CNN (levels.models) at\n"
                    "each level, from the same weights on the same batches: the loss curves\n"
                    "overlaid and checked against native's, and the throughput of each level.\n"
                    "Text: the Python standard library's own source; images: generated in code.\n"
                    "Under torchrun (WORLD_SIZE > 1) every run is wrapped in DistributedDataParallel.",
        epilog=EXIT_HELP)
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--level", default="all",
                   help="'all' (default: every level, those that cannot run here listed with the "
                        "reason) or comma-separated level names or numbers 1-5")
    p.add_argument("--baseline", default="torch",
                   help="comma-separated extra runs: 'torch' (the same model from torch's own modules: "
                        "nn.LSTM/cuDNN, nn.MultiheadAttention/SDPA; the default), 'native-compiled' "
                        "(torch.compile of the whole Level 1 model), or 'none'")
    p.add_argument("--preset", default="tiny", choices=PRESET_NAMES,
                   help="tiny (CPU, every level in under a minute; Triton via its interpreter), "
                        "small (CPU), gpu (GPT-2-small-like, bf16)")
    p.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    p.add_argument("--batch", type=int, help="batch per process (default: the preset's)")
    p.add_argument("--dtype", help="float32, bfloat16 or float16 (default: the preset's)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if there is a GPU, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="weights and batches (default 0)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the whole model of every run (graph breaks are counted)")
    p.add_argument("--compile-mode", help="torch.compile mode for Level 3 and --compile "
                                          "(default: 'default', or $LEVELS_COMPILE_MODE)")
    p.add_argument("--breakdown", action="store_true",
                   help="after training, profile 3 more steps of each run with torch.profiler and "
                        "print where the step's time goes, by layer type (attention, MLP, "
                        "layer norm, LSTM, conv, embedding, optimizer, other)")
    p.add_argument("--out", default="levels-reports",
                   help="directory for train-<model>-<preset>.json, .png and .log")
    return p


def _progress(console):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # redirect_*=False: rich would otherwise re-print what libraries write above the bar
    return Progress(TextColumn("{task.description:<26}"), BarColumn(bar_width=24),
                    TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[status]}"),
                    TimeElapsedColumn(), console=console, transient=True,
                    redirect_stdout=False, redirect_stderr=False)


def run_train(args, console) -> int:
    """`levels train`: see the module doc. Raises cli.NothingToRun for a missing device (exit 3)."""
    from .cli import NothingToRun, _device

    names = resolve_levels(args.level)
    baselines = resolve_baselines(args.baseline)
    device = _device(args.device)
    if args.preset == "gpu" and torch.device(device).type != "cuda":
        raise NothingToRun("the 'gpu' preset needs a CUDA GPU (GPT-2-small at 1024 tokens takes hours "
                           "on a CPU); here use --preset tiny or --preset small")
    _, rank, _ = world()
    try:
        if rank == 0:
            code = _run(args, console, names, baselines, device)
        else:
            with open(os.devnull, "w") as devnull:  # one voice: rank 0 prints and writes
                code = _run(args, type(console)(file=devnull), names, baselines, device)
        _wait_for_every_process()  # torchrun stops the others when one exits non-zero:
        return code                # let rank 0 finish writing first
    finally:
        _leave_process_group()  # under torchrun: every process leaves the group it joined


def _run(args, console, names, baselines, device) -> int:
    from rich.markup import escape
    from rich.table import Table

    from .cli import _library_output_to

    _, rank, _ = world()
    out = Path(args.out)
    stem = f"train-{args.model}-{args.preset}"  # one log per model and preset, next to its JSON
    log_path = out / (f"{stem}.log" if rank == 0 else f"{stem}-rank{rank}.log")
    with _library_output_to(log_path, console) as quiet:
        with _progress(quiet) as progress:
            task = progress.add_task("", total=1, status="")

            def on_run(run, phase, steps, items):
                if run.status == "skip":
                    quiet.print(f"{run.name:<16} skipped: {escape(run.reason)}", highlight=False)
                elif phase == "start":
                    tag = " (interpreter)" if run.interpreted else ""
                    progress.reset(task, total=steps, description=f"{args.model} · {run.name}{tag}",
                                   status="starting")
                elif run.status == "error":
                    quiet.print(f"{run.name:<16} [bold red]error[/]: {escape(run.reason[:300])}")
                else:  # one line that stays when the bar moves on to the next run
                    t = run.timing(items)
                    quiet.print(f"{run.name:<16} {len(run.losses)} steps  loss {run.losses[0]:.4f} → "
                                f"{run.losses[-1]:.4f}  val {run.val_loss:.4f}  "
                                f"{_rate(t['items_per_s'])} {unit}  first step {t['first_step_s']:.2f} s",
                                highlight=False, markup=False)

            def on_step(run, step, loss, seconds, items):
                progress.update(task, completed=step + 1,
                                status=f"loss {loss:.4f}  {_rate(items / seconds)} {unit}")

            unit = "images/s" if args.model == "cnn" else "tokens/s"
            report = train(args.model, names, baselines, args.preset, args.steps, device, args.dtype,
                           args.seed, args.batch, args.compile, args.compile_mode, on_run, on_step,
                           getattr(args, "breakdown", False))
        if rank != 0:
            return exit_code(report)
        json_path, png_path = save(report, out)

    s, agree = report["settings"], report["agreement"]
    base = next((r for r in report["runs"] if r["name"] == REFERENCE and r["status"] == "ok"), None)
    table = Table(title=f"levels train — {s['model']}, preset '{s['preset']}', {s['dtype']}, {s['device']}, "
                        f"{s['steps']} steps × {s['items_per_step']} {s['unit'].split('/')[0]}"
                        + (f", {s['world_size']} processes" if s["world_size"] > 1 else ""))
    for col in ("run", "status", "loss first → last", "val loss", s["unit"], "vs native", "1st step",
                f"vs native: first {agree['early_steps']} / later", "note"):
        table.add_column(col, no_wrap=col != "note", overflow="fold")
    below = []
    for r in report["runs"]:
        a = agree["runs"].get(r["name"])
        if r["status"] != "ok":
            style = "yellow" if r["status"] == "skip" else "bold red"
            table.add_row(_label(r), f"[{style}]{r['status']}[/]", "", "", "", "", "", "", "see below")
            reason = r["reason"] if len(r["reason"]) < 400 else r["reason"][:400] + "… (the JSON has it all)"
            below.append(f"[{style}]{r['name']}[/] ({r['status']}): {escape(reason)}")
            continue
        t = r["timing"]
        vs = "" if (base is None or r is base or r["interpreted"]) else \
            f"{t['items_per_s'] / base['timing']['items_per_s']:.2f}×"
        if a is None:
            agreed = "reference" if r["name"] == agree["reference"] else "—"
        else:
            later = "—" if a["worst_later"] is None else f"{a['worst_later']:.1e}"
            mark = "[green]ok[/]" if a["passed"] else "[bold red]FAIL[/]"
            agreed = f"{mark} {a['worst_early']:.1e} / {later}"
        notes = []
        if r["interpreted"]:
            notes.append("emulated: no speed")
        if r["graph_breaks"] is not None:
            notes.append(f"{r['graph_breaks']} graph break(s)")
        if r["aliased_gradients"]:
            notes.append("shared gradients (below)")
            below.append(f"[bold red]{r['name']}[/]: parameters share one gradient tensor, so "
                           f"clipping scales it twice: " + ", ".join(
                               f"{a} = {b}" for a, b in r["aliased_gradients"]))
        table.add_row(_label(r), "[green]ok[/]", f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}",
                      f"{r['val_loss']:.4f}", _rate(t["items_per_s"]), vs, f"{t['first_step_s']:.2f} s",
                      agreed, escape(", ".join(notes)))
    console.print(table)
    for line in below:
        console.print(line, highlight=False)
    if "note" in agree:
        console.print(agree["note"], style="yellow", markup=False)
    tf32 = sorted(n for n, a in agree["runs"].items() if a["early_bound"] != agree["early_bound"])
    with_tf32 = (f" ({tolerance(torch.float32, tf32=True):g} where TF32 runs: {', '.join(tf32)})"
                 if tf32 else "")
    console.print(f"agreement: relative loss difference from {agree['reference']} ≤ {agree['early_bound']:g} "
                  f"(the harness's {s['dtype']} bound){with_tf32} for the first {agree['early_steps']} "
                  f"steps, ≤ {agree['drift_bound']:g} after (training is chaotic: see equivalence/train.py)",
                  markup=False, highlight=False)
    if s.get("breakdown"):
        _print_breakdown(report, console)
    console.print(f"wrote {json_path} and {png_path}; library messages in {log_path}",
                  markup=False, highlight=False)
    return exit_code(report)


def _print_breakdown(report: dict, console) -> None:
    from rich.table import Table

    runs = [r for r in report["runs"] if r["status"] == "ok" and r.get("breakdown")]
    done = [r for r in runs if "ms_per_step" in r["breakdown"]]
    for r in runs:
        if "skipped" in r["breakdown"]:
            console.print(f"breakdown of {r['name']}: skipped, {r['breakdown']['skipped']}", markup=False)
    if not done:
        return
    clock = done[0]["breakdown"]["clock"]
    table = Table(title=f"where a training step's time goes ({clock}, ms per step and share; "
                        f"torch.profiler over {done[0]['breakdown']['steps']} steps)")
    table.add_column("layer type")
    for r in done:
        table.add_column(_label(r), justify="right")
    kinds = list(dict.fromkeys(k for r in done for k in r["breakdown"]["ms_per_step"]))
    for kind in kinds:
        cells = []
        for r in done:
            b = r["breakdown"]
            ms = b["ms_per_step"].get(kind)
            cells.append("" if ms is None else f"{ms:.2f} ({b['fraction'][kind]:.0%})")
        table.add_row(kind, *cells)
    table.add_row("step", *(f"{r['breakdown']['step_ms']:.2f}" for r in done), style="bold")
    console.print(table)


def main(argv=None) -> int:
    """`python -m equivalence.train` (what torchrun starts): the same command as `levels train`."""
    from rich.console import Console

    from .cli import NothingToRun

    parser = argparse.ArgumentParser(prog="levels")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    console = Console(width=max(Console().width, 150) if not sys.stdout.isatty() else None)
    try:
        return run_train(args, console)
    except NothingToRun as exc:
        console.print(f"levels train: {exc}", style="yellow", markup=False)
        return EXIT_NOTHING_RAN
    except (ValueError, TypeError) as exc:
        console.print(f"levels train: {exc}", style="red", markup=False)
        return EXIT_USAGE


def _wait_for_every_process() -> None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _leave_process_group() -> None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
