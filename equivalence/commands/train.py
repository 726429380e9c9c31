"""`levels train`: its arguments, a progress bar per run, the table of runs and of where a
step's time goes, and the JSON and the picture it writes; `python -m
equivalence.commands.train` is the same command (what torchrun starts). The training itself,
and what it measures, is equivalence/commands/training.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from rich.markup import escape

import levels

from ..tolerances import tolerance
from .console import (EXIT_NOTHING_RAN, EXIT_USAGE, Column, NothingToRun, Sheet, library_output_to,
                      resolve_device, terminal_console)
from .training import (AMP_DTYPES, MODELS, OPTIMIZERS, PRESET_NAMES, REFERENCE, exit_code, mode_of,
                       resolve_baselines, resolve_levels, train, world)


# ---------------------------------------------------------------------------------------
# Files: JSON and the picture
# ---------------------------------------------------------------------------------------

def stem(model: str, preset_name: str, mode: str = "eager", amp: str | None = None,
         optimizer: str = "adam") -> str:
    """train-<model>-<preset>[-compile|-cuda-graph][-amp-<dtype>][-muon]: one file per table."""
    return (f"train-{model}-{preset_name}" + ("" if mode == "eager" else f"-{mode}")
            + (f"-amp-{amp}" if amp else "") + ("" if optimizer == "adam" else f"-{optimizer}"))


def paths(report: dict, out_dir) -> tuple[Path, Path]:
    s = report["settings"]
    path = Path(out_dir) / stem(s["model"], s["preset"], s.get("mode", "eager"), s.get("amp"),
                                s.get("optimizer_name", "adam"))
    return path.with_suffix(".json"), path.with_suffix(".png")


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
    from ..plots import LEVEL_COLORS, _pyplot

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
    how = p.add_mutually_exclusive_group()
    how.add_argument("--compile", action="store_true",
                     help="torch.compile the whole model of every run (graph breaks are counted)")
    how.add_argument("--cuda-graph", action="store_true",
                     help="capture one whole training step (forward, backward, clipping, Adam) as a "
                          "CUDA graph after 3 eager steps and replay it for every later step (GPU)")
    p.add_argument("--amp", choices=sorted(AMP_DTYPES),
                   help="mixed precision: float32 parameters, the forward under torch.autocast of "
                        "this dtype (fp16 with a GradScaler)")
    p.add_argument("--compile-mode", help="torch.compile mode for Level 3 and --compile "
                                          "(default: 'default', or $LEVELS_COMPILE_MODE)")
    p.add_argument("--breakdown", action="store_true",
                   help="after training, profile 3 more steps of each run with torch.profiler and "
                        "print where the step's time goes, by layer type (attention, MLP, "
                        "layer norm, LSTM, conv, embedding, optimizer, other)")
    p.add_argument("--optimizer", default="adam", choices=OPTIMIZERS,
                   help="adam (default), or muon: levels.optim.Muon, whose Newton-Schulz step runs "
                        "at each run's level; the table then shows the optimizer step's time")
    p.add_argument("--out", default="levels-reports",
                   help="directory for train-<model>-<preset>.json, .png and .log")
    p.set_defaults(run=run_train)
    return p


def _progress(console):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # redirect_*=False: rich would otherwise re-print what libraries write above the bar
    return Progress(TextColumn("{task.description:<26}"), BarColumn(bar_width=24),
                    TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[status]}"),
                    TimeElapsedColumn(), console=console, transient=True,
                    redirect_stdout=False, redirect_stderr=False)


def run_train(args, console) -> int:
    """`levels train`: see training.py's doc. Raises NothingToRun for a missing device (exit 3)."""
    names = resolve_levels(args.level)
    baselines = resolve_baselines(args.baseline)
    device = resolve_device(args.device)
    if args.preset == "gpu" and torch.device(device).type != "cuda":
        raise NothingToRun("the 'gpu' preset needs a CUDA GPU (GPT-2-small at 1024 tokens takes hours "
                           "on a CPU); here use --preset tiny or --preset small")
    if getattr(args, "cuda_graph", False) and torch.device(device).type != "cuda":
        raise NothingToRun("--cuda-graph captures the training step as a CUDA graph, which needs a "
                           "CUDA GPU; here train eagerly (leave --cuda-graph out) or with --compile")
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


