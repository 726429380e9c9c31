"""Every command's table fits the terminal it is printed on, at 80 and at 120 columns: each
column header whole, no cell cut to "…", no line wider than the console, and every skip
reason (every note) printed whole, beside its row or under the table.

The tables are fed recorded GPU reports (reports/) with rows turned into skips carrying
the real skip reasons of this machine, so the widest figures and the longest reasons
meet the narrowest consoles; doctor's table is this machine's own.
"""

import copy
import io
import json
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console

import levels
from equivalence.check import CheckResult, Comparison
from equivalence.commands import agree, check, compare, console as console_module, doctor, profile
from equivalence.commands import select as select_command
from equivalence.commands import train
from equivalence import timing
from equivalence.commands.bench import overhead
from equivalence.select import Decision, Measurement

REPORTS = Path(__file__).resolve().parents[1] / "reports"
WIDTHS = (80, 120)
# the longest reason a row can carry here: Level 5's, the one every CPU user sees
CUDA_REASON = (levels.status("cuda", torch.device("cpu"), "mlp")
               or "needs a CUDA GPU; without one, read the kernels with `levels explain --level "
                  "cuda` (ptxas report works with nvcc alone)")
NUMBA_RAISED = ("raised RuntimeError: the simulator ran out of threads while it ran the kernel "
                "grad_input_kernel, at block (3, 0, 0) of a grid of 16 blocks of 256 threads each")
INTERPRETED = ("checked at 'tiny', not timed: Triton's CPU interpreter emulates the GPU one "
               "program at a time: its time says nothing about the kernel")


def _norm(text: str) -> str:
    return " ".join(text.split())


def _columns(block: list[str], bar: str) -> list[str]:
    """The text of each column of a block of table lines, its lines joined in order: a cell
    wrapped over several lines reads as one text again."""
    cols: list[list[str]] = []
    for line in block:
        parts = line.strip().strip(bar).split(bar)
        cols += [[] for _ in range(len(parts) - len(cols))]
        for k, part in enumerate(parts):
            if part.strip():
                cols[k].append(part.strip())
    return [_norm(" ".join(c)) for c in cols]


