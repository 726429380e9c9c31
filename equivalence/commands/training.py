"""`levels train`: a whole model trained at every level, from the same weights on the same batches.

    levels train --model gpt --preset tiny --level all      # every level that runs here
    levels train --model lstm --preset gpu --level native,triton --steps 50
    torchrun --nproc_per_node 2 -m equivalence.commands.train --model gpt --preset gpu --level triton

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
`loss.item()`, which waits for the device, so the clock measures the finished step. The runs
take turns of TURN_STEPS steps (`interleaved` in the report): every run's turn k before any
run's turn k + 1, the order rotated each round, so that a host or GPU that drifts over the
minutes a table takes drifts under every run alike (on the H100's hosts torch's own CNN step
measured 5.4 ms in one table and 8.8 ms in a probe minutes later:
reports/host-path-interleaved/). The speed counts only the steps that follow the run's own
step, as in a training loop: a turn's first step follows another run's, which a GPU-bound
step pays for (the LSTM LM's Level 4 step under --amp, H100: 5.3 ms after its own step,
6.2-6.6 ms after native's step, a sleep or a busy host; torch's host-bound step alike either
way: scripts/probe_step_after.py, reports/issue-26-turns-2026-11-27/); those first steps'
median is reported beside (`median_after_other_ms`). Every run's model and optimizer state
are alive at once. Runs compiled whole (`--compile`, native-compiled) and runs under torchrun
go one after another: each compiled run starts from an empty Dynamo cache, which would throw
away the others' compiled code. Triton's CPU interpreter (Level 4 without a GPU) runs at the
`tiny` preset only and is marked: an emulation's speed says nothing about the kernels.

Distributed: under `torchrun` (WORLD_SIZE > 1) every run is wrapped in
DistributedDataParallel (NCCL on GPUs, gloo on CPUs); each process takes its slice of the
same global batch, so 2 processes of batch B see what one process of batch 2B sees. Rank 0
prints and writes; losses are averaged over the processes.
"""

from __future__ import annotations

import copy
import os
import statistics
import traceback
from dataclasses import asdict, dataclass, field

import torch

import levels
from levels import models
from levels.models import data

from .. import environment
from ..settings import CompileMode, compile_mode as resolve_compile_mode
from ..tolerances import tolerance
from .console import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK
from .steps import (aliased_gradients, loss_of, step_in_turn,  # noqa: F401 - re-exported
                    train_steps)

MODELS = ("gpt", "llama", "lstm", "cnn")
PRESET_NAMES = ("tiny", "small", "gpu")
BASELINES = ("torch", "native-compiled")
REFERENCE = "native"
EARLY_STEPS = 5
# Relative difference of a later step's loss from the reference's (see the module doc).
DRIFT_BOUNDS = {torch.float32: 1e-2, torch.bfloat16: 5e-2, torch.float16: 5e-2}
WARMUP = 3
TURN_STEPS = 4  # an interleaved run's steps in a row (see the module doc)
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}