def print_table(report: dict, console) -> None:
    """The table of runs: loss, speed, agreement with the reference, and a note per run."""
    s, agree = report["settings"], report["agreement"]
    base = next((r for r in report["runs"] if r["name"] == REFERENCE and r["status"] == "ok"), None)
    how = "" if s.get("mode", "eager") == "eager" else f", {s['mode']}"
    precision = f"float32 + autocast {s['amp']}" if s.get("amp") else s["dtype"]
    muon = s.get("optimizer_name") == "muon"  # the optimizer step's time: its own column
    how += ", Muon" if muon else ""
    table = Sheet(f"levels train — {s['model']}, preset '{s['preset']}'{how}, {precision}, {s['device']}, "
                  f"{s['steps']} steps × {s['items_per_step']} {s['unit'].split('/')[0]}"
                  + (f", {s['world_size']} processes" if s["world_size"] > 1 else ""),
                  [Column("run"), Column("status", under="run"), "loss first → last",
                   Column("val loss", "right", under="loss first → last"),
                   Column(s["unit"], "right"), Column("vs native", "right", under=s["unit"]),
                   Column("1st step", "right")]
                  + ([Column("opt. step", "right")] if muon else [])
                  + [f"vs native: first {agree['early_steps']} / later"])
    for r in report["runs"]:
        a = agree["runs"].get(r["name"])
        if r["status"] != "ok":
            style = "yellow" if r["status"] == "skip" else "bold red"
            reason = r["reason"]  # a skip's reason whole; an error's traceback cut short
            if r["status"] != "skip" and len(reason) > 400:
                reason = reason[:400] + "… (the JSON has it all)"
            table.add_row(escape(_label(r)), f"[{style}]{r['status']}[/]",
                          *[""] * (7 if muon else 6), note=reason)
            continue
        t = r["timing"]
        # the interpreter emulates the GPU on the CPU: its tokens/s are no speed figure
        rate = "—" if r["interpreted"] else _rate(t["items_per_s"])
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
            notes.append("parameters share one gradient tensor, so clipping scales it twice: "
                         + ", ".join(f"{x} = {y}" for x, y in r["aliased_gradients"]))
        first = "—" if r["interpreted"] else f"{t['first_step_s']:.2f} s"
        opt_ms = t.get("median_optimizer_ms")
        opt = ["—" if r["interpreted"] or opt_ms is None else f"{opt_ms:.2f} ms"] if muon else []
        table.add_row(escape(_label(r)), "[green]ok[/]", f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}",
                      f"{r['val_loss']:.4f}", rate, vs, first, *opt, agreed, note=", ".join(notes))
    table.print(console)


