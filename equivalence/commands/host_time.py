"""`levels explain --level triton`'s "Where the microseconds go": one small Level 4 call's
host time, piece by piece (the host's, not the kernel's), measured live on a CUDA GPU by
host_probe.py, else as recorded in reports/h100-host-probe.json, and the lesson it teaches:
at a tiny shape the host's work is the call's time, and what removes it.
"""

from __future__ import annotations

import textwrap

import torch

from .. import cards

HOST_TITLE = "Where the microseconds go"
WIDTH = 88  # explain's rule: its sections are this wide


def _wrap(text: str, indent: str = "", first: str | None = None) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False)


def _us(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


NAME_WIDTH = 35  # the piece column; "what it is" gets WIDTH - 2 - NAME_WIDTH - 9 = 42 characters


def _table(rows: list[dict], name_width: int = NAME_WIDTH) -> list[str]:
    """One line per piece: name, microseconds, what it is (cut to the width, never wrapped:
    a wrapped row would break the columns)."""
    lines = []
    for r in rows:
        line = f"  {r['name']:<{name_width}}{_us(r['us']):>7}  {r['what']}"
        lines.append(line if len(line) <= WIDTH else line[:WIDTH - 3] + "...")
    return lines


def section(component: str, device) -> tuple[str, str]:
    """(title, text) of "Where the microseconds go": one small Level 4 call's host time,
    piece by piece: live on a CUDA GPU (host_probe.host_breakdown), else
    reports/h100-host-probe.json, so labelled."""
    from . import host_probe as hp

    device = torch.device(device)
    if component not in hp.PROBED:
        return (HOST_TITLE, _host_not_probed(component, hp))
    why_not_live = hp.unavailable_reason(device)
    data = None
    if why_not_live is None:
        try:
            data = hp.host_breakdown(component, device)
        except Exception as exc:  # noqa: BLE001 - the recorded numbers still teach
            why_not_live = f"the live probe failed: {type(exc).__name__}: {exc}"
    if data is None:
        try:
            data = hp.recorded_breakdown(component)
        except FileNotFoundError:
            return (HOST_TITLE, _host_missing(component, hp, why_not_live))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a damaged file
            return (HOST_TITLE, f"{hp._shown(hp.RECORDED)} could not be read "
                                       f"({type(exc).__name__}: {exc}).\n\n"
                           + _host_missing(component, hp, why_not_live, missing=False))
    title = HOST_TITLE + ("  (measured here)" if data["status"] == "measured" else
                          "  (recorded elsewhere, not measured here)")
    return title, _render_host(data, why_not_live, hp)


def _host_missing(component, hp, why_not_live, missing: bool = True) -> str:
    head = (f"No recorded host-time breakdown: {hp._shown(hp.RECORDED)} is missing, "
            if missing else "No recorded host-time breakdown to show, ")
    return "\n".join([
        _wrap(head + f"and this process cannot measure one ({why_not_live})."),
        "",
        "To record it, on a machine with a CUDA GPU:",
        f"  PYTHONPATH=. python3 scripts/probe_host.py {hp._shown(hp.RECORDED)}",
        "or measure it there directly, in Python:",
        f"  from equivalence.host_probe import host_breakdown; host_breakdown({component!r})"])


def _host_not_probed(component, hp) -> str:
    lines = [_wrap(f"Not broken down for {component}: the host probe "
                   f"(equivalence/host_probe.py) covers {' and '.join(hp.PROBED)}; see "
                   f"`levels explain --component layer_norm --level triton`. What it shows "
                   f"holds here too: whatever its kernels' own time, a Level 4 call costs the "
                   f"host the contract's checks, allocations, autograd.Function.apply (when "
                   f"a gradient is wanted) and one Python launch per kernel, and at a tiny "
                   f"shape that host time is the call's time.")]
    recorded = cards.get(component).host_probe.get("recorded")
    if recorded:
        try:
            rec = hp.load_recorded().get(recorded["group"], {})
            l4, eager = rec.get(recorded["level4"]), rec.get(recorded["library"])
        except (OSError, ValueError, AttributeError):
            l4 = eager = None
        if isinstance(l4, (int, float)) and isinstance(eager, (int, float)):
            lines += ["", _wrap(f"Recorded ({hp._shown(hp.RECORDED)}, not measured here): the "
                                f"whole Level 4 call {l4:.1f} µs against {recorded['library_name']} "
                                f"{eager:.1f} µs, {recorded['call']}.")]
    return "\n".join(lines)


def _render_host(data: dict, why_not_live: str | None, hp) -> str:
    lines = []
    if data["status"] == "measured":
        lines += [f"MEASURED here, now: {data.get('gpu')}, {data.get('date')}",
                  f"  versions  {data.get('versions')}",
                  f"  by        equivalence.host_probe.{data.get('command')}"]
    else:
        lines += [_wrap(f"RECORDED, not measured here ({why_not_live}). The numbers below "
                        f"are another machine's:")]
        for label, key in (("GPU", "gpu"), ("date", "date"), ("versions", "versions"),
                           ("file", "source"), ("made by", "command")):
            lines.append(f"  {label:<9} {data.get(key) or '(not in the file)'}")
        if data.get("note"):
            lines.append(_wrap(data["note"], indent=" " * 12, first=f"  {'note':<9} "))
    total, eager = data["total"], data["eager"]
    rule = f"  {'-' * (NAME_WIDTH - 2)}  {'-' * 7}"
    what = WIDTH - len(rule) - 2
    lines += ["", f"One call: {data['call']},", f"on {data['shapes']}.",
              "Host time per call, calls back to back (medians, µs):", "",
              f"  {'piece':<{NAME_WIDTH}}{'µs':>7}  what it is", rule + f"  {'-' * what}"]
    lines += _table(data["pieces"])
    lines += [rule]
    lines += _table([{**total, "name": "= " + total["name"]}, eager])
    if data.get("kernel_us") is not None:
        lines += _table([{"name": "GPU time of the call", "us": data["kernel_us"],
                          "what": "the kernel(s) alone, queue primed"}])
    lines += ["", "Next to it, not part of the call above:"]
    lines += _table(data["alternatives"])
    if data.get("footnote"):
        lines += ["", _wrap(data["footnote"], indent="    ", first="  ")]
    if data.get("errors"):
        lines += ["", "Pieces that could not be timed (n/a above):"]
        lines += [_wrap(f"{k}: {v}", indent="    ", first="  ") for k, v in data["errors"].items()]
    lines += ["", *_host_lesson(data, hp)]
    return "\n".join(lines)


def _host_lesson(data: dict, hp) -> list[str]:
    rows = {r["name"]: r["us"] for r in (*data["pieces"], *data["alternatives"])}
    total, eager = data["total"]["us"], data["eager"]["us"]
    component = data["component"]
    kernel = data.get("kernel_us")
    gpu = (f"the GPU's own part of it is {kernel:.1f} µs" if kernel is not None
           else "the GPU's own part is not in this recording (a live breakdown measures it)")
    out = ["The lesson:"]
    if total is not None and eager is not None:
        out.append(_wrap(f"What dominates a tiny call: the host. The pieces above are CPU work "
                         f"(Python, checks, allocations, launches) and add up to the call's "
                         f"{total:.1f} µs, {total / eager:.1f}x eager's {eager:.1f} µs; {gpu}. "
                         f"A faster kernel would not change this number.",
                         indent="  ", first="- "))
    crossover = hp.kernel_dominates_above(component, total)
    if crossover:
        out.append(_wrap(f"When the kernel time dominates: once the kernel runs longer than "
                         f"the host needs to issue it. Roughly: {crossover}. Below that size, "
                         f"cut host time; above it, kernel work is what shows.",
                         indent="  ", first="- "))
    out.append("- The fixes:")
    validate = rows.get(f"validate_{component}")
    once = f"validate once: the contract's checks cost {_us(validate)} µs on every call"
    fix_note = cards.get(component).host_probe.get("fix_note")
    if fix_note:
        once += fix_note(rows, data["raw"])
    out.append(_wrap(once + "; a layer whose shapes do not change can check at its first "
                     "call.", indent="    ", first="  * "))
    apply = rows.get("autograd.Function.apply")
    out.append(_wrap("skip autograd.Function when nothing needs a gradient"
                     + (f": apply costs {apply:.1f} µs a call" if apply is not None else "")
                     + "; Level 4 already calls the forward directly then (needs_grad in "
                       "triton_kernels/launch.py).", indent="    ", first="  * "))
    jit, fast, raw = (rows.get("launch through kernel[grid]"),
                      rows.get("launch (triton_kernels/launch.py)"),
                      rows.get("compiled launcher alone (ck.run)"))
    off = rows.get("the call, direct launches off")
    if jit is not None and fast is not None:
        direct = f"kernel[grid] {jit:.1f} µs -> {fast:.1f} µs a launch"
        if off is not None and total is not None:
            direct += f" (the whole call: {off:.1f} -> {total:.1f} µs)"
        if raw is not None:
            direct += f"; the compiled launcher alone, the floor from Python, is {raw:.1f} µs"
    elif off is not None and total is not None:
        direct = (f"the call takes {off:.1f} µs with every launch through kernel[grid], "
                  f"{total:.1f} µs with direct launches")
    else:
        direct = "they skip Triton's per-call binding and specialization"
    out.append(_wrap(f"direct launches (triton_kernels/launch.py): {direct}.",
                     indent="    ", first="  * "))
    out.append(_wrap("CUDA graphs: capture the call once and replay it: one graph launch, "
                     "with no Python, checks or allocations per call (shapes, dtypes and "
                     "buffers fixed at capture). levels.nn.cuda_graph(module, *example_args) "
                     "does this for a levels.nn layer.", indent="    ", first="  * "))
    return out
