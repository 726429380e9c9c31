"""`levels explain`: what a level actually runs for one call of a component.

    from equivalence.commands.explain import explain
    print(explain("layer_norm", "compile"))          # terminal
    explain("layer_norm", "native")                  # a notebook shows it as text

Each level answers in its own terms, from the real thing, never from a description:

  native       the ATen operators one forward and one backward call dispatch (recorded
               with a TorchDispatchMode), with counts: every non-view op is a kernel
               launch and a round trip through memory.
  torchscript  the graph the TorchScript executor optimized after warm-up calls, with its
               fusion groups (prim::TensorExprGroup) and what each one fused; for conv_bn,
               the frozen module's graph where batch norm was folded into the conv.
  compile      the code Inductor generated for the forward and the backward graph: C++
               (OpenMP + SIMD) on a CPU, Triton on a GPU, plus the library calls it kept.
  others       the level module's own `explain(component, device)`, if it has one.
  triton       also "Where the microseconds go": one small call's host time, piece by piece,
               live on a CUDA GPU, else as recorded (host_probe.py); triton and cuda: the
               host path before and after, as recorded on an H100 (host_path.py).
Inputs are the component's `tiny` case (float32 unless asked), so the listing is short.
"""

from __future__ import annotations

import re
import textwrap
import types
from collections import Counter
from dataclasses import dataclass
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import levels
from levels.contract import COMPONENTS

from .. import cards
from ..calls import upstream as _upstream  # a fixed random upstream gradient per output
from ..check import _prepare, flatten, resolve_dtype
from . import host_path
from .console import EXIT_NOTHING_RAN, EXIT_OK, HELP_FORMAT, resolve_device

RULE = "=" * 88


@dataclass(frozen=True)
class Section:
    title: str
    body: str


class Explanation(str):
    """The explanation as one printable string, with its parts in `.sections`.

    A str so that `print(explain(...))`, `"aten::erf" in explain(...)` and the CLI just
    work; `_repr_pretty_` makes a notebook cell show the text rather than its repr."""

    sections: tuple[Section, ...]
    component: str
    level: str
    device: str

    def __new__(cls, component: str, level: str, device: str, sections: list[Section]):
        info = levels.resolve(level)
        head = f"{component} at Level {info.number} ({info.title}) on {device}"
        parts = [RULE, head, RULE]
        for s in sections:
            parts += ["", f"--- {s.title} ---", s.body.rstrip()]
        obj = super().__new__(cls, "\n".join(parts) + "\n")
        obj.sections, obj.component = tuple(sections), component
        obj.level, obj.device = info.name, device
        return obj

    def section(self, title_start: str) -> str:
        """The body of the section titled `title_start` (shapes suffix aside), else of the
        first section whose title starts with it."""
        for s in self.sections:
            if s.title == title_start or s.title.startswith(title_start + "  ("):
                return s.body
        for s in self.sections:
            if s.title.startswith(title_start):
                return s.body
        titles = [s.title for s in self.sections]
        raise KeyError(f"no section starting with {title_start!r}; have {titles}")

    def _repr_pretty_(self, printer, cycle):  # IPython / Jupyter
        printer.text(str(self))


