// rms_norm.cu — RMSNorm over the last dimension, forward and backward, as a ladder.
//
//   y = x * rstd * w,   rstd = 1/sqrt(sum(x^2)/N + eps)            (no mean, no bias)
//   dx = rstd * (w*dy - xhat * mean(w*dy*xhat)),   xhat = x * rstd
//   dw = sum_rows dy * xhat
//
// layer_norm.cu's ladder with one reduction per row instead of two, and its helpers
// (common.cuh: Vec, warp_sum, block_sum, the launch helpers). x and dy are (M, N) views:
// rows stride_x / stride_dy elements apart, columns adjacent (cuda_kernels/rms_norm.py and
// rms_norm_autograd.cpp copy a tensor only when its last dimension is strided); weight, y,
// dx, rstd are contiguous. Every version accumulates in fp32.
//
// Versions (LEVELS_CUDA_VERSION_RMS_NORM=1|2|3|4; forward vN pairs with backward vN):
//   v1  one thread per row (the CPU loop on the GPU): uncoalesced, M threads. Backward: dx
//       by a thread per row, dw by a thread per column walking all M rows.
//   v2  one warp per row, lanes striding over the row, shuffle sums: coalesced, no shared
//       memory, no barrier. Backward: dx the same way; dw in two deterministic stages (P
//       chunks of rows x 256 columns into a (P, N) fp32 buffer, then a kernel adds the P
//       rows). Costs: x is read twice forward (sum, then output; the 2nd from L1/L2), and x
//       and dy twice backward (dx, then dw): 5 tensor passes where 3 are needed.
//   v3  16-byte vector loads, the row in registers: forward reads x once and writes y once
//       (a warp per row up to 256 wide, else a block of N/(2*VEC) threads per row, up to
//       512); backward fused and persistent (P resident blocks, each owning a chunk of rows,
//       with w and its dw partials in registers: x and dy read once, dx written once, then
//       the same second stage as v2). Costs: rows must be 16-byte aligned whole vectors and
//       fit in registers (forward N <= 1024 * VEC: 4096 fp32, 8192 bf16/fp16; backward
//       N <= 8192); otherwise v3 runs v2's kernels (said again in the launchers).
//   v4  v3's backward with R rows an iteration (forward: v3's). v3 keeps one row in flight
//       per block, and each row waits on three barriers (block_sum) with no load in flight.
//       In v4 a thread holds the same E columns of R rows, so its weight and dweight
//       registers serve all R, the iteration's 2 R E loads are issued before any math, and
//       one barrier serves the R row sums (a double-buffered scratch). R comes from a
//       measured rule (bwd_v4_rule: 4 for rows of up to 128 threads, else 2; 1 at 16 elements
//       a thread); `force` pins it for the tests and scripts/sweep_rms_norm_v4.py. Costs:
//       2 R E elements of registers a thread (R E <= 32: more spills), and v3's limits
//       (aligned rows, N <= 8192).
//
// Speed (H100, kernel time as a fraction of a copy of the same bytes; x, dy read, dx
// written; reports/rms-norm-v4-2026-11-27/):
//   `levels bench --component rms_norm` (16384 x 4096), three runs: forward 0.99x (v3's kernel,
//   fp32 and bf16); backward fp32 v4 0.93x, v3 0.92x; bf16 v4 0.89x, v3 0.82x, Level 4 0.89x.
//   The issue's 0.9x is met in fp32 and missed by 1% in bf16.
//   scripts/sweep_rms_norm_v4.py, bf16, 256 / 768 / 1024 / 2048 / 3072 / 4096 / 5120 / 8192
//   columns (64 Mi elements each): v4 0.85 / 0.91 / 0.89 / 0.87 / 0.90 / 0.87 / 0.86 / 0.77,
//   v3 0.84 / 0.89 / 0.84 / 0.84 / 0.85 / 0.80 / 0.85 / 0.75; fp32 v4 0.91-0.94 at every width.
//   The same bytes moved with no math (torch.add(x, dy, out=dx)) run at 1.00-1.03x copy, so
//   the access pattern is not the limit: what is left is the kernel's own (a reduction and a
//   barrier every R rows, the dweight partials' second pass).
//   Tried and not kept (the same sweeps, one run each): asking L2 for the next iteration's rows
//   (cp.async.bulk.prefetch.L2, a thread a row): 0.62-0.78x, slower at every width; the next
//   row's loads issued into a second set of registers before this row's math: 0.87x at 4096,
//   no better than R = 2, and 0.70x at 5120; x, dy and dx moved with the streaming cache hint
//   (ld/st.global.cs): 0.85x at 4096; four accumulators in sum_partials' walk down a column
//   (four loads in flight a thread): no gain, the stage is 3.4 us of the call's 158 us at
//   bf16 16384 x 4096; ncu puts the row kernel at 81% of DRAM peak, 47% occupancy
//   (scripts/probe_norm_backward.py; reports/cold-build-and-norm-backward-2026-11-27/).
#include "common.cuh"