# Each preset: the model's configuration, the batch (per process), the sequence length or
# image size, the steps, Adam's learning rate, the dtype and the number of validation batches.
#   tiny   every level in under a minute on a 2-core CPU, Triton's interpreter included:
#          its cost is per program and loop iteration, so widths and batches are minimal
#          (measured there: ~0.1-0.7 s per component call, ~1.5 s per ConvBN call)
#   small  a real CPU run (Levels 1-3; the interpreter is refused)
#   gpu    realistic sizes, bf16: GPT-2 small (768 wide, 12 heads, 12 layers, 1024 tokens),
#          a Llama-style model as wide and deep (12 query heads sharing 4 K/V heads, SwiGLU
#          2048 wide: about GPT-2 small's parameters), an LSTM LM of hidden 1024 at batch 64, a ResNet-ish CNN on 64x64 images. The LSTM's
#          windows are 64 tokens: Level 3 compiles the time loop in graphs of a few steps
#          (levels/compiled.py LSTM_CHUNK; the whole loop took 47 s at T=64 on the H100); its
#          embedding is as wide as its hidden state so that both layers have one shape (one
#          compile, not two)
# A 16-bit dtype means the parameters themselves are 16-bit (Adam's state too), with no fp32
# master copy; for the tens of steps of a benchmark that trains well enough, and the loss
# itself is always computed in fp32. `--amp` trains float32 parameters under autocast instead.
PRESETS = {
    "tiny": {
        "gpt": dict(config=dict(d_model=32, n_heads=2, n_layers=1, seq_len=16), batch=2, seq_len=16,
                    steps=10, lr=3e-3, dtype="float32", eval_batches=1),
        "llama": dict(config=dict(d_model=32, n_heads=2, n_kv_heads=1, n_layers=1, seq_len=16), batch=2,
                      seq_len=16, steps=10, lr=3e-3, dtype="float32", eval_batches=1),
        "lstm": dict(config=dict(embed=16, hidden=16, n_layers=2), batch=2, seq_len=12,
                     steps=10, lr=1e-2, dtype="float32", eval_batches=1),
        "cnn": dict(config=dict(widths=(8,), strides=(2,)), batch=2, image=8,
                    steps=6, lr=3e-3, dtype="float32", eval_batches=1),
    },
    "small": {
        "gpt": dict(config=dict(d_model=128, n_heads=4, n_layers=4, seq_len=128), batch=8,
                    seq_len=128, steps=100, lr=1e-3, dtype="float32", eval_batches=8),
        "llama": dict(config=dict(d_model=128, n_heads=4, n_kv_heads=2, n_layers=4, seq_len=128),
                      batch=8, seq_len=128, steps=100, lr=1e-3, dtype="float32", eval_batches=8),
        "lstm": dict(config=dict(embed=64, hidden=256, n_layers=2), batch=16, seq_len=64,
                     steps=100, lr=3e-3, dtype="float32", eval_batches=8),
        "cnn": dict(config=dict(widths=(16, 32, 64), strides=(1, 2, 2)), batch=32, image=32,
                    steps=100, lr=3e-3, dtype="float32", eval_batches=8),
    },
    "gpu": {
        "gpt": dict(config=dict(d_model=768, n_heads=12, n_layers=12, seq_len=1024), batch=8,
                    seq_len=1024, steps=50, lr=3e-4, dtype="bfloat16", eval_batches=4),
        "llama": dict(config=dict(d_model=768, n_heads=12, n_kv_heads=4, n_layers=12, seq_len=1024),
                      batch=8, seq_len=1024, steps=50, lr=3e-4, dtype="bfloat16", eval_batches=4),
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
    cuda_graph: bool = False        # every step after the warm-up one CUDA-graph replay
    losses: list = field(default_factory=list)
    step_s: list = field(default_factory=list)
    val_loss: float | None = None
    graph_breaks: int | None = None
    aliased_gradients: list = field(default_factory=list)  # pairs of parameters sharing a .grad
    breakdown: dict | None = None   # --breakdown: ms per step by layer type (equivalence.breakdown)
    optimizer_s: list = field(default_factory=list)  # --optimizer muon: each step's update
    turn_steps: int = 1             # steps in a row before another run's (interleaved: TURN_STEPS)

    def timing(self, items_per_step: int) -> dict | None:
        """First step, steady-state median and p20/p80 (after WARMUP steps, of the steps that
        follow this run's own step), items/s; interleaved, the median of the turns' first steps
        (each after another run's step) beside."""
        if not self.step_s:
            return None
        first = min(WARMUP, len(self.step_s) - 1)
        timed = range(first, len(self.step_s))
        own = [self.step_s[i] for i in timed if self.turn_steps == 1 or i % self.turn_steps]
        after_other = [self.step_s[i] for i in timed if self.turn_steps > 1 and not i % self.turn_steps]
        warm = own or [self.step_s[i] for i in timed]  # too few steps for a turn's second
        q = statistics.quantiles(warm, n=5, method="inclusive") if len(warm) > 1 else [warm[0]] * 4
        median = statistics.median(warm)
        opt = self.optimizer_s[min(WARMUP, len(self.optimizer_s) - 1):]
        return {"first_step_s": self.step_s[0], "median_step_ms": median * 1e3,
                "p20_step_ms": q[0] * 1e3, "p80_step_ms": q[3] * 1e3, "steps_timed": len(warm),
                "items_per_s": items_per_step / median,
                "median_after_other_ms": statistics.median(after_other) * 1e3 if after_other else None,
                "median_optimizer_ms": statistics.median(opt) * 1e3 if opt else None}

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
    if model == "llama":
        return models.TorchLlama(models.LlamaConfig(vocab=vocab, **config))
    if model == "lstm":
        return models.TorchLSTMLM(models.LSTMConfig(vocab=vocab, **config))
    return models.TorchResNet(models.CNNConfig(classes=data.CLASSES, **config))


LEVELED = {"gpt": models.GPT, "llama": models.Llama, "lstm": models.LSTMLM, "cnn": models.ResNet}


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


def batches_to(pairs, model: str, device: torch.device, dtype: torch.dtype) -> list:
    """(input, target) pairs on `device`: floating-point inputs (images) in `dtype`, and on a
    GPU the CNN's images channels_last (the layout its kernels read); tokens as they are."""
    fmt = torch.channels_last if (model == "cnn" and device.type == "cuda") else torch.contiguous_format
    return [(x.to(device=device, dtype=dtype if x.is_floating_point() else None,
                  memory_format=fmt if x.dim() == 4 else torch.preserve_format), y.to(device))
            for x, y in pairs]


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
        for m in inner.modules():  # a deep copy splits nn.LSTM's weight buffer, which cuDNN
            if isinstance(m, torch.nn.RNNBase):  # then rebuilds every call (torch skips bf16)
                m.flatten_parameters()
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
# The optimizer
# ---------------------------------------------------------------------------------------

OPTIMIZERS = ("adam", "muon")
MUON_LR = 0.02  # Muon's own default (Jordan et al.); AdamW's part takes the preset's lr


def optimizer_factory(name: str, level: str, lr: float, ns_dtype: torch.dtype):
    """(make_optimizer for train_steps or None for its Adam, the report's description). Muon
    runs newton_schulz at the run's own level (baselines: Level 1's), in `ns_dtype`."""
    if name not in OPTIMIZERS:
        raise ValueError(f"argument '--optimizer' must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
    if name == "adam":
        return None, "Adam, gradient norm clipped at 1.0"
    from levels.optim import Muon, split_parameters

    def make(model):
        hidden, rest = split_parameters(model)
        return Muon(hidden, rest, lr=MUON_LR, adamw_lr=lr, level=level, ns_dtype=ns_dtype)
    return make, (f"Muon (lr {MUON_LR}, momentum 0.95 Nesterov, 5 Newton-Schulz steps in "
                  f"{str(ns_dtype).removeprefix('torch.')} at each run's level) for the 2-D "
                  f"hidden weights, AdamW for the rest; gradient norm clipped at 1.0")


# ---------------------------------------------------------------------------------------
# The whole comparison
# ---------------------------------------------------------------------------------------

AMP_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
              "float16": torch.float16}


def mode_of(compile_model: bool, cuda_graph: bool) -> str:
    """How every run of a report steps: eager, compile (the whole model under torch.compile)
    or cuda-graph (each step after the warm-up one graph replay)."""
    return "compile" if compile_model else ("cuda-graph" if cuda_graph else "eager")


def train(model: str = "gpt", level_names=("native",), baselines=("torch",), preset_name: str = "tiny",
          steps: int | None = None, device=None, dtype: str | None = None, seed: int = 0,
          batch: int | None = None, compile_model: bool = False, compile_mode: str | None = None,
          on_run=None, on_step=None, breakdown: bool = False, amp: str | None = None,
          cuda_graph: bool = False, optimizer: str = "adam") -> dict:
    """Train `model` at each of `level_names` (and each baseline) from the same weights on the
    same batches; returns the report `levels train` writes. Progress callbacks:
    on_run(run, phase, steps, items_per_step) with phase "start" before a run (or its skip) and
    "done" after it; on_step(run, step, loss, seconds, items_per_step) after each step.
    `amp` ("bf16" or "fp16"): float32 parameters, the forward under torch.autocast of that
    dtype (see train_steps). `cuda_graph`: every step after the warm-up replays one captured
    CUDA graph (GPU only; not with compile_model, torchrun or fp16's loss scaling, whose
    overflow check reads a value on the host every step). `optimizer`: "adam" or "muon"
    (levels.optim.Muon at each run's level, its step timed on its own: Run.optimizer_s)."""
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
    amp_dtype = None
    if amp is not None:
        if amp not in AMP_DTYPES:
            raise ValueError(f"argument '--amp' must be one of {', '.join(AMP_DTYPES)}; got {amp!r}")
        amp_dtype = AMP_DTYPES[amp]
        if dtype is not None and DTYPES.get(dtype) != torch.float32:
            raise ValueError(f"argument '--dtype' must be float32 (or left out) with --amp: mixed "
                             f"precision keeps float32 parameters and computes in {amp}; got {dtype!r}")
    dtype_name = "float32" if amp_dtype is not None else (dtype or p["dtype"])
    if dtype_name not in DTYPES:
        raise ValueError(f"argument '--dtype' must be one of {', '.join(DTYPES)}; got {dtype_name!r}")
    torch_dtype = DTYPES[dtype_name]
    size, rank, _ = world()
    if cuda_graph:
        why = ("a CUDA device" if device.type != "cuda" else
               "no --compile (the whole step is captured instead)" if compile_model else
               "one process (no torchrun)" if size > 1 else
               "--amp bf16, not fp16 (fp16's loss scaler checks for overflow on the host every "
               "step, which a captured step cannot)" if amp_dtype == torch.float16 else
               "--optimizer adam (Muon's step is timed eagerly, between synchronizations)"
               if optimizer == "muon" else None)
        if why:
            raise ValueError(f"argument '--cuda-graph' needs {why}")
    optimizer_factory(optimizer, REFERENCE, p["lr"], torch.float32)  # refuses a bad name first
    if size > 1:
        device = init_distributed(device)

    mode = resolve_compile_mode(compile_mode, device)
    train_batches, val_batches, items, unit, about, vocab = make_data(model, p, seed, rank, size)
    train_batches = batches_to(train_batches, model, device, torch_dtype)
    val_batches = batches_to(val_batches, model, device, torch_dtype)
    torch.manual_seed(seed)
    twin = build_twin(model, p["config"], vocab).to(device=device, dtype=torch_dtype)

    runs = [Run(n, "level") for n in level_names] + [Run(n, "baseline") for n in baselines]
    for run in runs:
        run.whole_model_compiled = compile_model or run.name == "native-compiled"
        run.cuda_graph = cuda_graph
        run.interpreted = run.name == "triton" and _triton_interpreted()
        level = REFERENCE if run.name == "native-compiled" else (None if run.kind == "baseline" else run.name)
        reason = unavailable(model, level, device, preset_name, compile_model) if level else None
        if reason:
            run.status, run.reason = "skip", reason
    names = [r.name for r in runs]
    items_per_step = items * size
    # Interleaved: every run's turn of TURN_STEPS steps before any run's next turn (the order
    # rotated each round), so that a host or GPU that drifts over the minutes a table takes
    # drifts under every run alike. Compiled whole, runs go one after another: each starts
    # from an empty Dynamo cache (torch._dynamo.reset(), so that its graph breaks and first
    # step are its own), which would throw away the others' compiled code.
    interleaved = (not any(r.whole_model_compiled for r in runs) and size == 1
                   and sum(r.status != "skip" for r in runs) > 1)
    turn = TURN_STEPS if interleaved else 1
    for run in runs:
        run.turn_steps = turn

    def start(run):
        """This run's model and its steps (a generator); compiled whole, its graph-break count
        at start (run.graph_breaks until it ends)."""
        if run.whole_model_compiled:
            torch._dynamo.reset()
            run.graph_breaks = _graph_breaks()
        net, inner = prepare_model(model, twin, run, device, mode)
        make_opt, _ = optimizer_factory(optimizer, REFERENCE if run.kind == "baseline"
                                        else run.name, p["lr"], amp_dtype or torch_dtype)
        steps = train_steps(
            net, inner, train_batches, val_batches, p["lr"],
            on_step=(lambda s, loss, sec, run=run: on_step(run, s, loss, sec, items_per_step))
            if on_step else None, aliased=run.aliased_gradients, amp=amp_dtype,
            cuda_graph=cuda_graph, world_size=size, make_optimizer=make_opt,
            optimizer_s=run.optimizer_s if make_opt is not None else None)
        return {"run": run, "net": net, "inner": inner, "steps": steps}

    def ended(run, live, result, exc):
        """The run's losses, step times and validation loss, its breakdown and graph breaks;
        or, for a run that raised, the error (a result, reported)."""
        try:
            if exc is not None:
                raise exc
            run.losses, run.step_s, run.val_loss = result
            if breakdown:
                run.breakdown = _breakdown(live["net"], live["inner"], run, train_batches,
                                           p["lr"], size)
        except Exception as error:  # noqa: BLE001
            traceback.print_exception(error)  # into the log (library output goes there)
            run.status, run.reason = "error", f"{type(error).__name__}: {error}"[:2000]
        if run.graph_breaks is not None:
            run.graph_breaks = _graph_breaks() - run.graph_breaks
        if live is not None:
            live["net"] = live["inner"] = None  # this run's model and optimizer state go now
        if on_run:
            on_run(run, "done", p["steps"], items_per_step)

    with CompileMode(mode if "compile" in names else None, device):
        for group in ([runs] if interleaved else [[run] for run in runs]):
            lives = []
            for run in group:
                if on_run:
                    on_run(run, "start", p["steps"], items_per_step)
                if run.status == "skip":
                    continue
                try:
                    lives.append(start(run))
                except Exception as exc:  # noqa: BLE001
                    ended(run, None, None, exc)
            step_in_turn([live["steps"] for live in lives],
                         lambda i, result, exc: ended(lives[i]["run"], lives[i], result, exc),
                         turn)
    return {
        "settings": {"model": model, "preset": preset_name, "config": p["config"], "batch": p["batch"],
                     "seq_len": p.get("seq_len"), "image": p.get("image"), "steps": p["steps"],
                     "lr": p["lr"], "optimizer_name": optimizer,
                     "optimizer": optimizer_factory(optimizer, REFERENCE, p["lr"],
                                                    amp_dtype or torch_dtype)[1],
                     "dtype": str(torch_dtype).removeprefix("torch."), "device": str(device),
                     "seed": seed, "levels": list(level_names), "baselines": list(baselines),
                     "compile_model": compile_model, "compile_mode": mode, "world_size": size,
                     "mode": mode_of(compile_model, cuda_graph), "cuda_graph": cuda_graph,
                     "amp": str(amp_dtype).removeprefix("torch.") if amp_dtype else None,
                     "ddp_backend": ("nccl" if device.type == "cuda" else "gloo") if size > 1 else None,
                     "warmup_steps": WARMUP, "items_per_step": items_per_step, "unit": unit,
                     "interleaved": interleaved,
                     "turn_steps": turn,
                     "breakdown": breakdown},
        "data": about,
        "environment": environment.describe(device),
        "runs": [r.to_dict(items_per_step) for r in runs],
        "agreement": agreement(runs, amp_dtype or torch_dtype, tf32=frozenset(
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
