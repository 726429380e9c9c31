"""layer_norm across widths on the GPU: every Level 5 version and path the launcher can take,
Level 4 (Triton) and torch's own kernels, each as a fraction of a device copy's bandwidth
measured in the same run, forward, backward alone and forward + backward (issue #28: no
width may fall off a cliff).

    python scripts/sweep_layer_norm.py OUT.json [--dtypes bf16,fp32] [--widths 1023,4096]
                                                [--budget 140] [--reps 25] [--dry-run]
                                                [--only REGEX]

Cases: bf16 and fp32 x the widths below; rows M chosen so that the forward of one case moves
about 256 MB (x read + y written: far beyond the 50 MB L2, so every case streams from DRAM).
Bytes counted as the bench counts them: forward x + y, backward x + dy + dx (dweight/dbias
partials are the kernel's own overhead), forward + backward the sum of both. The reference is
a device copy of the forward's bytes (x's size, read once and written once) between two
16-byte aligned byte buffers: x.clone() itself is also recorded, but at an odd element count
torch's copy kernel is not the bandwidth bound (2047 x 16385 fp32: 0.73 TB/s against 2.85).

Timing: CUDA events around each call, the L2 flushed before each repetition by READING a
64 MB buffer (a zeroed one left 50 MB of dirty lines to be written back inside the next timed
call: copies of the same bytes measured 94 to 111 us), median with p20/p80 over `--reps`
repetitions (fewer where one call is slow, so a case never takes more than about 0.4 s). The backward alone is timed by calling each
implementation's backward directly (Level 5: the `layer_norm_bwd` op; torch:
aten.native_layer_norm_backward) or, for Level 4, autograd.grad on a retained graph. Every
variant's forward is checked against torch's first (its largest difference is recorded); a
variant that fails records its error and the sweep goes on. Past `--budget` seconds (the
build and Triton's compiles included) the remaining cases are recorded as skipped.

Variants (names in the JSON):
    copy                 x.clone()
    torch                aten.native_layer_norm / native_layer_norm_backward
    L4                   triton_kernels/layer_norm.py (Level 4), its default tiling
    L5 v<k>              Level 5 version k on a 16-byte aligned x, the path its launcher picks
    L5 v<k> unaligned    the same on an x whose first element is one element past a 16-byte
                         boundary (v3: its scalar block-per-row loop; backward: v2's kernels)
    L5 v<k> path=<p>     versions with forcible paths (cuda_kernels.layer_norm.PATHS), each
                         path forced, aligned (a path that cannot run the case records the
                         op's error, "does not support these sizes or layouts")
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import traceback

import torch

WIDTHS = [64, 127, 256, 512, 768, 1000, 1023, 1024, 1536, 2048, 3072, 4096, 4097, 5120, 8192,
          12288, 16384, 16385, 32768, 65536]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
CASE_BYTES = 256 * 2 ** 20  # moved by one forward (x + y)
FLUSH_BYTES = 64 * 2 ** 20  # > the H100's 50 MB L2
PER_TIMING_S = 0.4          # cap on one variant's repetitions
EPS = 1e-5


def rows_for(N: int, element_size: int) -> int:
    return max(1, CASE_BYTES // (2 * N * element_size))


def cases(dtype_names, widths):
    return [(name, N, rows_for(N, DTYPES[name].itemsize)) for name in dtype_names for N in widths]


def level5_variants():
    """(label, version, path, unaligned) for every Level 5 version and path to time."""
    from cuda_kernels import layer_norm as k5
    out = []
    for version in sorted(k5.VERSIONS):
        if version == 1:
            continue  # one thread per row: 10-40x below the rest, seconds at these sizes
        out.append((f"L5 v{version}", version, 0, False))
        if version >= 3:  # v2 loads one element at a time: alignment changes nothing
            out.append((f"L5 v{version} unaligned", version, 0, True))
        for path in getattr(k5, "PATHS", {}).get(version, {}):
            out.append((f"L5 v{version} path={path}", version, path, False))
    return out


# ------------------------------------------------------------------------------ timing --

class Timer:
    def __init__(self, reps: int):
        self.reps = reps
        self.flush = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")

    def __call__(self, fn) -> dict:
        fn()  # first call: compiles, allocates
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        one = time.perf_counter() - t0
        reps = max(5, min(self.reps, int(PER_TIMING_S / max(one, 1e-6))))
        start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            self.flush.amax()  # read, not written: no dirty lines left for the timed call
            start[i].record()
            fn()
            end[i].record()
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in zip(start, end))
        q = statistics.quantiles(ms, n=5, method="inclusive")  # p20, p40, p60, p80
        return dict(ms=statistics.median(ms), p20_ms=q[0], p80_ms=q[3], reps=reps)


def _rel_diff(y, ref) -> float:
    d = (y.float() - ref.float()).abs().max().item()
    return d / max(ref.float().abs().max().item(), 1e-30)


# ---------------------------------------------------------------------------- variants --

def _torch_fns(x, w, b, dy, N):
    state = {}

    def fwd():
        state["out"] = torch.native_layer_norm(x, [N], w, b, EPS)
        return state["out"][0]

    fwd()

    def bwd():
        _, mean, rstd = state["out"]
        return torch.ops.aten.native_layer_norm_backward(dy, x, [N], mean, rstd, w, b,
                                                         [True, True, True])

    return fwd, bwd, lambda: (fwd(), bwd())


def _level4_fns(x, w, b, dy, N):
    from triton_kernels import layer_norm as k4
    k4.check(x)

    def fwd():
        return k4._forward(x, w, b, EPS, save=True)[0]

    xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
    y = k4.layer_norm(xg, wg, bg, EPS)

    def bwd():
        return torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True)

    def both():
        yy = k4.layer_norm(xg, wg, bg, EPS)
        return torch.autograd.grad(yy, (xg, wg, bg), dy)

    return fwd, bwd, both


def _level5_fns(x, w, b, dy, N, version, path):
    ops = torch.ops.levels_cuda
    # a path is forced through the ops' optional last argument (versions with PATHS only)
    extra = (path,) if path else ()
    state = {}

    def fwd():
        state["out"] = ops.layer_norm_fwd(x, w, b, EPS, version, *extra)
        return state["out"][0]

    fwd()

    def bwd():
        _, mean, rstd = state["out"]
        return ops.layer_norm_bwd(dy, x, w, mean, rstd, version, *extra)

    return fwd, bwd, lambda: (fwd(), bwd())


def _context_lost() -> bool:
    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1).item()
        return False
    except Exception:  # a sticky error (illegal address, launch failure): nothing runs now
        return True


def unaligned_copy(x):
    """x's values in a tensor whose first element sits one element past a 16-byte boundary
    (rows N apart, so every row is as misaligned as the width makes it)."""
    M, N = x.shape
    buf = torch.empty(M * N + 1, dtype=x.dtype, device=x.device)
    xu = buf[1:].view(M, N)
    xu.copy_(x)
    return xu


def run_case(timer, dtype_name, N, M, deadline, wanted, row=None):
    """Times the `wanted` variants of one case into `row` (a new one with its own copy
    reference, or the row of an earlier pass: its copy is the reference again)."""
    dtype = DTYPES[dtype_name]
    g = torch.Generator(device="cuda").manual_seed(N)
    x = torch.randn((M, N), device="cuda", dtype=dtype, generator=g) * 2 + 0.5
    w = torch.randn((N,), device="cuda", dtype=dtype, generator=g) * 0.5 + 1
    b = torch.randn((N,), device="cuda", dtype=dtype, generator=g) * 0.5
    dy = torch.randn((M, N), device="cuda", dtype=dtype, generator=g)
    es = x.element_size()
    nbytes = dict(fwd=2 * M * N * es, bwd=3 * M * N * es, fwdbwd=5 * M * N * es)
    if row is None:
        row = dict(dtype=dtype_name, N=N, M=M, bytes=nbytes, variants={})
        half = -(-nbytes["fwd"] // 32) * 16  # x's bytes, rounded up to whole 16-byte vectors
        src = torch.empty(half, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy = timer(lambda: dst.copy_(src))
        row["copy"] = dict(copy, tb_per_s=2 * half / copy["ms"] / 1e9)
    copy_tbps = row["copy"]["tb_per_s"]
    if "clone" in wanted and "clone" not in row:
        clone = timer(lambda: x.clone())
        row["clone"] = dict(clone, tb_per_s=nbytes["fwd"] / clone["ms"] / 1e9)
    ref, mean, rstd = torch.native_layer_norm(x, [N], w, b, EPS)
    ref_grads = torch.ops.aten.native_layer_norm_backward(dy, x, [N], mean, rstd, w, b,
                                                          [True, True, True])

    builders = [("torch", lambda: _torch_fns(x, w, b, dy, N)),
                ("L4", lambda: _level4_fns(x, w, b, dy, N))]
    xu = None
    for label, version, path, unaligned in level5_variants():
        def make(version=version, path=path, unaligned=unaligned):
            nonlocal xu
            if unaligned and xu is None:
                xu = unaligned_copy(x)
            return _level5_fns(xu if unaligned else x, w, b, dy, N, version, path)
        builders.append((label, make))

    for label, make in builders:
        if label not in wanted:
            continue
        if time.perf_counter() > deadline:
            row["variants"][label] = dict(skipped="time budget spent")
            continue
        entry = {}
        try:
            fwd, bwd, both = make()
            entry["max_rel_diff_vs_torch"] = _rel_diff(fwd(), ref)
            grads = bwd()  # (dx, dweight, dbias) from every implementation
            for name_, got, want in zip(("dx", "dweight", "dbias"), grads, ref_grads):
                entry[f"max_rel_diff_{name_}_vs_torch"] = _rel_diff(got, want)
            for what, fn in (("fwd", fwd), ("bwd", bwd), ("fwdbwd", both)):
                t = timer(fn)
                tbps = nbytes[what] / t["ms"] / 1e9
                entry[what] = dict(t, tb_per_s=tbps, fraction_of_copy=tbps / copy_tbps)
        except Exception as e:  # a variant that refuses or breaks: say so, go on
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            if not isinstance(e, (ValueError, TypeError, RuntimeError)):
                entry["traceback"] = traceback.format_exc()[-800:]
        row["variants"][label] = entry
        parts = [f"{w_}={entry[w_]['fraction_of_copy']:.2f}" for w_ in ("fwd", "bwd", "fwdbwd")
                 if w_ in entry]
        print(f"{dtype_name} {M}x{N} {label:24s} "
              f"{' '.join(parts) if parts else entry.get('error', entry.get('skipped'))}",
              flush=True)
    return row


SUMMARY = ("torch", "L4", "L5 v3", "L5 v4", "L5 v4 unaligned")


def summary(rows) -> str:
    """One line a case: fraction of copy bandwidth, forward / backward, of the variants the
    goal compares (issue #28: Level 5 >= 0.85x at every width, and >= Level 4)."""
    lines = [f"{'case':>18s} " + " ".join(f"{v:>15s}" for v in SUMMARY) + "   (fwd/bwd)"]
    for row in rows:
        cells = []
        for v in SUMMARY:
            e = row.get("variants", {}).get(v, {})
            f = [e[w]["fraction_of_copy"] for w in ("fwd", "bwd") if w in e]
            cells.append("/".join(f"{x:.2f}" for x in f) if len(f) == 2 else "-")
        lines.append(f"{row['dtype']:>4s} {row['M']:>7d}x{row['N']:<6d} "
                     + " ".join(f"{c:>15s}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the JSON file to write")
    p.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32, fp16")
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="comma-separated N")
    p.add_argument("--budget", type=float, default=140.0,
                   help="seconds; the cases after it are recorded as skipped (default 140)")
    p.add_argument("--reps", type=int, default=25, help="repetitions per timing (default 25)")
    p.add_argument("--dry-run", action="store_true", help="list the cases and variants; no GPU")
    p.add_argument("--only", default=None,
                   help="time only the variants whose name matches this regular expression "
                        "(the copy is always timed), e.g. 'L4|L5 v4$'")
    a = p.parse_args(argv)
    dtype_names = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    for d in dtype_names:
        if d not in DTYPES:
            p.error(f"--dtypes: unknown dtype {d!r}; expected some of {sorted(DTYPES)}")
    try:
        widths = [int(n) for n in a.widths.split(",") if n.strip()]
    except ValueError:
        p.error(f"--widths: expected comma-separated integers; got {a.widths!r}")
    if any(n < 1 for n in widths):
        p.error("--widths: every width must be >= 1")
    if a.reps < 5:
        p.error("--reps: at least 5 (p20/p80 need them)")
    todo = cases(dtype_names, widths)
    try:
        only = re.compile(a.only) if a.only else None
    except re.error as e:
        p.error(f"--only: not a regular expression ({e}): {a.only!r}")
    labels = ["copy", "clone", "torch", "L4"] + [v[0] for v in level5_variants()]
    if only is not None:
        labels = [v for v in labels if v == "copy" or only.search(v)]
    if a.dry_run:
        for name, N, M in todo:
            print(f"{name} M={M} N={N} forward moves {2 * M * N * DTYPES[name].itemsize / 2**20:.0f} MB")
        print("variants:", ", ".join(labels))
        return 0
    if not torch.cuda.is_available():
        print("sweep_layer_norm: needs a CUDA GPU (use --dry-run to list the cases)",
              file=sys.stderr)
        return 2

    from equivalence.environment import describe
    t_start = time.perf_counter()
    deadline = t_start + a.budget
    result = dict(what="layer_norm across widths: fraction of a device copy's bandwidth",
                  environment=describe("cuda"), budget_s=a.budget, reps=a.reps, variants=labels,
                  rows=[])
    try:
        from cuda_kernels import build
        t0 = time.perf_counter()
        build.load()
        result["level5_build_s"] = time.perf_counter() - t0
    except Exception as e:  # Level 5 variants will each record the failure
        result["level5_build_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    timer = Timer(a.reps)
    # Two passes: the versions with forcible paths (the newest kernels) after everything
    # else, so that a kernel that faults (a CUDA error poisons the process) costs only its own
    # figures and the ones after it, never the references.
    newest = {v[0] for v in level5_variants() if v[2]} | {
        f"L5 v{v[1]}" for v in level5_variants() if v[2]} | {
        f"L5 v{v[1]} unaligned" for v in level5_variants() if v[2]}
    passes = [set(labels) - newest, set(labels) & newest]
    rows = {}
    for wanted in passes:
        if not wanted or result.get("context_lost"):
            continue
        for name, N, M in todo:
            key = (name, N)
            if time.perf_counter() > deadline:
                rows.setdefault(key, dict(dtype=name, N=N, M=M, skipped="time budget spent"))
                continue
            if "error" in rows.get(key, {}) or "skipped" in rows.get(key, {}):
                continue
            try:
                rows[key] = run_case(timer, name, N, M, deadline, wanted, rows.get(key))
                torch.cuda.synchronize()
            except Exception as e:  # e.g. out of memory allocating the case: record, go on
                rows.setdefault(key, dict(dtype=name, N=N, M=M))["error"] = \
                    f"{type(e).__name__}: {str(e)[:300]}"
            if _context_lost():
                result["context_lost"] = f"after {name} N={N}: later figures are missing"
                print("sweep_layer_norm: the CUDA context is lost (a kernel faulted); writing "
                      "what was measured", file=sys.stderr)
                break
            torch.cuda.empty_cache()
    result["rows"] = list(rows.values())
    result["seconds"] = time.perf_counter() - t_start
    print(summary(result["rows"]))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {a.out} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
