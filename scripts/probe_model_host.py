"""Is a whole model's training step host-bound? Wall time vs GPU time per step, and where the
host's time goes (cProfile), for Level 4 with and without the C++ replay and for the
torch-modules twin.

    python scripts/probe_model_host.py OUT.json [--model gpt] [--steps 10] [--amp bf16]
                                       [--runs triton,triton-python,cuda,torch]
                                       [--batch 1 --seq-len 16] [--compile]

Per run: the wall time of a step (the device synchronized after each), the GPU's busy
time in a step (torch.profiler: the sum of its kernels' durations, overlaps counted once
per kernel), the 30 GPU kernels that take the most time in a step, and the 40 Python
functions that take the most host time of a step (cProfile, own time). A step whose wall time
is close to its GPU time is GPU-bound; the difference is the time the GPU waits for the CPU.
`--amp bf16`: float32 parameters, the forward under torch.autocast (as `levels train --amp`).

`--batch 1 --seq-len 16`: the same model (every layer, every call) on a problem so small that
the GPU never holds the CPU back: the wall time of a step is then the host's own time, split
into forward, backward and optimizer (`host_phases_ms`), and cProfile's attribution is not
blurred by launches that block on a full queue.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from equivalence.commands import training as T  # noqa: E402
from equivalence.commands.steps import loss_of  # noqa: E402
from triton_kernels import replay  # noqa: E402


def _step_fn(net, opt, amp):
    """A training step as `levels train` runs it; `mark(phase)`, if given, is called at the
    end of the forward (with the loss), the backward, the clipping and the update."""
    params = list(net.parameters())

    def step(x, y, mark=None):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_of(net(x), y)
        if mark is not None:
            mark("forward")
        loss.backward()
        if mark is not None:
            mark("backward")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        if mark is not None:
            mark("clip")
        opt.step()
        if mark is not None:
            mark("update")
        return loss
    return step


def _gpu_ms_per_step(step, batches) -> tuple[float, list]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for x, y in batches:
            step(x, y)
        torch.cuda.synchronize()
    kernels: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:30]
    per_step = [{"kernel": k[:120], "ms_per_step": round(v / 1e3 / len(batches), 3)} for k, v in top]
    return sum(kernels.values()) / 1e3 / len(batches), per_step


def _phases_ms(step, batches, steps: int) -> dict:
    """Median host time of a step's forward (with the loss), backward and optimizer (clipping
    and update), calls back to back (meaningful when the GPU keeps up: --batch 1 --seq-len 16)."""
    ms: dict = {"forward": [], "backward": [], "optimizer": []}
    for i in range(steps):
        ends = {"start": time.perf_counter()}
        step(*batches[i % len(batches)], mark=lambda phase: ends.__setitem__(phase, time.perf_counter()))
        for phase, first, last in (("forward", "start", "forward"), ("backward", "forward", "backward"),
                                   ("optimizer", "backward", "update")):
            ms[phase].append((ends[last] - ends[first]) * 1e3)
    torch.cuda.synchronize()
    return {phase: statistics.median(v) for phase, v in ms.items()}


def setup(model: str, name: str, amp: torch.dtype | None = None, batch: int | None = None,
          seq_len: int | None = None, n_batches: int = 4, compiled: bool = False):
    """(net, opt, step, batches, items per step, unit, preset) of one run (a level's name,
    "native-compiled" or "torch") of `model` at the gpu preset, as `levels train` builds it;
    `compiled`: the whole model under torch.compile, as `levels train --compile`."""
    p = T.preset(model, "gpu")
    if batch:
        p["batch"] = batch
    if seq_len:
        p["seq_len"] = seq_len
    torch.manual_seed(0)
    train, _, items, unit, _, vocab = T.make_data(model, p, 0)
    twin = T.build_twin(model, p["config"], vocab)
    device = torch.device("cuda")
    dtype = torch.float32 if amp is not None else T.DTYPES[p["dtype"]]
    twin = twin.to(device=device, dtype=dtype)
    run = T.Run(name=name, kind="baseline" if name == "torch" else "level",
                whole_model_compiled=compiled or name == "native-compiled")
    net, _ = T.prepare_model(model, twin, run, device, "default")
    opt = torch.optim.Adam(list(net.parameters()), lr=p["lr"])
    batches = T.batches_to(list(train)[:n_batches], model, device, dtype)
    return net, opt, _step_fn(net, opt, amp), batches, items, unit, p


def probe(model: str, name: str, replay_on: bool, steps: int, profile_host: bool,
          amp: torch.dtype | None = None, batch: int | None = None,
          seq_len: int | None = None, compiled: bool = False) -> dict:
    net, opt, step, batches, items, unit, p = setup(model, name, amp, batch, seq_len,
                                                    compiled=compiled)
    replay.ENABLED = replay_on
    for x, y in batches[:3]:  # first calls: compiles, records
        step(x, y)
    torch.cuda.synchronize()
    wall = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        step(x, y)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
    # host time alone: steps back to back, no synchronize until the end
    t0 = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    enqueue_ms = (time.perf_counter() - t0) * 1e3 / steps
    torch.cuda.synchronize()
    phases = _phases_ms(step, batches, steps)
    gpu_ms, top_kernels = _gpu_ms_per_step(step, batches[:3])
    out = {"run": name, "replay": replay_on, "compiled": compiled or name == "native-compiled",
           "wall_ms_median": statistics.median(wall),
           "wall_ms": wall, "gpu_ms_per_step": gpu_ms, "top_kernels": top_kernels,
           "host_phases_ms": phases, "batch": p["batch"], "seq_len": p.get("seq_len"),
           "items_per_step": items, "unit": unit, "back_to_back_ms": enqueue_ms,
           "replay_stats": replay.stats(), "replay_reasons": replay.reasons()}
    if profile_host:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(5):
            step(*batches[i % len(batches)])
        torch.cuda.synchronize()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
        out["cprofile_top40_5steps"] = text.getvalue()
    return out


def write_report(path: str, model: str, amp: str | None, rows: list) -> None:
    """A probe's JSON: the GPU, torch's version and the date, the command, the rows."""
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(path).write_text(json.dumps({"environment": env, "model": model, "amp": amp,
                                      "command": " ".join(sys.argv), "rows": rows}, indent=1))


def probe_arguments(runs: str, runs_help: str = "comma-separated: a level's name, or torch "
                    "(the nn-modules twin)") -> argparse.ArgumentParser:
    """The arguments every whole-model probe takes: OUT.json, --model, --runs, --amp."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--runs", default=runs, help=runs_help)
    ap.add_argument("--amp", choices=sorted(T.AMP_DTYPES), default=None)
    return ap


