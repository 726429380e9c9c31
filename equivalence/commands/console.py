"""What every command shares on the terminal: exit codes, the device argument, comma
lists, a progress bar, tables that fit the terminal (`Sheet`) and their number formats, and
the log that libraries' output (their warnings included) goes to.

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
from dataclasses import dataclass
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


def fmt_roof(x: float | None) -> str:
    """A fraction of a roof; above 100% marked (a line under the table says why)."""
    return fmt_pct(x) + (" ⚠" if x is not None and x > 1 else "")


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


BREAK_EVEN_SAME = ("≈ = as fast as native: their p20–p80 intervals of forward+backward overlap, "
                   "so no count would hold from one run to the next (under it: the speed-up's range)")


def fmt_break_even(r: dict) -> str:
    be = r.get("break_even_calls_vs_native")
    if r["level"] == "native":
        return "baseline" if r["status"] == "ok" else "—"
    spread = r.get("speedup_vs_native")
    if be == "≈" and spread:
        return f"≈\n{spread[0]:.2f}–{spread[2]:.2f}×"
    return "—" if be is None else str(be)


# ---------------------------------------------------------------------------------------
# The console, and tables that fit it
# ---------------------------------------------------------------------------------------

PIPE_WIDTH = 150  # a pipe or a file keeps the whole table on one line per row


def terminal_console(file=None):
    """The console a command prints on: as wide as the terminal; a pipe or a file gets
    PIPE_WIDTH columns (a log is read in an editor, not folded to 80), unless $COLUMNS
    says how wide, which rich reads."""
    from rich.console import Console

    stream = file or sys.stdout
    told = os.environ.get("COLUMNS", "").isdigit()
    return Console(file=file, width=None if told or stream.isatty() else PIPE_WIDTH)


@dataclass
class Column:
    """One column of a `Sheet`. `header` may hold a line break. `under`: on a console too
    narrow for every column side by side, this column's cells become a second line of the
    column named `under` (its header too), so no column is left out or cut to "…".
    `optional`: a figure some devices do not measure (peak GPU memory): left out, and
    named under the table, where every cell of it is empty or "—"."""
    header: str
    justify: str = "left"
    under: str | None = None
    optional: bool = False


_EMPTY = ("", "—")  # a cell that says nothing


class Sheet:
    """A rich table that fits the console it is printed on, at 80 columns and more.

    A command declares its title (plain text) and columns, adds rows (cells in rich markup)
    each with an optional note (plain text: a skip reason, a failure, a remark), and
    prints. On the way out:
      - an `optional` column whose every cell is empty or "—" is left out, and a line below
        says which (a figure this device does not measure says nothing: GPU memory on a CPU);
      - every column gets at least its longest word (header included): a header or a
        number is never cut to "…" or broken inside a word;
      - a note that fits beside the row in NOTE_LINES lines stays there; a longer one
        becomes a marker ("[1]") and is printed in full under the table, the same note once;
      - still too wide: the columns declared `under=` another are stacked into it, then
        the cells lose their padding.
    Nothing is ever dropped to make room: a skip reason is always printed whole.
    """

    NOTE_LINES = 3  # a note wraps beside its row over at most this many lines, else goes below

    def __init__(self, title: str, columns, *, note: str = "note", **table_options):
        self.title, self.table_options = title, table_options
        self.columns = [c if isinstance(c, Column) else Column(c) for c in columns]
        self.note = note  # the notes' header
        self.rows: list[tuple[list[str], str, str | None, bool]] = []

    def add_row(self, *cells, note: str = "", style: str | None = None) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(self.columns)} cells expected, got {len(cells)}")
        self.rows.append(([("" if c is None else str(c)) for c in cells], note or "", style, False))

    def add_section(self) -> None:
        if self.rows:
            cells, note, style, _ = self.rows[-1]
            self.rows[-1] = (cells, note, style, True)

    # -- layout --------------------------------------------------------------------------

    def _shown(self) -> list[int]:
        return [i for i, c in enumerate(self.columns) if not c.optional
                or any(_plain(cells[i]).strip() not in _EMPTY for cells, *_ in self.rows)]

    def left_out(self) -> list[str]:
        """The headers of the optional columns that say nothing here (every cell empty)."""
        shown = set(self._shown()) if self.rows else set(range(len(self.columns)))
        return [c.header.replace("\n", " ") for i, c in enumerate(self.columns) if i not in shown]

    def _merged(self, stacked: bool):
        """(headers, justifies, rows of cells): with `stacked`, `under=` columns folded into
        theirs."""
        shown = self._shown() if self.rows else list(range(len(self.columns)))
        groups: dict[str, list[int]] = {}  # the first column's header -> the columns in it
        for i in shown:
            under = self.columns[i].under
            if stacked and under in groups:
                groups[under].append(i)
            else:
                groups[self.columns[i].header] = [i]
        groups = list(groups.values())
        headers = ["\n".join(self.columns[i].header for i in g) for g in groups]
        justify = [self.columns[g[0]].justify for g in groups]
        rows = [["\n".join(cells[i] for i in g if cells[i] or len(g) == 1) for g in groups]
                for cells, *_ in self.rows]
        return headers, justify, rows

    def layout(self, width: int):
        """The table to print at `width` columns and the notes printed under it."""
        from rich import box
        from rich.markup import escape
        from rich.table import Table

        notes = [note for _, note, _, _ in self.rows]
        has_notes = any(notes)
        marker_width = len(f"[{len(set(n for n in notes if n))}]")
        attempt = None
        for padding, stacked in ((1, False), (1, True), (0, True)):
            headers, justify, rows = self._merged(stacked)
            mins = [max([_longest_word(h) for h in [head]] + [_longest_word(r[k]) for r in rows])
                    for k, head in enumerate(headers)]
            maxs = [max([_widest_line(head)] + [_widest_line(r[k]) for r in rows])
                    for k, head in enumerate(headers)]
            n = len(headers) + (1 if has_notes else 0)
            overhead = 2 + (n - 1) + 2 * padding * n
            note_min = max(len(self.note), marker_width) if has_notes else 0
            spare = width - overhead - sum(mins) - note_min
            attempt = (padding, headers, justify, rows, mins, maxs, note_min, spare)
            if spare >= 0:
                break
        padding, headers, justify, rows, widths, maxs, note_width, spare = attempt
        widths = list(widths)
        # columns that would wrap get room first, the narrowest need first: most rows
        # then stay one line high; what is left goes to the notes
        for k in sorted(range(len(widths)), key=lambda k: maxs[k] - widths[k]):
            grow = min(max(0, spare), maxs[k] - widths[k])
            widths[k] += grow
            spare -= grow
        if has_notes:
            longest = max(max(map(len, n.splitlines()), default=0) for n in notes)
            note_width += max(0, min(spare, longest - note_width))
        inline = {n for n in notes if n and _note_lines(n, note_width) <= self.NOTE_LINES}
        below: dict[str, int] = {}
        for n in notes:
            if n and n not in inline and n not in below:
                below[n] = len(below) + 1
        if has_notes and not inline:  # only markers: the column needs no more than them
            note_width = max(len(self.note), len(f"[{len(below)}]"))
        options = {"box": box.HEAVY_HEAD, "padding": (0, padding), **self.table_options}
        table = Table(title=escape(self.title), **options)  # a title is plain text
        for head, just, w in zip(headers, justify, widths):
            table.add_column(head, justify=just, width=w, overflow="fold")
        if has_notes:
            table.add_column(self.note, width=note_width, overflow="fold")
        for cells, (_, note, style, section) in zip(rows, self.rows):
            if has_notes:
                cells = cells + [escape(note) if note in inline else
                                 (f"[{below[note]}]" if note else "")]
            table.add_row(*cells, style=style, end_section=section)
        return table, [f"[{i}] {note}" for note, i in below.items()]

    def print(self, console) -> None:
        table, below = self.layout(console.width)
        console.print(table)
        for line in below:
            console.print(line, markup=False, highlight=False)
        gone = self.left_out()
        if gone and self.rows:
            console.print(f"not shown, nothing measured on this device: {', '.join(gone)}",
                          markup=False, highlight=False)


def _plain(cell: str) -> str:
    from rich.text import Text
    try:
        return Text.from_markup(cell).plain
    except Exception:  # noqa: BLE001 - not markup after all: measure it as it is
        return cell


def _note_lines(note: str, width: int) -> int:
    """How many lines `note` takes wrapped at `width` (a word wider than that: too many)."""
    import textwrap

    from rich.cells import cell_len

    if max((cell_len(w) for w in note.split()), default=0) > width:
        return 1 << 30
    return len(textwrap.wrap(note, width, break_long_words=False))


def _longest_word(cell: str) -> int:
    from rich.cells import cell_len
    return max((cell_len(w) for w in _plain(cell).split()), default=0)


def _widest_line(cell: str) -> int:
    from rich.cells import cell_len
    return max((cell_len(line) for line in _plain(cell).splitlines()), default=0)
