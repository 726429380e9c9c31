// layer_norm.cu — LayerNorm over the last dimension, forward and backward, as a ladder.
//
//   y = (x - mean) * rstd * w + b,   mean = sum(x)/N,   rstd = 1/sqrt(sum((x-mean)^2)/N + eps)
//
// x is an (M, N) view: rows M apart by `stride_x` elements, columns adjacent (the Python
// side, cuda_kernels/layer_norm.py, copies x only when its last dimension is strided).
// weight, bias, y, dx, mean, rstd are contiguous (made so, or allocated so, by the caller).
// Every version accumulates in fp32 and computes the variance in two passes (centre, then
// square): exact to fp32 rounding whatever the mean, unlike E[x^2] - E[x]^2.
//
// Forward versions (each selectable: LEVELS_CUDA_VERSION_LAYER_NORM=1|2|3|4|5|6; v5's forward is
// v3's where v3's fast path runs, v4's elsewhere: version 5 is a backward):
//   v1  one thread per row: the CPU loop moved onto the GPU. Each thread walks its row three
//       times (mean, variance, output). Costs: a warp's 32 loads touch 32 rows, 32 cache
//       lines at once (no coalescing), and only M threads exist (16384 rows: about one
//       thread per CUDA core of an H100, far too few to hide memory latency).
//   v2  one warp per row, lanes striding over the row, reductions by register shuffles
//       (warp_sum): every load instruction of a warp reads 32 adjacent elements (coalesced)
//       and there is no shared memory and no barrier. Costs: the row is still read three
//       times (twice from L1/L2), loads are 4 or 2 bytes each, and one warp per row leaves
//       a wide row (N = 65536) to 32 threads.
//   v3  16-byte vector loads, the row held in registers, one block per wide row: each thread
//       loads its share of the row once (ld.global.v4: 4 fp32 or 8 bf16/fp16 per instruction),
//       both reductions run on registers, and y is written once: 2 bytes moved per byte of
//       x, the floor. Narrow rows (N <= 256) get a warp per row (no barrier); wider rows a
//       block of ceil(N/E) threads per row, E = two vectors (8 fp32, 16 bf16/fp16) up to 512
//       threads, else 32 (a barrier per reduction). Costs: registers bound the width (16384
//       here), and vector loads need aligned rows. So v3 FALLS BACK to a block-per-row loop
//       that re-reads the row from L1/L2 (vectorized if aligned, else scalar) when the base
//       pointers are not 16-byte aligned, the row stride or N is not a multiple of the
//       vector width, or N > 16384.
//   v4  v3's idea at every width and layout, the kernel picked by a rule from M, N, the dtype
//       and the alignment (layer_norm_plan.h: plain C++, its choices tested on the CPU).
//       Why v3 has cliffs (H100, fraction of a device copy's bandwidth, forward;
//       reports/h100-sweep-layer-norm-before.txt): the fallback loop reads the row three
//       times, one element a load, and gives a 1023-wide row 512 threads, each of which does
//       two elements between the block's barriers: bf16 4096 x 1023 0.28x (0.20x in issue
//       #28's run), 4097 0.45x, fp32 65536 0.50x; and its warp per narrow row keeps N/8 of
//       32 lanes busy: bf16 64 wide 0.34x. What removes them:
//       * element loads that still keep the row in registers: the same kernel with VEC = 1.
//         A warp's load still reads 32 adjacent elements (coalesced), x is still read once
//         and y written once. (A 16-byte body with an element head and tail is not enough:
//         at N = 1023 the rows of x and y start at 1023 r elements, a different misalignment
//         every row, and weight's columns sit at yet another.) Level 4 does the same at 1023.
//       * compile-time strides between a thread's loads (lane groups of S = 4..32, or a block
//         whose warps each own 32 CH adjacent vectors): every address is one register plus an
//         immediate. A runtime stride made ptxas keep a 64-bit address per load (100+
//         registers for 16 elements); weight and bias are loaded beside their use (all up
//         front, ptxas held them in registers: 119 at 32 fp32 a thread).
//       * narrow rows (N <= 32 E): a group of S lanes a row, 256 / S rows a block, shuffles
//         and no barrier, every lane busy.
//       * rows wider than a block's registers (16384 by vectors, 8192 by elements) split over
//         a cluster of 2-8 blocks (sm_90 thread-block clusters): each block holds its seg
//         columns, and the row's sums cross the cluster through distributed shared memory
//         (each block reads its peers' partial sums after one cluster barrier). The row is
//         still read once. Few rows (2M < SMs, N >= 4096) split too, so more SMs stream.
//       * the next row prefetched into L2 (prefetch.global.L2) while this row's sums cross
//         the block or the cluster: no registers held, no extra DRAM traffic.
//       * misaligned rows of a contiguous x (odd widths), phased (their section below): moved
//         as the 16-byte vectors that cover them, y at the same phase as x, weight and bias put
//         together for a block's phase once. The forward takes them where they hold as many
//         rows in flight as the element kernels (fwd_v4_ph_pays): bf16 6145-7001 columns
//         0.77-0.84x copy against 0.59-0.63x; at 1023-4097 the element kernels keep more rows
//         in flight and stay (0.68-0.80x). The backward keeps the element kernels.
//       Costs: 71 kernels, 89 with the phased forward (dtype x elements a thread x load width
//       x lane stride: the cold build's nvcc time); sm_90 for the split (elsewhere rows too
//       wide for one block take v3's loop; so do rows wider than 8 x 8192); the ops take a
//       forcing `path` argument so that tests and scripts/sweep_layer_norm.py reach every
//       kernel (paths 1 and 2 take the phased forward wherever it runs).
//
// Backward versions (the same version number; forward vN pairs with backward vN):
//   dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy*xhat)),   xhat = (x - mean) * rstd
//   dw = sum_rows dy*xhat,   db = sum_rows dy
//   v1  one thread per row for dx (two walks over x and dy); dw/db by one thread per column
//       walking all M rows (coalesced across threads, but only N threads and x, dy read a
//       second time).
//   v2  one warp per row for dx (shuffles); dw/db in two stages: P chunks of rows x 256
//       columns, each thread summing its column over its chunk into a (P, N) fp32 buffer,
//       then a kernel summing the P partial rows. Deterministic (no atomics), many more
//       threads than v1. Costs: x and dy are still read twice (once for dx, once for dw/db):
//       5 tensor passes where 3 are needed.
//   v3  fused and persistent: P blocks (as many as fit on the GPU at once), each owning a
//       contiguous chunk of rows, hold w and their partial dw/db for their columns in
//       registers, load x and dy once per row with 16-byte loads, write dx, and accumulate
//       dy*xhat and dy on the way: 3 tensor passes, the floor; then the same second-stage
//       sum as v2. Both row reductions share one set of barriers (block_sum2). Costs: the
//       row must fit in registers (N <= 8192), rows aligned as for the forward: otherwise
//       v3's backward is v2's (said again in the launcher).
//   v4  v3's fused backward with v4's forward's shapes: lane groups (narrow rows: v3 gave a
//       32-lane block to a 64-wide row, one row at a time), a block (any alignment, element
//       loads where needed: misaligned or odd widths fell to v2, 0.3-0.4x), or a cluster of
//       blocks per row beyond 8192 (v3: v2 again, 0.14-0.36x at 12288-65536): the row's two
//       sums cross the cluster once per row, each block keeps dw/db partial sums for its own
//       columns, the cluster writes one partial row. Persistent like v3 (one wave of blocks
//       or clusters, counted by the occupancy API), weight re-read per row from L1 (held
//       across rows it cost registers), the next row's x and dy prefetched into L2. Costs:
//       as v4's forward; rows wider than 8 x 8192 take v2's kernels.
//   v5  v3's fused backward with R rows an iteration (rms_norm.cu's version 4, with layer
//       norm's two sums): a thread holds the same E columns of R rows, so its weight and
//       dw/db registers serve all R, the 2 R E loads of an iteration are issued before any
//       math, and one barrier (a double-buffered scratch) serves the 2 R row sums, where v3
//       keeps one row in flight and waits on three barriers a row. R = 4 at 8 elements a
//       thread (rows up to 4096 wide: R = 2 at two blocks an SM would spill), 1 at 16
//       (fp32 rows up to 8192 wide). Aligned rows of 256 columns or more only; elsewhere, and
//       for 16-bit rows wider than 4096, v5's backward is v4's. The default for the widths where v3 was
//       (layer_norm_plan.h ln_default_version). Measured: below.
//   v6  (forward and backward) v5, and for wide rows a ring of shared-memory buffers that the
//       copy engine fills rows ahead (fwd_v6_bulk / bwd_v6_bulk, their section below): one
//       thread asks TMA for the next rows' pieces (cp.async.bulk, counted in by mbarriers),
//       the threads read each piece from shared memory as often as the math needs, a row
//       wider than a buffer splits over a cluster. Versions 3-5 hold a row in registers, so
//       a block's next row cannot load until this row's sums have crossed its barriers;
//       here the next rows are always on their way. Misaligned rows (odd widths, views) are
//       copied with the 16-byte granules around them and read one element a load. Costs:
//       sm_90, shared memory (up to 3 blocks an SM), two more kernel pairs. Taken where
//       measured faster (layer_norm_plan.h ln_v6_bulk: aligned rows, forward past 12288
//       16-bit / 16384 fp32 columns, backward past 4096; misaligned rows past 8192 but fp32
//       backwards); the default for rows of 256 columns or more.
//       Its cluster sums push partials with st.async instead of meeting at a cluster
//       barrier (ClusterSum2, which v4's SPLIT now uses too): the barrier's fence waited
//       for the previous row's stores. reports/layer-norm-v6-2026-11-27/: bf16 16384 /
//       32768 / 65536 columns, forward 1.01 / 0.98 / 0.85-0.96x copy (v4 0.78 / 0.55 /
//       0.44), backward 0.85 / 0.83 / 0.67-0.78x (v4 with cluster barriers 0.58 / 0.53 /
//       0.50; with the pushed sums 0.84 / 0.79 / 0.73); misaligned bf16 8193 / 16385 / 32769
//       0.58 / 0.57 / 0.42 forward, 0.65 / 0.61 / 0.66 backward (v4 0.44 / 0.32 / 0.34,
//       0.56 / 0.52 / 0.51).
//
// Measured during development (H100, 16384 x 4096, kernel time with a primed queue, the figures
// of `levels bench`; not yet in a committed report under reports/; TB/s counts
// the bytes each direction must move: forward x + y, backward x + dy + dx):
//                  forward fp32       forward bf16       backward fp32      backward bf16
//   v1             0.28 TB/s  0.09x   0.15 TB/s  0.05x   0.15 TB/s  0.05x   0.07 TB/s  0.03x
//   v2             1.39 TB/s  0.47x   1.20 TB/s  0.42x   1.18 TB/s  0.40x   0.98 TB/s  0.34x
//   v3             2.93 TB/s  0.99x   2.83 TB/s  0.98x   2.64 TB/s  0.89x   2.11 TB/s  0.73x
//   (x = of a device copy's bandwidth, 2.96 TB/s fp32, 2.87 bf16; torch.compile in the same
//   run: forward 2.96 / 2.52 TB/s, backward 2.51 / 2.02 TB/s, so v3 is 0.99x / 1.12x of it
//   forward and 1.05x / 1.05x backward.)
//   v4 across 20 widths (reports/h100-sweep-layer-norm.json, bf16, fraction of copy, forward /
//   backward, v3 in the same run): the cliffs go (1023 columns 0.88 / 0.86, v3 0.29 / 0.41;
//   64: 0.92 / 0.73, v3 0.32 / 0.27; 4097: 0.52 / 0.64, v3 0.36 / 0.28; 16384 backward 0.66,
//   v3 0.30), but where v3 takes its fast path v4 is slower (8192 forward 0.41, v3 1.13:
//   not profiled yet), so the Python side runs v3 for 16-byte-aligned rows of
//   256-8192 columns and v4 elsewhere (layer_norm.py default_version). Still under 0.85x:
//   odd and very wide rows (4097, 16385, 32768-65536 columns: 0.34-0.66).
//   v5 (reports/layer-norm-v5-2026-11-27/): `levels bench` at 16384 x 4096, backward bf16
//   0.82-0.83x (v3 0.75x, v4 0.80x, Level 4 0.87x in the same runs), fp32 0.91x (v3 0.91x);
//   scripts/sweep_layer_norm.py, bf16 backward at 256-3072 columns 0.90-1.00x (v3 0.83-0.90x),
//   4096 0.80-0.92x over two runs (v3 0.73-0.84x); past 4096 in 16 bits its own kernel ran
//   0.78 / 0.81x at 5120 / 8192 against v4's 0.84 / 0.88x, so v5 hands those rows to v4's
//   backward. The forward is v3's (1.08-1.16x copy in bf16). Now the default where v3 was.
//
// As an exercise (`levels assignment build --levels cuda`, docs/grading.md "Level 5"): the
// solution regions marked below are the kernels version 3 runs (its register-row and loop
// forwards, its fused backward, and v2's backward kernels, which v3 falls back to for rows
// that are no whole number of 16-byte vectors), version 5's backward (bwd_v5_fused: the
// default's at those widths), and the row math of version 4, which the default runs at the
// other widths (fwd_v4_stats, fwd_v4_out, bwd_v4_row: what a thread does with its share of a
// row; v4's layouts, reductions and rule stay given). v1 and v2's forwards stay: the steps
// below the ones to write.
#include <cooperative_groups.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>

#include "common.cuh"
#include "layer_norm_plan.h"
#include "mbarrier.cuh"

namespace levels_layer_norm {

// ---- a candidate for common.cuh (Vec, vec_width and the launch helpers moved there) ----

// Two block-wide sums for the price of one set of barriers. `scratch` holds >= 32 float2;
// call from all threads of the block; every thread gets both totals.
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = (blockDim.x + 31) >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = make_float2(a, b);
  __syncthreads();
  float2 v = (threadIdx.x < n_warps) ? scratch[threadIdx.x] : make_float2(0.0f, 0.0f);
  if (warp == 0) {
    v.x = warp_sum(v.x);
    v.y = warp_sum(v.y);
  }
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
}

// ---- constants of the launch plans ----
constexpr int V1_THREADS = 128;       // v1: threads (= rows) per block
constexpr int V2_ROWS = 8;            // v2: warps (= rows) per block of 256 threads
constexpr int V3_WARP_E = 8;          // v3 forward, a warp per row: elements per lane
constexpr int V3_ROWS = 8;            // v3 forward, a warp per row: rows per block
constexpr int PARTIAL_THREADS = 256;  // v2 dw/db stage 1: columns per block
constexpr int SUM_COLS = 32;          // stage 2: columns per block ...
constexpr int SUM_LANES = 16;         // ... and partial rows summed in parallel per column
constexpr int64_t V3_FWD_MAX_N = 32 * 512;  // widest row v3's forward keeps in registers
constexpr int64_t V3_BWD_MAX_N = 16 * 512;  // ... and v3's backward

// =====================================================================================
// Forward
// =====================================================================================

// v1: thread `row` owns row `row`. Three walks; its neighbours walk rows stride_x apart.
template <typename T>
__global__ void fwd_v1(const T* __restrict__ x,        // (M, N), rows stride_x apart
                       const T* __restrict__ weight,   // (N,)
                       const T* __restrict__ bias,     // (N,)
                       T* __restrict__ y,              // (M, N) contiguous
                       float* __restrict__ mean_out,   // (M,)
                       float* __restrict__ rstd_out,   // (M,)
                       int64_t M, int64_t N, int64_t stride_x, float eps) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M) return;
  const T* xr = x + row * stride_x;
  float sum = 0.0f;
  for (int64_t i = 0; i < N; ++i) sum += to_f32(xr[i]);
  const float mean = sum / (float)N;
  float sq = 0.0f;
  for (int64_t i = 0; i < N; ++i) {
    const float d = to_f32(xr[i]) - mean;
    sq += d * d;
  }
  const float rstd = 1.0f / sqrtf(sq / (float)N + eps);
  T* yr = y + row * N;
  for (int64_t i = 0; i < N; ++i)
    yr[i] = from_f32<T>((to_f32(xr[i]) - mean) * rstd * to_f32(weight[i]) + to_f32(bias[i]));
  mean_out[row] = mean;
  rstd_out[row] = rstd;
}