namespace levels_rms_norm {

constexpr int V1_THREADS = 128;       // v1: threads (= rows) per block
constexpr int V2_ROWS = 8;            // v2: warps (= rows) per block
constexpr int V3_WARP_E = 8;          // v3 forward, a warp per row: elements per lane
constexpr int PARTIAL_THREADS = 256;  // v2 dw stage 1: columns per block
constexpr int SUM_COLS = 32;          // stage 2: columns per block ...
constexpr int SUM_LANES = 16;         // ... and partial rows summed in parallel per column
constexpr int64_t V3_BWD_MAX_N = 16 * 512;

// =====================================================================================
// Forward
// =====================================================================================

// v1: thread `row` owns row `row`: a walk for the sum of squares, a walk for y.
template <typename T>
__global__ void fwd_v1(const T* __restrict__ x,       // (M, N), rows stride_x apart
                       const T* __restrict__ weight,  // (N,)
                       T* __restrict__ y,             // (M, N) contiguous
                       float* __restrict__ rstd_out,  // (M,)
                       int64_t M, int64_t N, int64_t stride_x, float eps) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M) return;
  const T* xr = x + row * stride_x;
  float sq = 0.0f;
  for (int64_t i = 0; i < N; ++i) sq += to_f32(xr[i]) * to_f32(xr[i]);
  const float rstd = rsqrtf(sq / (float)N + eps);
  T* yr = y + row * N;
  for (int64_t i = 0; i < N; ++i) yr[i] = from_f32<T>(to_f32(xr[i]) * rstd * to_f32(weight[i]));
  rstd_out[row] = rstd;
}

// v2: warp `row` owns row `row`; the early return is per warp, so every shuffle is full.
template <typename T>
__global__ void fwd_v2(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                       float* __restrict__ rstd_out, int64_t M, int64_t N, int64_t stride_x,
                       float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= M) return;
  // ### BEGIN SOLUTION
  const T* xr = x + row * stride_x;
  float sq = 0.0f;
  for (int64_t i = lane; i < N; i += 32) sq += to_f32(xr[i]) * to_f32(xr[i]);
  const float rstd = rsqrtf(warp_sum(sq) / (float)N + eps);
  T* yr = y + row * N;
  for (int64_t i = lane; i < N; i += 32)
    yr[i] = from_f32<T>(to_f32(xr[i]) * rstd * to_f32(weight[i]));
  if (lane == 0) rstd_out[row] = rstd;
  // ### END SOLUTION
}

// v3: a group of G threads owns a row (a warp, or the whole block); thread t holds vectors
// t, t + G, ... in registers. Launcher guarantees: x, weight, y 16-byte aligned; stride_x and
// N whole vectors; N <= E * G.
template <typename T, int E, bool WARP_PER_ROW>
__global__ void __launch_bounds__(512)
fwd_v3(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
       float* __restrict__ rstd_out, int64_t M, int64_t N, int64_t stride_x, float eps) {
  constexpr int VEC = vec_width<T>();
  constexpr int CHUNKS = E / VEC;
  static_assert(E % VEC == 0, "a thread holds whole vectors");
  using V = Vec<T, VEC>;
  __shared__ float scratch[32];
  int64_t row;
  int t, G;
  if constexpr (WARP_PER_ROW) {
    row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= M) return;  // whole warps leave; no block barrier in this variant
    t = threadIdx.x & 31;
    G = 32;
  } else {
    row = blockIdx.x;
    t = threadIdx.x;
    G = blockDim.x;
  }
  // ### BEGIN SOLUTION
  const int64_t n_vec = N / VEC;
  const V* xr = reinterpret_cast<const V*>(x + row * stride_x);
  V xk[CHUNKS];  // as loaded: 16-bit types stay packed two to a register
  float sq = 0.0f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
      xk[c] = xr[k];
