"""gemm.cu's version 8 (ping-pong consumers: each consumer warpgroup owns whole 128x128 tiles,
their mainloops alternate so one tile's epilogue runs under the other's MMAs) on an H100, in
one call: build Level 5, check version 8 against float64 (every epilogue, the SwiGLU pair, odd
M/N/K tails, strided inputs) and against version 6's bits, on shapes that stress the ping-pong
(many tiles per block, an odd count per block so consumer 0 has one more, fewer tiles than SMs
so consumer 1 idles, K not a multiple of the ring, one k-tile per tile), then time cuBLAS beside
versions 5, 6, 7 and 8 (single GEMMs and the MLP forward; version 8 has no batched kernel:
Newton–Schulz is unchanged, scripts/device_gemm7.py times it).

    PYTHONPATH=. python3 scripts/device_gemm8.py OUT.json [--check-only]

scripts/device_gemm7.py's run (its checks, its timings, its report format), with version 8
under test: each case is recorded in OUT.json, a failure or an exception does not stop the
run (a CUDA fault poisons the context: read the FIRST failure). ~1-2 min on an H100 after the
build. A hang (a wrong mbarrier parity or math order): run under `timeout`, and rebuild with
LEVELS_CUDA_NVCC_FLAGS=-DLEVELS_GEMM8_TIMEOUT=200 (every mbarrier wait traps after 200
million polls, printing the block, thread and parity).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import device_gemm7  # noqa: E402


def check_shapes(sms):
    """(M, N, K), tiles of 128x128. Beside version 7's shapes: 3 tiles in every block (consumer
    0 two, consumer 1 one) with a K tail, and KT = 4 with ~4 tiles per block (the two
    consumers' k-tiles share ring stages)."""
    return device_gemm7.CHECK_SHAPES + [(384, 128 * sms, 264), (4096, 2048, 200)]


if __name__ == "__main__":
    device_gemm7.main(V=8, versions=(5, 6, 7, 8), batched=False, shapes=check_shapes, doc=__doc__)