// v2: warp `row` owns row `row`; lane l reads columns l, l+32, ... (one 128-byte line per
// load instruction in fp32). The early return is per warp, so every shuffle is full-warp.
template <typename T>
__global__ void fwd_v2(const T* __restrict__ x, const T* __restrict__ weight,
                       const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ mean_out,
                       float* __restrict__ rstd_out, int64_t M, int64_t N, int64_t stride_x,
                       float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= M) return;
  const T* xr = x + row * stride_x;
  float sum = 0.0f;
  for (int64_t i = lane; i < N; i += 32) sum += to_f32(xr[i]);
  const float mean = warp_sum(sum) / (float)N;
  float sq = 0.0f;
  for (int64_t i = lane; i < N; i += 32) {
    const float d = to_f32(xr[i]) - mean;
    sq += d * d;
  }
  const float rstd = 1.0f / sqrtf(warp_sum(sq) / (float)N + eps);
  T* yr = y + row * N;
  for (int64_t i = lane; i < N; i += 32)
    yr[i] = from_f32<T>((to_f32(xr[i]) - mean) * rstd * to_f32(weight[i]) + to_f32(bias[i]));
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// v3, row in registers. A "group" of threads owns one row: a warp (WARP_PER_ROW, blocks of
// V3_ROWS rows) or the whole block (blockDim.x threads, one row per block). Thread t of the
// group holds vectors t, t + G, t + 2G, ... (G = group size): each load instruction of a
// warp reads 32 adjacent 16-byte vectors, 512 contiguous bytes.
// Launcher guarantees: x, weight, bias, y 16-byte aligned; stride_x and N multiples of VEC;
// N <= E * G.
template <typename T, int E, bool WARP_PER_ROW, int MAX_THREADS>
__global__ void __launch_bounds__(MAX_THREADS)
fwd_v3_registers(const T* __restrict__ x, const T* __restrict__ weight,
                 const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ mean_out,
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
    if (row >= M) return;  // whole warps leave; this variant has no block barrier
    t = threadIdx.x & 31;
    G = 32;
  } else {
    row = blockIdx.x;
    t = threadIdx.x;
    G = blockDim.x;
  }
  auto row_sum = [&](float v) {
    if constexpr (WARP_PER_ROW) return warp_sum(v);
    else return block_sum(v, scratch);
  };

  // ### BEGIN SOLUTION
  const int64_t n_vec = N / VEC;
  const V* xr = reinterpret_cast<const V*>(x + row * stride_x);
  float v[E];
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
      const V in = xr[k];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[c * VEC + j] = to_f32(in.v[j]);
        sum += v[c * VEC + j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[c * VEC + j] = 0.0f;
    }
  }
  const float mean = row_sum(sum) / (float)N;
  float sq = 0.0f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    if ((int64_t)c * G + t < n_vec) {  // padding lanes hold 0, not x - mean: keep them out
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = v[c * VEC + j] - mean;
        sq += d * d;
      }
    }
  }
  const float rstd = 1.0f / sqrtf(row_sum(sq) / (float)N + eps);

  // weight and bias are loaded here, after the reductions, not with x: loading them early
  // (to overlap their L2 latency with x's) was tried for bf16 and measured 0.66x copy
  // instead of 0.90x at 16384x4096: 43 registers instead of 32 halved the blocks per SM.
  const V* wv = reinterpret_cast<const V*>(weight);
  const V* bv = reinterpret_cast<const V*>(bias);
  V* yr = reinterpret_cast<V*>(y + row * N);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
      const V wk = wv[k], bk = bv[k];
      V out;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        out.v[j] = from_f32<T>((v[c * VEC + j] - mean) * rstd * to_f32(wk.v[j]) + to_f32(bk.v[j]));
      yr[k] = out;
    }
  }
  if (t == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  // ### END SOLUTION
}

// v3's fallback for rows it cannot hold or cannot load by vectors: one block per row, the
// row walked three times (the 2nd and 3rd mostly from L1/L2), VEC elements per load (VEC =
// 16 bytes when aligned, 1 otherwise). Any N, any row stride.
template <typename T, int VEC>
__global__ void fwd_v3_loop(const T* __restrict__ x, const T* __restrict__ weight,
                            const T* __restrict__ bias, T* __restrict__ y,
                            float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t M,
                            int64_t N, int64_t stride_x, float eps) {
  using V = Vec<T, VEC>;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  // ### BEGIN SOLUTION
  const int64_t n_vec = N / VEC;  // launcher: N % VEC == 0
  const V* xr = reinterpret_cast<const V*>(x + row * stride_x);
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < n_vec; k += blockDim.x) {
    const V in = xr[k];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += to_f32(in.v[j]);
  }
  const float mean = block_sum(sum, scratch) / (float)N;
  float sq = 0.0f;
  for (int64_t k = threadIdx.x; k < n_vec; k += blockDim.x) {
    const V in = xr[k];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = to_f32(in.v[j]) - mean;
      sq += d * d;
    }
  }
  const float rstd = 1.0f / sqrtf(block_sum(sq, scratch) / (float)N + eps);
  const V* wv = reinterpret_cast<const V*>(weight);
  const V* bv = reinterpret_cast<const V*>(bias);
  V* yr = reinterpret_cast<V*>(y + row * N);
  for (int64_t k = threadIdx.x; k < n_vec; k += blockDim.x) {
    const V in = xr[k], wk = wv[k], bk = bv[k];
    V out;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      out.v[j] = from_f32<T>((to_f32(in.v[j]) - mean) * rstd * to_f32(wk.v[j]) + to_f32(bk.v[j]));
    yr[k] = out;
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  // ### END SOLUTION
}

// =====================================================================================
// Backward
// =====================================================================================

// v1 dx: thread `row` owns row `row`; first walk: the two row sums, second walk: dx.
template <typename T>
__global__ void bwd_dx_v1(const T* __restrict__ dy,       // (M, N), rows stride_dy apart
                          const T* __restrict__ x,        // (M, N), rows stride_x apart
                          const T* __restrict__ weight,   // (N,)
                          const float* __restrict__ mean, const float* __restrict__ rstd,  // (M,)
                          T* __restrict__ dx,             // (M, N) contiguous
                          int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M) return;
  const T* xr = x + row * stride_x;
  const T* dyr = dy + row * stride_dy;
  const float mu = mean[row], rs = rstd[row];
  float c1 = 0.0f, c2 = 0.0f;
  for (int64_t i = 0; i < N; ++i) {
    const float xhat = (to_f32(xr[i]) - mu) * rs, wdy = to_f32(weight[i]) * to_f32(dyr[i]);
    c1 += xhat * wdy;
    c2 += wdy;
  }
  c1 /= (float)N;
  c2 /= (float)N;
  T* dxr = dx + row * N;
  for (int64_t i = 0; i < N; ++i) {
    const float xhat = (to_f32(xr[i]) - mu) * rs, wdy = to_f32(weight[i]) * to_f32(dyr[i]);
    dxr[i] = from_f32<T>((wdy - xhat * c1 - c2) * rs);
  }
}

// v1 dw/db: thread `col` walks column `col` down all M rows (adjacent threads read
// adjacent columns: coalesced), recomputing xhat from x, mean and rstd.
template <typename T>
__global__ void bwd_dwdb_v1(const T* __restrict__ dy, const T* __restrict__ x,
                            const float* __restrict__ mean, const float* __restrict__ rstd,
                            T* __restrict__ dweight, T* __restrict__ dbias,  // (N,)
                            int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float dw = 0.0f, db = 0.0f;
  for (int64_t m = 0; m < M; ++m) {
    const float g = to_f32(dy[m * stride_dy + col]);
    dw += g * (to_f32(x[m * stride_x + col]) - mean[m]) * rstd[m];
    db += g;
  }
  dweight[col] = from_f32<T>(dw);
  dbias[col] = from_f32<T>(db);
}

// v2 dx: warp `row` owns row `row`, lanes stride over it, the two sums by shuffles.
template <typename T>
__global__ void bwd_dx_v2(const T* __restrict__ dy, const T* __restrict__ x,
                          const T* __restrict__ weight, const float* __restrict__ mean,
                          const float* __restrict__ rstd, T* __restrict__ dx, int64_t M, int64_t N,
                          int64_t stride_dy, int64_t stride_x) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= M) return;  // per warp
  // ### BEGIN SOLUTION
  const T* xr = x + row * stride_x;
  const T* dyr = dy + row * stride_dy;
  const float mu = mean[row], rs = rstd[row];
  float c1 = 0.0f, c2 = 0.0f;
  for (int64_t i = lane; i < N; i += 32) {
    const float xhat = (to_f32(xr[i]) - mu) * rs, wdy = to_f32(weight[i]) * to_f32(dyr[i]);
    c1 += xhat * wdy;
    c2 += wdy;
  }
  c1 = warp_sum(c1) / (float)N;
  c2 = warp_sum(c2) / (float)N;
  T* dxr = dx + row * N;
  for (int64_t i = lane; i < N; i += 32) {
    const float xhat = (to_f32(xr[i]) - mu) * rs, wdy = to_f32(weight[i]) * to_f32(dyr[i]);
    dxr[i] = from_f32<T>((wdy - xhat * c1 - c2) * rs);
  }
  // ### END SOLUTION
}

// v2 dw/db, stage 1: block (blockIdx.x, p) sums columns [256 blockIdx.x, +256) over rows
// [p * rows_per_chunk, +rows_per_chunk) into partial row p of the (P, N) fp32 buffers.
template <typename T>
__global__ void bwd_dwdb_partial_v2(const T* __restrict__ dy, const T* __restrict__ x,
                                    const float* __restrict__ mean,
                                    const float* __restrict__ rstd,
                                    float* __restrict__ part_dw,  // (P, N) contiguous
                                    float* __restrict__ part_db,  // (P, N) contiguous
                                    int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x,
                                    int64_t rows_per_chunk) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= N) return;
  const int64_t p = blockIdx.y;
  const int64_t first = p * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < M ? first + rows_per_chunk : M;
  // ### BEGIN SOLUTION
  float dw = 0.0f, db = 0.0f;
  for (int64_t m = first; m < last; ++m) {
    const float g = to_f32(dy[m * stride_dy + col]);
    dw += g * (to_f32(x[m * stride_x + col]) - mean[m]) * rstd[m];
    db += g;
  }
  part_dw[p * N + col] = dw;
  part_db[p * N + col] = db;
  // ### END SOLUTION
}

// Stage 2 (v2 and v3): dweight[n] = sum_p part_dw[p, n] (and dbias). A block owns 32
// columns; its 16 rows of threads each sum every 16th partial row (a warp reads 128
// contiguous bytes), then the 16 sums of a column are added through shared memory.
template <typename T>
__global__ void sum_partials(const float* __restrict__ part_dw, const float* __restrict__ part_db,
                             T* __restrict__ dweight, T* __restrict__ dbias, int64_t P,
                             int64_t N) {
  __shared__ float s_dw[SUM_LANES][SUM_COLS + 1];
  __shared__ float s_db[SUM_LANES][SUM_COLS + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = (int64_t)blockIdx.x * SUM_COLS + tx;
  float dw = 0.0f, db = 0.0f;
  if (col < N) {
    for (int64_t p = ty; p < P; p += SUM_LANES) {
      dw += part_dw[p * N + col];
      db += part_db[p * N + col];
    }
  }
  s_dw[ty][tx] = dw;
  s_db[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && col < N) {
    for (int i = 1; i < SUM_LANES; ++i) {
      dw += s_dw[i][tx];
      db += s_db[i][tx];
    }
    dweight[col] = from_f32<T>(dw);
    dbias[col] = from_f32<T>(db);
  }
}

// v3, fused and persistent: block b owns rows [b * rows_per_block, +rows_per_block) and
// columns' vectors t, t + G, ... (G = blockDim.x), keeps weight and its dw/db partials for
// those columns in registers across all its rows, and writes the partials once at the end.
// x, dy and w stay in registers as loaded (16-bit types packed two to a register: half the
// registers of fp32 copies; ptxas spilled the bf16 kernel at 64 registers when they were
// widened up front), and are widened where used.
// Launcher guarantees: dy, x, weight, dx 16-byte aligned; stride_dy, stride_x, N multiples of
// VEC; N <= E * blockDim.x; part_dw/part_db hold gridDim.x rows of N floats.
template <typename T, int E, int MIN_BLOCKS>
__global__ void __launch_bounds__(512, MIN_BLOCKS)
bwd_v3_fused(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
             const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
             float* __restrict__ part_dw, float* __restrict__ part_db, int64_t M, int64_t N,
             int64_t stride_dy, int64_t stride_x, int64_t rows_per_block) {
  constexpr int VEC = vec_width<T>();
  constexpr int CHUNKS = E / VEC;
  static_assert(E % VEC == 0, "a thread holds whole vectors");
  using V = Vec<T, VEC>;
  __shared__ float2 scratch[32];
  const int t = threadIdx.x, G = blockDim.x;
  const int64_t n_vec = N / VEC;

  // ### BEGIN SOLUTION
  // Padding lanes (k >= n_vec) hold w = 0 and dy = 0: they add nothing to any sum, and
  // their dx is never stored.
  V zero;
#pragma unroll
  for (int j = 0; j < VEC; ++j) zero.v[j] = from_f32<T>(0.0f);
  V w[CHUNKS];
  float dw[E], db[E];
  const V* wv = reinterpret_cast<const V*>(weight);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    w[c] = k < n_vec ? wv[k] : zero;
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[c * VEC + j] = db[c * VEC + j] = 0.0f;
  }

  const int64_t first = (int64_t)blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < M ? first + rows_per_block : M;
#pragma unroll 1
  for (int64_t row = first; row < last; ++row) {  // the same trip count for the whole block
    const V* xr = reinterpret_cast<const V*>(x + row * stride_x);
    const V* dyr = reinterpret_cast<const V*>(dy + row * stride_dy);
    const float mu = mean[row], rs = rstd[row];
    V xk[CHUNKS], gk[CHUNKS];
    float c1 = 0.0f, c2 = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int64_t k = (int64_t)c * G + t;
      xk[c] = k < n_vec ? xr[k] : zero;
      gk[c] = k < n_vec ? dyr[k] : zero;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float wdy = to_f32(w[c].v[j]) * to_f32(gk[c].v[j]);
        c1 += (to_f32(xk[c].v[j]) - mu) * rs * wdy;
        c2 += wdy;
      }
    }
    const float2 sums = block_sum2(c1, c2, scratch);
    c1 = sums.x / (float)N;
    c2 = sums.y / (float)N;
    V* dxr = reinterpret_cast<V*>(dx + row * N);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      V out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int e = c * VEC + j;
        const float xhat = (to_f32(xk[c].v[j]) - mu) * rs, g = to_f32(gk[c].v[j]);
        out.v[j] = from_f32<T>((to_f32(w[c].v[j]) * g - xhat * c1 - c2) * rs);
        dw[e] += g * xhat;
        db[e] += g;
      }
      const int64_t k = (int64_t)c * G + t;
      if (k < n_vec) dxr[k] = out;
    }
  }

  float* pdw = part_dw + (int64_t)blockIdx.x * N;
  float* pdb = part_db + (int64_t)blockIdx.x * N;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        pdw[k * VEC + j] = dw[c * VEC + j];
        pdb[k * VEC + j] = db[c * VEC + j];
      }
    }
  }
  // ### END SOLUTION
}

// v5's backward: v3's fused persistent backward with R rows an iteration (rms_norm.cu's
// version 4, with layer norm's two row sums). A thread holds the same E columns of R rows:
// its weight and dw/db partials (registers) serve all R, the 2 R E loads of an iteration are
// issued before any math, and ONE barrier serves the 2 R row sums (each warp's sums go to a
// double-buffered scratch; the next iteration writes the other half, so no second barrier
// guards the reads). v3 has one row in flight per block and three barriers a row.
// Costs: 2 R E elements of registers a thread (R E <= 32 at most: wider plans spill);
// rows_per_block a multiple of R (the launcher's), so only the last block has a ragged
// iteration (masked rows: rstd 0, loads skipped, no store).
// Launcher guarantees: as v3's; blockDim.x a multiple of 32.
template <typename T, int E, int R, int MIN_BLOCKS>
__global__ void __launch_bounds__(512, MIN_BLOCKS)
bwd_v5_fused(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
             const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
             float* __restrict__ part_dw, float* __restrict__ part_db, int64_t M, int64_t N,
             int64_t stride_dy, int64_t stride_x, int64_t rows_per_block) {
  constexpr int VEC = vec_width<T>();
  constexpr int CHUNKS = E / VEC;
  static_assert(E % VEC == 0, "a thread holds whole vectors");
  using V = Vec<T, VEC>;
  __shared__ float2 red[2][R][32];  // [parity][row of the iteration][warp]: (c1, c2)
  const int t = threadIdx.x, G = blockDim.x, lane = t & 31, warp = t >> 5, n_warps = G >> 5;
  const int64_t n_vec = N / VEC;
  const float inv_n = 1.0f / (float)N;

  // ### BEGIN SOLUTION
  V zero;
#pragma unroll
  for (int j = 0; j < VEC; ++j) zero.v[j] = from_f32<T>(0.0f);
  V w[CHUNKS];
  float dw[E], db[E];
  const V* wv = reinterpret_cast<const V*>(weight);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    w[c] = k < n_vec ? wv[k] : zero;
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[c * VEC + j] = db[c * VEC + j] = 0.0f;
  }
  const int64_t first = (int64_t)blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < M ? first + rows_per_block : M;
  int parity = 0;