#pragma unroll
      for (int j = 0; j < VEC; ++j) sq += to_f32(xk[c].v[j]) * to_f32(xk[c].v[j]);
    }
  }
  if constexpr (WARP_PER_ROW) sq = warp_sum(sq);
  else sq = block_sum(sq, scratch);
  const float rstd = rsqrtf(sq / (float)N + eps);
  const V* wv = reinterpret_cast<const V*>(weight);
  V* yr = reinterpret_cast<V*>(y + row * N);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
      const V wk = wv[k];
      V out;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        out.v[j] = from_f32<T>(to_f32(xk[c].v[j]) * rstd * to_f32(wk.v[j]));
      yr[k] = out;
    }
  }
  if (t == 0) rstd_out[row] = rstd;
  // ### END SOLUTION
}

// =====================================================================================
// Backward
// =====================================================================================

// v1 dx: thread `row` owns row `row`: a walk for mean(w*dy*xhat), a walk for dx.
template <typename T>
__global__ void bwd_dx_v1(const T* __restrict__ dy, const T* __restrict__ x,
                          const T* __restrict__ weight, const float* __restrict__ rstd,
                          T* __restrict__ dx, int64_t M, int64_t N, int64_t stride_dy,
                          int64_t stride_x) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M) return;
  const T *xr = x + row * stride_x, *dyr = dy + row * stride_dy;
  const float rs = rstd[row];
  float c1 = 0.0f;
  for (int64_t i = 0; i < N; ++i) c1 += to_f32(xr[i]) * rs * to_f32(weight[i]) * to_f32(dyr[i]);
  c1 /= (float)N;
  T* dxr = dx + row * N;
  for (int64_t i = 0; i < N; ++i) {
    const float xhat = to_f32(xr[i]) * rs;
    dxr[i] = from_f32<T>((to_f32(weight[i]) * to_f32(dyr[i]) - xhat * c1) * rs);
  }
}

// v1 dw: thread `col` walks column `col` down all M rows (adjacent threads, adjacent columns).
template <typename T>
__global__ void bwd_dw_v1(const T* __restrict__ dy, const T* __restrict__ x,
                          const float* __restrict__ rstd, T* __restrict__ dweight, int64_t M,
                          int64_t N, int64_t stride_dy, int64_t stride_x) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float dw = 0.0f;
  for (int64_t m = 0; m < M; ++m)
    dw += to_f32(dy[m * stride_dy + col]) * to_f32(x[m * stride_x + col]) * rstd[m];
  dweight[col] = from_f32<T>(dw);
}

// v2 dx: warp `row` owns row `row`, one shuffle reduction.
template <typename T>
__global__ void bwd_dx_v2(const T* __restrict__ dy, const T* __restrict__ x,
                          const T* __restrict__ weight, const float* __restrict__ rstd,
                          T* __restrict__ dx, int64_t M, int64_t N, int64_t stride_dy,
                          int64_t stride_x) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= M) return;  // per warp
  // ### BEGIN SOLUTION
  const T *xr = x + row * stride_x, *dyr = dy + row * stride_dy;
  const float rs = rstd[row];
  float c1 = 0.0f;
  for (int64_t i = lane; i < N; i += 32)
    c1 += to_f32(xr[i]) * rs * to_f32(weight[i]) * to_f32(dyr[i]);
  c1 = warp_sum(c1) / (float)N;
  T* dxr = dx + row * N;
  for (int64_t i = lane; i < N; i += 32) {
    const float xhat = to_f32(xr[i]) * rs;
    dxr[i] = from_f32<T>((to_f32(weight[i]) * to_f32(dyr[i]) - xhat * c1) * rs);
  }
  // ### END SOLUTION
}