def explain(component: str, level: str | int, device="cpu", *, variant: str | None = None,
            dtype="float32") -> str:
    """What `level` runs for one call of `component` on `device` (see the module doc).

    variant: one of the component's variants (default: all of them); dtype: of the inputs."""
    if component not in COMPONENTS:
        raise ValueError(f"argument 'component' must be one of {', '.join(COMPONENTS)}; "
                         f"got {component!r}")
    info = levels.resolve(level)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"argument 'device' must be a torch device such as 'cpu' or 'cuda'; "
                         f"got {device!r}") from exc
    dtype = resolve_dtype(dtype)
    spec = cards.get(component)
    if variant is not None and variant not in spec.variants:
        raise ValueError(f"argument 'variant' must be one of {sorted(spec.variants)} for "
                         f"{component}; got {variant!r}")
    variants = [variant] if variant else list(spec.variants)
    name = str(device)

    reason = levels.status(info.name, device, component)
    if device.type == "cuda" and not torch.cuda.is_available():
        reason = "no CUDA device here (torch.cuda.is_available() is False)"
    if reason:
        note = f"Level {info.number} ({info.title}) cannot run {component} on {name}:\n{reason}"
        module = None if info.number == 0 else levels.get(info.name)
        if getattr(module, "EXPLAIN_WITHOUT_DEVICE", False):
            # Level 5's kernels can still be read, and their ptxas report made, with nvcc alone.
            return Explanation(component, info.name, name, [
                Section("runs elsewhere", note), Section("the kernels", module.explain(component, device)),
                Section(*host_path.section(component, info.name))])
        sections = [Section("unavailable", note)]
        if info.name == "triton":  # the recorded host-time lessons need no GPU
            sections += [host_time_section(component, device),
                         Section(*host_path.section(component, "triton"))]
        return Explanation(component, info.name, name, sections)
    explainers = {"native": _explain_native, "torchscript": _explain_torchscript,
                  "compile": _explain_compile}
    if info.name in explainers:
        sections = []
        for var in variants:
            case = spec.case("tiny", var, dtype, device, seed=0)
            label = f"[{var}] " if len(variants) > 1 else ""
            sections += [Section(label + s.title, s.body)
                         for s in explainers[info.name](component, case, device)]
        return Explanation(component, info.name, name, sections)

    module = levels.get(info.name)
    own = getattr(module, "explain", None)
    if own is None:
        return Explanation(component, info.name, name, [Section(
            "no explain yet", f"Level {info.number} ({info.title}) has no explain yet: its code "
                              f"is in the module {info.module} and the files it calls.")])
    if device.type == "cuda":
        # Kernel levels summarize the code they compiled; compile it here, once per variant,
        # forward and backward, on the spec's inputs (a level never imports the harness).
        for var in variants:
            _run(getattr(module, component), spec.case("small", var, dtype, device, seed=0))
        torch.cuda.synchronize(device)
    sections = [Section(info.title, str(own(component, device)))]
    if info.name == "triton":
        sections.append(host_time_section(component, device))
    if info.name in host_path.WHAT_CHANGED:
        sections.append(Section(*host_path.section(component, info.name)))
    return Explanation(component, info.name, name, sections)


# ---------------------------------------------------------------------------------------
# Running one case forward and backward
# ---------------------------------------------------------------------------------------

def _run(fn, case: cards.Case, backward: bool = True, seed: int = 0):
    """Call fn on fresh leaf copies of the case's inputs; then backward with a fixed
    upstream gradient. Returns the flat outputs."""
    args, _ = _prepare(case)
    outs = flatten(fn(**args))[:case.n_returned]
    if backward:
        torch.autograd.backward(outs, _upstream(outs, seed))
    return outs


def _variant_title(case: cards.Case, what: str) -> str:
    """A section title; forward sections also name the input shapes and dtype."""
    shapes = ", ".join(f"{k}{tuple(v)}" for k, v in case.shapes().items())
    return what + (f"  ({shapes}, {case.dtype})" if what.startswith("forward") else "")


# ---------------------------------------------------------------------------------------
# Level 1: the ATen ops, recorded at the dispatcher
# ---------------------------------------------------------------------------------------

