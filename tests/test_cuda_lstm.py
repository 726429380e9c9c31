"""Level 5 (CUDA C++) LSTM: both versions of cuda_kernels/lstm.cu, forward and backward through
time, through the harness (float64 reference, NaN-poisoned allocations, both layouts).

CPU (CI): the version plumbing, how the entry lays x out for the GEMM (a view in either row
order, else a copy), the h_{t-1} rows the dW_hh GEMM pairs with dz, and (with nvcc) that the
persistent kernels, which hold W_hh rows, accumulators and partial sums on chip, do not spill
on sm_90a.

CPU also: the PLAN rule (no version chosen: the ops get version 0, v2 where it fits, else v1),
and (with nvcc) that v2's non-default build knobs compile without spills.

GPU (@pytest.mark.gpu): every version x fp32/fp16/bf16 — the harness at the tiny preset (both
layouts: x time-major, weights transposed, biases and states strided), odd sizes (B 1, 3, 8,
20, 67: v2's forward with 8 and with 4 units a block, 67 more than one 64-row batch chunk;
H 1, 17, 33, 64, 512; T 1, 3, 5; I 1, 5, 7), x sliced (neither
row order: copied) and h0 an expanded view, v2's backward staging dz in pieces (fp32, H 1024),
a hidden size whose W_hh does not fit on chip (v2 refuses with a ValueError naming w_hh; v1
computes it; the plan runs v1 there and v2, bit for bit, where it fits), bitwise determinism, opcheck on
both ops, torch.compile(fullgraph=True) through the ops, and a bad version as an error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import levels
from cuda_kernels import build, versions
from cuda_kernels import lstm as K5
from equivalence import cards
from equivalence.check import check, check_args

ENV = K5.ENV_VERSION
CU = Path(K5.__file__).with_suffix(".cu")
VERSIONS = sorted(K5.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NAMES = ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")
NVCC = build.nvcc_available()


# ------------------------------------------------------------------------------ CPU --

def test_versions_and_default():
    assert VERSIONS == [1, 2] and K5.DEFAULT_VERSION == 2
    assert K5.ENV_VERSION == versions.env_name("lstm")
    assert K5.uses_tf32(torch.device("cuda"), torch.float32) is False
    assert K5.PLAN == 0 and K5.PLAN not in K5.VERSIONS  # the plan is no version a caller can pick


def test_plan_only_when_nothing_chose_a_version(monkeypatch):
    """version=None and no environment: the ops get PLAN (v2 where it fits, else v1, decided
    by the launcher); a version from the argument or the environment passes as chosen, and a
    bad one is refused before anything runs."""
    monkeypatch.delenv(ENV, raising=False)
    assert K5.kernel_version() == K5.PLAN
    assert K5.kernel_version(2) == 2 and K5.kernel_version(1) == 1
    monkeypatch.setenv(ENV, "  ")  # blank counts as unset, as in versions.resolve
    assert K5.kernel_version() == K5.PLAN
    monkeypatch.setenv(ENV, "2")
    assert K5.kernel_version() == 2 and K5.kernel_version(1) == 1
    monkeypatch.setenv(ENV, "0")  # the plan's code is not a version the environment may name
    with pytest.raises(ValueError, match=r"LEVELS_CUDA_VERSION_LSTM must be one of \[1, 2\]"):
        K5.kernel_version()
    with pytest.raises(ValueError, match=r"argument 'version' must be one of \[1, 2\]"):
        K5.kernel_version(0)


def test_entry_sends_the_plan_to_the_ops_when_no_version_was_chosen(monkeypatch):
    seen = []

    class Lstm:
        @staticmethod
        def default(x, h0, c0, w_ih, w_hh, b_ih, b_hh, version, gemm_version):
            seen.append(version)
            return x, h0, c0

    class Ops:
        lstm = Lstm

    monkeypatch.setattr(K5, "_ops", lambda: Ops)
    B, T, I, H = 2, 3, 4, 5
    args = [torch.randn(B, T, I), torch.randn(1, B, H), torch.randn(1, B, H), torch.randn(4 * H, I),
            torch.randn(4 * H, H), torch.randn(4 * H), torch.randn(4 * H)]
    monkeypatch.delenv(ENV, raising=False)
    K5.lstm(*args)
    K5.lstm(*args, version=2)
    monkeypatch.setenv(ENV, "1")
    K5.lstm(*args)
    assert seen == [K5.PLAN, 2, 1]


def test_version_from_argument_then_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert K5.resolve_version() == 2
    monkeypatch.setenv(ENV, "1")
    assert K5.resolve_version() == 1 and K5.resolve_version(2) == 2
    with pytest.raises(ValueError, match=r"lstm: argument 'version' must be one of \[1, 2\].*3"):
        K5.resolve_version(3)


@pytest.mark.skipif(NVCC is not None, reason=f"needs nvcc: {NVCC}")
def test_persistent_kernels_do_not_spill_on_sm90a():
    # v2 holds its accumulators (32 floats a thread), W_hh fragments and gate state in
    # registers under a 128-register cap (2 blocks an SM); a spill would put local-memory
    # traffic on the critical path of every time step.
    report = build.ptxas_report(CU, "90a")
    names = [k.get("kernel", k["mangled"]) for k in report]
    persistent = [k for k in report if "persistent_v2" in k.get("kernel", k["mangled"])]
    # forward x 2 partitions (8 units a block at small batch, 4 beyond) x 3 dtypes and the wide
    # one (16 units, 16-bit only) x 2; backward x 3 on CUDA cores, on the tensor cores x 2
    assert len(persistent) == 2 * 3 + 2 + 3 + 2, names
    for k in report:
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0, k
    for k in persistent:
        # __launch_bounds__(256, 2); the mma backward is one block an SM by its shared memory
        # (W_hh^T's 16 x 4H slice), so its cap is the architecture's
        assert k["registers"] <= (255 if "_mma" in k["mangled"] else 128), k


# v2's build knobs (lstm.cu: LEVELS_LSTM_V2_UNITS, LEVELS_LSTM_V2_BARRIER) that the default
# build does not compile; the sweep in scripts/device_level5.py builds them on the GPU machine,
# and a knob value that spills or does not compile would only show up there.
# (flags, persistent kernels: with UNITS=4 both forward partitions are one instantiation)
# (UNITS=16 makes the fat partition the wide one's instantiation)
KNOBS = [("-DLEVELS_LSTM_V2_UNITS=4 -DLEVELS_LSTM_V2_BARRIER=0", 3 + 2 + 3 + 2),
         ("-DLEVELS_LSTM_V2_UNITS=16 -DLEVELS_LSTM_V2_BARRIER=1", 2 * 3 + 3 + 2),
         ("-DLEVELS_LSTM_V2_BWD_MMA=0", 2 * 3 + 2 + 3)]


@pytest.mark.skipif(NVCC is not None, reason=f"needs nvcc: {NVCC}")
@pytest.mark.parametrize("knobs, kernels", KNOBS, ids=[k for k, _ in KNOBS])
def test_knob_variants_compile_without_spills(knobs, kernels, tmp_path):
    flags = [*build.TORCH_NVCC_FLAGS, *build.CUDA_FLAGS, f"-I{build.KERNELS_DIR}", "-Xptxas", "-v", "--cubin",
             build.gencode("90a"), *knobs.split()]
    proc = subprocess.run([build.find_nvcc(), *flags, "-o", str(tmp_path / "out.cubin"), str(CU)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    report = build.parse_ptxas(proc.stdout + proc.stderr)
    assert sum("persistent_v2" in k["mangled"] for k in report) == kernels, [k["mangled"] for k in report]
    for k in report:
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0, (knobs, k)
        if "persistent_v2" in k["mangled"]:
            assert k["registers"] <= (255 if "_mma" in k["mangled"] else 128), (knobs, k)


# ------------------------------------------------------------------------------ GPU --

def _args(B, T, I, H, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get("lstm").module.make_args(dict(B=B, T=T, I=I, H=H), dtype, torch.device("cuda"), g)


def _passes(args, version, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    r = check_args("lstm", "cuda", args)
    assert r.passed, f"v{version}: {r.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny_both_layouts(version, dtype, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    results = check("lstm", "cuda", dtype=dtype, device="cuda", size="tiny")
    assert {r.layout for r in results} == set(cards.LAYOUTS)
    for r in results:
        assert r.passed, f"v{version}: {r.summary()}"


# (B, T, I, H): nothing a multiple of a tile; B=67 takes two batch chunks (64 + 3) in v2's
# fp32 forward, B=20 and 67 run v2's forward with 4 units a block in fp32 and the wide
# partition (16 units, batch groups) in 16-bit (past LEVELS_LSTM_V2_FAT_BATCH = 16), the
# others with 8; H=1 and 17 leave most of a block's units and 16-wide K steps empty, H=512 is
# the bench's.
SHAPES = [(1, 1, 1, 1), (3, 5, 7, 17), (8, 5, 1, 64), (3, 1, 7, 512), (8, 5, 7, 512), (20, 3, 5, 33),
          (67, 3, 7, 17)]


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-T{}-I{}-H{}".format(*s))
def test_odd_sizes(version, dtype, shape, monkeypatch):
    _passes(_args(*shape, dtype, seed=sum(shape)), version, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_strided_views(version, dtype, monkeypatch):
    """x sliced out of a bigger buffer (flattens in neither row order: copied), both weights
    transposed, b_ih a slice, h0 one state expanded over the batch (stride 0), c0 strided."""
    B, T, I, H = 5, 4, 9, 24
    args = _args(B, T, I, H, dtype, seed=5)
    buf = torch.full((B, T + 3, I + 2), float("nan"), device="cuda", dtype=dtype)
    buf[:, 2:T + 2, 1:I + 1] = args["x"]
    args["x"] = buf[:, 2:T + 2, 1:I + 1]
    args["w_ih"] = args["w_ih"].t().contiguous().t()
    args["w_hh"] = args["w_hh"].t().contiguous().t()
    b = torch.full((4 * H + 5,), float("nan"), device="cuda", dtype=dtype)
    b[3:3 + 4 * H] = args["b_ih"]
    args["b_ih"] = b[3:3 + 4 * H]
    args["h0"] = args["h0"][:, :1].expand(1, B, H)
    c = torch.full((1, B, 3 * H), float("nan"), device="cuda", dtype=dtype)
    c[..., ::3] = args["c0"]
    args["c0"] = c[..., ::3]
    _passes(args, version, monkeypatch)


@pytest.mark.gpu
def test_w_hh_too_large_for_chip_v2_refuses_v1_computes(monkeypatch):
    # fp32, hidden 2048: 512 blocks of 16 W_hh rows (131 KB each) cannot all be resident.
    args = _args(2, 2, 3, 2048, torch.float32, seed=9)
    with pytest.raises(ValueError, match=r"lstm_fwd \(version 2\): w_hh .*2048.* does not fit on chip.*version 1"):
        K5.lstm(*(args[n] for n in NAMES), version=2)
    _passes(args, 1, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harness_tiny_under_the_plan(dtype, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)  # no version chosen: the ops get PLAN
    for r in check("lstm", "cuda", dtype=dtype, device="cuda", size="tiny"):
        assert r.passed, f"plan: {r.summary()}"


def _forward_and_grads(args, version):
    leaves = [args[n].detach().clone().requires_grad_(True) for n in NAMES]
    out, (h_n, c_n) = K5.lstm(*leaves, version=version)
    grads = torch.autograd.grad(out.float().square().sum() + h_n.float().sum() + c_n.float().sum(), leaves)
    return (out, h_n, c_n, *grads)


@pytest.mark.gpu
def test_plan_runs_v2_where_it_fits_and_v1_where_it_does_not(monkeypatch):
    # Each version is bitwise deterministic (test_bitwise_deterministic), so the plan's results
    # equal, bit for bit, those of the version it ran.
    monkeypatch.delenv(ENV, raising=False)
    fits = _args(8, 5, 16, 64, torch.bfloat16, seed=6)
    for got, want in zip(_forward_and_grads(fits, None), _forward_and_grads(fits, 2)):
        assert torch.equal(got, want)
    # fp32, hidden 2048: v2 cannot hold W_hh on chip (test_w_hh_too_large_for_chip...): v1 runs.
    big = _args(2, 2, 3, 2048, torch.float32, seed=9)
    with torch.no_grad():
        plan = K5.lstm(*(big[n] for n in NAMES))
        v1 = K5.lstm(*(big[n] for n in NAMES), version=1)
    assert torch.equal(plan[0], v1[0]) and torch.equal(plan[1][0], v1[1][0]) and torch.equal(plan[1][1], v1[1][1])
    with pytest.raises(ValueError, match=r"lstm_fwd \(version 2\): w_hh .*does not fit on chip"):
        K5.lstm(*(big[n] for n in NAMES), version=2)


# The 16-bit backward on the tensor cores (lstm.cu, lstm_bwd_persistent_v2_mma) and, past 16
# rows, the wide forward (16 units a block, batch groups): B=67 over three groups of 24 rows
# (the last 19), B=300 over groups of 80 rows, each two chunks (64 + 16), hidden 1024 with dz
# in double-buffered pieces (B=3: 2048 columns) and two groups of 24 rows (B=40); H=64 gives 4
# unit blocks, H=40 three, the last part empty.
MMA_SHAPES = [(67, 3, 7, 64), (300, 2, 3, 64), (3, 2, 5, 1024), (40, 3, 5, 1024), (9, 4, 3, 40)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("shape", MMA_SHAPES, ids=lambda s: "B{}-T{}-I{}-H{}".format(*s))
def test_v2_wide_forward_and_backward_on_tensor_cores(dtype, shape, monkeypatch):
    _passes(_args(*shape, dtype, seed=sum(shape)), 2, monkeypatch)


@pytest.mark.gpu
def test_v2_backward_stages_dz_in_pieces(monkeypatch):
    # fp32, hidden 1024: the forward's 128 blocks of 8 units (~170 KB each) fit one an SM, the
    # backward's 256 blocks two an SM, but 8 whole dz rows (4H = 4096 columns, 131 KB) next to
    # the W_hh^T slice would not: the backward stages dz in pieces of 1024 columns
    # (launch_bwd_v2), accumulating across them.
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if 2 * sms < 256:
        pytest.skip(f"needs 128 SMs for v2 at hidden 1024 in fp32 (2 blocks an SM); this GPU has {sms}")
    _passes(_args(3, 2, 5, 1024, torch.float32, seed=4), 2, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_bitwise_deterministic(version, dtype):
    # Partial sums meet in shared memory in a fixed order and nothing uses atomics: two runs
    # agree bit for bit, outputs and every gradient.
    args = _args(8, 6, 16, 96, dtype, seed=2)
    runs = []
    for _ in range(2):
        leaves = [args[n].detach().clone().requires_grad_(True) for n in NAMES]
        out, (h_n, c_n) = K5.lstm(*leaves, version=version)
        grads = torch.autograd.grad((out.float().square().sum() + h_n.float().sum() + c_n.float().sum()),
                                    leaves)
        runs.append((out, h_n, c_n, *grads))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def _op_args(dtype, version, save, requires_grad=False, time_major=False):
    B, T, I, H = 3, 4, 5, 12
    args = _args(B, T, I, H, dtype, seed=version)
    x = args["x"]
    x2 = (x.transpose(0, 1) if time_major else x).reshape(B * T, I)
    xp = torch.randn(B * T, 4 * H, device="cuda")
    tensors = [x2, args["w_ih"], args["b_ih"], xp, args["h0"][0].contiguous(), args["c0"][0].contiguous(),
               args["w_hh"], args["b_hh"]]
    if requires_grad:
        tensors = [t if i == 3 else t.detach().requires_grad_(True) for i, t in enumerate(tensors)]
    return (*tensors, time_major, save, version)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_opcheck(version, dtype):
    # Each opcheck traces the op through AOT autograd (seconds): the op a call is
    # (autograd.cpp: its C++ backward runs too) with gradients at every dtype, in one row
    # order each; the kernel ops (forward saving and not, backward) once per version.
    levels.get("cuda")
    ops = K5._ops()  # builds and loads the library, registers the fakes
    time_major = dtype == torch.bfloat16
    a = _args(3, 4, 5, 12, dtype, seed=version)
    if time_major:
        a["x"] = a["x"].transpose(0, 1).contiguous().transpose(0, 1)
    leaves = [a[n].detach().clone().requires_grad_(True)
              for n in ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")]
    torch.library.opcheck(ops.lstm, (*leaves, version, 4))
    torch.library.opcheck(ops.lstm_fwd, _op_args(dtype, version, save=True, time_major=time_major))
    if dtype != torch.float32:
        return
    torch.library.opcheck(ops.lstm_fwd, _op_args(dtype, version, save=False))
    fwd = _op_args(dtype, version, save=True)
    out, h_n, c_n, gates, cs = ops.lstm_fwd(*fwd)
    c0, w_hh = fwd[5], fwd[6]
    torch.library.opcheck(ops.lstm_bwd, (torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n),
                                         c0, w_hh, gates, cs, False, version))


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_inside_torch_compile(version, monkeypatch):
    # Fake implementations and the op's C++ autograd: Dynamo traces the Level 5 LSTM into one
    # graph (fullgraph=True: no break), and the compiled backward calls lstm_bwd.
    monkeypatch.setenv(ENV, str(version))
    level = levels.get("cuda")
    K5._ops()  # the library must be loaded before tracing (Dynamo cannot trace a build)
    args = _args(4, 5, 16, 32, torch.bfloat16, seed=11)
    leaves = [args[n].detach().clone().requires_grad_(True) for n in NAMES]

    def f(*t):
        out, (h_n, c_n) = level.lstm(*t)
        return torch.relu(out) + 1, h_n * 2, c_n

    torch._dynamo.reset()
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        outs = fn(*leaves)
        loss = sum(o.float().square().sum() for o in outs)
        results.append((*outs, *torch.autograd.grad(loss, leaves)))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)


BAD_VERSION = """
import torch
from cuda_kernels import lstm as K5
ops = K5._ops()
B, T, I, H = 2, 3, 4, 8
x2 = torch.randn(B * T, I, device="cuda")
s = torch.randn(B, H, device="cuda")
try:
    ops.lstm_fwd(x2, torch.randn(4 * H, I, device="cuda"), torch.randn(4 * H, device="cuda"),
                 torch.randn(B * T, 4 * H, device="cuda"), s, s, torch.randn(4 * H, H, device="cuda"),
                 torch.randn(4 * H, device="cuda"), False, False, 7)
except RuntimeError as exc:
    print("raised:", exc)
"""


@pytest.mark.gpu
def test_bad_version_is_an_error_naming_it():
    # In a child process: an error thrown by the C++ binding must reach Python as a
    # RuntimeError (a crash there would take the whole test session down).
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", BAD_VERSION], capture_output=True, text=True,
                         cwd=root, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert re.search(r"lstm_fwd \(version 7\): this version does not exist", out.stdout), \
        out.stdout + out.stderr[-2000:]