// v2 dw, stage 1: block (blockIdx.x, p) sums columns [256 blockIdx.x, +256) over rows
// [p * rows_per_chunk, +rows_per_chunk) into partial row p of the (P, N) fp32 buffer.
template <typename T>
__global__ void bwd_dw_partial_v2(const T* __restrict__ dy, const T* __restrict__ x,
                                  const float* __restrict__ rstd, float* __restrict__ part_dw,
                                  int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x,
                                  int64_t rows_per_chunk) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= N) return;
  const int64_t p = blockIdx.y, first = p * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < M ? first + rows_per_chunk : M;
  // ### BEGIN SOLUTION
  float dw = 0.0f;
  for (int64_t m = first; m < last; ++m)
    dw += to_f32(dy[m * stride_dy + col]) * to_f32(x[m * stride_x + col]) * rstd[m];
  part_dw[p * N + col] = dw;
  // ### END SOLUTION
}

// Stage 2 (v2 and v3): dweight[n] = sum_p part_dw[p, n]. A block owns 32 columns; its 16
// rows of threads each sum every 16th partial row, then shared memory adds the 16 sums.
template <typename T>
__global__ void sum_partials(const float* __restrict__ part_dw, T* __restrict__ dweight,
                             int64_t P, int64_t N) {
  __shared__ float s_dw[SUM_LANES][SUM_COLS + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = (int64_t)blockIdx.x * SUM_COLS + tx;
  float dw = 0.0f;
  if (col < N)
    for (int64_t p = ty; p < P; p += SUM_LANES) dw += part_dw[p * N + col];
  s_dw[ty][tx] = dw;
  __syncthreads();
  if (ty == 0 && col < N) {
    for (int i = 1; i < SUM_LANES; ++i) dw += s_dw[i][tx];
    dweight[col] = from_f32<T>(dw);
  }
}

// v3, fused and persistent: block b owns rows [b * rows_per_block, +rows_per_block) and
// the vectors t, t + G, ... of every row; w and the dw partials of its columns stay in
// registers across all its rows and the partials are written once at the end.
// Launcher guarantees: dy, x, weight, dx 16-byte aligned; strides and N whole vectors;
// N <= E * blockDim.x; part_dw holds gridDim.x rows of N floats.
template <typename T, int E, int MIN_BLOCKS>
__global__ void __launch_bounds__(512, MIN_BLOCKS)
bwd_v3_fused(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
             const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ part_dw,
             int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x, int64_t rows_per_block) {
  constexpr int VEC = vec_width<T>();
  constexpr int CHUNKS = E / VEC;
  static_assert(E % VEC == 0, "a thread holds whole vectors");
  using V = Vec<T, VEC>;
  __shared__ float scratch[32];
  const int t = threadIdx.x, G = blockDim.x;
  const int64_t n_vec = N / VEC;
  // ### BEGIN SOLUTION
  // Padding lanes (k >= n_vec) hold w = 0 and dy = 0: they add nothing, store nothing.
  V zero;
#pragma unroll
  for (int j = 0; j < VEC; ++j) zero.v[j] = from_f32<T>(0.0f);
  V w[CHUNKS];
  float dw[E];
  load_columns<T, E>(weight, n_vec, t, G, w);
#pragma unroll
  for (int e = 0; e < E; ++e) dw[e] = 0.0f;
  const int64_t first = (int64_t)blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < M ? first + rows_per_block : M;
#pragma unroll 1
  for (int64_t row = first; row < last; ++row) {  // the same trip count for the whole block
    const V* xr = reinterpret_cast<const V*>(x + row * stride_x);
    const V* dyr = reinterpret_cast<const V*>(dy + row * stride_dy);
    const float rs = rstd[row];
    V xk[CHUNKS], gk[CHUNKS];
    float c1 = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int64_t k = (int64_t)c * G + t;
      xk[c] = k < n_vec ? xr[k] : zero;
      gk[c] = k < n_vec ? dyr[k] : zero;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        c1 += to_f32(xk[c].v[j]) * rs * to_f32(w[c].v[j]) * to_f32(gk[c].v[j]);
    }
    c1 = block_sum(c1, scratch) / (float)N;
    V* dxr = reinterpret_cast<V*>(dx + row * N);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      V out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = to_f32(xk[c].v[j]) * rs, g = to_f32(gk[c].v[j]);
        out.v[j] = from_f32<T>((to_f32(w[c].v[j]) * g - xhat * c1) * rs);
        dw[c * VEC + j] += g * xhat;
      }
      const int64_t k = (int64_t)c * G + t;
      if (k < n_vec) dxr[k] = out;
    }
  }
  store_partials<T, E>(part_dw + (int64_t)blockIdx.x * N, dw, n_vec, t, G);
  // ### END SOLUTION
}

