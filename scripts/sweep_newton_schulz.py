"""Level 4 newton_schulz's tiles, swept on the GPU: each of its two GEMM kernels (the symmetric
product and the update) alone at the bench's shapes, with every candidate tile, against the
cuBLAS product it replaces, so that the tile rule in triton_kernels/newton_schulz.py
(`_tiles`) is read off measurements rather than guessed.

    python scripts/sweep_newton_schulz.py OUT.json

Each row: kernel, shape (batch, M, K or N), tile, median ms (triton.testing.do_bench), the
cuBLAS figure of the same product in the same run, and the number of programs the grid has
(against the GPU's SM count: a grid smaller than the GPU leaves SMs idle).
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

from equivalence.environment import describe
from triton_kernels import newton_schulz as ns
from triton_kernels.launch import cdiv

SYM_TILES = [  # BLOCK, BLOCK_K, num_warps, num_stages (square tiles: a mirror is a tile)
    (128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 4, 3), (128, 32, 8, 4),
    (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (64, 32, 4, 4)]
UPDATE_TILES = [  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages
    (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4),
    (64, 128, 64, 4, 4), (64, 64, 64, 4, 3), (64, 64, 64, 4, 4), (128, 64, 64, 4, 4)]
SYM_SHAPES = [(1, 1024, 1024), (1, 4096, 4096), (1, 4096, 11008), (1, 8192, 4096),
              (12, 768, 768), (12, 768, 3072), (4, 4096, 4096)]
UPDATE_SHAPES = [(1, 1024, 1024), (1, 4096, 4096), (1, 4096, 11008), (12, 768, 768),
                 (12, 768, 2304), (12, 768, 3072)]


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def sym_rows(dtype) -> list[dict]:
    rows = []
    for batch, M, K in SYM_SHAPES:
        X = torch.randn((batch, M, K), device="cuda", dtype=dtype)
        out = torch.empty((batch, M, M), device="cuda", dtype=dtype)
        cublas = bench(lambda: torch.matmul(X, X.mT))
        for BLOCK, BLOCK_K, warps, stages in SYM_TILES:
            tiles = cdiv(M, BLOCK)

            def run():
                ns.sym_kernel[(tiles * (tiles + 1) // 2, batch)](
                    X, out, out, out, M, K, *X.stride(), *out.stride(), *out.stride(), 1.0, 0.0,
                    SCALED=False, HAS_Y=False, UPCAST=False, DOT_PRECISION="tf32", BLOCK=BLOCK,
                    BLOCK_K=BLOCK_K, num_warps=warps, num_stages=stages)
            try:
                run()
                ref = torch.matmul(X.float(), X.float().mT)
                err = float(((out.float() - ref).norm() / ref.norm()))
                ms = bench(run)
            except Exception as e:  # a tile that does not fit: say so, go on
                rows.append(dict(kernel="sym", shape=[batch, M, K], tile=[BLOCK, BLOCK_K, warps, stages],
                                 error=str(e).splitlines()[0][:200]))
                continue
            rows.append(dict(kernel="sym", shape=[batch, M, K], tile=[BLOCK, BLOCK_K, warps, stages],
                             ms=ms, cublas_ms=cublas, ratio=cublas / ms, rel_err=err,
                             programs=tiles * (tiles + 1) // 2 * batch))
            print(f"sym {batch}x{M}x{K} {BLOCK},{BLOCK_K},{warps},{stages}: {ms:.4f} ms "
                  f"({cublas / ms:.2f}x cuBLAS X X^T)", flush=True)
    return rows


def update_rows(dtype) -> list[dict]:
    rows = []
    for batch, M, N in UPDATE_SHAPES:
        B = torch.randn((batch, M, M), device="cuda", dtype=dtype) / M ** 0.5
        X = torch.randn((batch, M, N), device="cuda", dtype=dtype)
        out = torch.empty_like(X)
        cublas = bench(lambda: torch.baddbmm(X, B, X, beta=2.0))
        for BM, BN, BK, warps, stages in UPDATE_TILES:
            grid = (cdiv(M, BM) * cdiv(N, BN), batch)

            def run():
                ns.update_kernel[grid](B, X, out, out, M, N, M, *B.stride(), *X.stride(),
                                       *out.stride(), 2.0, SCALED=False, UPCAST=False,
                                       DOT_PRECISION="tf32", BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                                       GROUP_M=8, num_warps=warps, num_stages=stages)
            try:
                run()
                ref = torch.baddbmm(X.float(), B.float(), X.float(), beta=2.0)
                err = float(((out.float() - ref).norm() / ref.norm()))
                ms = bench(run)
            except Exception as e:
                rows.append(dict(kernel="update", shape=[batch, M, N], tile=[BM, BN, BK, warps, stages],
                                 error=str(e).splitlines()[0][:200]))
                continue
            rows.append(dict(kernel="update", shape=[batch, M, N], tile=[BM, BN, BK, warps, stages],
                             ms=ms, cublas_ms=cublas, ratio=cublas / ms, rel_err=err,
                             programs=grid[0] * batch))
            print(f"update {batch}x{M}x{N} {BM},{BN},{BK},{warps},{stages}: {ms:.4f} ms "
                  f"({cublas / ms:.2f}x cuBLAS baddbmm)", flush=True)
    return rows


def main(path: str) -> None:
    dtype = torch.bfloat16
    report = dict(what="Level 4 newton_schulz kernels' tiles swept (bf16)", environment=describe(),
                  sms=torch.cuda.get_device_properties(0).multi_processor_count,
                  rows=sym_rows(dtype) + update_rows(dtype))
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