class _OpRecorder(TorchDispatchMode):
    """Sees every ATen op after autograd and decompositions: what actually executes."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _op_table(ops: list) -> str:
    def key(op):
        return str(op.overloadpacket) if hasattr(op, "overloadpacket") else str(op)

    counts = Counter(key(op) for op in ops)
    is_view = {key(op): bool(getattr(op, "is_view", False)) for op in ops}
    kernels = sum(c for k, c in counts.items() if not is_view[k])
    lines = [f"{len(ops)} ATen ops, {kernels} of them compute (views only relabel memory):",
             "  count  op"]
    for key, count in counts.items():  # in order of first appearance
        lines.append(f"  {count:5d}  {key}" + ("   (view: no kernel)" if is_view[key] else ""))
    return "\n".join(lines)


def _explain_native(component: str, case: cards.Case, device) -> list[Section]:
    fn = getattr(levels.get("native"), component)
    args, _ = _prepare(case)
    with _OpRecorder() as fwd:
        outs = flatten(fn(**args))[:case.n_returned]
    upstream = _upstream(outs)
    with _OpRecorder() as bwd:
        torch.autograd.backward(outs, upstream)
    return [Section(_variant_title(case, "forward: ATen ops dispatched"), _op_table(fwd.ops)),
            Section(_variant_title(case, "backward: ATen ops dispatched by autograd"),
                    _op_table(bwd.ops))]


# ---------------------------------------------------------------------------------------
# Level 2: the optimized TorchScript graph and its fusion groups
# ---------------------------------------------------------------------------------------

FUSION_KINDS = ("prim::TensorExprGroup", "prim::TensorExprDynamicGroup", "prim::FusionGroup",
                "prim::CudaFusionGroup", "prim::oneDNNFusionGroup")
_BOOKKEEPING = ("prim::Constant", "prim::ListConstruct", "prim::TupleConstruct",
                "prim::TupleUnpack", "prim::ListUnpack", "prim::Return", "prim::Param")


def _nodes(graph_or_block):
    """Every node, recursing into blocks (if/loop bodies) and subgraphs (fusion groups),
    but not into the unfused fallback copies that guard fused groups on a GPU."""
    for node in graph_or_block.nodes():
        yield node
        if node.kind() == "prim::FallbackGraph":
            continue
        for block in node.blocks():
            yield from _nodes(block)
        if node.hasAttribute("Subgraph"):
            yield from _nodes(node.g("Subgraph"))


def _fusion_report(graph) -> str:
    kinds = Counter(n.kind() for n in _nodes(graph))
    groups = [n for n in _nodes(graph) if n.kind() in FUSION_KINDS]
    lines = ["differentiable graphs (autograd through the graph): "
             f"{kinds['prim::DifferentiableGraph']}",
             f"loops kept in the graph (prim::Loop): {kinds['prim::Loop']}",
             f"fusion groups: {len(groups)}"]
    for i, node in enumerate(groups):
        inner = [n.kind() for n in _nodes(node.g("Subgraph")) if n.kind() not in _BOOKKEEPING]
        lines.append(f"  group {i} ({node.kind()}): {len(inner)} ops in one kernel: "
                     + ", ".join(inner))
    # Shape bookkeeping (aten::size, aten::eq on ints...) runs in the interpreter, not as kernels.
    aten = Counter(n.kind() for n in _nodes(graph) if n.kind().startswith("aten::")
                   and any(isinstance(o.type(), torch._C.TensorType) for o in n.outputs()))
    lines.append("tensor ops in the graph (inside groups too): "
                 + ", ".join(f"{k} x{c}" if c > 1 else k for k, c in aten.items()))
    return "\n".join(lines)


def _why_no_fusion(device) -> str:
    if device.type == "cuda":
        return ("No fusion group here: the TensorExpr fuser found nothing it supports between the "
                "library calls, or it is switched off (torch._C._jit_texpr_fuser_enabled() = "
                f"{torch._C._jit_texpr_fuser_enabled()}).")
    llvm = torch._C._llvm_enabled() if hasattr(torch._C, "_llvm_enabled") else False
    return ("No fusion groups on the CPU, and that is the lesson: TorchScript's fuser (NNC) "
            "generates CPU code only through LLVM, and only when asked to "
            f"(torch._C._jit_can_fuse_on_cpu() = {torch._C._jit_can_fuse_on_cpu()}, this build "
            f"has LLVM: {llvm}). The standard PyTorch wheels do not, so on a CPU this level runs "
            "the same ATen kernels as Level 1 through the graph interpreter. On a CUDA device "
            "the same graph gets prim::TensorExprGroup nodes: one generated kernel per pointwise "
            "chain. torch.compile (Level 3) fuses on the CPU too.")


def _explain_torchscript(component: str, case: cards.Case, device) -> list[Section]:
    ts = levels.get("torchscript")
    fn = getattr(ts, component)
    # The profiling executor records shapes on the first calls and optimizes (fuses) once it
    # has seen them; a few forward+backward calls get us to the optimized graphs.
    for _ in range(3):
        _run(fn, case)
    outs = _run(fn, case, backward=False)
    forward = torch.jit.last_executed_optimized_graph()
    forward_text = str(forward)
    torch.autograd.backward(outs, _upstream(outs))
    backward = torch.jit.last_executed_optimized_graph()
    fused = [n for n in _nodes(forward) if n.kind() in FUSION_KINDS]
    fused += [n for n in _nodes(backward) if n.kind() in FUSION_KINDS]
    sections = [
        Section(_variant_title(case, "forward: optimized graph summary"),
                _fusion_report(forward) + ("" if fused else "\n\n" + _why_no_fusion(device))),
        Section(_variant_title(case, "forward: optimized graph "
                                     "(torch.jit.last_executed_optimized_graph)"), forward_text),
        Section(_variant_title(case, "backward: the last backward graph autograd ran"),
                "Each prim::DifferentiableGraph above carries its own backward graph (symbolic "
                "derivatives), which the executor profiles and fuses like the forward one; "
                "this is the last of them to run, optimized:\n" + _fusion_report(backward)),
    ]
    sections += [Section(title, body)
                 for title, body in cards.get(component).explain("torchscript", case, device)]
    return sections


# ---------------------------------------------------------------------------------------
# Level 3: the code Inductor generates
# ---------------------------------------------------------------------------------------

def inductor_code(component: str, case: cards.Case, device, backward: bool = True,
                  **settings) -> list[str]:
    """Compile the Level 3 math of `case` afresh and return Inductor's output code
    (one module per graph: forward, then backward).

    A fresh copy of the function's code object gets its own Dynamo cache, so this
    compiles (or loads from Inductor's on-disk cache) without disturbing the level's
    compiled functions. `settings` override compiled.settings(), e.g. sdpa_rewrite=False."""
    from torch._inductor.graph import GraphLowering

    compiled = levels.get("compile")
    math = compiled.MATH[component]
    fresh = types.FunctionType(math.__code__.replace(), math.__globals__, math.__name__,
                               math.__defaults__, math.__closure__)
    fn = torch.compile(fresh, **compiled.compile_kwargs(device, **settings))
    codes: list[str] = []
    # Inductor hands every module it writes (or loads from its cache) to this hook;
    # torch._inductor.utils.run_and_get_code uses the same one, but resets all of Dynamo.
    with mock.patch.object(GraphLowering, "save_output_code", codes.append, create=True):
        _run(lambda **kw: compiled.call(component, fn, compiled.prepare(component, **kw)), case,
             backward=backward)
    return codes


def _strip_header(code: str) -> str:
    """Drop the import boilerplate every output module starts with: keep the kernels
    and the `call` function that runs them."""
    start = re.search(r"^(\w+ = async_compile\.|class Runner|def call|def partition_0)", code, re.M)
    if start is None:
        return code
    return "# (imports and helpers omitted)\n\n" + code[start.start():].strip("\n")


def _code_summary(code: str) -> str:
    kernels = re.findall(r"^(\w+) = async_compile\.(\w+)\(", code, re.M)
    externs = re.findall(r"(extern_kernels\.\w+|torch\.ops\.aten\.\w+(?:\.\w+)?)\(", code)
    lines = [f"{len(kernels)} generated kernel(s):"]
    lines += [f"  {name}  ({kind.replace('cpp_pybinding', 'C++').replace('triton', 'Triton')})"
              for name, kind in kernels]
    calls = Counter(externs)
    lines.append(f"{sum(calls.values())} library call(s) kept: "
                 + (", ".join(f"{k} x{c}" if c > 1 else k for k, c in calls.items()) or "none"))
    return "\n".join(lines)


def _explain_compile(component: str, case: cards.Case, device) -> list[Section]:
    compiled = levels.get("compile")
    settings = compiled.settings(device)
    codes = inductor_code(component, case, device)
    names = ["forward", "backward"]
    setting_line = (f"torch.compile(fullgraph=True, mode={settings['mode']!r}, "
                    f"dynamic={settings['dynamic']}), Inductor pattern matcher "
                    f"{'on' if settings['sdpa_rewrite'] else 'off'}; "
                    f"{'Triton' if device.type == 'cuda' else 'C++/OpenMP'} code for {device.type}")
    sections = []
    for i, code in enumerate(codes):
        what = names[i] if i < len(names) else f"graph {i}"
        summary = _code_summary(code)
        if i == 0:
            summary = setting_line + "\n" + summary
        if "scaled_dot_product" in code:
            summary += ("\nThe pattern matcher replaced matmul -> scale -> softmax -> matmul "
                        "with a fused scaled_dot_product_attention call: the score matrix is never "
                        "written to memory, and Inductor generated no attention kernel of its own.")
        sections.append(Section(_variant_title(case, f"{what}: Inductor output code summary"),
                                summary))
        sections.append(Section(_variant_title(case, f"{what}: Inductor output code"),
                                _strip_header(code)))
    if any("scaled_dot_product" in c for c in codes):
        plain = inductor_code(component, case, device, sdpa_rewrite=False)
        for i, code in enumerate(plain):
            what = names[i] if i < len(names) else f"graph {i}"
            sections.append(Section(
                _variant_title(case, f"{what} with the SDPA rewrite off (pattern_matcher=False)"),
                "What Inductor writes itself when it may not call the fused attention op "
                "(levels.compiled.configure(sdpa_rewrite=False) makes the level use this):\n"
                + _code_summary(code) + "\n\n" + _strip_header(code)))
    return sections


# ---------------------------------------------------------------------------------------
# Level 4: where a small call's microseconds go (the host's, not the kernel's)
# ---------------------------------------------------------------------------------------

HOST_TITLE = "Where the microseconds go"
WIDTH = len(RULE)


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


def host_time_section(component: str, device) -> Section:
    """"Where the microseconds go": one small Level 4 call's host time, piece by piece: live on
    a CUDA GPU (host_probe.host_breakdown), else reports/h100-host-probe.json, so labelled."""
    from . import host_probe as hp

    device = torch.device(device)
    if component not in hp.PROBED:
        return Section(HOST_TITLE, _host_not_probed(component, hp))
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
            return Section(HOST_TITLE, _host_missing(component, hp, why_not_live))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a damaged file
            return Section(HOST_TITLE, f"{hp._shown(hp.RECORDED)} could not be read "
                                       f"({type(exc).__name__}: {exc}).\n\n"
                           + _host_missing(component, hp, why_not_live, missing=False))
    title = HOST_TITLE + ("  (measured here)" if data["status"] == "measured" else
                          "  (recorded elsewhere, not measured here)")
    return Section(title, _render_host(data, why_not_live, hp))


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


def add_parser(sub) -> None:
    p = sub.add_parser("explain", formatter_class=HELP_FORMAT, help="show what a level actually runs",
                       description="native: the ATen ops a call dispatches; torchscript: the optimized "
                                   "graph; compile: Inductor's generated code; triton: kernel source "
                                   "(and PTX/SASS summary on a GPU).")
    p.add_argument("--component", required=True, choices=COMPONENTS)
    p.add_argument("--level", required=True)
    p.add_argument("--device")
    p.set_defaults(run=run)


def run(args, console) -> int:
    text = explain(args.component, levels.resolve(args.level).name, resolve_device(args.device))
    console.print(text, markup=False, highlight=False)
    return EXIT_NOTHING_RAN if any(s.title == "unavailable" for s in text.sections) else EXIT_OK


__all__ = ["Explanation", "Section", "explain", "host_time_section", "inductor_code"]