#pragma unroll 1
  for (int64_t row0 = first; row0 < last; row0 += R) {  // the same trip count block-wide
    V xk[R][CHUNKS], gk[R][CHUNKS];
    float mu[R], rs[R];
    // Inline, each row's statistics loaded beside its row: the same loads through
    // common.cuh's load_rows (statistics after all the rows) ran 0.79x copy in bf16 at
    // 16384 x 4096 against 0.82-0.83x (reports/layer-norm-v5-2026-11-27/).
#pragma unroll
    for (int r = 0; r < R; ++r) {  // every load of the iteration issued before any math
      const bool live = row0 + r < last;  // else: zeros and rstd 0, nothing loaded
      const int64_t row = live ? row0 + r : first;
      const V* xr = reinterpret_cast<const V*>(x + row * stride_x);
      const V* dyr = reinterpret_cast<const V*>(dy + row * stride_dy);
      mu[r] = live ? mean[row] : 0.0f;
      rs[r] = live ? rstd[row] : 0.0f;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        const int64_t k = (int64_t)c * G + t;
        xk[r][c] = live && k < n_vec ? xr[k] : zero;
        gk[r][c] = live && k < n_vec ? dyr[k] : zero;
      }
    }
    float c1[R], c2[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float wdy = to_f32(w[c].v[j]) * to_f32(gk[r][c].v[j]);
          s1 += (to_f32(xk[r][c].v[j]) - mu[r]) * wdy;
          s2 += wdy;
        }
      s1 = warp_sum(s1);
      s2 = warp_sum(s2);
      if (lane == 0) red[parity][r][warp] = make_float2(s1, s2);
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {  // each warp adds the n_warps partial sums by shuffles
      const float2 v = lane < n_warps ? red[parity][r][lane] : make_float2(0.0f, 0.0f);
      c1[r] = warp_sum(v.x) * rs[r] * inv_n;  // mean(w dy xhat)
      c2[r] = warp_sum(v.y) * inv_n;          // mean(w dy)
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
          const int e = c * VEC + j;
          const float xhat = (to_f32(xk[r][c].v[j]) - mu[r]) * rs[r], g = to_f32(gk[r][c].v[j]);
          out.v[j] = from_f32<T>((to_f32(w[c].v[j]) * g - xhat * c1[r] - c2[r]) * rs[r]);
          dw[e] += g * xhat;  // a masked row adds 0 (dy and rstd are 0)
          db[e] += g;
        }
        const int64_t k = (int64_t)c * G + t;
        if (row0 + r < last && k < n_vec) dxr[k] = out;
      }
    }
  }

  float* pdw = part_dw + (int64_t)blockIdx.x * N;
  float* pdb = part_db + (int64_t)blockIdx.x * N;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        pdw[k * VEC + j] = dw[c * VEC + j];
        pdb[k * VEC + j] = db[c * VEC + j];
      }
    }
  }
  // ### END SOLUTION
}

// =====================================================================================
// Version 4: the kernel chosen by a rule (layer_norm_plan.h), no width left to a slow loop
// =====================================================================================

// A thread's share of a row (or of a SPLIT block's seg columns): CH loads of VEC elements,
// VEC = 16 bytes' worth (VECT) or 1, at vector indices first, first + S, first + 2S, ...
// S is a compile-time stride, so every address is one register plus an immediate offset
// (with a runtime stride ptxas kept a 64-bit address per load: 100+ registers for 16
// elements). Columns at or past `n` are never read or written and hold zero; n is a
// multiple of VEC when VECT (the launcher's rule), so a load is all in or all out.
//   group mode (S lanes a row, S <= 32): first = lane in the group; a warp instruction
//     reads 32/S rows' S adjacent vectors.
//   block mode (S = 32, the block's warps share a row): first = warp * 32 * CH + lane; a
//     warp owns 32 * CH adjacent vectors and each of its instructions reads 32 of them.
template <typename T, int E, bool VECT, int S>
struct RowPart {
  static constexpr int VEC = VECT ? vec_width<T>() : 1;
  static constexpr int CH = E / VEC;
  static constexpr int STRIDE = S;
  static_assert(E % VEC == 0, "a thread holds whole vectors");
  using V = Vec<T, VEC>;
  using Elem = T;
  V v[CH];

  __device__ __forceinline__ static int col(int first, int c) { return (first + c * S) * VEC; }
  __device__ __forceinline__ static bool in(int first, int c, int n) { return col(first, c) < n; }

  __device__ __forceinline__ void load(const T* __restrict__ p, int first, int n) {
    const V* q = reinterpret_cast<const V*>(p) + first;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (in(first, c, n)) {
        v[c] = q[c * S];
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[c].v[j] = from_f32<T>(0.0f);
      }
    }
  }
  __device__ __forceinline__ float f(int c, int j) const { return to_f32(v[c].v[j]); }
  __device__ __forceinline__ static void put(T* p, int first, int c, const V& value) {
    (reinterpret_cast<V*>(p) + first)[c * S] = value;
  }
};

// Which row of the block's R a thread works on, where its share starts, how its row adds.
template <int S, int CH>
struct RowLanes {
  int g, first;
  int t, count;  // this thread's index among the threads of its row, and their number
  bool block_mode;
  __device__ __forceinline__ explicit RowLanes(int R) {
    block_mode = S == 32 && R == 1 && blockDim.x > 32;
    if (block_mode) {
      g = 0;
      first = (int)(threadIdx.x >> 5) * 32 * CH + (int)(threadIdx.x & 31);
      t = (int)threadIdx.x;
      count = (int)blockDim.x;
    } else {
      g = (int)threadIdx.x / S;
      first = (int)threadIdx.x % S;
      t = first;
      count = S;
    }
  }
};

// The two sums of a row over the S lanes that share it (lanes of a group adjacent inside
// one warp): xor shuffles never leave the group, every lane ends with the same bits
// (a + b == b + a), no barrier. Every lane of the warp calls it.
template <int S>
__device__ __forceinline__ float2 group_sum2(float a, float b) {
#pragma unroll
  for (int off = S >> 1; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  return make_float2(a, b);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LEVELS_LN_CLUSTERS 1
// The two sums of a row split over the blocks of a cluster. Each block adds its part
// (block_sum2), then threads 0..C-1 push it into every block's inbox (slot `rank`) through
// distributed shared memory with st.async, whose bytes count off the receiver's mbarrier;
// each block waits on its own barrier and adds the C values in rank order: the same bits in
// every block of the cluster. Rounds alternate between two inboxes and two barriers: a
// block pushes round r + 2 only after round r + 1 completed, which needs every block's push
// of round r + 1, sent after that block had read round r.
// Why not a cluster barrier (version 4 did: slot, cluster.sync, read the peers' slots): the
// barrier's release is a memory fence that waits for the thread's earlier stores to reach
// L2, the previous row's output included. ncu on version 6's first kernels: "membar" the
// largest stall (5.2 cycles an instruction forward, 2.3 backward), 0.52-0.66x copy.
// A cluster of one block (C == 1) is a block: block_sum2 alone.
struct ClusterInbox {
  float2 box[2][LN_MAX_CLUSTER];
  uint64_t bar[2];
};

struct ClusterSum2 {
  ClusterInbox* in;
  float2* scratch;
  int C;
  uint32_t rank;
  int round;
  // Every thread of every block of the cluster, once, before the first round.
  __device__ __forceinline__ ClusterSum2(ClusterInbox* inbox, float2* scratch_)
      : in(inbox), scratch(scratch_), round(0) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    C = (int)cluster.num_blocks();
    rank = cluster.block_rank();
    if (threadIdx.x == 0) {
      levels_mbarrier::mbar_init(&in->bar[0], 1);
      levels_mbarrier::mbar_init(&in->bar[1], 1);
      levels_mbarrier::mbar_init_fence();
    }
    cluster.sync();  // every block's barriers exist before anyone pushes to them
  }
  __device__ __forceinline__ float2 operator()(float a, float b) {
    const float2 mine = block_sum2(a, b, scratch);
    if (C == 1) return mine;
    const int buf = round & 1, parity = (round >> 1) & 1;
    ++round;
    if (threadIdx.x == 0) levels_mbarrier::mbar_expect_tx(&in->bar[buf], (uint32_t)(C * sizeof(float2)));
    if ((int)threadIdx.x < C)
      levels_mbarrier::push_f32x2(&in->box[buf][rank], &in->bar[buf], threadIdx.x, mine.x, mine.y);
    levels_mbarrier::mbar_wait(&in->bar[buf], parity);
    float2 total = in->box[buf][0];
    for (int r = 1; r < C; ++r) {
      total.x += in->box[buf][r].x;
      total.y += in->box[buf][r].y;
    }
    return total;
  }
};
#endif

// Asks L2 for n elements at p, one prefetch per 128-byte line, spread over `lanes` threads
// (t = this thread's index among them). The kernels below call it for the NEXT row right
// after loading this one: while this row's sums cross the lanes (a barrier in block mode,
// a cluster barrier in SPLIT), the next row's bytes travel from DRAM, and its loads then hit
// L2. No registers held, no extra DRAM traffic (the bytes are read anyway); a hint only.
template <typename T>
__device__ __forceinline__ void prefetch_l2(const T* p, int64_t n, int t, int lanes) {
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = n * (int64_t)sizeof(T);
  for (int64_t off = (int64_t)t * 128; off < bytes; off += (int64_t)lanes * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

// A row's mean and rstd from the thread's share xr and `total(value, k)`, the row's sum of
// every thread's value (k: which of the two sums). `own(c, j)`: element j of vector c is one
// of the row's columns (else it holds 0: padding, or a neighbour row's element the phased
// kernels zeroed).
template <typename P, typename Total, typename Own>
__device__ __forceinline__ float2 fwd_v4_stats(const P& xr, int N, float eps, Total total, Own own) {
  float2 stats = make_float2(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000));
  // ### BEGIN SOLUTION
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < P::CH; ++c)
#pragma unroll
    for (int j = 0; j < P::VEC; ++j) s += xr.f(c, j);
  const float mean = total(s, 0) / (float)N;
  float sq = 0.0f;
#pragma unroll
  for (int c = 0; c < P::CH; ++c)
#pragma unroll
    for (int j = 0; j < P::VEC; ++j) {
      if (!own(c, j)) continue;  // padding holds 0, not the mean: keep it out
      const float d = xr.f(c, j) - mean;
      sq += d * d;
    }
  stats = make_float2(mean, 1.0f / sqrtf(total(sq, 1) / (float)N + eps));
  // ### END SOLUTION
  return stats;  // (mean, rstd); NaN until the lines between the markers are written
}

// y for the thread's columns. `fetch(c, wk, bk)` gives vector c's weight and bias (false:
// the vector is not this share's, skip it); `put(c, out)` stores vector c of y. weight and
// bias are loaded chunk by chunk beside the store that uses them: loaded as a whole share up
// front, ptxas issued all their loads at once and held them in registers (119 registers at
// 32 fp32 a thread: fewer rows in flight per SM). They are the same columns for every row,
// so these loads hit L1.
template <typename P, typename T, typename Fetch, typename Put>
__device__ __forceinline__ void fwd_v4_out(const P& xr, float mean, float rstd, Fetch fetch, Put put) {
  // ### BEGIN SOLUTION
#pragma unroll
  for (int c = 0; c < P::CH; ++c) {
    typename P::V wk, bk;
    if (!fetch(c, wk, bk)) continue;
    typename P::V out;
#pragma unroll
    for (int j = 0; j < P::VEC; ++j)
      out.v[j] = from_f32<T>((xr.f(c, j) - mean) * rstd * to_f32(wk.v[j]) + to_f32(bk.v[j]));
    put(c, out);
  }
  // ### END SOLUTION
}

// fwd_v4_out's weight, bias and y for an aligned share: vector c at the share's own place.
template <typename P, typename T>
__device__ __forceinline__ void fwd_v4_out(T* __restrict__ y, const P& xr,
                                           const T* __restrict__ weight,
                                           const T* __restrict__ bias, int first, int n,
                                           float mean, float rstd) {
  using V = typename P::V;
  const V* wq = reinterpret_cast<const V*>(weight) + first;
  const V* bq = reinterpret_cast<const V*>(bias) + first;
  fwd_v4_out<P, T>(
      xr, mean, rstd,
      [&](int c, V& wk, V& bk) {
        if (!P::in(first, c, n)) return false;
        wk = wq[c * P::STRIDE];
        bk = bq[c * P::STRIDE];
        return true;
      },
      [&](int c, const V& out) { P::put(y, first, c, out); });
}

// The share's own elements when its vectors are all in or all out (aligned rows, element loads).
template <typename P>
struct OwnVectors {
  int first, n;
  __device__ __forceinline__ bool operator()(int c, int) const { return P::in(first, c, n); }
};

// Blocks per SM the ROWS kernels are compiled for (ptxas caps registers to fit them):
// groups (256 threads) 3, a block per row of 8 elements a thread 2 (of up to 512 threads,
// so that a row's barriers overlap another row's loads), wider 1. Without the bound ptxas
// picked caps of its own and spilled a few bytes.
constexpr int ln_min_blocks(int S, int E) { return S < 32 ? 3 : (E <= 8 ? 2 : 1); }
// The forward by elements (misaligned or odd widths) at 16 a thread: two 512-thread blocks'
// worth of registers (<= 64 a thread), so that a row of 257-512 threads (4097-8192 columns)
// gets three blocks an SM. At 1 ptxas took 78 registers, two blocks of 288 threads fit an
// SM (ncu, bf16 4097 columns: 28% occupancy, DRAM 45%, 0.59x copy).
constexpr int ln_fwd_min_blocks(int S, int E, bool vect) {
  return S == 32 && E == 16 && !vect ? 2 : ln_min_blocks(S, E);
}

// v4 forward, ROWS: a row in the registers of its threads: S lanes of a warp (group mode, R
// = blockDim.x / S rows a block) or the whole block (block mode, S = 32, R = 1). Blocks
// stride over the rows (the grid is capped) and every thread runs the same number of
// iterations, so shuffles and barriers stay uniform: a group whose row is past M works on
// zeros and stores nothing.
// Launcher guarantees: (VECT) x, weight, bias, y 16-byte aligned, stride_x and N multiples
// of VEC; N <= E * (threads of a row); group mode blockDim.x == S * R, block mode S == 32.
template <typename T, int E, bool VECT, int S>
__global__ void __launch_bounds__(S < 32 ? LN_GROUP_BLOCK : LN_MAX_THREADS, ln_fwd_min_blocks(S, E, VECT))
fwd_v4_rows(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
            T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
            int64_t M, int N, int64_t stride_x, float eps, int R) {
  using P = RowPart<T, E, VECT, S>;
  __shared__ float2 scratch[32];
  const RowLanes<S, P::CH> lanes(R);
  const int first = lanes.first;
  auto total = [&](float v, int) {
    return lanes.block_mode ? block_sum2(v, 0.0f, scratch).x : group_sum2<S>(v, 0.0f).x;
  };
#pragma unroll 1  // one row at a time: an unrolled copy would double the registers
  for (int64_t base = (int64_t)blockIdx.x * R; base < M; base += (int64_t)gridDim.x * R) {
    const int64_t row = base + lanes.g;
    const bool live = row < M;
    const int n = live ? N : 0;  // a group past the last row loads and stores nothing
    const int64_t r = live ? row : base;
    P xr;
    xr.load(x + r * stride_x, first, n);
    const int64_t next = row + (int64_t)gridDim.x * R;
    if (next < M) prefetch_l2(x + next * stride_x, N, lanes.t, lanes.count);
    const float2 stats = fwd_v4_stats(xr, N, eps, total, OwnVectors<P>{first, n});
    fwd_v4_out(y + r * (int64_t)N, xr, weight, bias, first, n, stats.x, stats.y);
    if (live && first == 0) {
      mean_out[row] = stats.x;
      rstd_out[row] = stats.y;
    }
  }
}

// v4 forward, SPLIT (sm_90): a cluster of C = gridDim.x blocks per row, block `rank` holding
// columns [rank * seg, +seg) in registers (block mode); clusters stride over the rows
// (gridDim.y of them, the same rows for every block of a cluster).
// Launcher guarantees: clusters of (gridDim.x, 1, 1); (VECT) as fwd_v4_rows and seg a
// multiple of VEC; seg <= E * blockDim.x, blockDim.x a multiple of 32.
template <typename T, int E, bool VECT>
__global__ void __launch_bounds__(512)
fwd_v4_split(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
             T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
             int64_t M, int N, int64_t stride_x, float eps, int seg) {
#ifdef LEVELS_LN_CLUSTERS
  using P = RowPart<T, E, VECT, 32>;
  __shared__ float2 scratch[32];
  __shared__ ClusterInbox inbox;
  const int first = (int)(threadIdx.x >> 5) * 32 * P::CH + (int)(threadIdx.x & 31);
  const int col0 = (int)blockIdx.x * seg;
  const int rest = N - col0;
  const int n = rest < 0 ? 0 : (rest < seg ? rest : seg);
  ClusterSum2 sums(&inbox, scratch);
  auto total = [&](float v, int) { return sums(v, 0.0f).x; };
#pragma unroll 1
  for (int64_t row = blockIdx.y; row < M; row += gridDim.y) {
    P xr;
    xr.load(x + row * stride_x + col0, first, n);
    if (row + gridDim.y < M)
      prefetch_l2(x + (row + gridDim.y) * stride_x + col0, n, threadIdx.x, blockDim.x);
    const float2 stats = fwd_v4_stats(xr, N, eps, total, OwnVectors<P>{first, n});
    fwd_v4_out(y + row * (int64_t)N + col0, xr, weight + col0, bias + col0, first, n, stats.x,
               stats.y);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      mean_out[row] = stats.x;
      rstd_out[row] = stats.y;
    }
  }
  cooperative_groups::this_cluster().sync();  // no block leaves while a peer may still push to it
#endif
}

