"""Pictures of what `compare` and `profile` measured (matplotlib, Agg backend, PNG files).

  levels_figure    per component: steady-state speed-up over native (fwd and fwd+bwd, p20/p80
                   error bars) above the price of getting there: the first call (cold or warm
                   cache) and the break-even call count. This is compare.png.
  scaling_figure   time per call against problem size, per level, log-log: where the fixed
                   per-call cost stops mattering and which level wins at which size.
  roofline_figure  each level as a point (arithmetic intensity, achieved TFLOP/s) under the
                   roofs this device really reaches (equivalence.ceilings), not a datasheet's.
  suite_figure     `levels bench --suite models`: per component, each level's speed relative to
                   the best library call at every shape of the model-shape suite.

Every function takes the rows `compare` and `profile` write to JSON (Profile.to_dict() plus
"check" and "break_even_calls_vs_native"), so a committed report can be drawn again later
without a GPU. Each returns the path it wrote.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import levels

PASSES = (("fwd", "forward"), ("fwd_bwd", "forward+backward"))
COLORS = {"fwd": "#4C72B0", "fwd_bwd": "#DD8452"}
LEVEL_COLORS = {"native": "#4C72B0", "torchscript": "#55A868", "compile": "#C44E52",
                "triton": "#8172B2", "cuda": "#CCB974"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window, never need a display
    import matplotlib.pyplot as plt
    return plt


def _timed(row: dict | None) -> bool:
    return bool(row) and row["status"] == "ok" and row.get("check") != "FAIL"


def _why_no_bar(row: dict | None) -> str:
    if not row:
        return "not run"
    if row["status"] == "ok" and row.get("check") == "FAIL":
        return "check FAILED"
    return {"skip": "unavailable here", "untimed": "checked, not timed\n(interpreter)",
            "error": "error"}.get(row["status"], row["status"])


def _label(name: str) -> str:
    try:
        return f"{levels.resolve(name).number} {name}"
    except ValueError:
        return name


def _speedup(row: dict, base: dict, key: str) -> tuple[float, float, float]:
    """Speed-up of `row` over `base` and its p20/p80 range (the row's spread)."""
    b, t = base[key]["median_ms"], row[key]
    return b / t["median_ms"], b / t["p80_ms"], b / t["p20_ms"]


def _log_limits(values, pad=2.0) -> tuple[float, float]:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return 0.1, 10.0
    return min(values) / pad, max(values) * pad


def _break_even_text(row: dict) -> str:
    be = row.get("break_even_calls_vs_native")
    if row["level"] == "native":
        return "baseline"
    if be is None:
        return ""
    if be == "≈":  # the spreads overlap: no count would survive the next run
        return "≈ native's speed"
    return "never pays off" if be == "never" else f"pays off after {be} call{'s' * (be != 1)}"


def _headline(rows: list[dict]) -> str:
    """The one message of compare.png: the best steady-state win, and what first calls cost."""
    native = {r["component"]: r for r in rows if r["level"] == "native" and _timed(r)}
    # either pass: a forward win of 3.0× is the headline even where forward+backward's is 2.5×;
    # a win counts only where the p20–p80 intervals do not overlap (below its low end: 1×)
    wins = [(_speedup(r, native[r["component"]], key), r, key) for r in rows for key in ("fwd", "fwd_bwd")
            if r["level"] != "native" and _timed(r) and r["component"] in native]
    firsts = [r for r in rows if _timed(r) and r.get("first_call_ms")]
    parts = []
    if wins:
        (x, _, _), r, key = max(wins, key=lambda w: w[0][0])
        base = native[r["component"]][key]
        if x > 1 and r[key]["p80_ms"] < base.get("p20_ms", base["median_ms"]):
            parts.append(f"{r['level']} is up to {x:.1f}× faster than native in steady state "
                         f"({r['component']}, {'fwd+bwd' if key == 'fwd_bwd' else 'forward'})")
        else:
            parts.append("no level is measurably faster than native in steady state here")
    if firsts:
        r = max(firsts, key=lambda r: r["first_call_ms"])
        cache = f", {r['first_call_cache']} cache" if r.get("first_call_cache") else ""
        parts.append(f"but a first call costs up to {r['first_call_ms'] / 1e3:.1f} s "
                     f"({r['level']} {r['component']}{cache})")
    return ", ".join(parts) or "nothing could be timed here"


def _where(settings: dict, environment: dict) -> str:
    device = environment.get("gpu") or f"CPU, {environment.get('cpu_threads', '?')} threads"
    return f"{settings['dtype']}, size '{settings['size']}', {device}, torch {environment.get('torch')}"


def _wrap(text: str, width_in: float, fontsize: float) -> str:
    # about 0.55 em per character of DejaVu Sans: wrap to the figure, never cut a sentence
    return textwrap.fill(text, max(30, int(width_in * 72 / (0.55 * fontsize))))


def _times_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda ms, _: f"{ms:g} ms" if ms < 1000 else f"{ms / 1000:g} s"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _speedup_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=2))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}×"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def levels_figure(rows: list[dict], settings: dict, environment: dict, path) -> Path:
    """Speed-up panels above first-call panels, one column per component (see module doc)."""
    plt = _pyplot()
    comps = list(dict.fromkeys(r["component"] for r in rows))
    names = list(dict.fromkeys(r["level"] for r in rows))
    by = {(r["component"], r["level"]): r for r in rows}
    width = 2.2 + 3.0 * len(comps)
    fig, axes = plt.subplots(2, len(comps), figsize=(width, 8.0), squeeze=False, sharey="row",
                             layout="constrained", gridspec_kw={"height_ratios": [1.15, 1]})
    xs = list(range(len(names)))
    speedups, firsts = [], []
    for col, comp in enumerate(comps):
        top, bottom = axes[0][col], axes[1][col]
        base = by.get((comp, "native"))
        for offset, (key, label) in zip((-0.2, 0.2), PASSES):
            for x, name in zip(xs, names):
                row = by.get((comp, name))
                if not (_timed(row) and _timed(base)):
                    continue
                s, lo, hi = _speedup(row, base, key)
                speedups += [lo, hi]
                top.bar(x + offset, s, width=0.4, color=COLORS[key],
                        label=label if (col == 0 and x == 0) else None,
                        yerr=[[s - lo], [hi - s]], capsize=2, error_kw={"lw": 0.8})
        top.axhline(1.0, color="black", lw=0.8, ls="--")
        top.set_title(comp, fontsize=11)
        for x, name in zip(xs, names):
            row = by.get((comp, name))
            if not _timed(row):
                color = "red" if row and row.get("check") == "FAIL" else "gray"
                for ax in (top, bottom):
                    ax.text(x, 0.5, _why_no_bar(row), rotation=90, ha="center", va="center",
                            transform=ax.get_xaxis_transform(), fontsize=7, color=color)
                continue
            ms = row["first_call_ms"]
            firsts.append(ms)
            bottom.bar(x, ms, width=0.6, color=LEVEL_COLORS.get(name, "#999999"))
            cache = row.get("first_call_cache")
            note = "\n".join(t for t in (f"{cache} cache" if cache else "", _break_even_text(row)) if t)
            bottom.text(x, ms * 1.25, note, ha="center", va="bottom", fontsize=6.5, rotation=90)
        for ax in (top, bottom):
            ax.set_xticks(xs, [_label(n) for n in names], rotation=40, ha="right", fontsize=8)
            ax.set_xlim(-0.6, len(names) - 0.4)
            ax.set_yscale("log")
            ax.grid(axis="y", which="major", alpha=0.3)
        _speedup_axis(top)
        _times_axis(bottom)
    lo, hi = _log_limits(speedups, pad=1.6)
    axes[0][0].set_ylim(min(lo, 0.5), max(hi, 2.0))
    lo, hi = _log_limits(firsts)
    axes[1][0].set_ylim(lo, hi * 60)  # headroom for the labels above the tallest bar
    axes[0][0].set_ylabel("steady-state speed-up over native\n(log; median, bars: p20–p80)")
    axes[1][0].set_ylabel("first call, fwd+bwd (log)\nincl. compile / JIT / build")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(_wrap(_headline(rows), width, 11), fontsize=11, fontweight="bold")
    fig.supxlabel(_wrap(_where(settings, environment) + ". Top: above the dashed line is faster than "
                        "native. Bottom: the first call's cost; cold = it compiled, warm = it found "
                        "its on-disk cache; pays off after n calls = the break-even against native.",
                        width, 8.5), fontsize=8.5, color="#333333")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def scaling_figure(points: list[dict], component: str, dim: str, settings: dict,
                   environment: dict, path) -> Path:
    """Median fwd+bwd time against the size of dimension `dim`, one line per level.

    points: {"level", "value" (of dim), "fwd_bwd": Timing dict} per measured size."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    names = list(dict.fromkeys(p["level"] for p in points))
    for name in names:
        mine = sorted((p for p in points if p["level"] == name and p.get("fwd_bwd")),
                      key=lambda p: p["value"])
        if not mine:
            continue
        x = [p["value"] for p in mine]
        y = [p["fwd_bwd"]["median_ms"] for p in mine]
        err = [[p["fwd_bwd"]["median_ms"] - p["fwd_bwd"]["p20_ms"] for p in mine],
               [p["fwd_bwd"]["p80_ms"] - p["fwd_bwd"]["median_ms"] for p in mine]]
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=2, label=_label(name),
                    color=LEVEL_COLORS.get(name))
    measured = [p for p in points if p.get("fwd_bwd")]
    if measured:  # a slope-1 guide through the largest point: linear in the work
        big = max(measured, key=lambda p: p["value"])
        xs = sorted({p["value"] for p in measured})
        ref = big["fwd_bwd"]["median_ms"]
        ax.plot(xs, [ref * v / big["value"] for v in xs], color="gray", lw=0.8, ls=":",
                label="∝ size (guide)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"{dim} (the other dimensions as at size '{settings['size']}'; log₂)")
    ax.set_ylabel("median time per fwd+bwd call (ms, log)")
    ax.grid(which="major", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{component}: flat on the left = per-call overhead, parallel to the guide = "
                 "work-bound", fontsize=10)
    fig.text(0.5, 0.005, _where(settings, environment) + "; bars: p20–p80", ha="center",
             fontsize=8, color="#333333")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def roofline_figure(rows: list[dict], ceilings: dict, settings: dict, environment: dict,
                    path) -> Path:
    """Achieved TFLOP/s against arithmetic intensity (the card's FLOPs / minimum bytes), per level
    and pass, under min(matmul rate, copy bandwidth × intensity) measured on this device."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    peak, bw = ceilings["matmul_tflops"], ceilings["copy_tbps"]
    points = []
    for r in rows:
        if not _timed(r):
            continue
        for key, marker in (("fwd", "o"), ("fwd_bwd", "s")):
            tp = r["throughput"][key]
            if not tp or not tp["tbps"]:
                continue
            ai = tp["tflops"] / tp["tbps"]  # FLOP per byte
            points.append((ai, tp["tflops"], r, key, marker))
    intensities = [p[0] for p in points] + [peak / bw]
    lo, hi = min(intensities) / 8, max(intensities) * 8
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, bw * x) for x in xs], color="black", lw=1.5)
    ax.text(lo * 1.3, bw * lo * 1.3 * 3, f"copy {bw * 1e3:.3g} GB/s", fontsize=8)  # above its line
    ax.text(hi / 1.3, peak * 1.15, f"{ceilings['dtype']} matmul {peak:.3g} TFLOP/s", fontsize=8,
            ha="right")
    for ai, tflops, r, key, marker in points:
        ax.scatter(ai, tflops, marker=marker, s=40, color=LEVEL_COLORS.get(r["level"], "#999999"),
                   edgecolor="black", lw=0.5, zorder=3)
    for name in dict.fromkeys(p[2]["level"] for p in points):
        ax.scatter([], [], marker="o", color=LEVEL_COLORS.get(name, "#999999"), label=_label(name))
    ax.scatter([], [], marker="o", color="white", edgecolor="black", label="forward")
    ax.scatter([], [], marker="s", color="white", edgecolor="black", label="forward+backward")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ys = [p[1] for p in points] or [peak]
    ax.set_ylim(min(min(ys) / 5, bw * lo), peak * 3)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the minimum traffic, log)")
    ax.set_ylabel("achieved TFLOP/s (log)")
    ax.grid(which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    comps = ", ".join(dict.fromkeys(r["component"] for r in rows))
    ridge = peak / bw
    bound = ("memory-bound" if points and max(p[0] for p in points) < ridge else "compute-bound"
             if points and min(p[0] for p in points) >= ridge else "on both sides of the ridge")
    best = max(points, key=lambda p: p[1] / min(peak, bw * p[0]), default=None)
    message = f"{comps} is {bound} here"
    if best:
        fraction = best[1] / min(peak, bw * best[0])
        message += f"; best: {best[2]['level']} {dict(PASSES)[best[3]]} at {fraction:.0%} of its roof"
        if fraction > 1:  # never above a roof without saying why
            message += "\n(above it: the roof is stale, measured under load, or the data fits in cache)"
    ax.set_title(message, fontsize=10)
    fig.text(0.5, 0.005, _where(settings, environment) + "; roofs measured on this device",
             ha="center", fontsize=8, color="#333333")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _suite_headline(report: dict) -> str:
    """The suite's one message: how many goals the first level with figures meets, and
    its slowest shape against the library."""
    names = report["settings"]["levels"]
    for name in names:
        rows = [r for r in report["summary"] if r["level"] == name and r["goal"] is not None]
        timed = [(e, e["levels"][name]) for e in report["entries"]
                 if e["levels"].get(name, {}).get("ratio") is not None]
        if not timed:
            continue
        met = sum(r["status"] == "met" for r in rows)
        e, s = min(timed, key=lambda es: es[1]["ratio"])
        text = (f"{_label(name)} meets {met} of {len(rows)} goals; slowest: {e['component']} "
                f"{e['model']} {e['direction']} at {s['ratio']:.2f}× {e['best_library']}")
        if report.get("smoke"):
            text = "CPU smoke run (tiny twins, not the goals' shapes): " + text
        return text
    return "no level could be timed against a library call here"


def suite_figure(report: dict, path) -> Path:
    """`levels bench --suite models`: per component, one horizontal bar per shape and pass
    and level: the level's speed relative to the best library call at that shape (best
    library median / level median, p20-p80 whiskers), on one log scale shared by all
    panels, with lines at parity (1×), at the component's goal and at the 0.7× floor; on a GPU
    a tick marks each level's ratio by kernel time alone (kernel_ratio)."""
    plt = _pyplot()
    entries, names = report["entries"], report["settings"]["levels"]
    goals, floor = report["settings"]["goals"], report["settings"]["floor"]
    comps = list(dict.fromkeys(e["component"] for e in entries))
    rows_of = {c: [e for e in entries if e["component"] == c] for c in comps}
    bar_h = 0.8 / max(1, len(names))
    row_in = 0.12 + 0.12 * len(names)
    heights = [len(rows_of[c]) * row_in + 0.7 for c in comps]
    width = 11.0
    fig, axes = plt.subplots(len(comps), 1, figsize=(width, sum(heights) + 1.6), squeeze=False,
                             sharex=True, layout="constrained",
                             gridspec_kw={"height_ratios": heights})
    ratios = []
    for ax, comp in zip((a[0] for a in axes), comps):
        rows = rows_of[comp]
        ys = list(range(len(rows)))
        whole_skips = []
        for i, name in enumerate(names):
            sides = [e["levels"].get(name) for e in rows]
            if all(s is None or s["status"] == "skip" for s in sides):
                why = next((s["reason"] for s in sides if s), "not run")
                whole_skips.append(f"{_label(name)}: not run here ({why.splitlines()[0][:90]})")
                continue
            offset = (i - (len(names) - 1) / 2) * bar_h
            for y, s in zip(ys, sides):
                yy = y + offset
                if s is not None and s.get("ratio") is not None:
                    r = s["ratio"]
                    lo, hi = s["ratio_spread"] or (r, r)
                    ratios += [lo, hi]
                    ax.barh(yy, r, height=bar_h * 0.9, color=LEVEL_COLORS.get(name, "#999999"),
                            xerr=[[max(r - lo, 0)], [max(hi - r, 0)]], capsize=1.5,
                            error_kw={"lw": 0.7}, label=_label(name) if y == 0 else None)
                    ax.text(max(hi, r) * 1.04, yy, f"{r:.2f}×", va="center", fontsize=6.5)
                    k = s.get("kernel_ratio")
                    if k:  # kernels alone: the distance to the bar's end is host time
                        ratios.append(k)
                        ax.plot([k], [yy], marker="|", ms=7, mew=1.6, color="black",
                                zorder=3)
                else:
                    status = "no library ran" if s and s["status"] == "ok" else \
                        (s["status"] if s else "not run")
                    ax.text(1.0, yy, f" {_label(name)}: {status}", va="center", fontsize=6.5,
                            color="red" if status in ("error", "wrong") else "gray")
        ax.axvline(1.0, color="black", lw=0.9, ls="--")
        goal_lines = sorted({g for grp, g in goals.items() if grp.split()[0] == comp})
        for g in goal_lines:
            if g != 1.0:
                ax.axvline(g, color="#2ca02c", lw=0.9, ls=":")
        ax.axvline(floor, color="#d62728", lw=0.9, ls=":")
        ax.set_yticks(ys, [f"{e['model']} — {e['description']}, {e['direction']}" for e in rows],
                      fontsize=7.5)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first shape at the top
        goal_text = ", ".join(f"{grp.split(' ', 1)[1] + ' ' if ' ' in grp else ''}geomean ≥ {g:g}×"
                              for grp, g in goals.items() if grp.split()[0] == comp)
        ax.set_title(f"{comp}" + (f" — goal: {goal_text}" if goal_text else ""), fontsize=10,
                     loc="left")
        if whole_skips:
            ax.text(0.99, 0.02, "\n".join(whole_skips), transform=ax.transAxes, ha="right",
                    va="bottom", fontsize=6.5, color="gray")
        ax.grid(axis="x", which="major", alpha=0.3)
    ax0 = axes[0][0]
    ax0.set_xscale("log", base=2)
    lo, hi = _log_limits(ratios + [floor, 1.0], pad=1.4)
    ax0.set_xlim(lo, hi * 1.5)  # room for the value labels right of the longest bar
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, NullFormatter
    for a in axes:
        a[0].xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}×"))
        a[0].xaxis.set_minor_formatter(NullFormatter())
    handles = [Patch(color=LEVEL_COLORS.get(n, "#999999"), label=_label(n)) for n in names]
    handles += [Line2D([], [], color="black", ls="--", lw=0.9, label="as fast as the library"),
                Line2D([], [], color="#2ca02c", ls=":", lw=0.9, label="goal, where not 1×"),
                Line2D([], [], color="#d62728", ls=":", lw=0.9, label=f"floor {floor:g}×")]
    if any(s.get("kernel_ratio") for e in report["entries"] for s in e["levels"].values()):
        handles.append(Line2D([], [], color="black", marker="|", ls="none", ms=7, mew=1.6,
                              label="kernels alone (no host time)"))
    # above the first panel, right of its title: constrained layout makes room for it
    ax0.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=3, fontsize=7.5,
               frameon=False)
    axes[-1][0].set_xlabel(_wrap("speed relative to the best library call at that shape (library "
                                 "median / level median, log scale; > 1×: the level is faster; "
                                 "whiskers: p20–p80)", width - 2.5, 8.5), fontsize=8.5)
    env = report["environment"]
    device = env.get("gpu") or f"CPU, {env.get('cpu_threads', '?')} threads"
    fig.suptitle(_wrap(_suite_headline(report), width, 11), fontsize=11, fontweight="bold")
    fig.supxlabel(_wrap(f"{device}, torch {env.get('torch')}, triton {env.get('triton')}, "
                        f"{report['settings']['dtype']}, {env.get('date', '')[:10]}. Libraries: "
                        "SDPA (fastest of FLASH/EFFICIENT/CUDNN pinned), F.layer_norm, "
                        "F.linear+GELU, nn.LSTM, F.conv2d+batch_norm, timed in the same run.",
                        width, 8), fontsize=8, color="#333333")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
