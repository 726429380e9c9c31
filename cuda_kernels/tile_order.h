// tile_order.h — the order in which gemm.cu's symmetric schedule launches its tiles. Plain
// C++ (host and device): gemm.cu's batched kernels call it, and the CPU tests
// (tests/test_cuda_newton_schulz.py) compile it with g++ and check every tile comes once, in
// the order stated here.
//
// A symmetric product (X X^T, A A with A = A^T) computes only the T (T + 1) / 2 tiles on and
// below the diagonal of its T x T tiles. Block p of the launch takes tile lower_tile(p), row
// by row; where X is larger than L2, banded_lower_tile(p) instead: bands of `group` tile rows,
// each band's rectangle left of its diagonal column by column, then its own triangle. Blocks
// run roughly in launch order, so row by row a wave of 132 blocks reads 1-2 row panels of X
// and up to all T column panels, which no longer stay in L2 once X is larger than it (every
// wave reads them from DRAM again); a band's wave reads `group` row panels and about
// 132 / group column panels. Level 4 measured it (triton_kernels/newton_schulz.py,
// reports/phased-rows-and-bands-2026-11-27/): 1.49x -> 1.62x torch.matmul(X, X.T) at
// 4096 x 11008 bf16, 1.53x -> 1.66x at 8192^2, within 2% at 32-72 MB.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LEVELS_TILE_FN __host__ __device__ __forceinline__
#else
#define LEVELS_TILE_FN inline
#endif

namespace levels_tiles {

// tile rows a band; -DLEVELS_SYM_BAND=1 (through LEVELS_CUDA_NVCC_FLAGS) builds the row-by-row
// order everywhere, for an A/B of the two in one device call
#ifndef LEVELS_SYM_BAND
#define LEVELS_SYM_BAND 8
#endif
constexpr int64_t SYM_BAND = LEVELS_SYM_BAND;

// Tile (i, j), j <= i, of the lower triangle, numbered i (i + 1) / 2 + j: i is the
// triangular root of p, from a double square root corrected by one either way.
LEVELS_TILE_FN void lower_tile(int64_t p, int64_t& i, int64_t& j) {
  i = (int64_t)((sqrt(8.0 * (double)p + 1.0) - 1.0) * 0.5);
  while ((i + 1) * (i + 2) / 2 <= p) ++i;
  while (i * (i + 1) / 2 > p) --i;
  j = p - i * (i + 1) / 2;
}

// Tile number p in bands of `group` tile rows of T: a band covers the same rows in both
// orders, so lower_tile(p)'s row finds it; its first b (b + 1) / 2 tiles are the rows above.
LEVELS_TILE_FN void banded_lower_tile(int64_t p, int64_t T, int64_t group, int64_t& i, int64_t& j) {
  int64_t row, col;
  lower_tile(p, row, col);
  const int64_t b = row / group * group, q = p - b * (b + 1) / 2;
  const int64_t g = T - b < group ? T - b : group;  // the last band may be shorter
  if (q < b * g) {  // the rectangle, column by column
    i = b + q % g;
    j = q / g;
    return;
  }
  lower_tile(q - b * g, i, j);  // the band's own triangle, row by row
  i += b;
  j += b;
}

// The band of a symmetric launch of T tile rows over an X of x_bytes: SYM_BAND where X is
// larger than L2 (and there is more than one band), else 1 (row by row).
LEVELS_TILE_FN int64_t sym_band(int64_t T, int64_t x_bytes, int64_t l2_bytes) {
  return T > SYM_BAND && x_bytes > l2_bytes ? SYM_BAND : 1;
}

}  // namespace levels_tiles