// ---- version 4, phased: misaligned rows moved as the 16-byte vectors that cover them ----
// An odd width puts every row at its own offset from a 16-byte boundary (bf16, N = 4097: row
// r starts r mod 8 elements past one), so the kernels above read such rows one element a
// load: 8 (16-bit) or 4 (fp32) times the load and store instructions of a 16-byte vector,
// and at 4097 columns the forward stopped at 0.68x copy. But y is laid out like x whenever x
// is contiguous (or its row stride keeps every row's offset: the launcher checks), so row r
// of x and row r of y start at the same phase ph (elements past a 16-byte boundary). A
// thread can then move the row as the aligned vectors that cover [row - ph, row + N): a
// vector straddling either end holds a neighbour row's elements, which are zeroed after the
// load (kept out of both sums) and never stored (those two vectors store element by
// element). Only weight and bias sit at another phase, the same for every row of phase ph:
// a block takes the rows of one phase (rows r with r mod K = its class, K = VEC: rows K apart
// are 16 x stride bytes apart), puts each vector of weight and bias together once from the
// two aligned vectors around it (shifted_vec) and keeps them in shared memory for all its
// rows. What it costs: a row's span is N + VEC - 1 columns (one more vector, sometimes one
// more warp), the masks, element stores at a row's two ends, shared memory, a persistent
// grid, and 18 kernels of their own (the aligned kernels' code is unchanged). What it
// measured: it wins only where it holds as many rows in flight as the element kernel
// (fwd_v4_ph_pays, the rule for the forward; the backward keeps the element kernels, whose
// phased form lost at every 16-bit width: reports/phased-rows-and-bands-2026-11-27/). Eligible
// rows: x and y agree in phase, weight and bias aligned (layer_norm_plan.h ln_rows_phased);
// a view whose rows sit at other phases than y's (x[:, 1:]) takes the element kernels.

// out[j] = (a ++ b)[VEC + j - PH]: the VEC elements PH before b's first.
template <typename T, int VEC, int PH>
__device__ __forceinline__ Vec<T, VEC> shift_pick(const Vec<T, VEC>& a, const Vec<T, VEC>& b) {
  Vec<T, VEC> out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) out.v[j] = j < PH ? a.v[VEC + j - PH] : b.v[j - PH];
  return out;
}

// Elements w[e0 + j - ph], j < VEC, of a 16-byte aligned w of n elements (e0 a multiple of
// VEC, 0 <= ph < VEC), from the aligned vectors at e0 - VEC and e0. Lanes whose element
// falls outside [0, n) hold whatever was there: the callers never store them.
template <typename T>
__device__ __forceinline__ Vec<T, vec_width<T>()> shifted_vec(const T* __restrict__ w, int e0, int ph,
                                                              int n) {
  constexpr int VEC = vec_width<T>();
  using V = Vec<T, VEC>;
  const V* q = reinterpret_cast<const V*>(w) + e0 / VEC;
  V a, b;
#pragma unroll
  for (int j = 0; j < VEC; ++j) a.v[j] = b.v[j] = from_f32<T>(0.0f);
  if (e0 < n) b = q[0];
  if (ph == 0) return b;
  if (e0 >= VEC) a = q[-1];
  switch (ph) {
#define LEVELS_LN_PICK(k) \
  case k:                 \
    if constexpr (k < VEC) return shift_pick<T, VEC, k>(a, b); else return b;
    LEVELS_LN_PICK(1) LEVELS_LN_PICK(2) LEVELS_LN_PICK(3) LEVELS_LN_PICK(4)
    LEVELS_LN_PICK(5) LEVELS_LN_PICK(6) LEVELS_LN_PICK(7)
#undef LEVELS_LN_PICK
    default: return b;
  }
}

// The phase of a row: how many elements past a 16-byte boundary it starts.
template <typename T>
__device__ __forceinline__ int row_phase(const T* row) {
  return (int)((reinterpret_cast<uintptr_t>(row) & 15) / sizeof(T));
}

// Where a phased share's elements belong: the share's vectors start at memory index e_base
// of the row's span [row - ph, row + N) (a SPLIT block's piece: e_base = its first column),
// and only vectors before `span` (the piece's extent) are the share's. Element j of vector
// c is column e - ph, e = e_base + col(c) + j: the share's iff its vector is and
// 0 <= e - ph < n (n = N, or 0 for a group past the last row).
template <typename P>
struct PhasedShare {
  int first, e_base, ph, span, n;
  __device__ __forceinline__ int e0(int c) const { return e_base + P::col(first, c); }
  __device__ __forceinline__ bool has(int c) const { return P::col(first, c) < span; }
  __device__ __forceinline__ bool operator()(int c, int j) const {
    return has(c) && (unsigned)(e0(c) + j - ph) < (unsigned)n;
  }
  // Store vector c of a row whose span starts (moved back by ph, plus e_base) at yb: whole
  // where all VEC elements are the row's, else element by element (a row's two ends).
  template <typename T>
  __device__ __forceinline__ void put(T* __restrict__ yb, int c, const typename P::V& out) const {
    const int e = e0(c);
    if (!has(c)) return;  // another block's piece (SPLIT)
    if (e >= ph && e + P::VEC - ph <= n) {
      P::put(yb, first, c, out);
      return;
    }
#pragma unroll
    for (int j = 0; j < P::VEC; ++j)
      if ((*this)(c, j)) yb[P::col(first, c) + j] = out.v[j];
  }
};

// Zero the elements of a loaded share that are not the row's (a neighbour row's, in the
// vectors at either end): they must count in neither sum, and a NaN there must not leak in.
template <typename P>
__device__ __forceinline__ void mask_phase(P& xr, const PhasedShare<P>& sh) {
#pragma unroll
  for (int c = 0; c < P::CH; ++c)
#pragma unroll
    for (int j = 0; j < P::VEC; ++j)
      if (!sh(c, j)) xr.v[c].v[j] = from_f32<typename P::Elem>(0.0f);
}

// A share of weight (or bias) for a phase, put together from aligned vectors (shifted_vec).
// Lanes that are no column of the row hold 0, not what lay past the weight's end: never
// used for a stored element, but a NaN from there once reached a row's sums (a phased
// backward, not kept, multiplied them by dy = 0: the H100 tests found it, fp16, 4097 columns).
template <typename P, typename T>
__device__ __forceinline__ void load_weight_ph(P& w, const T* __restrict__ weight, const PhasedShare<P>& sh,
                                               int N) {
#pragma unroll
  for (int c = 0; c < P::CH; ++c) {
    if (sh.has(c)) w.v[c] = shifted_vec(weight, sh.e0(c), sh.ph, N);
#pragma unroll
    for (int j = 0; j < P::VEC; ++j)
      if (!sh(c, j)) w.v[c].v[j] = from_f32<T>(0.0f);
  }
}

// The block's weight and bias for its phase, put together once into shared memory (the
// dynamic shared memory of the phased forward: 2 x the share's vectors), vector i of the
// share (its index along the row, P::col / VEC) at ws[i] and bs[i]. Every group of a block
// holds the same columns: group 0 writes them. Held in registers instead (call 3), they
// took 16 of them at 16 bf16 elements a thread (91 in all, against 56 for the element
// kernel): 2 blocks an SM at 4097 columns instead of 4, and 0.25x copy.
template <typename P, typename T>
__device__ __forceinline__ void stage_params_ph(typename P::V* ws, typename P::V* bs, const T* __restrict__ weight,
                                                const T* __restrict__ bias, const PhasedShare<P>& whole,
                                                int N, bool writer) {
  P w, b;
  load_weight_ph(w, weight, whole, N);
  load_weight_ph(b, bias, whole, N);
  if (writer)
#pragma unroll
    for (int c = 0; c < P::CH; ++c)
      if (whole.has(c)) {
        ws[P::col(whole.first, c) / P::VEC] = w.v[c];
        bs[P::col(whole.first, c) / P::VEC] = b.v[c];
      }
  __syncthreads();
}

// y for a phased share (yb: y's row at x's phase, moved back by ph, plus e_base), weight and
// bias from the block's copy for its phase (stage_params_ph).
template <typename P, typename T>
__device__ __forceinline__ void fwd_ph_out(T* __restrict__ yb, const P& xr, const typename P::V* ws,
                                           const typename P::V* bs, const PhasedShare<P>& sh,
                                           float mean, float rstd) {
  using V = typename P::V;
  fwd_v4_out<P, T>(
      xr, mean, rstd,
      [&](int c, V& wk, V& bk) {
        if (!sh.has(c)) return false;
        wk = ws[P::col(sh.first, c) / P::VEC];
        bk = bs[P::col(sh.first, c) / P::VEC];
        return true;
      },
      [&](int c, const V& out) { sh.put(yb, c, out); });
}

// Blocks an SM the phased forward is compiled for: ln_fwd_min_blocks's two 512-thread blocks
// (64 registers) at 16 elements a thread, and four 256-thread group blocks (64) where
// ln_min_blocks asks three (85): at 84 and 71 registers (call 4's build) a row of 288
// threads (4097 bf16 columns) got 2 blocks an SM, and the lane groups 3, against the
// element kernels' 4 and 5.
constexpr int ln_fwd_ph_min_blocks(int S, int E) {
  return S < 32 ? 4 : (E == 16 ? 2 : ln_min_blocks(S, E));
}

// fwd_v4_rows on phased rows: block b takes the rows r = b mod K + K k (its phase class),
// so weight and bias are put together for its phase once (stage_params_ph). Put together per
// row instead (call 1 of reports/phased-rows-and-bands-2026-11-27/), the two loads and the switch
// of each vector of weight and of bias ran one after the other after the row's sums, and the
// kernel lost to the element loads it replaced (bf16 1023 columns 0.43x copy against 0.78x).
// Launcher guarantees: weight, bias 16-byte aligned; row r of y (contiguous) at the phase of
// row r of x; N + VEC - 1 <= E * (threads of a row); gridDim.x a multiple of K; dynamic
// shared memory for 2 x (threads of a row) x E elements.
template <typename T, int E, int S>
__global__ void __launch_bounds__(S < 32 ? LN_GROUP_BLOCK : LN_MAX_THREADS, ln_fwd_ph_min_blocks(S, E))
fwd_v4_rows_ph(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
               T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
               int64_t M, int N, int64_t stride_x, float eps, int R) {
  using P = RowPart<T, E, true, S>;
  using V = typename P::V;
  constexpr int K = P::VEC;
  __shared__ float2 scratch[32];
  const RowLanes<S, P::CH> lanes(R);
  const int first = lanes.first;
  auto total = [&](float v, int) {
    return lanes.block_mode ? block_sum2(v, 0.0f, scratch).x : group_sum2<S>(v, 0.0f).x;
  };
  const int cls = (int)(blockIdx.x % K);
  const int64_t peers = gridDim.x / K, rows = M > cls ? (M - cls + K - 1) / K : 0;
  const int ph = row_phase(x + cls * stride_x);
  const PhasedShare<P> whole{first, 0, ph, N + ph, N};
  extern __shared__ __align__(16) unsigned char ln_ph_smem[];
  V* ws = reinterpret_cast<V*>(ln_ph_smem);
  V* bs = ws + (lanes.block_mode ? (int)blockDim.x : S) * P::CH;
  stage_params_ph(ws, bs, weight, bias, whole, N, lanes.g == 0);
#pragma unroll 1
  for (int64_t base = (int64_t)(blockIdx.x / K) * R; base < rows; base += peers * R) {
    const int64_t k = base + lanes.g;
    const bool live = k < rows;
    const int64_t r = cls + (int64_t)K * (live ? k : base);
    const PhasedShare<P> sh{first, 0, ph, live ? N + ph : 0, live ? N : 0};
    P xr;
    xr.load(x + r * stride_x - ph, first, sh.span);
    mask_phase(xr, sh);
    const int64_t next = k + peers * R;
    if (next < rows) prefetch_l2(x + (cls + K * next) * stride_x, N, lanes.t, lanes.count);
    const float2 stats = fwd_v4_stats(xr, N, eps, total, sh);
    fwd_ph_out(y + r * (int64_t)N - ph, xr, ws, bs, sh, stats.x, stats.y);
    if (live && first == 0) {
      mean_out[r] = stats.x;
      rstd_out[r] = stats.y;
    }
  }
}

// fwd_v4_split on phased rows: cluster p (blockIdx.y) takes rows of class p mod K, its block
// `rank` memory elements [rank * seg, +seg) of each row's span [row - ph, row + N), with
// that piece of weight and bias in shared memory. Launcher guarantees as fwd_v4_rows_ph
// (gridDim.y a multiple of K), seg a multiple of VEC, C * seg >= N + VEC - 1,
// seg <= E * blockDim.x.
template <typename T, int E>
__global__ void __launch_bounds__(512)
fwd_v4_split_ph(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                int64_t M, int N, int64_t stride_x, float eps, int seg) {
#ifdef LEVELS_LN_CLUSTERS
  using P = RowPart<T, E, true, 32>;
  using V = typename P::V;
  constexpr int K = P::VEC;
  __shared__ float2 scratch[32];
  __shared__ ClusterInbox inbox;
  const int first = (int)(threadIdx.x >> 5) * 32 * P::CH + (int)(threadIdx.x & 31);
  const int col0 = (int)blockIdx.x * seg;
  const int cls = (int)(blockIdx.y % K);
  const int64_t peers = gridDim.y / K, rows = M > cls ? (M - cls + K - 1) / K : 0;
  const int ph = row_phase(x + cls * stride_x);
  const int rest = N + ph - col0;
  const PhasedShare<P> sh{first, col0, ph, rest < 0 ? 0 : (rest < seg ? rest : seg), N};
  ClusterSum2 sums(&inbox, scratch);
  auto total = [&](float v, int) { return sums(v, 0.0f).x; };
  extern __shared__ __align__(16) unsigned char ln_ph_smem[];
  V* ws = reinterpret_cast<V*>(ln_ph_smem);
  V* bs = ws + (int)blockDim.x * P::CH;
  stage_params_ph(ws, bs, weight, bias, sh, N, true);
#pragma unroll 1
  for (int64_t k = blockIdx.y / K; k < rows; k += peers) {
    const int64_t r = cls + (int64_t)K * k;
    P xr;
    xr.load(x + r * stride_x - ph + col0, first, sh.span);
    mask_phase(xr, sh);
    if (k + peers < rows)
      prefetch_l2(x + (r + K * peers) * stride_x - ph + col0, sh.span, threadIdx.x, blockDim.x);
    const float2 stats = fwd_v4_stats(xr, N, eps, total, sh);
    fwd_ph_out(y + r * (int64_t)N - ph + col0, xr, ws, bs, sh, stats.x, stats.y);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      mean_out[r] = stats.x;
      rstd_out[r] = stats.y;
    }
  }
  cooperative_groups::this_cluster().sync();  // no block leaves while a peer may still push to it
#endif
}

// One row's backward on registers, shared by ROWS and SPLIT: dx for the thread's columns,
// and dy * xhat, dy added to its dw/db partial sums. `total` adds (c1, c2) over the row.
template <typename P, typename T, int E, typename Total>
__device__ __forceinline__ void bwd_v4_row(const P& xr, const P& gr, const P& w, T* dxr, int first,
                                           int n, int N, float mu, float rs, float (&dw)[E],
                                           float (&db)[E], Total total) {
  // ### BEGIN SOLUTION
  float c1 = 0.0f, c2 = 0.0f;
#pragma unroll
  for (int c = 0; c < P::CH; ++c)
#pragma unroll
    for (int j = 0; j < P::VEC; ++j) {
      const float wdy = w.f(c, j) * gr.f(c, j);  // dy = 0 on padding: it adds nothing
      c1 += (xr.f(c, j) - mu) * rs * wdy;
      c2 += wdy;
    }
  const float2 sums = total(c1, c2);
  c1 = sums.x / (float)N;
  c2 = sums.y / (float)N;
#pragma unroll
  for (int c = 0; c < P::CH; ++c) {
    typename P::V out;
#pragma unroll
    for (int j = 0; j < P::VEC; ++j) {
      const float xhat = (xr.f(c, j) - mu) * rs, g = gr.f(c, j);
      out.v[j] = from_f32<T>((w.f(c, j) * g - xhat * c1 - c2) * rs);
      dw[c * P::VEC + j] += g * xhat;
      db[c * P::VEC + j] += g;
    }
    if (P::in(first, c, n)) P::put(dxr, first, c, out);
  }
  // ### END SOLUTION
}

