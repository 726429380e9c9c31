"""The twins compiled for a real GPU, without one: every kernel through numba's CUDA target
to PTX (the assembly nvcc also produces from the C++), for a chosen architecture.

    NUMBA_ENABLE_CUDASIM=0 python -m numba_kernels.ptx [--cc 9.0] [--out DIR]

Why: the simulator runs a kernel's Python source as Python; it never compiles it. Whether
numba's CUDA target accepts the same source (every expression typed, shared and local
arrays of constant shape, the device functions the factories capture) is a separate
question, and a GPU run is the only other way to ask it. `cuda.compile_ptx` answers it with
libNVVM (part of the CUDA toolkit) alone. Two things this caught while writing the twins:
array shapes written as expressions (`tile + 1`) and the builtin min/max of two numbers,
which this numba's CUDA target does not compile (the kernels use ternaries, as the C++).

One workaround, confined to this tool: numba compiles a kernel's device functions for the
compute capability of the *current device*, which it asks the driver for; without a GPU
there is none, so `_target_device` answers with the requested architecture while compiling.

Exit status: 0 every kernel compiled, 1 one did not (its error printed), 3 nothing could be
compiled here (the simulator is on, or libNVVM is missing: the reason printed).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path


def _signatures():
    """(name, kernel, argument types) of every twin kernel, head dimension 16 for attention."""
    from numba import boolean, float32, float64, int32, int64

    from . import attention, gemm, layer_norm, rms_norm, rope

    # What the launchers pass: float32 spans (binding.operand), Python ints, floats (eps,
    # scale) and bools, which numba types as int64, float64 and boolean.
    a, i, f, b = float32[::1], int64, float64, boolean
    lens = int32[::1]  # attention's kv_lens (an empty array: every key)
    rows = layer_norm.ROW_KERNELS
    g = gemm.gemm_kernels()
    att = attention.attention_kernels(16)
    qkv = (a, i, i, i, i) * 3  # q, k, v: each a span and four strides
    return [
        ("layer_norm.fwd_block_row", rows.fwd, (a, i, i, a, i, a, i, a, a, a, i, i, f)),
        ("layer_norm.bwd_dx_block_row", rows.bwd_dx, (a, i, i, a, i, i, a, i, a, a, a, i, i)),
        ("layer_norm.bwd_dwdb_partial", layer_norm.bwd_dwdb_partial, (a, i, i, a, i, i, a, a, a, a, i, i, i)),
        ("layer_norm.sum_partials", layer_norm.sum_partials, (a, a, a, a, i, i)),
        ("rms_norm.fwd_block_row", rms_norm.fwd_block_row, (a, i, i, a, i, a, a, i, i, f)),
        ("rms_norm.bwd_dx_block_row", rms_norm.bwd_dx_block_row, (a, i, i, a, i, i, a, i, a, a, i, i)),
        ("rms_norm.bwd_dw_partial", rms_norm.bwd_dw_partial, (a, i, i, a, i, i, a, a, i, i, i)),
        ("rms_norm.sum_partials", rms_norm.sum_partials, (a, a, i, i)),
        ("gemm.gemm_tiled (32x32)", g.gemm, (a, i, i, a, i, i, i, i, i, a, i, i, a, i, b, a, i, i, i)),
        ("gemm.column_sum_kernel", gemm.column_sum_kernel, (a, i, i, a, i, i)),
        ("attention.attn_fwd (D=16)", att.fwd, qkv + (a, a, lens, i, i, i, i, f, b, b)),
        ("attention.attn_bwd_delta", att.bwd_delta, (a, a, i, i, i, i, a, i, i)),
        ("attention.attn_bwd_dkdv", att.bwd_dkdv,
         qkv + (a, i, i, i, i, a, a, a, a, lens, i, i, i, i, f, b, b)),
        ("attention.attn_bwd_dq", att.bwd_dq, qkv + (a, i, i, i, i, a, a, a, lens, i, i, i, i, f, b, b)),
        ("rope.rope_v2", rope.rope_v2, (a, a, a, a) + (i,) * 12 + (f, b)),
    ]


@contextlib.contextmanager
def _target_device(cc: tuple[int, int]):
    from numba.cuda import dispatcher

    class Target:
        compute_capability = cc

    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: Target()
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def unavailable_reason() -> str | None:
    from . import SIMULATED

    if SIMULATED:
        return "numba's CUDA simulator is on in this process: run with NUMBA_ENABLE_CUDASIM=0"
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as exc:  # noqa: BLE001 - any failure to load libNVVM is the reason
        return f"libNVVM (CUDA toolkit) could not be loaded: {type(exc).__name__}: {exc}"
    return None


def compile_all(cc=(9, 0), out_dir: Path | None = None) -> list[tuple[str, str | None, int]]:
    """(kernel, error or None, lines of PTX) for every twin kernel, compiled for `cc`."""
    from numba import cuda

    results = []
    with _target_device(cc):
        for name, kernel, signature in _signatures():
            try:
                ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=cc)
            except Exception as exc:  # noqa: BLE001 - reported per kernel
                results.append((name, f"{type(exc).__name__}: {exc}", 0))
                continue
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
                (out_dir / f"{name.split(' ')[0]}.ptx").write_text(ptx)
            results.append((name, None, ptx.count("\n")))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m numba_kernels.ptx", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 (H100), 8.0 (A100)")
    parser.add_argument("--out", type=Path, help="write each kernel's PTX into this directory")
    args = parser.parse_args(argv)
    try:
        cc = tuple(int(p) for p in args.cc.split("."))
        if len(cc) != 2:
            raise ValueError
    except ValueError:
        parser.error(f"argument --cc must be MAJOR.MINOR, e.g. 9.0; got {args.cc!r}")
    reason = unavailable_reason()
    if reason:
        print(f"numba_kernels.ptx: nothing compiled: {reason}", file=sys.stderr)
        return 3
    results = compile_all(cc, args.out)
    for name, error, lines in results:
        print(f"ok   {name:34} {lines} lines of PTX" if error is None else f"FAIL {name:34} {error}")
    return 0 if all(error is None for _, error, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