// v4: v3's fused persistent backward with R rows an iteration. A thread holds the same E
// columns of R rows: its weight and dweight partials (registers) serve all R, the 2 R E loads
// of an iteration are in flight together, and ONE barrier serves the R row sums (each warp's
// sums go to a double-buffered scratch; the next iteration writes the other half, so no
// second barrier guards the reads). v3 has one row in flight per block and three barriers a
// row (block_sum). Costs: 2 R E elements of registers a thread (R E <= 32: wider plans spill
// or halve the blocks an SM holds); rows_per_block a multiple of R (the launcher's), so only
// the last block has a ragged iteration (masked rows: rstd 0, loads skipped, no store).
// Launcher guarantees: as v3's; blockDim.x a multiple of 32.
template <typename T, int E, int R, int MIN_BLOCKS>
__global__ void __launch_bounds__(512, MIN_BLOCKS)
bwd_v4_fused(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
             const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ part_dw,
             int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x, int64_t rows_per_block) {
  constexpr int VEC = vec_width<T>();
  constexpr int CHUNKS = E / VEC;
  static_assert(E % VEC == 0, "a thread holds whole vectors");
  using V = Vec<T, VEC>;
  __shared__ float red[2][R][32];  // [parity][row of the iteration][warp]
  const int t = threadIdx.x, G = blockDim.x, lane = t & 31, warp = t >> 5, n_warps = G >> 5;
  const int64_t n_vec = N / VEC;
  const float inv_n = 1.0f / (float)N;
  // ### BEGIN SOLUTION
  V w[CHUNKS];
  float dw[E];
  load_columns<T, E>(weight, n_vec, t, G, w);
#pragma unroll
  for (int e = 0; e < E; ++e) dw[e] = 0.0f;
  const int64_t first = (int64_t)blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < M ? first + rows_per_block : M;
  int parity = 0;
#pragma unroll 1
  for (int64_t row0 = first; row0 < last; row0 += R) {  // the same trip count block-wide
    V xk[R][CHUNKS], gk[R][CHUNKS];
    float rs[R];
    load_rows<T, E, R>(x, dy, stride_x, stride_dy, row0, last, n_vec, t, G, xk, gk);
#pragma unroll
    for (int r = 0; r < R; ++r) rs[r] = row0 + r < last ? rstd[row0 + r] : 0.0f;  // 0: masked
    float c1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          s += to_f32(xk[r][c].v[j]) * to_f32(w[c].v[j]) * to_f32(gk[r][c].v[j]);
      s = warp_sum(s);
      if (lane == 0) red[parity][r][warp] = s;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {  // each warp adds the n_warps partial sums by shuffles
      const float s = warp_sum(lane < n_warps ? red[parity][r][lane] : 0.0f);
      c1[r] = s * rs[r] * inv_n;  // mean(w * dy * xhat), xhat = x * rstd
    }
    parity ^= 1;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      V* dxr = reinterpret_cast<V*>(dx + (row0 + r) * N);
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        V out;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xhat = to_f32(xk[r][c].v[j]) * rs[r], g = to_f32(gk[r][c].v[j]);
          out.v[j] = from_f32<T>((to_f32(w[c].v[j]) * g - xhat * c1[r]) * rs[r]);
          dw[c * VEC + j] += g * xhat;  // a masked row adds 0 (dy and rstd are 0)
        }
        const int64_t k = (int64_t)c * G + t;
        if (row0 + r < last && k < n_vec) dxr[k] = out;
      }
    }
  }
  store_partials<T, E>(part_dw + (int64_t)blockIdx.x * N, dw, n_vec, t, G);
  // ### END SOLUTION
}

// =====================================================================================
// Launchers
// =====================================================================================