// v4 backward, ROWS, persistent: block b owns rows [b * rows_per_block, +rows_per_block),
// R at a time (one per group), x and dy of a row in registers, the thread's dw/db partial
// sums in registers across all its rows (weight per row, from L1). At the end the R groups'
// partials are added in group order through shared memory (no atomics:
// deterministic) and written as partial row b.
// Launcher guarantees as fwd_v4_rows (dy, x, weight, dx for x, weight, bias, y), and in
// group mode S * E <= LN_GROUP_COLS.
constexpr int LN_GROUP_COLS = 32 * 16;  // the widest row a group holds (S <= 32, E <= 16)

template <typename T, int E, bool VECT, int S>
__global__ void __launch_bounds__(S < 32 ? LN_GROUP_BLOCK : LN_MAX_THREADS, ln_min_blocks(S, E))
bwd_v4_rows(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
            const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
            float* __restrict__ part_dw, float* __restrict__ part_db, int64_t M, int N,
            int64_t stride_dy, int64_t stride_x, int64_t rows_per_block, int R) {
  using P = RowPart<T, E, VECT, S>;
  __shared__ float2 scratch[32];
  __shared__ float acc[2][LN_GROUP_COLS];
  const RowLanes<S, P::CH> lanes(R);
  const int first = lanes.first;
  P w;
  float dw[E], db[E];
#pragma unroll
  for (int e = 0; e < E; ++e) dw[e] = db[e] = 0.0f;
  auto total = [&](float a, float b) {
    return lanes.block_mode ? block_sum2(a, b, scratch) : group_sum2<S>(a, b);
  };

  const int64_t first_row = (int64_t)blockIdx.x * rows_per_block;
  const int64_t last = first_row + rows_per_block < M ? first_row + rows_per_block : M;
#pragma unroll 1
  for (int64_t base = first_row; base < last; base += R) {  // the same trip count block-wide
    const int64_t row = base + lanes.g;
    const bool live = row < last;
    const int n = live ? N : 0;
    const int64_t r = live ? row : base;
    P xr, gr;
    xr.load(x + r * stride_x, first, n);
    gr.load(dy + r * stride_dy, first, n);
    if (row + R < last) {
      prefetch_l2(x + (row + R) * stride_x, N, lanes.t, lanes.count);
      prefetch_l2(dy + (row + R) * stride_dy, N, lanes.t, lanes.count);
    }
    w.load(weight, first, n);  // per row, from L1: held across rows it cost registers
    const float mu = live ? mean[r] : 0.0f, rs = live ? rstd[r] : 0.0f;
    bwd_v4_row<P, T, E>(xr, gr, w, dx + r * (int64_t)N, first, n, N, mu, rs, dw, db, total);
  }

  float* pdw = part_dw + (int64_t)blockIdx.x * N;
  float* pdb = part_db + (int64_t)blockIdx.x * N;
  if (lanes.block_mode || R == 1) {  // one row at a time: the thread's partials are the block's
#pragma unroll
    for (int c = 0; c < P::CH; ++c) {
      if (!P::in(first, c, N)) continue;
#pragma unroll
      for (int j = 0; j < P::VEC; ++j) {
        pdw[P::col(first, c) + j] = dw[c * P::VEC + j];
        pdb[P::col(first, c) + j] = db[c * P::VEC + j];
      }
    }
    return;
  }
  for (int k = 0; k < R; ++k) {  // groups add theirs in order 0, 1, ..., R-1
    if (lanes.g == k) {
#pragma unroll
      for (int c = 0; c < P::CH; ++c) {
        if (!P::in(first, c, N)) continue;
#pragma unroll
        for (int j = 0; j < P::VEC; ++j) {
          const int col = P::col(first, c) + j;
          acc[0][col] = (k == 0 ? 0.0f : acc[0][col]) + dw[c * P::VEC + j];
          acc[1][col] = (k == 0 ? 0.0f : acc[1][col]) + db[c * P::VEC + j];
        }
      }
    }
    __syncthreads();
  }
  for (int col = threadIdx.x; col < N; col += blockDim.x) {
    pdw[col] = acc[0][col];
    pdb[col] = acc[1][col];
  }
}

// v4 backward, SPLIT (sm_90), persistent: cluster p (blockIdx.y) owns rows
// [p * rows_per_cluster, +rows_per_cluster); its block `rank` owns columns [rank * seg, +seg)
// of each, their weight and dw/db partial sums in registers; the row's two sums meet across
// the cluster once per row (ClusterSum2); block `rank` writes its columns of
// partial row p. Launcher guarantees as fwd_v4_split; part_dw/part_db hold gridDim.y rows.
template <typename T, int E, bool VECT>
__global__ void __launch_bounds__(512)
bwd_v4_split(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
             const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
             float* __restrict__ part_dw, float* __restrict__ part_db, int64_t M, int N,
             int64_t stride_dy, int64_t stride_x, int64_t rows_per_cluster, int seg) {
#ifdef LEVELS_LN_CLUSTERS
  using P = RowPart<T, E, VECT, 32>;
  __shared__ float2 scratch[32];
  __shared__ ClusterInbox inbox;
  const int first = (int)(threadIdx.x >> 5) * 32 * P::CH + (int)(threadIdx.x & 31);
  const int col0 = (int)blockIdx.x * seg;
  const int rest = N - col0;
  const int n = rest < 0 ? 0 : (rest < seg ? rest : seg);
  ClusterSum2 sums(&inbox, scratch);
  P w;
  float dw[E], db[E];
#pragma unroll
  for (int e = 0; e < E; ++e) dw[e] = db[e] = 0.0f;
  const int64_t first_row = (int64_t)blockIdx.y * rows_per_cluster;
  const int64_t last = first_row + rows_per_cluster < M ? first_row + rows_per_cluster : M;
#pragma unroll 1
  for (int64_t row = first_row; row < last; ++row) {
    P xr, gr;
    xr.load(x + row * stride_x + col0, first, n);
    gr.load(dy + row * stride_dy + col0, first, n);
    if (row + 1 < last) {
      prefetch_l2(x + (row + 1) * stride_x + col0, n, threadIdx.x, blockDim.x);
      prefetch_l2(dy + (row + 1) * stride_dy + col0, n, threadIdx.x, blockDim.x);
    }
    w.load(weight + col0, first, n);
    auto total = [&](float a, float b) { return sums(a, b); };
    bwd_v4_row<P, T, E>(xr, gr, w, dx + row * (int64_t)N + col0, first, n, N, mean[row],
                        rstd[row], dw, db, total);
  }
  float* pdw = part_dw + (int64_t)blockIdx.y * N + col0;
  float* pdb = part_db + (int64_t)blockIdx.y * N + col0;
#pragma unroll
  for (int c = 0; c < P::CH; ++c) {
    if (!P::in(first, c, n)) continue;
#pragma unroll
    for (int j = 0; j < P::VEC; ++j) {
      pdw[P::col(first, c) + j] = dw[c * P::VEC + j];
      pdb[P::col(first, c) + j] = db[c * P::VEC + j];
    }
  }
  cooperative_groups::this_cluster().sync();  // no block leaves while a peer may still push to it
#endif
}

// =====================================================================================
// Version 6: rows through shared memory, copied there by the copy engine (sm_90)
// =====================================================================================

// Why: version 4's wide rows (a block or a cluster per row, the row in registers) keep ONE
// row piece in flight per block, and one 512-thread block fits an SM (ncu, bf16: 117-124
// registers a thread in the backward, 25% occupancy; 54-78 in the forward). While a block
// reduces its row and waits at the cluster's barriers, its SM asks DRAM for nothing but a
// prefetch: 34-60% of DRAM bandwidth at 16384-65536 columns (reports/layer-norm-v6-*/).
// Here a thread of the block hands the copy engine (TMA) the pieces of the next `stages`
// rows, one cp.async.bulk each, into a ring of shared-memory buffers; an mbarrier per buffer
// counts the bytes in (mbarrier.cuh). The threads read a piece from shared memory as often as
// the math needs (three passes in the forward: sum, squares, output; two in the backward),
// which costs shared-memory bandwidth, not DRAM's, and hold nothing across rows but the
// backward's dw/db partial sums. Costs: sm_90 only, up to ~200 KB of shared memory a block
// (up to 3 blocks an SM: layer_norm_plan.h ln_v6_plan), one thread issuing every copy.
//
// Rows that are no whole number of 16-byte vectors (odd widths, views one element in: VECT
// false): the copy's contract wants 16-byte addresses and sizes, so each piece is copied
// with the 16-byte granules around it, [floor16(start), ceil16(end)), into a buffer one
// vector longer, and read from `phase` elements in, one element a load; y and dx are stored
// one element a store (coalesced: a warp's 32 stores are 32 adjacent elements). The copy
// reads up to 15 bytes before and after a piece: inside the same 16-byte granules, so
// inside the tensor's allocation (allocations start on 256 bytes and end on 16 at least);
// nothing outside the view is written.

// The rows of cluster blockIdx.y: blockIdx.y, blockIdx.y + gridDim.y, ...
__device__ __forceinline__ int64_t v6_rows(int64_t M) {
  return M > (int64_t)blockIdx.y ? (M - 1 - (int64_t)blockIdx.y) / gridDim.y + 1 : 0;
}

// Where a piece of n elements at p is copied from, how many bytes, and how many elements
// into its buffer it then starts (0 when VECT: p is 16-byte aligned, n whole vectors).
template <typename T, bool VECT>
struct V6Piece {
  const char* from;
  uint32_t bytes;
  int phase;
  __device__ __forceinline__ V6Piece(const T* p, int n) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t lo = VECT ? start : start & ~(uintptr_t)15;
    const uintptr_t hi = VECT ? start + (uintptr_t)n * sizeof(T)
                              : (start + (uintptr_t)n * sizeof(T) + 15) & ~(uintptr_t)15;
    from = reinterpret_cast<const char*>(lo);
    bytes = (uint32_t)(hi - lo);
    phase = (int)((start - lo) / sizeof(T));
  }
};

// Thread 0 puts row k's pieces (from each of the `count` sources, rows `stride` apart, n
// elements from column col0) into buffer k % stages: `count` slots of `slot` elements.
template <typename T, bool VECT>
__device__ __forceinline__ void v6_fetch(T* ring, uint64_t* full, int stages, int64_t k,
                                         const T* const* src, const int64_t* stride, int count,
                                         int slot, int n) {
  const int s = (int)(k % stages);
  const int64_t row = (int64_t)blockIdx.y + k * gridDim.y;
  uint32_t total = 0;
  for (int a = 0; a < count; ++a) total += V6Piece<T, VECT>(src[a] + row * stride[a], n).bytes;
  levels_mbarrier::mbar_expect_tx(&full[s], total);
  for (int a = 0; a < count; ++a) {
    const V6Piece<T, VECT> piece(src[a] + row * stride[a], n);
    levels_mbarrier::bulk_load(ring + ((int64_t)s * count + a) * slot, piece.from, piece.bytes, &full[s]);
  }
}

// The ring's barriers, the resident pieces (weight, and the forward's bias) and the first
// `stages` rows' pieces, all asked for by thread 0 before anyone waits.
template <typename T, bool VECT>
__device__ __forceinline__ void v6_start(uint64_t* full, uint64_t* kept_bar, int stages, T* kept,
                                         const T* const* resident, int n_resident, T* ring,
                                         int64_t rows, const T* const* src, const int64_t* stride,
                                         int count, int slot, int n) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) levels_mbarrier::mbar_init(&full[s], 1);
    levels_mbarrier::mbar_init(kept_bar, 1);
    levels_mbarrier::mbar_init_fence();
    uint32_t total = 0;
    for (int a = 0; a < n_resident; ++a) total += V6Piece<T, VECT>(resident[a], n).bytes;
    levels_mbarrier::mbar_expect_tx(kept_bar, total);
    for (int a = 0; a < n_resident; ++a) {
      const V6Piece<T, VECT> piece(resident[a], n);
      levels_mbarrier::bulk_load(kept + (int64_t)a * slot, piece.from, piece.bytes, kept_bar);
    }
    for (int64_t k = 0; k < stages && k < rows; ++k)
      v6_fetch<T, VECT>(ring, full, stages, k, src, stride, count, slot, n);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  levels_mbarrier::mbar_wait(kept_bar, 0);
}

// A thread's columns of a piece, as `units` of U elements: 16-byte vectors (VECT) or single
// elements, unit u at element u * U of the piece (after its phase). get(p, u) / put(p, u, v):
// unit u of the piece that starts at p.
template <typename T, bool VECT>
struct V6Units {
  static constexpr int U = VECT ? vec_width<T>() : 1;
  using V = Vec<T, U>;
  __device__ __forceinline__ static V get(const T* p, int u) {
    if constexpr (VECT) {
      return reinterpret_cast<const V*>(p)[u];
    } else {
      V v;
      v.v[0] = p[u];
      return v;
    }
  }
  __device__ __forceinline__ static void put(T* p, int u, const V& v) {
    if constexpr (VECT) reinterpret_cast<V*>(p)[u] = v;
    else p[u] = v.v[0];
  }
};

// v6 forward: cluster (blockIdx.y) visits rows blockIdx.y, + gridDim.y, ...; block `rank`
// (blockIdx.x) owns columns [rank * seg, + seg). The row's two sums cross the cluster by
// ClusterSum2 (a cluster of one block is a block).
// Launcher guarantees: clusters of (gridDim.x, 1, 1), blockDim.x == LN6_THREADS; seg a
// multiple of VEC and (gridDim.x - 1) * seg < N; (VECT) x, weight, bias, y 16-byte aligned,
// stride_x and N multiples of VEC; dynamic shared memory (2 + stages) * slot elements, slot
// = seg (VECT) or seg + VEC; stages <= LN6_MAX_STAGES.
template <typename T, bool VECT>
__global__ void __launch_bounds__(LN6_THREADS, 3)  // three blocks an SM: <= 85 registers
fwd_v6_bulk(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
            T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
            int64_t M, int N, int64_t stride_x, float eps, int seg, int stages) {
#ifdef LEVELS_LN_CLUSTERS
  using Un = V6Units<T, VECT>;
  constexpr int U = Un::U;
  extern __shared__ __align__(128) unsigned char v6_smem[];
  __shared__ float2 scratch[32];
  __shared__ ClusterInbox inbox;
  __shared__ uint64_t full[LN6_MAX_STAGES], kept_bar;
  const int col0 = (int)blockIdx.x * seg;
  const int n = N - col0 < seg ? N - col0 : seg;  // >= 1: the launcher's guarantee
  const int units = (n + U - 1) / U;                // n is whole vectors when VECT
  const int slot = VECT ? seg : seg + vec_width<T>();
  T* kept = reinterpret_cast<T*>(v6_smem);  // weight, bias
  T* ring = kept + 2 * (int64_t)slot;
  const int64_t rows = v6_rows(M);
  const T* resident[2] = {weight + col0, bias + col0};
  const T* src[1] = {x + col0};
  const int64_t stride[1] = {stride_x};
  v6_start<T, VECT>(full, &kept_bar, stages, kept, resident, 2, ring, rows, src, stride, 1, slot, n);
  const T* ws = kept + V6Piece<T, VECT>(weight + col0, n).phase;
  const T* bs = kept + slot + V6Piece<T, VECT>(bias + col0, n).phase;
  ClusterSum2 sums(&inbox, scratch);
  auto total = [&](float v) { return sums(v, 0.0f).x; };
#pragma unroll 1
  for (int64_t k = 0; k < rows; ++k) {
    const int64_t row = (int64_t)blockIdx.y + k * gridDim.y;
    levels_mbarrier::mbar_wait(&full[k % stages], (int)((k / stages) & 1));
    const T* xs = ring + (k % stages) * slot + V6Piece<T, VECT>(x + row * stride_x + col0, n).phase;
    float s = 0.0f;
    for (int u = threadIdx.x; u < units; u += LN6_THREADS) {
      const typename Un::V a = Un::get(xs, u);
#pragma unroll
      for (int j = 0; j < U; ++j) s += to_f32(a.v[j]);
    }
    const float mu = total(s) / (float)N;
    float sq = 0.0f;
    for (int u = threadIdx.x; u < units; u += LN6_THREADS) {
      const typename Un::V a = Un::get(xs, u);
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const float d = to_f32(a.v[j]) - mu;
        sq += d * d;
      }
    }
    const float rs = 1.0f / sqrtf(total(sq) / (float)N + eps);
    T* yr = y + row * (int64_t)N + col0;
    for (int u = threadIdx.x; u < units; u += LN6_THREADS) {
      const typename Un::V a = Un::get(xs, u), wk = Un::get(ws, u), bk = Un::get(bs, u);
      typename Un::V out;
#pragma unroll
      for (int j = 0; j < U; ++j)
        out.v[j] = from_f32<T>((to_f32(a.v[j]) - mu) * rs * to_f32(wk.v[j]) + to_f32(bk.v[j]));
      Un::put(yr, u, out);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      mean_out[row] = mu;
      rstd_out[row] = rs;
    }
    __syncthreads();  // every thread is done with the buffer before it is refilled
    if (threadIdx.x == 0 && k + stages < rows)
      v6_fetch<T, VECT>(ring, full, stages, k + stages, src, stride, 1, slot, n);
  }
  cooperative_groups::this_cluster().sync();  // no block leaves while a peer may still push to it