def _parse(output: str) -> list[dict]:
    """Each table in `output`: its header texts, its body columns' texts and what follows it
    up to the next table (the notes printed under it)."""
    lines = output.splitlines()
    tables, i = [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("┏"):
            head_end = next(j for j in range(i, len(lines)) if lines[j].lstrip().startswith("┡"))
            end = next(j for j in range(head_end, len(lines)) if lines[j].lstrip().startswith("└"))
            body = [ln for ln in lines[head_end + 1:end] if ln.lstrip().startswith("│")]
            nxt = next((j for j in range(end, len(lines)) if lines[j].lstrip().startswith("┏")),
                       len(lines))
            tables.append({"headers": _columns(lines[i + 1:head_end], "┃"),
                           "body": _columns(body, "│"),
                           "after": _norm(" ".join(lines[end + 1:nxt]))})
            i = end
        i += 1
    return tables


def _render(width: int, draw) -> tuple[str, list]:
    """Run `draw(console)` on a console `width` columns wide; returns what it printed and
    the Sheets it printed."""
    sheets = []
    original = console_module.Sheet.print

    def recording(self, console):
        sheets.append(self)
        return original(self, console)

    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, force_terminal=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(console_module.Sheet, "print", recording)
        draw(console)
    return out.getvalue(), sheets


def _assert_fits(width: int, draw, must_show=()) -> str:
    text, sheets = _render(width, draw)
    assert sheets, "the command printed no Sheet"
    for line in text.splitlines():
        assert len(line) <= width, f"a line wider than {width} columns:\n{line}"
    assert "…" not in text, f"a cell was cut short at {width} columns:\n{text}"
    tables = _parse(text)
    assert len(tables) == len(sheets)
    for sheet, table in zip(sheets, tables):
        gone = sheet.left_out()
        shown = [c for c in sheet.columns if c.header.replace("\n", " ") not in gone]
        expected = _norm(" ".join(c.header for c in shown)
                         + (f" {sheet.note}" if any(n for _, n, _, _ in sheet.rows) else ""))
        got = _norm(" ".join(table["headers"]))
        assert got == expected, f"headers at {width} columns: {got!r}, expected {expected!r}"
        everything = " ".join(table["body"]) + " " + table["after"]
        for _, note, _, _ in sheet.rows:
            assert _norm(note) in everything, f"note not shown whole at {width}: {note!r}\n{text}"
        if gone:
            assert "not shown" in table["after"]
    anywhere = [_norm(text)] + [t["after"] for t in tables] + [c for t in tables for c in t["body"]]
    for reason in must_show:
        assert any(_norm(reason) in where for where in anywhere), f"{reason!r} not shown at {width}"
    return text


def _check_results():
    out = []
    for comp, variant in (("layer_norm", "default"), ("attention", "causal")):
        for layout in ("contiguous", "strided"):
            for dtype in ("float32", "bfloat16"):
                out.append(CheckResult(comp, "torchscript", variant, dtype, "cpu", "tiny", 1, "pass",
                                       tolerance=1e-5, layout=layout,
                                       comparisons=[Comparison("grad running_var", 1.2e-7, 3e-6, True)]))
                out.append(CheckResult(comp, "cuda", variant, dtype, "cpu", "tiny", 1, "skip",
                                       reason=CUDA_REASON, layout=layout))
    out.append(CheckResult("mlp", "triton", "default", "float32", "cpu", "tiny", 1, "fail",
                           tolerance=1e-5, tf32=True,
                           comparisons=[Comparison("grad w1", float("nan"), float("nan"), False,
                                                   "NaN in 12 of 4096 elements")]))
    return out


def _compare_report(device: str):
    report = copy.deepcopy(json.loads((REPORTS / "h100" / "compare.json").read_text()))
    report["settings"]["device"] = device
    for r in report["rows"]:
        if r["level"] == "torchscript":  # as fast as native within the spread
            r.update(break_even_calls_vs_native="≈", speedup_vs_native=[0.91, 1.0, 1.12])
        if r["level"] == "cuda":
            r.update(status="skip", check="skip", reason=CUDA_REASON, fwd=None, fwd_bwd=None,
                     throughput={"fwd": None, "fwd_bwd": None}, first_call_ms=None,
                     break_even_calls_vs_native=None)
        elif r["level"] == "triton":
            r.update(status="untimed", reason=INTERPRETED, fwd=None, fwd_bwd=None,
                     throughput={"fwd": None, "fwd_bwd": None}, break_even_calls_vs_native=None)
    return report


def _profile_rows():
    report = json.loads((REPORTS / "h100" / "profile-mlp.json").read_text())
    rows = copy.deepcopy(report["rows"])
    rows[-1].update(status="skip", reason=CUDA_REASON, fwd=None, fwd_bwd=None, host=None,
                    first_call_ms=None, peak_memory_mb=None,
                    throughput={"fwd": None, "fwd_bwd": None})
    cpu = [dict(r, peak_memory_mb=None) for r in rows]  # no GPU memory on a CPU
    return report, rows, cpu


def _decisions():
    out = []
    for comp, variant in (("layer_norm", "default"), ("conv_bn", "train")):
        found = [Measurement("native", "ok", first_call_ms=3.1, fwd_ms=0.21, fwd_bwd_ms=0.74),
                 Measurement("torchscript", "ok", first_call_ms=40, fwd_ms=0.2, fwd_bwd_ms=0.75),
                 Measurement("compile", "ok", first_call_ms=9000, fwd_ms=0.12, fwd_bwd_ms=0.55),
                 Measurement("triton", "interpreted", "Triton's CPU interpreter emulates the GPU: "
                                                      "its speed says nothing about the kernel"),
                 Measurement("cuda", "unavailable", CUDA_REASON)]
        out.append(Decision(comp, variant, "float32", "cpu", "x ≤64×8×16×16, weight ≤16×8×4×4",
                            "fwd_bwd", "compile", found))
    return out


def _overhead_report():
    report = copy.deepcopy(json.loads((REPORTS / "h100-overhead.json").read_text()))
    for r in report["rows"]:
        if r["level"] == "cuda":
            r.update(status="skip", reason=CUDA_REASON)
    report["goals"][0]["settled"] = False  # the widest status cell: "missed (unsettled)"
    cpu = copy.deepcopy(report)
    cpu["settings"]["device"], cpu["environment"]["gpu"] = "cpu", None
    cpu["graph_rows"], cpu["goals"] = [], []
    return report, cpu


def _train_report():
    report = copy.deepcopy(json.loads((REPORTS / "train" / "host-path" /
                                       "train-gpt-gpu.json").read_text()))
    report["runs"][-2].update(status="skip", reason=CUDA_REASON)
    report["runs"][-3]["interpreted"] = True
    return report


def _agreement():
    names = ["float64 reference", "native", "torchscript", "compile", "triton"]
    matrix = [[0.0 if i == j else 1.7e-7 * (1 + i + j) for j in range(5)]
              for i in range(5)]
    return agree.Agreement("lstm", "default", "float32", names, matrix,
                           {"cuda": CUDA_REASON, "numba": NUMBA_RAISED}, 1)


DRAWS = {
    "check": lambda c: check.results_table(_check_results(), "levels check — size 'tiny', device cpu")
    .print(c),
    "compare (GPU)": lambda c: compare.print_report(_compare_report("cuda"), c),
    "compare (CPU)": lambda c: compare.print_report(_compare_report("cpu"), c),
    "profile (GPU)": lambda c: profile.print_table(_profile_rows()[1], _profile_rows()[0]["settings"],
                                                   _profile_rows()[0]["environment"], c),
    "profile (CPU)": lambda c: profile.print_table(_profile_rows()[2], _profile_rows()[0]["settings"],
                                                   {"gpu": None}, c),
    "select": lambda c: select_command.print_table(_decisions(), "cpu", "small", "fwd_bwd", c),
    "agree": lambda c: agree.print_table(_agreement(), c),
    "doctor": lambda c: doctor.render(doctor.diagnose("cpu"), c),
    "bench --overhead (GPU)": lambda c: overhead.print_report(_overhead_report()[0], c),
    "bench --overhead (CPU)": lambda c: overhead.print_report(_overhead_report()[1], c),
    "train": lambda c: train.print_table(_train_report(), c),
}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("command", list(DRAWS))
def test_every_table_fits_and_shows_every_header_and_reason(command, width):
    must = [CUDA_REASON] if command != "doctor" or not torch.cuda.is_available() else []
    if command == "agree":
        must.append(NUMBA_RAISED)
    _assert_fits(width, DRAWS[command], must_show=must)


def test_a_cpu_compare_leaves_out_what_a_cpu_does_not_measure():
    text, _ = _render(120, DRAWS["compare (CPU)"])
    assert "TFLOP/s" not in text and "TB/s" not in text
    text, _ = _render(120, DRAWS["compare (GPU)"])
    assert "TFLOP/s" in text and "TB/s" in text
    text, sheets = _render(120, DRAWS["profile (CPU)"])
    assert "peak MB" in sheets[0].left_out() and "not shown, nothing measured on this device: peak MB" \
        in _norm(text)


def test_the_same_long_note_is_printed_once_under_the_table():
    text, _ = _render(80, DRAWS["check"])
    assert _norm(text).count(_norm(CUDA_REASON)) == 1
    assert re.search(r"│ ?\[1\] *│", text)


def test_a_pipe_gets_wide_tables_unless_columns_says_otherwise(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console_module.terminal_console(io.StringIO()).width == console_module.PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "80")
    assert console_module.terminal_console(io.StringIO()).width == 80


def test_overhead_goal_says_when_one_run_does_not_settle_it():
    # the verdict reads the median; a goal between the rounds' p20 and p80 is "unsettled",
    # and the table says so beside met or missed (the same code flips between lent machines)
    assert timing.settled(10.0, 2.0, 8.0) is True
    assert timing.settled(10.0, 12.0, 30.0) is True
    assert timing.settled(10.0, 4.7, 13.7) is False
    assert timing.settled(10.0, None, 13.7) is None
    row = {"component": "conv_bn", "level": "cuda", "status": "ok",
           "host_fwd_vs_eager_us": 6.75, "host_fwd_vs_eager_p20_us": 4.72,
           "host_fwd_vs_eager_p80_us": 13.7, "host_fwd_bwd_vs_eager_us": 30.7,
           "host_fwd_bwd_vs_eager_p20_us": 3.53, "host_fwd_bwd_vs_eager_p80_us": 35.0}
    fwd, fwd_bwd = overhead.goals([row], "cuda")
    assert (fwd["status"], fwd["settled"]) == ("met", False)
    assert (fwd_bwd["status"], fwd_bwd["settled"]) == ("met", True)
    report, _ = _overhead_report()
    report["goals"] = [fwd, fwd_bwd]
    console = Console(record=True, width=160)
    overhead.print_report(report, console)
    text = console.export_text()
    assert text.count("(unsettled)") == 1 and "unsettled (1): the goal lies between" in text