template <typename T>
static int fwd_launch(int version, const T* x, const T* w, T* y, float* rstd, int64_t M,
                      int64_t N, int64_t stride_x, float eps, cudaStream_t stream) {
  constexpr int VEC = vec_width<T>();
  constexpr int BLOCK_E = 2 * VEC;  // two 16-byte vectors a thread (layer_norm's measured choice)
  const bool vec_ok = levels_aligned16(x) && levels_aligned16(w) && levels_aligned16(y) &&
                      N % VEC == 0 && (M == 1 || stride_x % VEC == 0);
  if (version == 1) {
    fwd_v1<T><<<(unsigned)levels_cdiv(M, V1_THREADS), V1_THREADS, 0, stream>>>(
        x, w, y, rstd, M, N, stride_x, eps);
  } else if (version >= 3 && vec_ok && N <= 32 * V3_WARP_E) {  // narrow: a warp per row
    fwd_v3<T, V3_WARP_E, true><<<(unsigned)levels_cdiv(M, V2_ROWS), V2_ROWS * 32, 0, stream>>>(
        x, w, y, rstd, M, N, stride_x, eps);
  } else if (version >= 3 && vec_ok && N <= BLOCK_E * 512) {  // a block per row
    fwd_v3<T, BLOCK_E, false><<<(unsigned)M, levels_threads_for(levels_cdiv(N, BLOCK_E), 512), 0,
                                stream>>>(x, w, y, rstd, M, N, stride_x, eps);
  } else {  // v2, and v3 where rows are misaligned or too wide for registers
    fwd_v2<T><<<(unsigned)levels_cdiv(M, V2_ROWS), V2_ROWS * 32, 0, stream>>>(
        x, w, y, rstd, M, N, stride_x, eps);
  }
  return levels_launch_status();
}

// v2's split of the rows into P chunks: chunks x column blocks make ~8 blocks per SM.
static int64_t v2_partials(int64_t M, int64_t N) {
  const int64_t want = levels_cdiv(8 * (int64_t)levels_sm_count(), levels_cdiv(N, PARTIAL_THREADS));
  return want < M ? want : M;
}

// v3's fused backward: E elements a thread (8 up to 4096 wide, else 16), P = the blocks that
// are resident at once. E == 0: too wide, v2's kernels run.
struct BwdV3Plan {
  int E, threads;
  int64_t P;
};

template <typename T>
static BwdV3Plan bwd_v3_plan(int64_t M, int64_t N) {
  if (N > V3_BWD_MAX_N) return {0, 0, v2_partials(M, N)};
  BwdV3Plan plan{N <= 8 * 512 ? 8 : 16, 0, 0};
  plan.threads = levels_threads_for(levels_cdiv(N, plan.E), 512);
  const int per_sm = levels_blocks_per_sm(
      plan.E == 8 ? (const void*)bwd_v3_fused<T, 8, 2> : (const void*)bwd_v3_fused<T, 16, 1>,
      plan.threads, 0);
  const int64_t resident = (int64_t)levels_sm_count() * per_sm;
  plan.P = resident < M ? resident : M;
  return plan;
}

// v4's plan: v3's E, then R rows an iteration. `force` (scripts, tests) pins R (1, 2 or 4);
// 0 lets the rule choose. P = the blocks resident at once, but no more than the R-row groups
// there are. E == 0: too wide for registers (or a forced R this E cannot hold), v2's
// kernels run.
struct BwdV4Plan {
  int E, R, threads;
  const void* kernel;
  int64_t P;
};

constexpr int V4_FORCES[] = {1, 2, 4};

// The measured rule (scripts/sweep_rms_norm_v4.py; the header's figures): R = 4 while a row
// takes at most 128 threads (bf16 up to 1024 columns), else 2; at E = 16, 1 (R = 2 there
// needs 122 registers: one block an SM, and slower at 5120 columns, 0.74x against 0.86x).
static int bwd_v4_rule(int E, int threads) {
  if (E == 16) return 1;
  return threads <= 128 ? 4 : 2;
}

template <typename T>
static const void* bwd_v4_kernel(int E, int R) {
  if (E == 8 && R == 1) return (const void*)bwd_v4_fused<T, 8, 1, 2>;
  if (E == 8 && R == 2) return (const void*)bwd_v4_fused<T, 8, 2, 2>;
  if (E == 8 && R == 4) return (const void*)bwd_v4_fused<T, 8, 4, 1>;
  if (E == 16 && R == 1) return (const void*)bwd_v4_fused<T, 16, 1, 1>;
  if (E == 16 && R == 2) return (const void*)bwd_v4_fused<T, 16, 2, 1>;
  return nullptr;  // R * E > 32: would spill
}

