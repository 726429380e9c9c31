"""Level 5 (CUDA C++) rms_norm: every version of cuda_kernels/rms_norm.cu, forward and
backward, through the harness (float64 reference, NaN-poisoned allocations, both layouts).

The versions' paths are chosen by size and alignment (v3: a warp per row up to 256 wide, a
block per row up to 1024 vectors, else v2's warp per row; its backward fused with 8 or 16
elements a thread up to 8192 wide, else v2's kernels), so the GPU tests pick widths that
land on every path (the model widths 896, 3584 and 4096 among them), widths that are no
multiple of anything (1, 7, 1023, 4097), rows the persistent backward splits raggedly, and
views that defeat 16-byte loads.

On a CPU (the version plumbing is tests/test_cuda_versions.py's): with nvcc, that the
kernels holding a row in registers do not spill on sm_90a. The C++ autograd around the
kernel ops runs on the CPU in tests/test_cuda_autograd_cpu.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cuda_kernels import build
from cuda_kernels import rms_norm as rn
from equivalence import cards
from equivalence.check import check, check_args
from equivalence.tolerances import tolerance
from tests.test_cuda_layer_norm import VIEWS, _ptxas, viewed

ENV = rn.ENV_VERSION
CU = Path(rn.__file__).with_suffix(".cu")
VERSIONS = sorted(rn.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------ CPU --

@pytest.mark.skipif(shutil.which("nvcc") is None,
                    reason="nvcc not found: install the CUDA toolkit (or put it on PATH) to "
                           "compile the Level 5 kernels")
def test_register_resident_kernels_do_not_spill_on_sm90a():
    # v3 holds a row (and, backward, the weight and the dweight partials) in registers; a
    # spill would turn them into local-memory traffic and the bandwidth goal with them.
    report = _ptxas(CU)
    held = {k: v for k, v in report.items()
            if "fwd_v3" in k or "bwd_v3_fused" in k or "bwd_v4_fused" in k}
    # 3 dtypes x (v3: 2 forward + 2 backward variants; v4: every kernel of rms_norm.cu's
    # bwd_v4_kernel)
    assert len(held) == 3 * (4 + len(rn.V4_KERNELS)), sorted(report)
    spilled = {k: v for k, v in held.items() if v[1] or v[2]}
    assert not spilled, f"(registers, spill stores, spill loads): {spilled}"


# ------------------------------------------------------------------------------ GPU --

def _args(rows, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get("rms_norm").module.make_args(dict(rows=rows, N=N), dtype,
                                                  torch.device("cuda"), g)


def _passes(args, version, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    r = check_args("rms_norm", "cuda", args)
    assert r.passed, f"v{version}: {r.summary()}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny_both_layouts(version, dtype, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    results = check("rms_norm", "cuda", dtype=dtype, device="cuda", size="tiny")
    assert {r.layout for r in results} == set(cards.LAYOUTS)
    for r in results:
        assert r.passed, f"v{version}: {r.summary()}"


# Widths that land on every path (module doc), model widths, rows that split raggedly.
SHAPES = [((513,), 1), ((3, 7), 7), ((37,), 256), ((1000,), 1023), ((64,), 896),
          ((2, 50), 3584), ((129,), 4096), ((3, 77), 4097), ((17,), 8192), ((5,), 20000)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,N", SHAPES)
def test_odd_and_wide_rows(version, dtype, rows, N, monkeypatch):
    _passes(_args(rows, N, dtype, seed=N), version, monkeypatch)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", VIEWS)
def test_views(version, dtype, layout, monkeypatch):
    args = _args((96,), 1024, dtype, seed=7)  # 1024: wide enough for v3's vector path
    _passes(viewed(args, layout, ("weight",)), version, monkeypatch)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_expanded_upstream_gradient_and_determinism(version):
    # `.sum().backward()` hands the backward a stride-0 gradient; the dweight reduction has
    # no atomics, so two runs agree bit for bit.
    args = _args((300,), 768, torch.float32, seed=3)
    grads = []
    for _ in range(2):
        x, w = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight"))
        rn.rms_norm(x, w, 1e-6, version=version).sum().backward()
        grads.append((x.grad, w.grad))
    x, w = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight"))
    torch.nn.functional.rms_norm(x, (768,), w, 1e-6).sum().backward()
    for got, want in zip(grads[0], (x.grad, w.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(version, dtype):
    build.load()
    ops = torch.ops.levels_cuda
    args = _args((33,), 200, dtype, seed=version)
    x, w = args["x"], args["weight"]
    torch.library.opcheck(ops.rms_norm_fwd, (x, w, 1e-6, version))
    # the op a call is (rms_norm_autograd.cpp): its C++ autograd traced by AOT autograd
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w)]
    torch.library.opcheck(ops.rms_norm, (*leaves, 1e-6, version))
    _, rstd = ops.rms_norm_fwd(x, w, 1e-6, version)
    torch.library.opcheck(ops.rms_norm_bwd, (torch.randn_like(x), x, w, rstd, version))


# Version 4's backward with each rows-an-iteration R pinned (the op's `force`), through the
# harness: a Function of the two kernel ops, the backward forced. Rows that leave the last
# block a ragged iteration (M not a multiple of R, fewer rows than blocks), both widths of E
# (8 up to 4096 columns, 16 beyond), and layouts that defeat 16-byte loads, where a forced
# R must be refused with the op's error (never another kernel). An R with no kernel at this
# width (R = 4 at E = 16 would spill) is refused too.
class _ForcedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, force):
        x2 = x.reshape(-1, x.shape[-1])
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        w = weight.contiguous()
        y, rstd = torch.ops.levels_cuda.rms_norm_fwd(x2, w, eps, 4)
        ctx.save_for_backward(x2, w, rstd)
        ctx.force, ctx.shape = force, x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, rstd = ctx.saved_tensors
        dy2 = dy.reshape(x2.shape).contiguous()
        dx, dw = torch.ops.levels_cuda.rms_norm_bwd(dy2, x2, w, rstd, 4, ctx.force)
        return dx.view(ctx.shape), dw, None, None


V4_CASES = [((1,), 4096), ((3,), 896), ((1001,), 4096), ((2, 45), 768), ((37,), 8192),
            ((513,), 256), ((7,), 6144)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,N", V4_CASES)
@pytest.mark.parametrize("force", rn.FORCES[4])
def test_version4_every_rows_an_iteration(force, rows, N, dtype):
    build.load()
    args = _args(rows, N, dtype, seed=N + force)
    E = 8 if N <= 4096 else 16
    fn = lambda x, weight, eps: _ForcedBackward.apply(x, weight, eps, force)  # noqa: E731
    if (E, force) not in rn.V4_KERNELS:
        x = args["x"].detach().requires_grad_(True)
        with pytest.raises(RuntimeError, match="does not support these sizes or layouts"):
            fn(x, args["weight"], args["eps"]).float().sum().backward()
        return
    r = check_args("rms_norm", args, fn=fn)
    assert r.passed, f"v4 R={force}: {r.summary()}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("force", rn.FORCES[4])
def test_version4_forced_rows_refuse_misaligned_rows(force):
    build.load()
    buf = torch.randn(64, 1025, device="cuda", dtype=torch.bfloat16)
    x, w = buf[:, 1:], torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    _, rstd = torch.ops.levels_cuda.rms_norm_fwd(x, w, 1e-6, 4)
    with pytest.raises(RuntimeError, match=r"rms_norm_bwd \(version 4\): this version does not "
                                           r"support these sizes or layouts"):
        torch.ops.levels_cuda.rms_norm_bwd(torch.randn_like(x), x, w, rstd, 4, force)
    # the rule's choice (force 0) runs v2's kernels there instead, and is right
    dy = torch.randn_like(x)
    dx, dw = torch.ops.levels_cuda.rms_norm_bwd(dy, x, w, rstd, 4, 0)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    rs = torch.rsqrt((x64 * x64).mean(1, keepdim=True) + 1e-6)
    g = dy64 * w64
    want_dx = rs * (g - x64 * rs * (g * x64 * rs).mean(1, keepdim=True))
    want_dw = (dy64 * x64 * rs).sum(0)
    for got, want in ((dx, want_dx), (dw, want_dw)):
        rel = float((got.double() - want).norm() / want.norm())
        assert rel < tolerance(torch.bfloat16), rel


@pytest.mark.gpu
@needs_gpu
def test_forcing_rows_at_another_version_or_an_r_not_listed_is_an_error():
    build.load()
    x, w = torch.randn(8, 256, device="cuda"), torch.randn(256, device="cuda")
    _, rstd = torch.ops.levels_cuda.rms_norm_fwd(x, w, 1e-6, 3)
    for version, force in ((3, 2), (4, 3), (4, 8)):
        with pytest.raises(RuntimeError, match="does not support these sizes or layouts"):
            torch.ops.levels_cuda.rms_norm_bwd(torch.randn_like(x), x, w, rstd, version, force)


BAD_VERSION = """
import torch
from cuda_kernels import build
build.load()
x = torch.randn(4, 64, device="cuda")
try:
    torch.ops.levels_cuda.rms_norm_fwd(x, torch.ones(64, device="cuda"), 1e-6, 7)
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
    assert re.search(r"rms_norm_fwd \(version 7\): this version does not exist", out.stdout), \
        out.stdout + out.stderr[-2000:]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_inside_torch_compile(version, monkeypatch):
    # fake kernel ops + the C++ autograd: Dynamo traces one graph, whose backward calls ours
    monkeypatch.setenv(ENV, str(version))
    build.load()  # the library must be loaded before tracing (Dynamo cannot trace a build)
    args = _args((2, 50), 384, torch.bfloat16, seed=11)
    x, w = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight"))

    def f(x, w):
        return torch.relu(rn.rms_norm(x, w, 1e-6)) + 1

    torch._dynamo.reset()
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        out = fn(x, w)
        results.append((out, *torch.autograd.grad(out.float().square().sum(), (x, w))))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)