def amp_dtype(a) -> torch.dtype | None:
    return T.AMP_DTYPES[a.amp] if a.amp else None


def main() -> None:
    ap = probe_arguments("triton,triton-python,torch", "comma-separated: a level's name, a level's "
                         "name + '-python' (replay off), or torch (the nn-modules twin)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=None, help="override the preset's batch")
    ap.add_argument("--seq-len", type=int, default=None, help="override the preset's sequence length")
    ap.add_argument("--compile", action="store_true", help="every run's model compiled whole "
                    "(as `levels train --compile`); the run native-compiled is always compiled")
    a = ap.parse_args()
    amp = amp_dtype(a)
    rows = []
    for run in a.runs.split(","):
        name, on = run.removesuffix("-python"), not run.endswith("-python")
        r = probe(a.model, name, on, a.steps, True, amp, a.batch, a.seq_len, a.compile)
        rows.append(r)
        print(f"{name:8s} replay={on!s:5s} wall {r['wall_ms_median']:.1f} ms  "
              f"gpu {r['gpu_ms_per_step']:.1f} ms  back-to-back {r['back_to_back_ms']:.1f} ms  "
              f"host fwd/bwd/opt {'/'.join(f'{v:.1f}' for v in r['host_phases_ms'].values())} ms  "
              f"{r['replay_stats']} {r['replay_reasons']}", flush=True)
    write_report(a.out, a.model, a.amp, rows)
    for r in rows:
        print(f"==== {r['run']} replay={r['replay']}: GPU kernels, ms per step")
        for k in r["top_kernels"]:
            print(f"  {k['ms_per_step']:8.3f}  {k['kernel']}")
        print(r["cprofile_top40_5steps"][:7000])


if __name__ == "__main__":
    main()