template <typename T>
static BwdV4Plan bwd_v4_plan(int64_t M, int64_t N, int force) {
  BwdV4Plan plan{0, 0, 0, nullptr, v2_partials(M, N)};
  if (N > V3_BWD_MAX_N) return plan;
  const int E = N <= 8 * 512 ? 8 : 16;
  const int threads = levels_threads_for(levels_cdiv(N, E), 512);
  const int R = force ? force : bwd_v4_rule(E, threads);
  const void* kernel = bwd_v4_kernel<T>(E, R);
  if (!kernel) return plan;
  plan = {E, R, threads, kernel, 0};
  const int64_t resident = (int64_t)levels_sm_count() * levels_blocks_per_sm(kernel, threads, 0);
  const int64_t groups = levels_cdiv(M, R);
  plan.P = resident < groups ? resident : groups;
  return plan;
}

template <typename T>
static int bwd_launch(int version, int force, const T* dy, const T* x, const T* w,
                      const float* rstd, T* dx, T* dw, float* part_dw, int64_t P, int64_t M,
                      int64_t N, int64_t stride_dy, int64_t stride_x, cudaStream_t stream) {
  if (version == 1) {
    bwd_dx_v1<T><<<(unsigned)levels_cdiv(M, V1_THREADS), V1_THREADS, 0, stream>>>(
        dy, x, w, rstd, dx, M, N, stride_dy, stride_x);
    bwd_dw_v1<T><<<(unsigned)levels_cdiv(N, 256), 256, 0, stream>>>(dy, x, rstd, dw, M, N,
                                                                    stride_dy, stride_x);
    return levels_launch_status();
  }
  if (P < 1) return LEVELS_UNSUPPORTED;  // the caller allocated no partial rows
  constexpr int VEC = vec_width<T>();
  BwdV3Plan plan{0, 0, 0};
  BwdV4Plan plan4{0, 0, 0, nullptr, 0};
  if (version == 3) plan = bwd_v3_plan<T>(M, N);
  if (version == 4) plan4 = bwd_v4_plan<T>(M, N, force);
  // The forward's alignment rule; where it fails, v3's and v4's backward is v2's.
  const bool aligned = levels_aligned16(dy) && levels_aligned16(x) && levels_aligned16(w) &&
                       levels_aligned16(dx) && N % VEC == 0 &&
                       (M == 1 || (stride_x % VEC == 0 && stride_dy % VEC == 0));
  if (force && !(aligned && plan4.E)) return LEVELS_UNSUPPORTED;  // never another kernel
  const bool fused = (plan.E != 0 || plan4.E != 0) && aligned;
  // Whole chunks (of R rows at v4): `used` <= P blocks are non-empty.
  const int R = plan4.E ? plan4.R : 1;
  const int64_t rows_per = levels_cdiv(levels_cdiv(M, P), R) * R;
  const int64_t used = levels_cdiv(M, rows_per);
  if (fused && plan4.E) {
    void* args[] = {(void*)&dy, (void*)&x, (void*)&w, (void*)&rstd, (void*)&dx, (void*)&part_dw,
                    (void*)&M, (void*)&N, (void*)&stride_dy, (void*)&stride_x, (void*)&rows_per};
    const cudaError_t e = cudaLaunchKernel(plan4.kernel, dim3((unsigned)used),
                                           dim3((unsigned)plan4.threads), args, 0, stream);
    if (e != cudaSuccess) return (int)e;
  } else if (fused && plan.E == 8) {
    bwd_v3_fused<T, 8, 2><<<(unsigned)used, plan.threads, 0, stream>>>(
        dy, x, w, rstd, dx, part_dw, M, N, stride_dy, stride_x, rows_per);
  } else if (fused) {
    bwd_v3_fused<T, 16, 1><<<(unsigned)used, plan.threads, 0, stream>>>(
        dy, x, w, rstd, dx, part_dw, M, N, stride_dy, stride_x, rows_per);
  } else {
    bwd_dx_v2<T><<<(unsigned)levels_cdiv(M, V2_ROWS), V2_ROWS * 32, 0, stream>>>(
        dy, x, w, rstd, dx, M, N, stride_dy, stride_x);
    const dim3 grid((unsigned)levels_cdiv(N, PARTIAL_THREADS), (unsigned)used);
    bwd_dw_partial_v2<T><<<grid, PARTIAL_THREADS, 0, stream>>>(dy, x, rstd, part_dw, M, N,
                                                               stride_dy, stride_x, rows_per);
  }
  sum_partials<T><<<(unsigned)levels_cdiv(N, SUM_COLS), dim3(SUM_COLS, SUM_LANES), 0, stream>>>(
      part_dw, dw, used, N);
  return levels_launch_status();
}

}  // namespace levels_rms_norm