def _run(args, console, names, baselines, device) -> int:
    _, rank, _ = world()
    out = Path(args.out)
    name = stem(args.model, args.preset, mode_of(args.compile, getattr(args, "cuda_graph", False)),
                args.amp and str(AMP_DTYPES[args.amp]).removeprefix("torch."),
                getattr(args, "optimizer", "adam"))
    log_path = out / (f"{name}.log" if rank == 0 else f"{name}-rank{rank}.log")  # beside its JSON
    with library_output_to(log_path, console) as quiet:
        with _progress(quiet) as progress:
            tasks = {}  # one bar per run that has started and not finished (interleaved runs
            # step together: each has its own bar)

            def on_run(run, phase, steps, items):
                if run.status == "skip":
                    quiet.print(f"{run.name:<16} skipped: {escape(run.reason)}", highlight=False)
                elif phase == "start":
                    tag = " (interpreter)" if run.interpreted else ""
                    tasks[run.name] = progress.add_task(f"{args.model} · {run.name}{tag}",
                                                        total=steps, status="starting")
                    return
                if run.name in tasks:
                    progress.remove_task(tasks.pop(run.name))
                if run.status == "skip":
                    return
                if run.status == "error":
                    quiet.print(f"{run.name:<16} [bold red]error[/]: {escape(run.reason[:300])}")
                else:  # one line that stays when the bar moves on to the next run
                    t = run.timing(items)
                    speed = ("emulated on the CPU: no speed figure" if run.interpreted else
                             f"{_rate(t['items_per_s'])} {unit}  first step {t['first_step_s']:.2f} s")
                    quiet.print(f"{run.name:<16} {len(run.losses)} steps  loss {run.losses[0]:.4f} → "
                                f"{run.losses[-1]:.4f}  val {run.val_loss:.4f}  {speed}",
                                highlight=False, markup=False)

            def on_step(run, step, loss, seconds, items):
                speed = "" if run.interpreted else f"  {_rate(items / seconds)} {unit}"
                progress.update(tasks[run.name], completed=step + 1, status=f"loss {loss:.4f}{speed}")

            unit = "images/s" if args.model == "cnn" else "tokens/s"
            report = train(args.model, names, baselines, args.preset, args.steps, device, args.dtype,
                           args.seed, args.batch, args.compile, args.compile_mode, on_run, on_step,
                           getattr(args, "breakdown", False), args.amp,
                           getattr(args, "cuda_graph", False), getattr(args, "optimizer", "adam"))
        if rank != 0:
            return exit_code(report)
        json_path, png_path = save(report, out)

    print_table(report, console)
    s, agree = report["settings"], report["agreement"]
    if s.get("interleaved"):
        turn = s.get("turn_steps", 1)
        console.print(f"timing: the runs take turns of {turn} steps (the order rotated each round), "
                      "so a host or GPU that drifts during the table drifts under every run alike; "
                      f"speed is each run's median step after the first {s['warmup_steps']}, of "
                      "the steps that follow the run's own step (as in a training loop; a turn's "
                      "first step follows another run's: its median is in the JSON, "
                      "median_after_other_ms)", markup=False, highlight=False)
    if "note" in agree:
        console.print(agree["note"], style="yellow", markup=False)
    tf32 = sorted(n for n, a in agree["runs"].items() if a["early_bound"] != agree["early_bound"])
    with_tf32 = (f" ({tolerance(torch.float32, tf32=True):g} where TF32 runs: {', '.join(tf32)})"
                 if tf32 else "")
    console.print(f"agreement: relative loss difference from {agree['reference']} ≤ {agree['early_bound']:g} "
                  f"(the harness's {s.get('amp') or s['dtype']} bound){with_tf32} for the first {agree['early_steps']} "
                  f"steps, ≤ {agree['drift_bound']:g} after (training is chaotic: see equivalence/train.py)",
                  markup=False, highlight=False)
    if s.get("breakdown"):
        _print_breakdown(report, console)
    console.print(f"wrote {json_path} and {png_path}; library messages in {log_path}",
                  markup=False, highlight=False)
    return exit_code(report)


def _print_breakdown(report: dict, console) -> None:
    runs = [r for r in report["runs"] if r["status"] == "ok" and r.get("breakdown")]
    done = [r for r in runs if "ms_per_step" in r["breakdown"]]
    for r in runs:
        if "skipped" in r["breakdown"]:
            console.print(f"breakdown of {r['name']}: skipped, {r['breakdown']['skipped']}", markup=False)
    if not done:
        return
    clock = done[0]["breakdown"]["clock"]
    table = Sheet(f"where a training step's time goes ({clock}, ms per step and share; "
                  f"torch.profiler over {done[0]['breakdown']['steps']} steps)",
                  ["layer type"] + [Column(escape(_label(r)), "right") for r in done])
    kinds = list(dict.fromkeys(k for r in done for k in r["breakdown"]["ms_per_step"]))
    for kind in kinds:
        cells = []
        for r in done:
            b = r["breakdown"]
            ms = b["ms_per_step"].get(kind)
            cells.append("" if ms is None else f"{ms:.2f} ({b['fraction'][kind]:.0%})")
        table.add_row(kind, *cells)
    table.add_row("step", *(f"{r['breakdown']['step_ms']:.2f}" for r in done), style="bold")
    table.print(console)


def main(argv=None) -> int:
    """`python -m equivalence.commands.train` (what torchrun starts): `levels train`."""
    parser = argparse.ArgumentParser(prog="levels")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    console = terminal_console()
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
