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
// Versions (LEVELS_CUDA_VERSION_RMS_NORM=1|2|3; forward vN pairs with backward vN):
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
//
// Speed: not yet measured on a GPU (layer_norm's v3, the same design, reached 0.98x copy
// forward and 0.73-0.89x backward on the H100). `levels bench --component rms_norm` times
// every version against the copy bandwidth.
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
  const V* wv = reinterpret_cast<const V*>(weight);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    w[c] = k < n_vec ? wv[k] : zero;
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[c * VEC + j] = 0.0f;
  }
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
  float* pdw = part_dw + (int64_t)blockIdx.x * N;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) pdw[k * VEC + j] = dw[c * VEC + j];
    }
  }
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
  } else if (version == 3 && vec_ok && N <= 32 * V3_WARP_E) {  // narrow: a warp per row
    fwd_v3<T, V3_WARP_E, true><<<(unsigned)levels_cdiv(M, V2_ROWS), V2_ROWS * 32, 0, stream>>>(
        x, w, y, rstd, M, N, stride_x, eps);
  } else if (version == 3 && vec_ok && N <= BLOCK_E * 512) {  // a block per row
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

template <typename T>
static int bwd_launch(int version, const T* dy, const T* x, const T* w, const float* rstd, T* dx,
                      T* dw, float* part_dw, int64_t P, int64_t M, int64_t N, int64_t stride_dy,
                      int64_t stride_x, cudaStream_t stream) {
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
  if (version == 3) plan = bwd_v3_plan<T>(M, N);
  // The forward's alignment rule; where it fails, v3's backward is v2's.
  const bool fused = plan.E != 0 && levels_aligned16(dy) && levels_aligned16(x) &&
                     levels_aligned16(w) && levels_aligned16(dx) && N % VEC == 0 &&
                     (M == 1 || (stride_x % VEC == 0 && stride_dy % VEC == 0));
  const int64_t rows_per = levels_cdiv(M, P);  // whole chunks: `used` <= P are non-empty
  const int64_t used = levels_cdiv(M, rows_per);
  if (fused && plan.E == 8) {
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
  if (version < 1 || version > 3) return LEVELS_BAD_VERSION;
  LEVELS_DISPATCH(dtype, T, {
    return fwd_launch<T>(version, static_cast<const T*>(x), static_cast<const T*>(weight),
                         static_cast<T*>(y), rstd, M, N, stride_x, eps, stream);
  });
  return LEVELS_OK;  // not reached
}

// How many partial rows P (a contiguous fp32 buffer of P * N floats) the backward of
// `version` needs for these sizes (version 1: none). A negative value is a LevelsStatus.
extern "C" int64_t levels_rms_norm_bwd_partials(int dtype, int version, int64_t M, int64_t N) {
  using namespace levels_rms_norm;
  if (version < 1 || version > 3) return LEVELS_BAD_VERSION;
  if (version == 1) return 0;
  if (version == 2) return v2_partials(M, N);
  LEVELS_DISPATCH(dtype, T, { return bwd_v3_plan<T>(M, N).P; });
  return LEVELS_OK;  // not reached
}

// dx, dweight of rms_norm. dy, x: (M, N), rows stride_dy / stride_x apart, adjacent columns;
// weight: contiguous (N,); rstd: the forward's, contiguous (M,) fp32; dx: contiguous (M, N);
// dweight: contiguous (N,); partials: partial_rows * N fp32 (any partial_rows >= 1 is
// correct for versions 2 and 3: the count only sets the split).
extern "C" int levels_rms_norm_bwd(int dtype, int version, const void* dy, const void* x,
                                   const void* weight, const float* rstd, void* dx, void* dweight,
                                   float* partials, int64_t partial_rows, int64_t M, int64_t N,
                                   int64_t stride_dy, int64_t stride_x, cudaStream_t stream) {
  using namespace levels_rms_norm;
  if (version < 1 || version > 3) return LEVELS_BAD_VERSION;
  LEVELS_DISPATCH(dtype, T, {
    return bwd_launch<T>(version, static_cast<const T*>(dy), static_cast<const T*>(x),
                         static_cast<const T*>(weight), rstd, static_cast<T*>(dx),
                         static_cast<T*>(dweight), partials, partial_rows, M, N, stride_dy,
                         stride_x, stream);
  });
  return LEVELS_OK;  // not reached
}