#endif
}

// v6 backward: as the forward, with x's and dy's pieces side by side in each buffer, the
// weight's piece resident, and the thread's dw/db partial sums for its columns (units
// threadIdx.x + i * LN6_THREADS, i < LN6_VPT * VEC / U) in registers across all the
// cluster's rows. The cluster writes partial row blockIdx.y. Launcher guarantees as the
// forward's (dy, x, weight, dx), plus seg <= LN6_VPT * VEC * LN6_THREADS; dynamic shared
// memory (1 + 2 * stages) * slot elements; part_dw/part_db hold gridDim.y rows.
template <typename T, bool VECT>
__global__ void __launch_bounds__(LN6_THREADS, 2)  // two blocks an SM: <= 128 registers
bwd_v6_bulk(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
            const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
            float* __restrict__ part_dw, float* __restrict__ part_db, int64_t M, int N,
            int64_t stride_dy, int64_t stride_x, int seg, int stages) {
#ifdef LEVELS_LN_CLUSTERS
  using Un = V6Units<T, VECT>;
  constexpr int U = Un::U;
  constexpr int PER = LN6_VPT * vec_width<T>() / U;  // units a thread covers
  extern __shared__ __align__(128) unsigned char v6_smem[];
  __shared__ float2 scratch[32];
  __shared__ ClusterInbox inbox;
  __shared__ uint64_t full[LN6_MAX_STAGES], kept_bar;
  const int col0 = (int)blockIdx.x * seg;
  const int n = N - col0 < seg ? N - col0 : seg;
  const int units = (n + U - 1) / U;
  const int slot = VECT ? seg : seg + vec_width<T>();
  T* kept = reinterpret_cast<T*>(v6_smem);  // weight
  T* ring = kept + slot;
  const int64_t rows = v6_rows(M);
  const T* resident[1] = {weight + col0};
  const T* src[2] = {x + col0, dy + col0};
  const int64_t stride[2] = {stride_x, stride_dy};
  v6_start<T, VECT>(full, &kept_bar, stages, kept, resident, 1, ring, rows, src, stride, 2, slot, n);
  const T* ws = kept + V6Piece<T, VECT>(weight + col0, n).phase;
  ClusterSum2 sums(&inbox, scratch);
  float dw[PER * U], db[PER * U];
#pragma unroll
  for (int e = 0; e < PER * U; ++e) dw[e] = db[e] = 0.0f;
#pragma unroll 1
  for (int64_t k = 0; k < rows; ++k) {
    const int64_t row = (int64_t)blockIdx.y + k * gridDim.y;
    const float mu = mean[row], rs = rstd[row];
    levels_mbarrier::mbar_wait(&full[k % stages], (int)((k / stages) & 1));
    const T* xs = ring + (k % stages) * 2 * slot + V6Piece<T, VECT>(x + row * stride_x + col0, n).phase;
    const T* gs = ring + ((k % stages) * 2 + 1) * slot +
                  V6Piece<T, VECT>(dy + row * stride_dy + col0, n).phase;
    float c1 = 0.0f, c2 = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int u = (int)threadIdx.x + i * LN6_THREADS;
      if (u >= units) break;
      const typename Un::V a = Un::get(xs, u), g = Un::get(gs, u), wk = Un::get(ws, u);
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const float wdy = to_f32(wk.v[j]) * to_f32(g.v[j]);
        c1 += (to_f32(a.v[j]) - mu) * rs * wdy;
        c2 += wdy;
      }
    }
    const float2 row_sums = sums(c1, c2);
    c1 = row_sums.x / (float)N;
    c2 = row_sums.y / (float)N;
    T* dxr = dx + row * (int64_t)N + col0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int u = (int)threadIdx.x + i * LN6_THREADS;
      if (u >= units) break;
      const typename Un::V a = Un::get(xs, u), g = Un::get(gs, u), wk = Un::get(ws, u);
      typename Un::V out;
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const float xhat = (to_f32(a.v[j]) - mu) * rs, gj = to_f32(g.v[j]);
        out.v[j] = from_f32<T>((to_f32(wk.v[j]) * gj - xhat * c1 - c2) * rs);
        dw[i * U + j] += gj * xhat;
        db[i * U + j] += gj;
      }
      Un::put(dxr, u, out);
    }
    __syncthreads();  // every thread is done with the buffer before it is refilled
    if (threadIdx.x == 0 && k + stages < rows)
      v6_fetch<T, VECT>(ring, full, stages, k + stages, src, stride, 2, slot, n);
  }
  float* pdw = part_dw + (int64_t)blockIdx.y * N + col0;
  float* pdb = part_db + (int64_t)blockIdx.y * N + col0;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int u = (int)threadIdx.x + i * LN6_THREADS;
    if (u >= units) break;
#pragma unroll
    for (int j = 0; j < U; ++j) {
      pdw[u * U + j] = dw[i * U + j];
      pdb[u * U + j] = db[i * U + j];
    }
  }
  cooperative_groups::this_cluster().sync();  // no block leaves while a peer may still push to it
#endif
}

// =====================================================================================
// Launchers
// =====================================================================================

template <typename T>
static int fwd_v1_launch(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,
                         int64_t M, int64_t N, int64_t stride_x, float eps, cudaStream_t stream) {
  fwd_v1<T><<<(unsigned)levels_cdiv(M, V1_THREADS), V1_THREADS, 0, stream>>>(
      x, w, b, y, mean, rstd, M, N, stride_x, eps);
  return levels_launch_status();
}

template <typename T>
static int fwd_v2_launch(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,
                         int64_t M, int64_t N, int64_t stride_x, float eps, cudaStream_t stream) {
  fwd_v2<T><<<(unsigned)levels_cdiv(M, V2_ROWS), V2_ROWS * 32, 0, stream>>>(
      x, w, b, y, mean, rstd, M, N, stride_x, eps);
  return levels_launch_status();
}

template <typename T>
static int fwd_v3_launch(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,
                         int64_t M, int64_t N, int64_t stride_x, float eps, cudaStream_t stream) {
  constexpr int VEC = vec_width<T>();
  // 16-byte loads need every row to start on a 16-byte boundary: the base pointers
  // aligned, and the row stride and the width whole vectors (no stride when M == 1).
  const bool vec_ok = levels_aligned16(x) && levels_aligned16(w) && levels_aligned16(b) &&
                      levels_aligned16(y) && N % VEC == 0 && (M == 1 || stride_x % VEC == 0);
  const unsigned rows = (unsigned)M;  // one block per row below
  // Elements per thread of the block-per-row path: two 16-byte vectors a thread in both
  // fp32 and 16-bit types (4096 wide: 512 threads fp32, 256 threads bf16). One vector a
  // thread (512 threads) left bf16 at 0.90x copy: twice the barriers per byte.
  constexpr int BLOCK_E = 2 * VEC;
  if (vec_ok && N <= 32 * V3_WARP_E) {  // narrow: a warp per row, V3_ROWS rows per block
    fwd_v3_registers<T, V3_WARP_E, true, V3_ROWS * 32>
        <<<(unsigned)levels_cdiv(M, V3_ROWS), V3_ROWS * 32, 0, stream>>>(x, w, b, y, mean, rstd,
                                                                        M, N, stride_x, eps);
  } else if (vec_ok && N <= BLOCK_E * 512) {  // a block of N/BLOCK_E threads per row
    fwd_v3_registers<T, BLOCK_E, false, 512>
        <<<rows, levels_threads_for(levels_cdiv(N, BLOCK_E), 512), 0, stream>>>(
            x, w, b, y, mean, rstd, M, N, stride_x, eps);
  } else if (vec_ok && N <= V3_FWD_MAX_N) {  // 32 per thread: at most 512 threads
    fwd_v3_registers<T, 32, false, 512>
        <<<rows, levels_threads_for(levels_cdiv(N, 32), 512), 0, stream>>>(
            x, w, b, y, mean, rstd, M, N, stride_x, eps);
  } else if (vec_ok) {  // too wide for registers: loop over the row, still by vectors
    fwd_v3_loop<T, VEC><<<rows, levels_threads_for(N / VEC, 1024), 0, stream>>>(
        x, w, b, y, mean, rstd, M, N, stride_x, eps);
  } else {  // misaligned, or a width that is no whole number of vectors: one element per load
    fwd_v3_loop<T, 1><<<rows, levels_threads_for(N, 512), 0, stream>>>(x, w, b, y, mean, rstd,
                                                                      M, N, stride_x, eps);
  }
  return levels_launch_status();
}

// The number P of partial rows (two fp32 buffers of P x N) a backward version needs, from
// the sizes alone, so that the binding can allocate them (with torch's allocator) before
// the launch. v3's fused kernel runs one block per partial row: as many blocks as fit on
// the GPU at once. v2 (and v3 when it falls back to v2) splits the rows into P chunks so
// that chunks x column blocks make about 8 blocks of 256 threads per SM.
static int64_t v2_partials(int64_t M, int64_t N) {
  const int64_t col_blocks = levels_cdiv(N, PARTIAL_THREADS);
  const int64_t want = levels_cdiv(8 * (int64_t)levels_sm_count(), col_blocks);
  return want < M ? want : M;
}

struct BwdV3Plan {
  bool fused;   // false: N too wide for registers; v2's kernels run instead
  int E;        // elements per thread: 8 (N <= 4096) or 16 (N <= 8192)
  int threads;  // per block, N / E rounded up to whole warps
  int64_t P;    // partial rows
};

template <typename T>
static BwdV3Plan bwd_v3_plan(int64_t M, int64_t N) {
  BwdV3Plan plan{false, 0, 0, 0};
  if (N > V3_BWD_MAX_N) {
    plan.P = v2_partials(M, N);
    return plan;
  }
  plan.fused = true;
  plan.E = N <= 8 * 512 ? 8 : 16;
  plan.threads = levels_threads_for(levels_cdiv(N, plan.E), 512);
  const int per_sm = levels_blocks_per_sm(
      plan.E == 8 ? (const void*)bwd_v3_fused<T, 8, 2> : (const void*)bwd_v3_fused<T, 16, 1>,
      plan.threads, 0);
  const int64_t resident = (int64_t)levels_sm_count() * per_sm;
  plan.P = resident < M ? resident : M;
  return plan;
}

// ---- version 5: version 3's forward where the rule runs it, a backward R rows an iteration ----

// v5's backward plan: v3's E, then R rows an iteration: 4 at 8 elements a thread (rows of
// up to 4096 columns), 1 at 16, fp32 only. rms_norm.cu's version 4 measured R = 4 as fast as
// R = 2 at 256-4096 bf16 columns (within 0.03x copy); here R = 2 at two blocks an SM would
// spill (64 registers: dw and db partials beside x, dy and w), so R = 4 at one block an SM,
// 123 registers. 16-bit rows wider than 4096 (16 elements a thread, R = 1) ran slower than
// version 4's backward (bf16 5120 / 8192 columns: 0.78 / 0.81x copy against 0.84 / 0.88x;
// fp32 0.85 / 0.87x against 0.86 / 0.81x: reports/layer-norm-v5-2026-11-27/), so they take
// it, and so do rows under 256 columns. P = the blocks resident at once but no more than
// the R-row groups there are. fused == false: version 4's backward runs.
struct BwdV5Plan {
  bool fused;
  int E, R, threads;
  const void* kernel;
  int64_t P;
};

template <typename T>
static const void* bwd_v5_kernel(int E) {
  if (E == 8) return (const void*)bwd_v5_fused<T, 8, 4, 1>;
  if constexpr (sizeof(T) == 4) return (const void*)bwd_v5_fused<T, 16, 1, 1>;
  return nullptr;
}

template <typename T>
static BwdV5Plan bwd_v5_plan(int64_t M, int64_t N) {
  BwdV5Plan plan{false, 0, 0, 0, nullptr, 0};
  // Rows under 256 columns: version 4's lane groups (a block of R rows a few lanes wide ran
  // 0.33x copy at 64 bf16 columns, version 4 0.73x: sweep-1-every-width.json).
  if (N < 256 || N > V3_BWD_MAX_N) return plan;
  plan.E = N <= 8 * 512 ? 8 : 16;
  plan.kernel = bwd_v5_kernel<T>(plan.E);
  if (!plan.kernel) return plan;
  plan.fused = true;
  plan.threads = levels_threads_for(levels_cdiv(N, plan.E), 512);
  plan.R = plan.E == 8 ? 4 : 1;
  const int64_t resident =
      (int64_t)levels_sm_count() * levels_blocks_per_sm(plan.kernel, plan.threads, 0);
  const int64_t groups = levels_cdiv(M, plan.R);
  plan.P = resident < groups ? resident : groups;
  return plan;
}

// ---- version 4 ----

// Whether this GPU launches clusters AND this library holds the cluster kernels' code for it
// (they compile to nothing below sm_90), per device, asked once.
static bool v4_clusters() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  static int known[64];  // 0: not asked yet; 1: no; 2: yes
  if (dev >= 0 && dev < 64 && known[dev]) return known[dev] == 2;
  int major = 0, cluster_launch = 0;
  cudaFuncAttributes attr{};
  const bool ok =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, dev) == cudaSuccess &&
      cudaFuncGetAttributes(&attr, fwd_v4_split<float, LN_SPLIT_E, true>) == cudaSuccess &&
      major >= 9 && cluster_launch && attr.binaryVersion >= 90;
  (void)cudaGetLastError();  // a failed query is an answer ("no"), not a launch error
  if (dev >= 0 && dev < 64) known[dev] = ok ? 2 : 1;
  return ok;
}

// The host's per-call questions answered once: multiprocessors per device, and how many
// blocks or clusters of a backward plan fit at once (the occupancy API costs microseconds a
// query, and a backward asked four). Entries are one 64-bit word each, (key << 32) | value,
// so a lookup racing a store reads an old answer or a new one, never half of each. (Two
// questions whose keys collide would share an answer: that costs speed only, since any
// partial-row count and any SM count give a plan that computes the right result.)
static std::atomic<uint64_t> v4_answers[512];

template <typename Ask>
static int v4_remember(uint32_t key, Ask ask) {
  key |= 1u;  // never 0: an empty slot reads as key 0
  std::atomic<uint64_t>& slot = v4_answers[(key * 2654435761u) >> 23];
  const uint64_t seen = slot.load(std::memory_order_relaxed);
  if ((uint32_t)(seen >> 32) == key) return (int)(uint32_t)seen;
  const int value = ask();
  slot.store(((uint64_t)key << 32) | (uint32_t)value, std::memory_order_relaxed);
  return value;
}

static uint32_t v4_key(uint32_t a, uint32_t b) { return (a * 0x9E3779B1u) ^ (b + 0x7F4A7C15u + (a << 6)); }

static int v4_sm_count() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return levels_sm_count();
  }
  return v4_remember(v4_key(0x534d53u, (uint32_t)dev), [] { return levels_sm_count(); });
}

template <typename T>
static LnPlan v4_plan(bool backward, int64_t M, int64_t N, bool aligned, int force) {
  return ln_plan(backward, M, N, (int)sizeof(T), aligned, v4_clusters(), v4_sm_count(), force);
}

// 16-byte loads need every row of every operand to start on a 16-byte boundary (the row
// stride means nothing when M == 1).
template <typename T>
static bool v4_rows_aligned(int64_t M, int64_t N, std::initializer_list<const void*> ptrs,
                            std::initializer_list<int64_t> strides) {
  constexpr int VEC = vec_width<T>();
  if (N % VEC) return false;
  for (const void* p : ptrs)
    if (!levels_aligned16(p)) return false;
  if (M > 1)
    for (int64_t s : strides)
      if (s % VEC) return false;
  return true;
}

