"""Level 5 (CUDA C++) layer_norm: every version of cuda_kernels/layer_norm.cu, forward and
backward, through the harness (float64 reference, NaN-poisoned allocations, both layouts).

Each version has paths chosen by size and alignment (v3: a warp per row, a block per row
with 8 or 32 elements a thread, a looped fallback by vectors or by elements; its backward:
fused with 8 or 16 elements a thread, or v2's kernels; v4: lane groups, a block, or a
cluster per row, by 16-byte or element loads, each forcible), so the GPU tests pick widths
that land on every path, widths that are no multiple of anything (1, 7, 1023, 4097), rows
the persistent backward splits raggedly, and views that defeat 16-byte loads.

On a CPU: the version plumbing, version 4's rule (cuda_kernels/layer_norm_plan.h compiled
by g++: its choices, the guarantees its kernels rely on, and a Python mirror of the
kernels' thread-to-column maps), and (with nvcc) that the kernels that hold a row in
registers do not spill on sm_90a."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import levels
from cuda_kernels import build
from cuda_kernels import layer_norm as ln
from equivalence import cards
from equivalence.check import check, check_args
from equivalence.tolerances import tolerance

ENV = ln.ENV_VERSION
CU = Path(ln.__file__).with_suffix(".cu")
VERSIONS = sorted(ln.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------ CPU --

def _ptxas(path: Path) -> dict[str, tuple[int, int, int]]:
    """{kernel (demangled): (registers, spill stores, spill loads)} for sm_90a."""
    out = subprocess.run(
        ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--cubin",
         "-Xptxas", "-v", "-I", str(path.parent), "-o", "/dev/null", str(path)],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = {}
    pattern = (r"Compiling entry function '(\S+)'.*?\n.*?\n\s+\d+ bytes stack frame, (\d+) bytes "
               r"spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers")
    for name, stores, loads, regs in re.findall(pattern, out.stderr):
        if shutil.which("cu++filt") or shutil.which("c++filt"):
            tool = shutil.which("cu++filt") or shutil.which("c++filt")
            name = subprocess.run([tool, name], capture_output=True, text=True).stdout.strip()
        found[name] = (int(regs), int(stores), int(loads))
    return found


@pytest.mark.skipif(shutil.which("nvcc") is None,
                    reason="nvcc not found: install the CUDA toolkit (or put it on PATH) to "
                           "compile the Level 5 kernels")
def test_register_resident_kernels_do_not_spill_on_sm90a():
    # v3 holds a row (and, backward, weight and dw/db partials) in registers; a spill would
    # turn those registers into local-memory traffic and the bandwidth goals with them.
    report = _ptxas(CU)
    held = {k: v for k, v in report.items()
            if "fwd_v3_registers" in k or "bwd_v3_fused" in k or "bwd_v5_fused" in k}
    # 3 dtypes x v3's 3 forward + 2 backward variants; v5's backward, R = 4 in every dtype
    # and R = 1 (16 elements a thread) in fp32 only
    assert len(held) == 3 * 5 + 3 + 1, sorted(report)
    spilled = {k: v for k, v in held.items() if v[1] or v[2]}
    assert not spilled, f"(registers, spill stores, spill loads): {spilled}"
    # version 4: every instantiation its launchers can pick, none spilling: forward rows 11
    # (fp32) + 9 + 9 (16-bit: no 32 element loads), backward rows 10 a dtype, and the two
    # split kernels x 2 load widths x 3 dtypes
    v4 = {k: v for k, v in report.items() if "_v4_" in k and "_ph<" not in k}
    assert len(v4) == 29 + 30 + 12, sorted(v4)
    # its phased forward (misaligned rows by 16-byte vectors): rows 5 a dtype (a 32-lane group
    # is also the block kernel's first width) and the split kernel, x 3 dtypes
    v4_ph = {k: v for k, v in report.items() if "_v4_" in k and "_ph<" in k}
    assert len(v4_ph) == 15 + 3, sorted(v4_ph)
    spilled = {k: v for k, v in {**v4, **v4_ph}.items() if v[1] or v[2]}
    assert not spilled, f"(registers, spill stores, spill loads): {spilled}"
    # version 6: its forward and backward, 3 dtypes x 2 load widths each (the backward's dw/db
    # partials are registers: a spill would put them in local memory once per row)
    v6 = {k: v for k, v in report.items() if "_v6_" in k}
    assert len(v6) == 12, sorted(v6)
    spilled = {k: v for k, v in v6.items() if v[1] or v[2]}
    assert not spilled, f"(registers, spill stores, spill loads): {spilled}"


# ------------------------------------------------------------------ version 4's rule --

_PLAN_SHIM = r"""
#include "layer_norm_plan.h"
extern "C" void plan(int backward, long long M, long long N, int elem, int aligned, int clusters,
                     int sms, int force, long long* out) {
  const levels_layer_norm::LnPlan p = levels_layer_norm::ln_plan(
      backward != 0, M, N, elem, aligned != 0, clusters != 0, sms, force);
  const long long v[7] = {p.path, p.vec, p.E, p.G, p.R, p.C, p.seg};
  for (int i = 0; i < 7; ++i) out[i] = v[i];
}
"""
PLAN_FIELDS = ("path", "vec", "E", "G", "R", "C", "seg")
ROWS, SPLIT, LOOP, NONE = 1, 2, 3, 0


@pytest.fixture(scope="module")
def plan(host_library):
    """layer_norm_plan.h's ln_plan (version 4's rule)."""
    lib = host_library(_PLAN_SHIM, "ln-plan")
    out = (ctypes.c_longlong * 7)()

    def call(M, N, dtype, aligned=True, backward=False, clusters=True, sms=132, force=0):
        lib.plan(int(backward), M, N, torch.empty((), dtype=dtype).element_size(), int(aligned),
                 int(clusters), sms, force, out)
        return dict(zip(PLAN_FIELDS, list(out)))
    return call


BF16, F32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize("case,want", [
    # narrow rows: a group of lanes per row, 256 / G rows a block, 32 bytes a thread
    (dict(M=1 << 20, N=64, dtype=BF16), dict(path=ROWS, vec=1, E=16, G=4, R=64)),
    (dict(M=1 << 19, N=64, dtype=F32), dict(path=ROWS, vec=1, E=8, G=8, R=32)),
    (dict(M=9, N=1, dtype=F32, aligned=False), dict(path=ROWS, vec=0, E=8, G=4, R=64)),
    (dict(M=9, N=7, dtype=BF16, aligned=False), dict(path=ROWS, vec=0, E=16, G=4, R=64)),
    # 4096 x 1023, version 3's cliff: element loads, the row still in registers, a block each
    (dict(M=4096, N=1023, dtype=BF16, aligned=False), dict(path=ROWS, vec=0, E=16, G=64, R=1)),
    (dict(M=4096, N=1023, dtype=F32, aligned=False), dict(path=ROWS, vec=0, E=8, G=128, R=1)),
    # medium rows, aligned: a block of N / E threads, E the smallest that fits 512 threads
    (dict(M=16384, N=4096, dtype=BF16), dict(path=ROWS, vec=1, E=16, G=256, R=1)),
    (dict(M=16384, N=4096, dtype=F32), dict(path=ROWS, vec=1, E=8, G=512, R=1)),
    (dict(M=2048, N=16384, dtype=F32), dict(path=ROWS, vec=1, E=32, G=512, R=1)),
    (dict(M=2048, N=4097, dtype=BF16, aligned=False), dict(path=ROWS, vec=0, E=16, G=288, R=1)),
    # wider than a block holds: a cluster of blocks per row (sm_90), else v3's loop
    (dict(M=2047, N=16385, dtype=F32, aligned=False), dict(path=SPLIT, vec=0, C=3, seg=5462, G=352)),
    (dict(M=1024, N=65536, dtype=BF16), dict(path=SPLIT, vec=1, C=8, seg=8192, G=512)),
    (dict(M=512, N=65536, dtype=F32), dict(path=SPLIT, vec=1, C=8, seg=8192, G=512)),
    (dict(M=512, N=65537, dtype=F32, aligned=False), dict(path=LOOP, vec=0)),
    (dict(M=2047, N=16385, dtype=F32, aligned=False, clusters=False), dict(path=LOOP, vec=0)),
    # few rows: a split even where a block would hold the row, so that more SMs stream
    (dict(M=8, N=4096, dtype=BF16), dict(path=SPLIT, vec=1, C=2, seg=2048, G=128)),
    (dict(M=8, N=4096, dtype=BF16, clusters=False), dict(path=ROWS, vec=1, E=16, G=256)),
    (dict(M=8, N=1024, dtype=BF16), dict(path=ROWS, vec=1, E=16, G=64)),
    # backward: x, dy, w and two partial sums a column: 8 or 16 elements a thread
    (dict(M=16384, N=4096, dtype=BF16, backward=True), dict(path=ROWS, vec=1, E=8, G=512, R=1)),
    (dict(M=16384, N=768, dtype=F32, backward=True), dict(path=ROWS, vec=1, E=8, G=96, R=1)),
    (dict(M=1 << 20, N=64, dtype=BF16, backward=True), dict(path=ROWS, vec=1, E=8, G=8, R=32)),
    (dict(M=4096, N=8192, dtype=BF16, backward=True), dict(path=ROWS, vec=1, E=16, G=512)),
    (dict(M=4096, N=8193, dtype=F32, backward=True, aligned=False),
     dict(path=SPLIT, vec=0, C=2, seg=4097, G=288)),
    (dict(M=512, N=65536, dtype=F32, backward=True), dict(path=SPLIT, vec=1, C=8, seg=8192)),
    # forced paths: what can run, or NONE (an error at the op, never another path)
    (dict(M=64, N=1024, dtype=F32, force=2), dict(path=SPLIT, vec=1, C=2, seg=512, G=32)),
    (dict(M=64, N=1024, dtype=F32, force=3), dict(path=LOOP, vec=1)),
    (dict(M=64, N=1024, dtype=F32, force=5), dict(path=ROWS, vec=0, E=8, G=128)),
    (dict(M=64, N=1, dtype=F32, force=2), dict(path=NONE)),
    (dict(M=64, N=65536, dtype=F32, force=1), dict(path=NONE)),
    (dict(M=64, N=4096, dtype=F32, force=2, clusters=False), dict(path=NONE)),
])
def test_version4_rule_picks(plan, case, want):
    got = plan(**case)
    assert {k: got[k] for k in want} == want, f"{case}: {got}"


# ------------------------------------------------------------------ version 6's plan --

_V6_SHIM = r"""
#include "layer_norm_plan.h"
extern "C" void plan6(int backward, long long N, int elem, int aligned, long long* out) {
  const levels_layer_norm::Ln6Plan p =
      levels_layer_norm::ln_v6_plan(backward != 0, N, elem, aligned != 0);
  const long long v[5] = {p.ok, p.C, p.seg, p.stages, p.smem};
  for (int i = 0; i < 5; ++i) out[i] = v[i];
}
extern "C" int bulk6(int backward, long long N, int elem, int aligned) {
  return levels_layer_norm::ln_v6_bulk(backward != 0, N, elem, aligned != 0);
}
extern "C" long long limits6(int i) {
  using namespace levels_layer_norm;
  const long long v[5] = {LN6_THREADS, LN6_SMEM_BYTES[2], LN6_MAX_STAGES, LN6_VPT, LN_MAX_CLUSTER};
  return v[i];
}
"""


@pytest.fixture(scope="module")
def plan6(host_library):
    """layer_norm_plan.h's ln_v6_plan and ln_v6_bulk (version 6's plan and rule)."""
    lib = host_library(_V6_SHIM, "ln-plan6")
    lib.limits6.restype = ctypes.c_longlong
    out = (ctypes.c_longlong * 5)()

    def call(N, elem, backward=False, aligned=True):
        lib.plan6(int(backward), N, elem, int(aligned), out)
        return dict(zip(("ok", "C", "seg", "stages", "smem"), list(out)))
    call.bulk = lambda N, elem, backward, aligned: bool(lib.bulk6(int(backward), N, elem, int(aligned)))
    call.limits = dict(zip(("threads", "smem", "stages", "vpt", "cluster"),
                           (lib.limits6(i) for i in range(5))))
    return call


@pytest.mark.parametrize("N,elem,backward,want", [
    # buffers of about 16 KB, the fewest blocks a row that keep them there, and as many
    # buffers (2-8) as fit in 72 KB a block (3 blocks an SM), else 110 KB (2), else 200 (1)
    (4096, 2, False, dict(ok=1, C=1, seg=4096, stages=7, smem=73728)),
    (12288, 2, False, dict(ok=1, C=2, seg=6144, stages=4)),
    (16384, 2, False, dict(ok=1, C=2, seg=8192, stages=2, smem=65536)),
    (65536, 2, False, dict(ok=1, C=8, seg=8192, stages=2)),
    (65536, 4, False, dict(ok=1, C=8, seg=8192, stages=4, smem=196608)),  # one block an SM
    # the backward holds x and dy: half the columns a buffer
    (4096, 2, True, dict(ok=1, C=1, seg=4096, stages=4)),
    (8192, 2, True, dict(ok=1, C=2, seg=4096, stages=4)),
    (65536, 2, True, dict(ok=1, C=8, seg=8192, stages=2, smem=81920)),
    (32768, 4, True, dict(ok=1, C=8, seg=4096, stages=2)),
    # rounding seg up to whole vectors must not leave the last block with no columns
    (24584, 2, False, dict(ok=1, C=4, seg=6152)),
    (8, 2, True, dict(ok=1, C=1, seg=8, stages=8)),
    # no plan: backward rows whose dw/db partials would need more registers than a thread
    # keeps (fp32 past 8 x 4096)
    (65536, 4, True, dict(ok=0)),
])
def test_version6_plan_picks(plan6, N, elem, backward, want):
    got = plan6(N, elem, backward)
    assert {k: got[k] for k in want} == want, f"{N} x {elem} B, backward={backward}: {got}"


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("elem", [2, 4])
@pytest.mark.parametrize("backward", [False, True])
def test_version6_plans_are_ones_the_kernels_can_run(plan6, elem, backward, aligned):
    # Every plan: each block has columns ((C - 1) seg < N <= C seg), seg whole vectors, a
    # cluster of at most 8, 2-8 buffers of one piece (and, misaligned, one vector more for
    # the granules around it), shared memory within the budget (the kernels' guarantees).
    lim = plan6.limits
    vec = 16 // elem
    step = vec if aligned else 1
    for N in list(range(step, 4096, step * 7)) + list(range(4096, 70000, step * 331)) + [65536]:
        p = plan6(N, elem, backward, aligned)
        fits = not backward or N <= lim["cluster"] * lim["vpt"] * vec * lim["threads"]
        assert bool(p["ok"]) == fits, (N, p)
        if not p["ok"]:
            continue
        assert p["seg"] % vec == 0 and (p["C"] - 1) * p["seg"] < N <= p["C"] * p["seg"], (N, p)
        assert 1 <= p["C"] <= lim["cluster"] and 2 <= p["stages"] <= lim["stages"], (N, p)
        assert p["smem"] <= lim["smem"], (N, p)
        arrays, kept = (2, 1) if backward else (1, 2)
        slot = p["seg"] + (0 if aligned else vec)
        assert p["smem"] == (kept + arrays * p["stages"]) * slot * elem, (N, p)
        if backward:
            assert p["seg"] <= lim["vpt"] * vec * lim["threads"], (N, p)
    assert plan6(4097 * vec, elem, backward, aligned)["ok"] == 1
    assert plan6(4097 * vec + 1, elem, backward, aligned)["ok"] == (0 if aligned else 1)


@pytest.mark.parametrize("N,elem,backward,want", [
    # misaligned rows: each buffer one vector longer (the 16-byte granules around a piece)
    (4097, 2, False, dict(ok=1, C=1, seg=4104, stages=6, smem=(2 + 6) * (4104 + 8) * 2)),
    (16385, 2, True, dict(ok=1, C=5, seg=3280, stages=5)),
    (1023, 4, False, dict(ok=1, C=1, seg=1024, stages=8)),
    (32769, 4, True, dict(ok=0)),  # seg 4104 fp32: more partials than a thread keeps
])
def test_version6_plan_picks_misaligned(plan6, N, elem, backward, want):
    got = plan6(N, elem, backward, aligned=False)
    assert {k: got[k] for k in want} == want, f"{N} x {elem} B, backward={backward}: {got}"


def test_version6_takes_its_kernel_for_wide_rows_only(plan6):
    # the widths the H100 sweep measured it faster (layer_norm_plan.h ln_v6_bulk)
    assert plan6.bulk(16384, 2, False, True) and plan6.bulk(32768, 4, False, True)
    assert not plan6.bulk(12288, 2, False, True) and not plan6.bulk(16384, 4, False, True)
    assert plan6.bulk(6144, 2, True, True) and plan6.bulk(4104, 4, True, True)
    assert not plan6.bulk(4096, 2, True, True) and not plan6.bulk(1024, 4, True, True)
    # misaligned rows past 8192 columns, but fp32 backwards (version 4's element loads)
    assert plan6.bulk(8193, 2, False, False) and plan6.bulk(16385, 2, True, False)
    assert plan6.bulk(16385, 4, False, False) and not plan6.bulk(16385, 4, True, False)
    assert not plan6.bulk(4097, 2, False, False) and not plan6.bulk(1023, 4, True, False)


# What each kernel of layer_norm.cu is instantiated for (its launcher's switches): a plan
# outside these would be refused at the launch (LEVELS_UNSUPPORTED).
def _row_widths(backward, elem, vec):
    if backward:
        return [8, 16]
    return {(4, True): [8, 16, 32], (2, True): [16, 32], (4, False): [8, 16],
            (2, False): [16]}[(elem, vec)]


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("aligned", [True, False])
def test_version4_plans_are_ones_the_kernels_can_run(plan, backward, dtype, aligned):
    # every width 1..70000 (a stride through it) and row counts few and many: the
    # guarantees the kernels' comments list, for whatever the rule picks
    elem = torch.empty((), dtype=dtype).element_size()
    vec_width = 16 // elem
    widths = sorted(set(range(1, 600)) | set(range(600, 70000, 97)) | {16384, 16385, 32768, 65536})
    for N in widths:
        if aligned and N % vec_width:
            continue  # 16-byte loads need whole vectors: the launcher never says aligned here
        for M in (1, 7, 4096):
            p = plan(M, N, dtype, aligned=aligned, backward=backward)
            where = f"M={M} N={N} {dtype} aligned={aligned} backward={backward}: {p}"
            assert p["vec"] == int(aligned), where
            if p["path"] == ROWS:
                widths_ = _row_widths(backward, elem, aligned)
                assert p["E"] in widths_, where
                assert p["G"] * p["E"] >= N and p["G"] <= 512, where
                if p["G"] <= 32 and p["R"] > 1:  # lane groups: the first width, 256 threads
                    assert p["E"] == widths_[0] and p["G"] in (4, 8, 16, 32), where
                    assert p["G"] * p["R"] == 256 and p["G"] * p["E"] <= 512, where
                else:
                    assert p["R"] == 1 and p["G"] % 32 == 0 and p["G"] > 32, where
            elif p["path"] == SPLIT:
                C, seg, G = p["C"], p["seg"], p["G"]
                assert 2 <= C <= 8 and (C - 1) * seg < N <= C * seg, where
                assert G % 32 == 0 and G <= 512 and seg <= 16 * G, where
                assert not aligned or seg % vec_width == 0, where
            else:
                assert p["path"] == LOOP and N > 8 * 8192, where  # wider than 8 blocks of 8192


def _columns_of_row(p, N, elem):
    """Every column the threads of one row (or, SPLIT, one block of the row per rank) load
    and store, as layer_norm.cu's RowLanes / RowPart compute them: a Python mirror of the
    kernels' index arithmetic (the part a GPU run would catch only as a wrong element)."""
    VEC = 16 // elem if p["vec"] else 1
    CH = p["E"] // VEC
    group = p["path"] == ROWS and p["R"] > 1
    S = p["G"] if group else 32
    pieces = ([(r * p["seg"], min(p["seg"], N - r * p["seg"])) for r in range(p["C"])]
              if p["path"] == SPLIT else [(0, N)])
    cols = []
    for col0, n in pieces:
        for thread in range(p["G"]):  # the threads of one row (group g = 0 of the block)
            first = thread % S if group else (thread >> 5) * 32 * CH + (thread & 31)
            for c in range(CH):
                start = (first + c * S) * VEC
                if start < n:  # RowPart::in: a whole vector in or out
                    assert start + VEC <= n, (p, N, thread, c)
                    cols += [col0 + start + j for j in range(VEC)]
    return cols


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("aligned", [True, False])
def test_version4_threads_cover_each_column_once(plan, backward, dtype, aligned):
    elem = torch.empty((), dtype=dtype).element_size()
    for N in [1, 2, 3, 7, 8, 33, 64, 127, 255, 256, 257, 511, 513, 768, 1000, 1023, 1024, 4096,
              4097, 8191, 8192, 8193, 12288, 16384, 16385, 32768, 65535, 65536]:
        if aligned and N % (16 // elem):
            continue
        for M in (3, 4096):
            p = plan(M, N, dtype, aligned=aligned, backward=backward)
            if p["path"] == LOOP:
                continue  # version 3's loop and version 2's kernels: their own tests
            cols = _columns_of_row(p, N, elem)
            assert sorted(cols) == list(range(N)), (M, N, dtype, aligned, backward, p)


# ------------------------------------------------------------------------------ GPU --

def _args(rows, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get("layer_norm").module.make_args(dict(rows=rows, N=N), dtype,
                                                    torch.device("cuda"), g)


def _passes(args, version, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    r = check_args("layer_norm", "cuda", args)
    assert r.passed, f"v{version}: {r.summary()}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny_both_layouts(version, dtype, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    results = check("layer_norm", "cuda", dtype=dtype, device="cuda", size="tiny")
    assert {r.layout for r in results} == set(cards.LAYOUTS)
    for r in results:
        assert r.passed, f"v{version}: {r.summary()}"


# Widths that land on every path (see the module doc), and rows that split raggedly.
SHAPES = [((513,), 1), ((3, 7), 7), ((37,), 256), ((1000,), 1023), ((129,), 4096),
          ((3, 77), 4097), ((17,), 8192), ((9,), 12288), ((5,), 20000), ((3,), 65536)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,N", SHAPES)
def test_odd_and_wide_rows(version, dtype, rows, N, monkeypatch):
    _passes(_args(rows, N, dtype, seed=N), version, monkeypatch)


# Version 5's backward (R = 4 rows an iteration up to 4096 columns, 1 at 16 elements a
# thread): row counts that leave the last block a ragged iteration (fewer rows than R, than
# blocks, M not a multiple of R) at the widths where it is the default, in every dtype.
V5_SHAPES = [((1,), 768), ((3,), 1024), ((1001,), 768), ((2, 45), 2048), ((7,), 4096),
             ((513,), 256), ((37,), 6144)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,N", V5_SHAPES)
def test_version5_ragged_row_groups(rows, N, dtype, monkeypatch):
    _passes(_args(rows, N, dtype, seed=N + 5), 5, monkeypatch)


VIEWS = ["offset_by_one", "transposed", "sliced_3d", "one_row", "strided_params"]


def viewed(args: dict, layout: str, params: tuple) -> dict:
    """args with x (96, N) (or, for "strided_params", the 1-D `params`) laid out as `layout`,
    NaN around the views (rms_norm's tests use it too)."""
    x = args["x"]
    M, N = x.shape

    def gapped(*shape):
        return torch.full(shape, float("nan"), dtype=x.dtype, device=x.device)
    if layout == "offset_by_one":  # rows 2 bytes/4 bytes off 16: no vector loads
        buf = gapped(M, N + 8)
        buf[:, 1:N + 1] = x
        args["x"] = buf[:, 1:N + 1]
    elif layout == "transposed":  # the last dimension strided: copied by the Python side
        args["x"] = x.t().contiguous().t()
    elif layout == "sliced_3d":  # (4, M/4, N) out of a (4, M/4 + 6, N + 16) buffer: aligned rows
        buf = gapped(4, M // 4 + 6, N + 16)
        buf[:, 2:M // 4 + 2, 8:N + 8] = x.view(4, M // 4, N)
        args["x"] = buf[:, 2:M // 4 + 2, 8:N + 8]
    elif layout == "one_row":  # M == 1: its row stride means nothing
        args["x"] = x[:1]
    elif layout == "strided_params":
        for name in params:
            buf = gapped(2 * N)
            buf[::2] = args[name]
            args[name] = buf[::2]
    return args


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", VIEWS)
def test_views(version, dtype, layout, monkeypatch):
    args = _args((96,), 1024, dtype, seed=7)  # 1024: wide enough for v3's vector path
    _passes(viewed(args, layout, ("weight", "bias")), version, monkeypatch)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_expanded_upstream_gradient_and_determinism(version):
    # `.sum().backward()` hands the backward a stride-0 gradient; the dw/db reduction has
    # no atomics, so two runs agree bit for bit.
    args = _args((300,), 768, torch.float32, seed=3)
    grads = []
    for _ in range(2):
        x, w, b = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight", "bias"))
        ln.layer_norm(x, w, b, 1e-5, version=version).sum().backward()
        grads.append((x.grad, w.grad, b.grad))
    x, w, b = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight", "bias"))
    torch.nn.functional.layer_norm(x, (768,), w, b, 1e-5).sum().backward()
    for got, want in zip(grads[0], (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b_ in zip(*grads):
        assert torch.equal(a, b_)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(version, dtype):
    build.load()
    ops = torch.ops.levels_cuda
    args = _args((33,), 200, dtype, seed=version)
    x, w, b = args["x"], args["weight"], args["bias"]
    torch.library.opcheck(ops.layer_norm_fwd, (x, w, b, 1e-5, version))
    # the op a call is (autograd.cpp): its C++ autograd traced by AOT autograd
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    torch.library.opcheck(ops.layer_norm, (*leaves, 1e-5, version))
    _, mean, rstd = ops.layer_norm_fwd(x, w, b, 1e-5, version)
    dy = torch.randn_like(x)
    torch.library.opcheck(ops.layer_norm_bwd, (dy, x, w, mean, rstd, version))


BAD_VERSION = """
import torch
from cuda_kernels import build
build.load()
x = torch.randn(4, 64, device="cuda")
w = torch.ones(64, device="cuda")
try:
    torch.ops.levels_cuda.layer_norm_fwd(x, w, w, 1e-5, 7)
except RuntimeError as exc:
    print("raised:", exc)
"""


@pytest.mark.gpu
@needs_gpu
def test_bad_version_is_an_error_naming_it():
    # In a child process: an error thrown by the C++ binding must reach Python as a
    # RuntimeError (a crash there would take the whole test session down).
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", BAD_VERSION], capture_output=True, text=True,
                         cwd=root, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert re.search(r"layer_norm_fwd \(version 7\): this version does not exist", out.stdout), \
        out.stdout + out.stderr[-2000:]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_inside_torch_compile(version, monkeypatch):
    # The kernel ops have fake implementations and the op a call is has its autograd in C++:
    # Dynamo traces them into one graph (fullgraph=True: no break), and the compiled backward
    # calls our backward op.
    monkeypatch.setenv(ENV, str(version))
    levels.get("cuda")
    build.load()  # the library must be loaded before tracing (Dynamo cannot trace a build)
    args = _args((2, 50), 384, torch.bfloat16, seed=11)
    x, w, b = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight", "bias"))

    def f(x, w, b):
        return torch.relu(ln.layer_norm(x, w, b, 1e-5)) + 1

    torch._dynamo.reset()
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        out = fn(x, w, b)
        results.append((out, *torch.autograd.grad(out.float().square().sum(), (x, w, b))))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_no_rows_give_torchs_result():
    # a batch of 0: an empty y and dx, zero weight and bias gradients, no launch
    x = torch.randn(0, 3, 40, device="cuda", requires_grad=True)
    w = torch.randn(40, device="cuda", requires_grad=True)
    b = torch.randn(40, device="cuda", requires_grad=True)
    y = levels.get("cuda").layer_norm(x, w, b)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and not w.grad.any() and not b.grad.any()


_PHASED_SHIM = r"""
#include "layer_norm_plan.h"
extern "C" int phased(unsigned long long x, unsigned long long y, unsigned long long w,
                      unsigned long long b, long long M, long long N, long long stride_x, int elem) {
  return levels_layer_norm::ln_rows_phased(x, y, w, b, M, N, stride_x, elem);
}
"""


# Misaligned rows move as 16-byte vectors (version 4's phased kernels) only where row r of x
# and row r of the contiguous output start at the same phase for every r, and weight and bias
# are aligned: a contiguous x of odd width yes; x[:, 1:] of a wider tensor no (its rows sit
# one element later than y's); any misaligned parameter no.
@pytest.mark.parametrize("x,y,w,b,M,N,stride,elem,want", [
    (4096, 8192, 0, 16, 1000, 4097, 4097, 2, True),       # contiguous, odd width
    (4096, 8192, 0, 16, 1000, 1023, 1023, 4, True),       # fp32
    (4098, 8192, 0, 16, 1000, 4097, 4098, 2, False),      # x[:, 1:] of (M, 4098)
    (4098, 8194, 0, 16, 1, 4097, 4098, 2, True),          # one row: its stride means nothing
    (4096, 8192, 2, 16, 1000, 4097, 4097, 2, False),      # weight misaligned
    (4096, 8192, 0, 4, 1000, 4097, 4097, 2, False),       # bias misaligned
    (4096, 8192, 0, 16, 1000, 4097, 4097 + 8, 2, True),   # rows 8 elements further apart: same phases
    (4096, 8192, 0, 16, 1000, 4097, 4097 + 4, 2, False),  # 4 further: not y's
    (4096, 8192, 0, 16, 0, 0, 0, 2, False),               # no columns
])
def test_version4_phased_rows_rule(host_library, x, y, w, b, M, N, stride, elem, want):
    lib = host_library(_PHASED_SHIM, "ln-phased")  # compiled by the first case only
    assert bool(lib.phased(ctypes.c_ulonglong(x), ctypes.c_ulonglong(y), ctypes.c_ulonglong(w),
                           ctypes.c_ulonglong(b), ctypes.c_longlong(M), ctypes.c_longlong(N),
                           ctypes.c_longlong(stride), elem)) is want


# Version 4: every path forced at widths that land on every kernel shape (one element, a
# lane group, a block, element loads at odd widths, a cluster split, the widest), on aligned
# rows, on x[:, 1:] of a wider tensor (no 16-byte loads, odd row stride) and on rows of a
# wider buffer (aligned, strided). A forced path that cannot run a size must be refused
# with the op's error, and only where layer_norm_plan.h says so.
V4_WIDTHS = [1, 7, 33, 1023, 1024, 4097, 16385, 65536]
V4_PATHS = [0, 1, 2, 3, 5, 6]  # 0: the rule's choice; 5, 6: 1, 2 with element loads


def _refuses(fn, args: dict) -> None:
    """fn's forward and backward refuse args with the launchers' message. detach(), not
    clone(): a clone of a sliced x would be contiguous (realigned)."""
    with pytest.raises(RuntimeError, match="does not support these sizes or layouts"):
        w = args["weight"].detach().requires_grad_(True)
        fn(args["x"].detach().requires_grad_(True), w, args["bias"], 1e-5).sum().backward()


def _v4_layout(args: dict, layout: str) -> dict:
    x = args["x"]
    M, N = x.shape
    if layout == "sliced":  # x[:, 1:] of an (M, N + 1) tensor: misaligned, odd row stride
        buf = torch.full((M, N + 1), float("nan"), dtype=x.dtype, device=x.device)
        buf[:, 1:] = x
        args["x"] = buf[:, 1:]
    elif layout == "row_padded":  # rows N + 8 apart: aligned, strided
        buf = torch.full((M, N + 8), float("nan"), dtype=x.dtype, device=x.device)
        buf[:, :N] = x
        args["x"] = buf[:, :N]
    return args


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout,dtype", [("contiguous", torch.float32),
                                          ("contiguous", torch.bfloat16),
                                          ("sliced", torch.float32), ("sliced", torch.bfloat16),
                                          ("sliced", torch.float16),
                                          ("row_padded", torch.bfloat16)])
@pytest.mark.parametrize("N", V4_WIDTHS)
@pytest.mark.parametrize("path", V4_PATHS)
def test_version4_every_path(path, N, layout, dtype, plan):
    import functools
    rows = (513,) if N <= 1024 else ((37,) if N <= 16385 else (5,))
    args = _v4_layout(_args(rows, N, dtype, seed=N + path), layout)
    fn = functools.partial(ln.layer_norm, version=4, path=path)
    x = args["x"]
    aligned = (x.data_ptr() % 16 == 0 and N % (16 // x.element_size()) == 0
               and x.stride(0) % (16 // x.element_size()) == 0)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    clusters = torch.cuda.get_device_capability(x.device)[0] >= 9
    fwd_plan = plan(rows[0], N, dtype, aligned=aligned, clusters=clusters, sms=sms, force=path)
    bwd_plan = plan(rows[0], N, dtype, aligned=aligned, backward=True, clusters=clusters,
                    sms=sms, force=path)
    if fwd_plan["path"] == NONE or bwd_plan["path"] == NONE:
        _refuses(fn, args)
        return
    r = check_args("layer_norm", args, fn=fn)
    assert r.passed, f"v4 path {path} ({fwd_plan}, backward {bwd_plan}): {r.summary()}"


# Version 4's phased forward (misaligned rows moved by the 16-byte vectors that cover them):
# contiguous x of widths that are no multiple of a vector, so row r starts r*N elements past a
# boundary, every phase in turn. Row counts below and above the K = 16 / element-size phase
# classes the kernels assign to blocks (1, 3, K + 1, many); the lane-group, block and cluster
# (SPLIT) kernels by forcing paths 1 and 2 (a forced path runs the phased kernel wherever it
# has one), and the rule (0), through the harness (float64 reference, NaN-poisoned outputs;
# the backward is the element kernels').
PHASED_WIDTHS = [7, 127, 1023, 4097, 9001]
PHASED_ROWS = [(1,), (3,), (9,), (1000,)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("path", [0, 1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", PHASED_WIDTHS)
@pytest.mark.parametrize("rows", PHASED_ROWS)
def test_version4_phased_rows(rows, N, dtype, path, plan):
    import functools
    args = _args(rows, N, dtype, seed=N + rows[0] + path)
    elem = torch.empty((), dtype=dtype).element_size()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    clusters = torch.cuda.get_device_capability()[0] >= 9
    fn = functools.partial(ln.layer_norm, version=4, path=path)
    plans = [plan(rows[0], N + 16 // elem - 1, dtype, aligned=True, backward=bw, clusters=clusters,
                  sms=sms, force=path) for bw in (False, True)]
    elements = [plan(rows[0], N, dtype, aligned=False, backward=bw, clusters=clusters, sms=sms,
                     force=path) for bw in (False, True)]
    e0 = 8 if dtype == torch.float32 else 16
    phased_runs = plans[0]["path"] == SPLIT or (plans[0]["path"] == ROWS and plans[0]["E"] <= 2 * e0)
    if elements[1]["path"] == NONE or (elements[0]["path"] == NONE and not phased_runs):
        # refused: the backward by elements, or the forward by either kernel family
        _refuses(fn, args)
        return
    r = check_args("layer_norm", args, fn=fn)
    assert r.passed, f"v4 phased, path {path} ({plans}): {r.summary()}"


# A vector at either end of a phased row holds the neighbour row's elements (or, past the
# last row and past weight's last column, whatever lies there): they are zeroed after the
# load, so a NaN or inf in one row reaches no other row's y or dx, and none from past the
# tensors' ends reaches any. Every tensor here is the head of a buffer padded with NaN. Paths
# 1 and 2 force the phased kernels (lane groups or a block, a cluster); 0 at 1000 x 6145 is
# the rule's choice (the phased kernel for 16-bit rows: as many rows in flight).
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,path", [(37, 127, 1), (37, 4097, 1), (37, 4097, 2), (37, 1023, 1),
                                      (1, 4097, 1), (3, 4097, 2), (9, 33, 1), (1000, 6145, 0)])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_version4_phased_rows_keep_to_their_row(M, N, path, dtype, poison):
    g = torch.Generator(device="cpu").manual_seed(N)

    def padded(*shape):  # contiguous, 16-byte aligned, NaN in the 64 bytes after it
        numel = int(torch.tensor(shape).prod())
        buf = torch.full((numel + 64 // torch.empty((), dtype=dtype).element_size(),),
                         float("nan"), dtype=dtype, device="cuda")
        buf[:numel] = torch.randn(numel, generator=g).to("cuda", dtype)
        return buf[:numel].view(*shape)
    x, w, b, dy = padded(M, N), padded(N), padded(N), padded(M, N)
    bad = min(5, M - 1) if M > 1 else None
    if bad is not None:
        x[bad] = poison
    x.requires_grad_(True)
    y = ln.layer_norm(x, w, b, 1e-5, version=4, path=path)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_(True)
    y64 = torch.nn.functional.layer_norm(x64, (N,), w.double(), b.double(), 1e-5)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    others = [r for r in range(M) if r != bad]
    tol = tolerance(dtype)  # the harness's bound per dtype
    for got, ref in ((y, y64), (dx, dx64)):
        got, ref = got.detach().double()[others], ref.detach()[others]
        assert torch.isfinite(got).all(), f"row {bad}'s {poison}, or a NaN past an end, got in"
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < tol, f"relative error {err:.2e} >= {tol:g}"
    if bad is not None:
        assert not torch.isfinite(y.detach()[bad]).all()
    else:  # no poisoned row: dweight and dbias too
        (dw,) = torch.autograd.grad(ln.layer_norm(x, w.requires_grad_(True), b, 1e-5, version=4,
                                                  path=path), w, dy)
        assert torch.isfinite(dw).all(), "a NaN past an end reached dweight"


# Version 6's copy-engine kernel forced at widths from one vector to 65536 columns (a block
# per row and clusters of 2-8; buffers of 16 bytes to 64 KB), in rows that wrap its ring of
# buffers several times (2500 rows over about 132 clusters: the mbarrier parities of rounds
# 0, 1, 0, ...), in one row, on aligned rows and on rows of a wider buffer (aligned,
# strided) and on misaligned rows (x[:, 1:] of a wider tensor: every row a different
# phase, copied with the 16-byte granules around it). fp32 backward rows past 8 x 4096
# columns have no copy-engine plan: forced, the op refuses them.
V6_CASES = [(2500, 8), (2500, 256), (1001, 1024), (37, 4096), (37, 6144), (1, 16384),
            (9, 12288), (5, 20000), (3, 65536), (513, 1), (513, 7), (37, 4097), (5, 16385)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", ["contiguous", "row_padded", "sliced"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,N", V6_CASES)
def test_version6_copy_engine_kernel_forced(rows, N, dtype, layout, plan6):
    import functools
    args = _v4_layout(_args((rows,), N, dtype, seed=N + 6), layout)
    fn = functools.partial(ln.layer_norm, version=6, path=1)
    elem = torch.empty((), dtype=dtype).element_size()
    x, vec = args["x"], 16 // elem
    aligned = x.data_ptr() % 16 == 0 and N % vec == 0 and (rows == 1 or x.stride(0) % vec == 0)
    planned = plan6(N, elem, aligned=aligned)["ok"] and plan6(N, elem, True, aligned)["ok"]
    if not planned or torch.cuda.get_device_capability()[0] < 9:
        _refuses(fn, args)
        return
    r = check_args("layer_norm", args, fn=fn)
    assert r.passed, f"v6 forced, {rows} x {N} {dtype} {layout}: {r.summary()}"


def test_default_version_is_6_for_rows_of_256_columns_or_more_else_4(monkeypatch):
    # cuda_kernels/layer_norm.py default_version: the rule read off the H100 sweeps (version 6:
    # version 5 where version 3's fast path runs, version 4's kernels where rows are
    # misaligned, its copy-engine kernels for wider rows, aligned or not; version 4 for
    # narrow rows). A call that names no version hands the op version 0, which applies the
    # rule in C++ (checked against this mirror below); the environment still overrides it.
    monkeypatch.delenv("LEVELS_CUDA_VERSION_LAYER_NORM", raising=False)
    for N, dtype, want in [(768, torch.bfloat16, 6), (4096, torch.float32, 6), (8192, torch.bfloat16, 6),
                           (16384, torch.bfloat16, 6), (65536, torch.float32, 6), (256, torch.float32, 6),
                           (1023, torch.bfloat16, 6), (4097, torch.bfloat16, 6), (16385, torch.float32, 6),
                           (64, torch.bfloat16, 4), (255, torch.float32, 4), (1, torch.float32, 4)]:
        x = torch.empty(3, N, dtype=dtype)
        assert ln.default_version(x) == want, (N, dtype)
    wide = torch.empty(3, 4104, dtype=torch.bfloat16)
    assert ln.default_version(wide[:, 1:4097]) == 6  # misaligned rows: version 6 (4's kernels)
    assert ln.default_version(wide[:, 8:4104]) == 6
    assert ln.resolve_version() == ln.RULE == 0
    monkeypatch.setenv("LEVELS_CUDA_VERSION_LAYER_NORM", "2")
    assert ln.resolve_version() == 2


_RULE_SHIM = r"""
#include "layer_norm_plan.h"
extern "C" int rule(unsigned long long x, long long M, long long N, long long stride, int elem) {
  using namespace levels_layer_norm;
  (void)x, (void)M, (void)stride, (void)elem;  // the op's arguments; the width alone decides
  return ln_default_version(N);
}
"""


def test_the_ops_rule_in_cpp_is_the_python_mirrors(host_library):
    # The op applies layer_norm_plan.h's rule to the (M, N) row view it is handed (the address
    # of its first element and its row stride); default_version reads the same off the tensor.
    # Both must agree on every width, dtype and alignment, or the bench would time one version
    # and call it the other.
    rule = host_library(_RULE_SHIM, "ln-rule").rule
    rule.argtypes = [ctypes.c_ulonglong, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_longlong,
                     ctypes.c_int]
    seen = set()
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.empty(5, 8208 + 8, dtype=dtype)
        for N in (64, 255, 256, 768, 1000, 1023, 4096, 4097, 8192, 8200, 8208):
            for start in (0, 1, 4, 8):
                for view in (base[:, start:start + N], base.view(-1)[start:start + 5 * N].view(5, N),
                             base[:1, start:start + N]):
                    want = ln.default_version(view)
                    got = rule(view.data_ptr(), view.shape[0], N, view.stride(0), view.element_size())
                    assert got == want, (dtype, N, start, view.stride())
                    seen.add(want)
    assert seen == {4, 6}
