"""What every command shares on the terminal: exit codes, the device argument, comma
lists, a progress bar, tables' number formats, and the log that libraries' output goes to.

A command prints our progress and our table; what compilers, warnings and C++ code print
goes to a log file named in the last line (`library_output_to`): libraries talk to their
authors, and a user running `levels compare` wants the table, and the log when something
breaks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_RAN = 0, 1, 2, 3
HELP_FORMAT = argparse.RawDescriptionHelpFormatter  # descriptions keep their line breaks


class NothingToRun(Exception):
    """The request is valid but this machine cannot serve it (exit 3), e.g. no GPU."""


def split_list(value: str | None, choices=None, what="value") -> list[str] | None:
    """A comma-separated argument as a list (None stays None), each item one of `choices`."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if choices is not None:
        for item in items:
            if item not in choices:
                raise argparse.ArgumentTypeError(
                    f"argument '--{what}' must be one of {', '.join(choices)}; got {item!r}")
    return items


def resolve_device(value: str | None) -> str:
    """The device to run on, checked before anything runs: a bad name is a usage error
    (exit 2), a valid one this machine lacks is NothingToRun (exit 3) with the reason."""
    import torch

    from ..environment import parse_device
    chosen = parse_device(value)
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is a CPU-only build (torch.version.cuda is None)"
                   if torch.version.cuda is None else "no GPU is visible to the CUDA driver")
            raise NothingToRun(f"no CUDA GPU here: torch.cuda.is_available() is False; {why}. "
                               "Run on a machine with an NVIDIA GPU, or use --device cpu")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise NothingToRun(f"no {chosen} here: this machine has {torch.cuda.device_count()} "
                               f"GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return str(chosen)


COMPILE_MODE_HELP = ("Level 3's torch.compile mode: 'default' (the default, or $LEVELS_COMPILE_MODE) or "
                     "'max-autotune-no-cudagraphs', which benchmarks GEMM/conv candidates for every "
                     "shape: on a GPU it adds minutes to a cold run (later runs hit the disk cache), "
                     "on a CPU it changes little")


def add_filters(p, size_default: str | None, size_help: str,
                dtype_help: str = "comma-separated: float32/fp32, float16/fp16, bfloat16/bf16 "
                                  "(default: float32,bfloat16)") -> None:
    """The filters `levels check` and `levels compare` share."""
    from levels.contract import COMPONENTS

    p.add_argument("--component", help=f"comma-separated, from: {', '.join(COMPONENTS)} "
                                       "(default: all)")
    p.add_argument("--level", help="comma-separated level names or numbers 1-5 (default: all)")
    p.add_argument("--dtype", help=dtype_help)
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if there is a GPU, else cpu)")
    p.add_argument("--size", default=size_default, help=size_help)
    p.add_argument("--seed", type=int, help="replay a run (default: fresh random inputs)")


@contextlib.contextmanager
def library_output_to(log_path: Path, console):
    """Run the block with everything but our console going to `log_path`: Python's
    sys.stdout/sys.stderr (warnings, logging, tracebacks libraries print) and the process's
    file descriptors 1 and 2 (C++ code, compiler subprocesses inherit them). Yields a
    console that still writes where ours did."""
    from rich.console import Console

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ours = console.file
    for stream in (sys.stdout, sys.stderr, ours):
        stream.flush()
    terminal = None
    try:
        if ours.fileno() in (1, 2):  # a real terminal or file: keep a handle of its own
            terminal = os.fdopen(os.dup(ours.fileno()), "w", buffering=1,
                                 encoding=getattr(ours, "encoding", None) or "utf-8", errors="replace")
    except (AttributeError, OSError, ValueError):
        pass  # a notebook's or pytest's stream has no descriptor: fds 1/2 are not it
    quiet = Console(file=terminal or ours, width=console.width if not console.is_terminal else None)
    with open(log_path, "w", buffering=1, encoding="utf-8", errors="replace") as log:
        saved_fds = [os.dup(1), os.dup(2)]
        saved_streams = sys.stdout, sys.stderr
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        try:
            with warnings.catch_warnings():
                # to the log whoever records warnings (pytest, a notebook): a library's
                # warning is its message to its own users, not ours
                warnings.showwarning = lambda message, category, filename, lineno, file=None, \
                    line=None: log.write(warnings.formatwarning(message, category, filename, lineno, line))
                yield quiet
        finally:
            log.flush()
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
            if terminal is not None:
                terminal.flush()
                terminal.close()


def log_note(log_path: Path) -> str:
    """The last line of a command: how much libraries printed, and where it went."""
    try:
        lines = sum(1 for line in Path(log_path).read_text(errors="replace").splitlines()
                    if line.strip())
    except OSError:
        return ""
    if not lines:
        return f"libraries printed nothing ({log_path} is empty)"
    return f"messages printed by libraries (compilers, warnings): {lines} line(s) in {log_path}"


def progress(console, total: int):
    """A transient progress bar on `console` (the quiet one of `library_output_to`)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # redirect_*=False: rich would otherwise re-print what libraries write above the bar
    return Progress(TextColumn("{task.description:<28}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                    console=console, transient=True, redirect_stdout=False, redirect_stderr=False)


# ---------------------------------------------------------------------------------------
# Numbers in tables (compare's and profile's rows)
# ---------------------------------------------------------------------------------------

def fmt_err(x: float | None) -> str:
    if x is None or x != x:
        return "—"
    return f"{x:.1e}"


def fmt_pct(x: float | None) -> str:
    return f"{x:.0%}" if x is not None else "—"


def fmt_ms(t) -> str:
    return f"{t['median_ms']:.3g}" if t else "—"


def fmt_spread(t) -> str:
    return f"{t['median_ms']:.3g}\n{t['p20_ms']:.3g}–{t['p80_ms']:.3g}" if t else "—"


def fmt_first_call(r: dict) -> str:
    if not r["first_call_ms"]:
        return "—"
    cache = f" {r['first_call_cache']}" if r.get("first_call_cache") else ""
    return f"{r['first_call_ms']:.0f} ms{cache}" if r["first_call_ms"] >= 10 else \
        f"{r['first_call_ms']:.2g} ms{cache}"


def fmt_break_even(r: dict) -> str:
    be = r.get("break_even_calls_vs_native")
    if r["level"] == "native":
        return "baseline" if r["status"] == "ok" else "—"
    return "—" if be is None else str(be)