// The cluster launch of a SPLIT plan: (C, cluster_rows) blocks in clusters of (C, 1, 1).
static cudaLaunchConfig_t v4_cluster_config(const LnPlan& p, int64_t cluster_rows,
                                            cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)p.C, (unsigned)cluster_rows, 1);
  cfg.blockDim = dim3((unsigned)p.G, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = (unsigned)p.C;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// fn(kernel): the ROWS kernel of plan p. Group mode (R > 1) runs the first row width of
// layer_norm_plan.h's lists (a narrow row never needs more) at the plan's G; block mode
// the plan's E at stride 32.
template <typename T, bool VECT, typename Fn>
static int fwd_v4_rows_kernel(const LnPlan& p, Fn fn) {
  constexpr int E0 = sizeof(T) == 4 ? 8 : 16;
  if (p.R > 1) {
    if (p.E != E0) return LEVELS_UNSUPPORTED;
    switch (p.G) {
      case 4: return fn(fwd_v4_rows<T, E0, VECT, 4>);
      case 8: return fn(fwd_v4_rows<T, E0, VECT, 8>);
      case 16: return fn(fwd_v4_rows<T, E0, VECT, 16>);
      case 32: return fn(fwd_v4_rows<T, E0, VECT, 32>);
      default: return LEVELS_UNSUPPORTED;
    }
  }
  // the lists: 16-byte loads fp32 8/16/32, 16-bit 16/32; element loads fp32 8/16, 16-bit
  // 16 (32 elements a thread spilled: wider rows go to SPLIT)
  if (p.E == E0) return fn(fwd_v4_rows<T, E0, VECT, 32>);
  if constexpr (VECT || sizeof(T) == 4) {
    if (p.E == 2 * E0) return fn(fwd_v4_rows<T, 2 * E0, VECT, 32>);
  }
  if constexpr (VECT && sizeof(T) == 4) {
    if (p.E == 32) return fn(fwd_v4_rows<T, 32, true, 32>);
  }
  return LEVELS_UNSUPPORTED;
}

template <typename T, bool VECT, typename Fn>
static int bwd_v4_rows_kernel(const LnPlan& p, Fn fn) {
  if (p.R > 1) {
    if (p.E != 8) return LEVELS_UNSUPPORTED;
    switch (p.G) {
      case 4: return fn(bwd_v4_rows<T, 8, VECT, 4>);
      case 8: return fn(bwd_v4_rows<T, 8, VECT, 8>);
      case 16: return fn(bwd_v4_rows<T, 8, VECT, 16>);
      case 32: return fn(bwd_v4_rows<T, 8, VECT, 32>);
      default: return LEVELS_UNSUPPORTED;
    }
  }
  if (p.E == 8) return fn(bwd_v4_rows<T, 8, VECT, 32>);
  if (p.E == 16) return fn(bwd_v4_rows<T, 16, VECT, 32>);
  return LEVELS_UNSUPPORTED;
}

template <typename T, bool VECT>
static int fwd_v4_go(const LnPlan& p, const T* x, const T* w, const T* b, T* y, float* mean,
                     float* rstd, int64_t M, int64_t N, int64_t stride_x, float eps,
                     cudaStream_t stream) {
  const int n = (int)N;  // ROWS and SPLIT hold N <= 65536
  if (p.path == LN_SPLIT) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg =
        v4_cluster_config(p, M < 65535 ? M : 65535, stream, attr);  // clusters stride over the rest
    return (int)cudaLaunchKernelEx(&cfg, fwd_v4_split<T, LN_SPLIT_E, VECT>, x, w, b, y, mean, rstd,
                                   M, n, stride_x, eps, (int)p.seg);
  }
  const int64_t want = levels_cdiv(M, p.R);
  const unsigned blocks = (unsigned)(want < (1 << 20) ? want : (1 << 20));  // blocks stride over the rest
  return fwd_v4_rows_kernel<T, VECT>(p, [&](auto kernel) {
    kernel<<<blocks, p.G * p.R, 0, stream>>>(x, w, b, y, mean, rstd, M, n, stride_x, eps, p.R);
    return levels_launch_status();
  });
}

// fn(kernel): the phased ROWS kernel of plan p (made for the row's span, N + VEC - 1
// columns), as fwd_v4_rows_kernel: the first width of the list at the plan's G for lane
// groups, the plan's E at stride 32 for a block; none for fp32's 32 elements a thread, whose
// weight and bias held in registers (64 of them, the first form) spilled.
template <typename T, typename Fn>
static int fwd_v4_ph_rows_kernel(const LnPlan& p, Fn fn) {
  constexpr int E0 = sizeof(T) == 4 ? 8 : 16;
  if (p.R > 1) {
    if (p.E != E0) return LEVELS_UNSUPPORTED;
    switch (p.G) {
      case 4: return fn(fwd_v4_rows_ph<T, E0, 4>);
      case 8: return fn(fwd_v4_rows_ph<T, E0, 8>);
      case 16: return fn(fwd_v4_rows_ph<T, E0, 16>);
      case 32: return fn(fwd_v4_rows_ph<T, E0, 32>);
      default: return LEVELS_UNSUPPORTED;
    }
  }
  if (p.E == E0) return fn(fwd_v4_rows_ph<T, E0, 32>);
  if (p.E == 2 * E0) return fn(fwd_v4_rows_ph<T, 2 * E0, 32>);
  return LEVELS_UNSUPPORTED;
}

// The phased kernels' dynamic shared memory: weight and bias for the block's phase, the
// share's vectors twice.
template <typename T>
static size_t fwd_v4_ph_smem(const LnPlan& p) {
  return 2 * (size_t)p.G * (size_t)(p.path == LN_SPLIT ? LN_SPLIT_E : p.E) * sizeof(T);
}

// The phased forward (fwd_v4_rows_ph, fwd_v4_split_ph) of plan p.
template <typename T>
static int fwd_v4_go_ph(const LnPlan& p, const T* x, const T* w, const T* b, T* y, float* mean,
                        float* rstd, int64_t M, int64_t N, int64_t stride_x, float eps,
                        cudaStream_t stream) {
  constexpr int K = vec_width<T>();
  const int n = (int)N;
  const int64_t per_class = levels_cdiv(M, K);  // rows of the largest phase class
  const size_t smem = fwd_v4_ph_smem<T>(p);
  if (p.path == LN_SPLIT) {  // K x (clusters a class) clusters: the class is blockIdx.y mod K
    const void* kernel = (const void*)fwd_v4_split_ph<T, LN_SPLIT_E>;
    if (const cudaError_t e = levels_smem_opt_in_once(kernel, (int)smem)) return (int)e;
    const int fit = levels_occupancy_once(kernel, p.C, p.G, [&] {
      int clusters = 0;
      cudaLaunchAttribute attr[1];
      cudaLaunchConfig_t cfg = v4_cluster_config(p, 1, nullptr, attr);
      cfg.dynamicSmemBytes = smem;
      if (cudaOccupancyMaxActiveClusters(&clusters, fwd_v4_split_ph<T, LN_SPLIT_E>, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
      }
      return clusters;
    });
    const int64_t wave = levels_cdiv(fit > 0 ? fit : v4_sm_count() / p.C, K);
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg =
        v4_cluster_config(p, K * (per_class < wave ? per_class : wave), stream, attr);
    cfg.dynamicSmemBytes = smem;
    return (int)cudaLaunchKernelEx(&cfg, fwd_v4_split_ph<T, LN_SPLIT_E>, x, w, b, y, mean, rstd, M,
                                   n, stride_x, eps, (int)p.seg);
  }
  // Persistent: one wave of blocks (a multiple of K), each putting weight and bias together
  // once for its phase and then walking its class's rows. One block a row (the aligned
  // kernels' grid) paid that setup per row, ahead of the row's loads: bf16 4097 columns fell
  // to 0.23x copy (call 2 of reports/phased-rows-and-bands-2026-11-27/).
  const int64_t want = levels_cdiv(per_class, p.R);
  return fwd_v4_ph_rows_kernel<T>(p, [&](auto kernel) -> int {
    if (const cudaError_t e = levels_smem_opt_in_once((const void*)kernel, (int)smem)) return (int)e;
    const int per_sm = levels_blocks_per_sm((const void*)kernel, p.G * p.R, smem);
    const int64_t wave = levels_cdiv((int64_t)(per_sm > 0 ? per_sm : 1) * v4_sm_count(), K);
    const unsigned blocks = (unsigned)(K * (want < wave ? want : wave));  // a multiple of K
    kernel<<<blocks, p.G * p.R, smem, stream>>>(x, w, b, y, mean, rstd, M, n, stride_x, eps, p.R);
    return levels_launch_status();
  });
}

// When the rule (force 0) takes the phased kernel: where its rows in flight, blocks an SM x
// rows a block, are at least the element kernel's. Both kernels are latency-bound at these
// widths (a row's loads, two reductions, its stores, then the next row), so the rows an SM
// holds at once set the bandwidth; the phased kernel moves 16-byte vectors but may hold
// fewer rows: its span is N + VEC - 1 columns (at 1023 bf16 columns 3 warps a row against
// 2), its registers 64 against the element kernel's 56 (at 4097: 3 blocks an SM against 4),
// its shared memory the phase's weight and bias. Measured on the H100 (call 5 of
// reports/phased-rows-and-bands-2026-11-27/, forward, fraction of copy, phased against element
// loads): bf16 6145 / 7001 columns 0.78 / 0.83 against 0.59 / 0.63 (as many rows in flight:
// the rule takes them), but 4097 0.54 against 0.68, 2047 0.70 against 0.80, 1023 0.59
// against 0.78, 127 0.48 against 0.51 (fewer rows in flight: the rule does not). The rule
// misses at 5001 (3 blocks an SM each, phased 0.61 against 0.69): a tie in rows in flight
// is not always a win. Cluster (SPLIT) plans: the element kernel, unless forced.
template <typename T>
static bool fwd_v4_ph_pays(const LnPlan& ph, const LnPlan& el) {
  if (ph.path != LN_ROWS || el.path != LN_ROWS) return false;
  const size_t smem = fwd_v4_ph_smem<T>(ph);
  int rows_ph = 0, rows_el = 0;
  if (fwd_v4_ph_rows_kernel<T>(ph, [&](auto kernel) {
        if (levels_smem_opt_in_once((const void*)kernel, (int)smem) != cudaSuccess) return 1;
        rows_ph = ph.R * levels_blocks_per_sm((const void*)kernel, ph.G * ph.R, smem);
        return 0;
      }) != 0)
    return false;
  if (fwd_v4_rows_kernel<T, false>(el, [&](auto kernel) {
        rows_el = el.R * levels_blocks_per_sm((const void*)kernel, el.G * el.R, 0);
        return 0;
      }) != 0)
    return true;
  return rows_ph >= rows_el;
}

template <typename T>
static int fwd_v4_launch(int force, const T* x, const T* w, const T* b, T* y, float* mean,
                         float* rstd, int64_t M, int64_t N, int64_t stride_x, float eps,
                         cudaStream_t stream) {
  constexpr int VEC = vec_width<T>();
  const bool aligned = v4_rows_aligned<T>(M, N, {x, w, b, y}, {stride_x});
  if (!aligned && !(force & LN_FORCE_ELEMENTS) &&
      ln_rows_phased(reinterpret_cast<uintptr_t>(x), reinterpret_cast<uintptr_t>(y),
                     reinterpret_cast<uintptr_t>(w), reinterpret_cast<uintptr_t>(b), M, N, stride_x,
                     (int)sizeof(T))) {
    const LnPlan ph = v4_plan<T>(false, M, N + VEC - 1, true, force);
    const bool runs = ph.path == LN_SPLIT ||
                      (ph.path == LN_ROWS && fwd_v4_ph_rows_kernel<T>(ph, [](auto) { return 0; }) == 0);
    if (runs && (force || fwd_v4_ph_pays<T>(ph, v4_plan<T>(false, M, N, false, 0))))
      return fwd_v4_go_ph<T>(ph, x, w, b, y, mean, rstd, M, N, stride_x, eps, stream);
  }
  const LnPlan p = v4_plan<T>(false, M, N, aligned, force);
  if (p.path == LN_NONE) return LEVELS_UNSUPPORTED;
  if (p.path == LN_LOOP) {  // version 3's loop: wider than any register plan
    if (p.vec)
      fwd_v3_loop<T, VEC><<<(unsigned)M, levels_threads_for(N / VEC, 1024), 0, stream>>>(
          x, w, b, y, mean, rstd, M, N, stride_x, eps);
    else
      fwd_v3_loop<T, 1><<<(unsigned)M, levels_threads_for(N, 512), 0, stream>>>(
          x, w, b, y, mean, rstd, M, N, stride_x, eps);
    return levels_launch_status();
  }
  return p.vec ? fwd_v4_go<T, true>(p, x, w, b, y, mean, rstd, M, N, stride_x, eps, stream)
               : fwd_v4_go<T, false>(p, x, w, b, y, mean, rstd, M, N, stride_x, eps, stream);
}

// How many blocks (ROWS) or clusters (SPLIT) of a backward plan fit on the GPU at once, for
// either load width: the partial rows are counted before the launch knows the layout, so the
// smaller of the two, and the persistent grid is one wave either way.
// Asked once per device and plan shape (levels_occupancy_once): a small backward must not pay
// the calculator on every call.
template <typename T, bool VECT>
static int v4_bwd_resident(const LnPlan& p) {
  int count = 0;
  if (p.path == LN_SPLIT) {
    const void* kernel = (const void*)bwd_v4_split<T, LN_SPLIT_E, VECT>;
    count = levels_occupancy_once(kernel, p.C, p.G, [&] {
      int clusters = 0;
      cudaLaunchAttribute attr[1];
      const cudaLaunchConfig_t cfg = v4_cluster_config(p, 1, nullptr, attr);
      if (cudaOccupancyMaxActiveClusters(&clusters, bwd_v4_split<T, LN_SPLIT_E, VECT>, &cfg) !=
          cudaSuccess) {
        (void)cudaGetLastError();  // not a launch error: do not let it surface as one
        return 0;
      }
      return clusters;
    });
    if (count < 1) count = levels_sm_count() / p.C;
  } else {
    int per_sm = 1;
    if (bwd_v4_rows_kernel<T, VECT>(p, [&](auto kernel) {
          per_sm = levels_blocks_per_sm((const void*)kernel, p.G * p.R, 0);
          return 0;
        }) != 0)
      per_sm = 1;
    count = per_sm * levels_sm_count();
  }
  return count > 0 ? count : 1;
}

template <typename T>
static int64_t bwd_v4_partials(int force, int64_t M, int64_t N) {
  // The partial rows are counted before the launch knows the layout: plan as aligned rows,
  // which needs N a whole number of 16-byte vectors (a forced cluster split of 7 bf16
  // columns has no aligned plan, only an element-load one: the H100 tests found it refused).
  const bool vec_width = N % (16 / (int64_t)sizeof(T)) == 0;
  const LnPlan p = v4_plan<T>(true, M, N, vec_width, force);  // the layout changes vec only
  if (p.path == LN_NONE) return LEVELS_UNSUPPORTED;
  if (p.path == LN_LOOP) return v2_partials(M, N);
  int dev = 0;
  (void)cudaGetDevice(&dev);
  const uint32_t key = v4_key(v4_key(v4_key((uint32_t)dev, (uint32_t)sizeof(T)),
                                     (uint32_t)(p.path * 64 + p.E)),
                              (uint32_t)(p.G * 1024 + p.R * 16 + p.C));
  const int64_t resident = v4_remember(key, [&] {
    const int a = v4_bwd_resident<T, true>(p), b = v4_bwd_resident<T, false>(p);
    return a < b ? a : b;
  });
  const int64_t want = p.path == LN_SPLIT ? M : levels_cdiv(M, p.R);
  return resident < want ? resident : want;
}

template <typename T, bool VECT>
static int bwd_v4_go(const LnPlan& p, const T* dy, const T* x, const T* w, const float* mean,
                     const float* rstd, T* dx, float* part_dw, float* part_db, int64_t used,
                     int64_t rows_per, int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x,
                     cudaStream_t stream) {
  const int n = (int)N;
  if (p.path == LN_SPLIT) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = v4_cluster_config(p, used, stream, attr);
    return (int)cudaLaunchKernelEx(&cfg, bwd_v4_split<T, LN_SPLIT_E, VECT>, dy, x, w, mean, rstd,
                                   dx, part_dw, part_db, M, n, stride_dy, stride_x, rows_per,
                                   (int)p.seg);
  }
  return bwd_v4_rows_kernel<T, VECT>(p, [&](auto kernel) {
    kernel<<<(unsigned)used, p.G * p.R, 0, stream>>>(dy, x, w, mean, rstd, dx, part_dw, part_db,
                                                      M, n, stride_dy, stride_x, rows_per, p.R);
    return levels_launch_status();
  });
}

// ---- version 6 ----

template <typename T>
static const void* v6_kernel(bool backward, bool aligned) {
  if (aligned) return backward ? (const void*)bwd_v6_bulk<T, true> : (const void*)fwd_v6_bulk<T, true>;
  return backward ? (const void*)bwd_v6_bulk<T, false> : (const void*)fwd_v6_bulk<T, false>;
}

// The launch of a version 6 plan: (C, clusters) blocks in clusters of (C, 1, 1).
static cudaLaunchConfig_t v6_config(const Ln6Plan& p, int64_t clusters, cudaStream_t stream,
                                    cudaLaunchAttribute* attr) {
  const LnPlan shape{LN_SPLIT, 1, 0, LN6_THREADS, 1, p.C, p.seg};
  cudaLaunchConfig_t cfg = v4_cluster_config(shape, clusters, stream, attr);
  cfg.dynamicSmemBytes = (size_t)p.smem;
  return cfg;
}