// =====================================================================================
// extern "C" launchers: the switch over versions
// =====================================================================================

// y, rstd = rms_norm(x, weight). x: (M, N), rows stride_x elements apart, adjacent columns;
// weight: contiguous (N,); y: contiguous (M, N); rstd: contiguous (M,) fp32. M, N >= 1.
extern "C" int levels_rms_norm_fwd(int dtype, int version, const void* x, const void* weight,
                                   void* y, float* rstd, int64_t M, int64_t N, int64_t stride_x,
                                   float eps, cudaStream_t stream) {
  using namespace levels_rms_norm;
  if (version < 1 || version > 4) return LEVELS_BAD_VERSION;
  LEVELS_DISPATCH(dtype, T, {
    return fwd_launch<T>(version, static_cast<const T*>(x), static_cast<const T*>(weight),
                         static_cast<T*>(y), rstd, M, N, stride_x, eps, stream);
  });
  return LEVELS_OK;  // not reached
}

// A version, and a `force` (0, or one of version 4's plans, V4_FORCES), the backward runs.
static int levels_rms_norm_check(int version, int force) {
  using namespace levels_rms_norm;
  if (version < 1 || version > 4) return LEVELS_BAD_VERSION;
  if (force == 0) return LEVELS_OK;
  if (version != 4) return LEVELS_UNSUPPORTED;
  for (const int r : V4_FORCES)
    if (force == r) return LEVELS_OK;
  return LEVELS_UNSUPPORTED;
}

// How many partial rows P (a contiguous fp32 buffer of P * N floats) the backward of
// `version` (and `force`) needs for these sizes (version 1: none). A negative value is a
// LevelsStatus.
extern "C" int64_t levels_rms_norm_bwd_partials(int dtype, int version, int force, int64_t M,
                                                int64_t N) {
  using namespace levels_rms_norm;
  if (const int bad = levels_rms_norm_check(version, force)) return bad;
  if (version == 1) return 0;
  if (version == 2) return v2_partials(M, N);
  LEVELS_DISPATCH(dtype, T, {
    return version == 3 ? bwd_v3_plan<T>(M, N).P : bwd_v4_plan<T>(M, N, force).P;
  });
  return LEVELS_OK;  // not reached
}

// dx, dweight of rms_norm. dy, x: (M, N), rows stride_dy / stride_x apart, adjacent columns;
// weight: contiguous (N,); rstd: the forward's, contiguous (M,) fp32; dx: contiguous (M, N);
// dweight: contiguous (N,); partials: partial_rows * N fp32 (any partial_rows >= 1 is
// correct for versions 2-4: the count only sets the split). force: 0, or (version 4 only) the
// rows an iteration to pin (V4_FORCES; a plan these sizes cannot run is an error, never
// another kernel).
extern "C" int levels_rms_norm_bwd(int dtype, int version, int force, const void* dy,
                                   const void* x, const void* weight, const float* rstd, void* dx,
                                   void* dweight, float* partials, int64_t partial_rows,
                                   int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x,
                                   cudaStream_t stream) {
  using namespace levels_rms_norm;
  if (const int bad = levels_rms_norm_check(version, force)) return bad;
  LEVELS_DISPATCH(dtype, T, {
    return bwd_launch<T>(version, force, static_cast<const T*>(dy), static_cast<const T*>(x),
                         static_cast<const T*>(weight), rstd, static_cast<T*>(dx),
                         static_cast<T*>(dweight), partials, partial_rows, M, N, stride_dy,
                         stride_x, stream);
  });
  return LEVELS_OK;  // not reached
}