// The clusters a launch of plan p uses: as many as fit on the GPU at once (the grid is
// persistent: one wave), at most one per row. The occupancy answer is asked once per device
// and plan (levels_occupancy_once); the shared-memory opt-in once per kernel and size.
template <typename T>
static int64_t v6_clusters(bool backward, bool aligned, const Ln6Plan& p, int64_t M) {
  const void* kernel = v6_kernel<T>(backward, aligned);
  int count = 0;
  if (levels_smem_opt_in_once(kernel, (int)p.smem) == cudaSuccess)
    count = levels_occupancy_once(kernel, p.C, p.smem, [&] {
      int clusters = 0;
      cudaLaunchAttribute attr[1];
      const cudaLaunchConfig_t cfg = v6_config(p, 1, nullptr, attr);
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();  // not a launch error: do not let it surface as one
        return 0;
      }
      return clusters;
    });
  int64_t G = count > 0 ? count : levels_sm_count() / p.C;
  if (G > M) G = M;
  return G > 0 ? G : 1;
}

// Version 6's copy-engine plan for this call, or none (ok == false: version 5 runs): the
// rule's choice (force 1: wherever a plan exists), on a GPU with clusters. aligned: the
// rows load as 16-byte vectors (else the kernels' VECT = false instantiations run).
template <typename T>
static Ln6Plan v6_choose(bool backward, int force, int64_t N, bool aligned) {
  const Ln6Plan none{false, 0, 0, 0, 0};
  if (!v4_clusters()) return none;
  if (!force && !ln_v6_bulk(backward, N, (int)sizeof(T), aligned)) return none;
  return ln_v6_plan(backward, N, (int)sizeof(T), aligned);
}

template <typename T>
static int fwd_v6_launch(const Ln6Plan& p, bool aligned, const T* x, const T* w, const T* b, T* y,
                         float* mean, float* rstd, int64_t M, int64_t N, int64_t stride_x,
                         float eps, cudaStream_t stream) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = v6_config(p, v6_clusters<T>(false, aligned, p, M), stream, attr);
  if (aligned)
    return (int)cudaLaunchKernelEx(&cfg, fwd_v6_bulk<T, true>, x, w, b, y, mean, rstd, M, (int)N,
                                   stride_x, eps, (int)p.seg, p.stages);
  return (int)cudaLaunchKernelEx(&cfg, fwd_v6_bulk<T, false>, x, w, b, y, mean, rstd, M, (int)N,
                                 stride_x, eps, (int)p.seg, p.stages);
}

// The partial rows version 6's backward needs (its copy-engine kernel's clusters), counted
// before the launch knows the layout: enough for either layout's plan. 0: it would not run.
template <typename T>
static int64_t bwd_v6_partials(int force, int64_t M, int64_t N) {
  int64_t most = 0;
  for (const bool aligned : {true, false}) {
    if (aligned && N % vec_width<T>()) continue;
    const Ln6Plan p = v6_choose<T>(true, force, N, aligned);
    const int64_t G = p.ok ? v6_clusters<T>(true, aligned, p, M) : 0;
    if (G > most) most = G;
  }
  return most;
}

template <typename T>
static int bwd_launch(int version, int force, const T* dy, const T* x, const T* w, const float* mean,
                      const float* rstd, T* dx, T* dw, T* db, float* partials, int64_t P,
                      int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x,
                      cudaStream_t stream) {
  if (version == 1) {
    bwd_dx_v1<T><<<(unsigned)levels_cdiv(M, V1_THREADS), V1_THREADS, 0, stream>>>(
        dy, x, w, mean, rstd, dx, M, N, stride_dy, stride_x);
    bwd_dwdb_v1<T><<<(unsigned)levels_cdiv(N, 256), 256, 0, stream>>>(dy, x, mean, rstd, dw, db,
                                                                      M, N, stride_dy, stride_x);
    return levels_launch_status();
  }
  if (P < 1) return LEVELS_UNSUPPORTED;  // the caller allocated no partial rows
  constexpr int VEC = vec_width<T>();
  // The blocks (partial rows) a kernel uses: P, the buffer's rows, except where version 5's
  // count (the larger of its two backwards': the alignment decides which runs) exceeds the
  // kernel's one wave.
  int64_t blocks = P;
  if (version == 6) {  // the copy-engine kernel where the rule (or force) says; else version 5
    const bool aligned = v4_rows_aligned<T>(M, N, {dy, x, w, dx}, {stride_dy, stride_x});
    const Ln6Plan p6 = v6_choose<T>(true, force, N, aligned);
    if (p6.ok) {
      const int64_t G = v6_clusters<T>(true, aligned, p6, M);
      if (G > P) return LEVELS_UNSUPPORTED;  // the caller's buffer: levels_layer_norm_bwd_partials
      float* part_dw = partials;
      float* part_db = partials + P * N;
      cudaLaunchAttribute attr[1];
      const cudaLaunchConfig_t cfg = v6_config(p6, G, stream, attr);
      const cudaError_t e =
          aligned ? cudaLaunchKernelEx(&cfg, bwd_v6_bulk<T, true>, dy, x, w, mean, rstd, dx, part_dw,
                                       part_db, M, (int)N, stride_dy, stride_x, (int)p6.seg, p6.stages)
                  : cudaLaunchKernelEx(&cfg, bwd_v6_bulk<T, false>, dy, x, w, mean, rstd, dx, part_dw,
                                       part_db, M, (int)N, stride_dy, stride_x, (int)p6.seg, p6.stages);
      if (e != cudaSuccess) return (int)e;
      sum_partials<T><<<(unsigned)levels_cdiv(N, SUM_COLS), dim3(SUM_COLS, SUM_LANES), 0,
                        stream>>>(part_dw, part_db, dw, db, G, N);
      return levels_launch_status();
    }
    if (force) return LEVELS_UNSUPPORTED;  // forced, and it cannot run here
    version = 5;
  }
  if (version == 5) {  // aligned rows up to 8192 wide: the R-row kernel; else version 4's
    const BwdV5Plan p5 = bwd_v5_plan<T>(M, N);
    if (p5.fused && v4_rows_aligned<T>(M, N, {dy, x, w, dx}, {stride_dy, stride_x})) {
      blocks = p5.P < P ? p5.P : P;
      const int64_t rows_per = levels_cdiv(levels_cdiv(M, blocks), p5.R) * p5.R;
      const int64_t used = levels_cdiv(M, rows_per);
      float* part_dw = partials;
      float* part_db = partials + P * N;
      void* args[] = {(void*)&dy,      (void*)&x,       (void*)&w,  (void*)&mean,
                      (void*)&rstd,    (void*)&dx,      (void*)&part_dw, (void*)&part_db,
                      (void*)&M,       (void*)&N,       (void*)&stride_dy, (void*)&stride_x,
                      (void*)&rows_per};
      const cudaError_t e = cudaLaunchKernel(p5.kernel, dim3((unsigned)used),
                                             dim3((unsigned)p5.threads), args, 0, stream);
      if (e != cudaSuccess) return (int)e;
      sum_partials<T><<<(unsigned)levels_cdiv(N, SUM_COLS), dim3(SUM_COLS, SUM_LANES), 0,
                        stream>>>(part_dw, part_db, dw, db, used, N);
      return levels_launch_status();
    }
    const int64_t p4 = bwd_v4_partials<T>(0, M, N);
    blocks = p4 < P ? p4 : P;
    version = 4;
  }
  if (version == 4) {
    const LnPlan p4 = v4_plan<T>(true, M, N, v4_rows_aligned<T>(M, N, {dy, x, w, dx},
                                                                {stride_dy, stride_x}), force);
    if (p4.path == LN_NONE) return LEVELS_UNSUPPORTED;
    if (p4.path != LN_LOOP) {  // LOOP: version 2's kernels, below
      const int64_t rows_per = levels_cdiv(M, blocks), used = levels_cdiv(M, rows_per);
      float* part_dw = partials;
      float* part_db = partials + P * N;
      const int status =
          p4.vec ? bwd_v4_go<T, true>(p4, dy, x, w, mean, rstd, dx, part_dw, part_db, used,
                                      rows_per, M, N, stride_dy, stride_x, stream)
                 : bwd_v4_go<T, false>(p4, dy, x, w, mean, rstd, dx, part_dw, part_db, used,
                                       rows_per, M, N, stride_dy, stride_x, stream);
      if (status != LEVELS_OK) return status;
      sum_partials<T><<<(unsigned)levels_cdiv(N, SUM_COLS), dim3(SUM_COLS, SUM_LANES), 0,
                        stream>>>(part_dw, part_db, dw, db, used, N);
      return levels_launch_status();
    }
  }
  BwdV3Plan plan{false, 0, 0, 0};
  if (version == 3) plan = bwd_v3_plan<T>(M, N);
  // The same alignment rule as the forward's; where it fails, v3's backward is v2's.
  const bool fused = plan.fused && levels_aligned16(dy) && levels_aligned16(x) &&
                     levels_aligned16(w) && levels_aligned16(dx) && N % VEC == 0 &&
                     (M == 1 || (stride_x % VEC == 0 && stride_dy % VEC == 0));
  float* part_dw = partials;
  float* part_db = partials + P * N;
  // Whole chunks of rows_per rows; `used` <= P chunks are non-empty and get written.
  const int64_t rows_per = levels_cdiv(M, blocks);
  const int64_t used = levels_cdiv(M, rows_per);
  if (fused) {
    if (plan.E == 8)
      bwd_v3_fused<T, 8, 2><<<(unsigned)used, plan.threads, 0, stream>>>(
          dy, x, w, mean, rstd, dx, part_dw, part_db, M, N, stride_dy, stride_x, rows_per);
    else
      bwd_v3_fused<T, 16, 1><<<(unsigned)used, plan.threads, 0, stream>>>(
          dy, x, w, mean, rstd, dx, part_dw, part_db, M, N, stride_dy, stride_x, rows_per);
  } else {
    bwd_dx_v2<T><<<(unsigned)levels_cdiv(M, V2_ROWS), V2_ROWS * 32, 0, stream>>>(
        dy, x, w, mean, rstd, dx, M, N, stride_dy, stride_x);
    const dim3 grid((unsigned)levels_cdiv(N, PARTIAL_THREADS), (unsigned)used);
    bwd_dwdb_partial_v2<T><<<grid, PARTIAL_THREADS, 0, stream>>>(
        dy, x, mean, rstd, part_dw, part_db, M, N, stride_dy, stride_x, rows_per);
  }
  sum_partials<T><<<(unsigned)levels_cdiv(N, SUM_COLS), dim3(SUM_COLS, SUM_LANES), 0, stream>>>(
      part_dw, part_db, dw, db, used, N);
  return levels_launch_status();
}

}  // namespace levels_layer_norm

// =====================================================================================
// extern "C" launchers: the switch over versions
// =====================================================================================

// y, mean, rstd = layer_norm(x, weight, bias). x: (M, N) with rows stride_x elements apart
// and adjacent columns; weight, bias: contiguous (N,); y: contiguous (M, N); mean, rstd:
// contiguous (M,) fp32. M, N >= 1. force: 0, or a path to force: version 4's
// (layer_norm_plan.h: 1 ROWS, 2 SPLIT, 3 LOOP, + 4 for element loads) or version 6's (1: the
// copy-engine kernel at any width); a forced path that cannot run these sizes here is
// LEVELS_UNSUPPORTED.
static int levels_layer_norm_check(int version, int force) {
  if (version < 1 || version > 6) return LEVELS_BAD_VERSION;
  if (force == 0) return LEVELS_OK;
  if (version == 4 && force > 0 && force <= 7) return LEVELS_OK;
  if (version == 6 && force == 1) return LEVELS_OK;
  return LEVELS_UNSUPPORTED;
}

// The version that version 0 ("the measured rule", layer_norm_plan.h ln_default_version)
// stands for, for this x: (M, N) rows stride_x elements apart. The binding asks before it
// calls the launchers below, in the forward and again in the backward (the same x: the same
// answer). Today the width alone decides; the rest of x's view (its address, its row
// stride) is read by the version's own launcher, which picks its kernel from it.
extern "C" int levels_layer_norm_default_version(int dtype, const void* x, int64_t M, int64_t N,
                                                 int64_t stride_x) {
  (void)dtype, (void)x, (void)M, (void)stride_x;
  return levels_layer_norm::ln_default_version(N);
}

extern "C" int levels_layer_norm_fwd(int dtype, int version, int force, const void* x,
                                     const void* weight, const void* bias, void* y, float* mean,
                                     float* rstd, int64_t M, int64_t N, int64_t stride_x,
                                     float eps, cudaStream_t stream) {
  using namespace levels_layer_norm;
  if (const int bad = levels_layer_norm_check(version, force)) return bad;
  LEVELS_DISPATCH(dtype, T, {
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(weight);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    if (version == 6) {  // the copy-engine kernel where the rule (or force) says; else version 5
      const bool aligned = v4_rows_aligned<T>(M, N, {xt, wt, bt, yt}, {stride_x});
      const Ln6Plan p6 = v6_choose<T>(false, force, N, aligned);
      if (p6.ok)
        return fwd_v6_launch<T>(p6, aligned, xt, wt, bt, yt, mean, rstd, M, N, stride_x, eps, stream);
      if (force) return LEVELS_UNSUPPORTED;
      version = 5;
    }
    if (version == 5)  // the forward the rule runs: version 3's or version 4's
      version = ln_v5_forward(N, ln_rows_aligned(reinterpret_cast<uintptr_t>(x), M, N, stride_x,
                                                 (int)sizeof(T)));
    switch (version) {
      case 1: return fwd_v1_launch<T>(xt, wt, bt, yt, mean, rstd, M, N, stride_x, eps, stream);
      case 2: return fwd_v2_launch<T>(xt, wt, bt, yt, mean, rstd, M, N, stride_x, eps, stream);
      case 3: return fwd_v3_launch<T>(xt, wt, bt, yt, mean, rstd, M, N, stride_x, eps, stream);
      default:
        return fwd_v4_launch<T>(force, xt, wt, bt, yt, mean, rstd, M, N, stride_x, eps, stream);
    }
  });
  return LEVELS_OK;  // not reached
}

// How many partial rows P the backward of `version` (and `force`) needs for these sizes: the
// caller passes `partials`, a contiguous fp32 buffer of 2 * P * N floats (P may be 0:
// version 1 needs none). A negative value is a LevelsStatus.
extern "C" int64_t levels_layer_norm_bwd_partials(int dtype, int version, int force, int64_t M,
                                                  int64_t N) {
  using namespace levels_layer_norm;
  if (const int bad = levels_layer_norm_check(version, force)) return bad;
  if (version == 1) return 0;
  if (version == 2) return v2_partials(M, N);
  if (version == 3) {
    LEVELS_DISPATCH(dtype, T, { return bwd_v3_plan<T>(M, N).P; });
  }
  if (version == 5 || version == 6) {  // enough for any backward it may run (alignment decides)
    LEVELS_DISPATCH(dtype, T, {
      const int64_t p6 = version == 6 ? bwd_v6_partials<T>(force, M, N) : 0;
      if (force) return p6 > 0 ? p6 : (int64_t)LEVELS_UNSUPPORTED;
      const int64_t p5 = bwd_v5_plan<T>(M, N).P, p4 = bwd_v4_partials<T>(0, M, N);
      const int64_t p54 = p5 > p4 ? p5 : p4;
      return p6 > p54 ? p6 : p54;
    });
  }
  LEVELS_DISPATCH(dtype, T, { return bwd_v4_partials<T>(force, M, N); });
  return LEVELS_OK;  // not reached
}

// dx, dweight, dbias of layer_norm. dy: (M, N), rows stride_dy apart; x: (M, N), rows
// stride_x apart (both with adjacent columns); weight: contiguous (N,); mean, rstd: the
// forward's, contiguous (M,) fp32; dx: contiguous (M, N); dweight, dbias: contiguous (N,);
// partials: 2 * partial_rows * N fp32, partial_rows = levels_layer_norm_bwd_partials(dtype,
// version, force, M, N) (any P >= 1 is correct for versions 2-5; the count only sets the
// split).
extern "C" int levels_layer_norm_bwd(int dtype, int version, int force, const void* dy,
                                     const void* x, const void* weight, const float* mean,
                                     const float* rstd, void* dx, void* dweight, void* dbias,
                                     float* partials, int64_t partial_rows, int64_t M, int64_t N,
                                     int64_t stride_dy, int64_t stride_x, cudaStream_t stream) {
  using namespace levels_layer_norm;
  if (const int bad = levels_layer_norm_check(version, force)) return bad;
  LEVELS_DISPATCH(dtype, T, {
    return bwd_launch<T>(version, force, static_cast<const T*>(dy), static_cast<const T*>(x),
                         static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx),
                         static_cast<T*>(dweight), static_cast<T*>(dbias), partials, partial_rows,
                         M, N, stride_dy, stride_x, stream);
  });
  return LEVELS_OK;  // not reached
}
