// lstm.cu — the recurrence of a one-layer LSTM (batch_first, gates i, f, g, o as nn.LSTM),
// forward and backward through time, as a ladder of two versions.
//
//   z_t = xp_t + h_{t-1} W_hh^T + b_hh          xp = x W_ih^T + b_ih: ONE GEMM for all steps,
//   i, f, g, o = sigmoid, sigmoid, tanh, sigmoid  made before these kernels run (part A's
//   c_t = f c_{t-1} + i g,   h_t = o tanh(c_t)    gemm, fp32 output; cuda_kernels/lstm.py)
//
// Only h_{t-1} W_hh^T must stay inside the loop over time: per step a (B, H) x (H, 4H) product,
// tiny at small batch. At B=8, hidden 512 it is 2*8*512*2048 = 16.8 MFLOP, 0.02 us of an H100's
// bf16 tensor cores and ~0.3 us of its fp32 CUDA cores, and W_hh (2 MB bf16) comes from L2 in
// ~0.4 us. A kernel launch, though, costs several us from the moment the previous kernel drains
// to the moment the next one runs (launch latency, block scheduling, the tail of the last wave).
// So a kernel per step is LAUNCH-BOUND at small batch: T launches x several us, next to well
// under a microsecond of math. That is the whole case for persistence (version 2): launch once,
// keep the weights on chip, and pay a grid-wide barrier (~1-2 us, a round trip through L2)
// per step instead of a launch.
//   Measured on the H100 (B=8, input 256, hidden 512, T=64, forward; filled in from
//   `levels bench --component lstm --level cuda`): v1 ___ ms (___ us/step), v2 ___ ms
//   (___ us/step), nn.LSTM (cuDNN) ___ ms; bf16 v2 / nn.LSTM = ___x, fp32 ___x.
//
// Versions (LEVELS_CUDA_VERSION_LSTM=1|2, or version=):
//   v1  one fused step kernel per time step, T launches: a warp per (hidden unit, batch row)
//       computes its 4 gate dot products over H (lanes stride along K: coalesced rows of W_hh
//       and of h_{t-1}, shuffle sums), then the gate nonlinearities and the cell update, all in
//       one kernel instead of Level 1's ~10 per step. W_hh is read from L2 every step; c travels
//       between launches through an fp32 (B, H) buffer. Works at any size. Costs: T launches
//       (launch-bound at small batch, above), W_hh re-read from L2 by every warp (B times).
//   v2  one PERSISTENT cooperative launch for the whole sequence. Block k owns hidden units
//       4k..4k+3 — all four gates of each, 16 rows of W_hh, which is exactly the M of one
//       tensor-core mma.m16n8k16 — and keeps those rows in shared memory for all T steps; its
//       c stays in shared memory (fp32). Per step a block stages h_{t-1} (B x H, from L2) in
//       shared memory, its 8 warps split K = H and multiply (16-bit: mma.sync, batch as N in
//       8-column tiles; fp32: exact FMAs on CUDA cores, no TF32), the partial sums meet in
//       shared memory (fixed order: deterministic, no atomics), one thread per (unit, batch
//       row) applies the gates, writes h_t to global memory, and every block meets at
//       cooperative_groups' grid.sync() before the next step reads h_t. Costs: a grid barrier
//       per step; ceil(H/4) blocks that must ALL be resident at once, each holding 16 rows of
//       W_hh — so the whole W_hh must fit in the GPU's combined shared memory (on an H100
//       roughly hidden <= 1000 fp32 / 1500 bf16, less with a large batch): beyond that the
//       launcher refuses (a ValueError naming w_hh and pointing at v1), never runs slowly or
//       wrongly. The grid is launched with cudaLaunchCooperativeKernel and sized from
//       cudaOccupancyMaxActiveBlocksPerMultiprocessor, so co-residency is GUARANTEED by the
//       launch: if the blocks cannot all be resident the launch fails with an error. Level 4's
//       spin barrier could only assume it (and needed a timeout and a NaN poison to avoid a
//       silent hang when another kernel held some SMs); here the driver checks.
//
// Backward through time (same version number): per step, from t = T-1 down to 0,
//   dh = dout_t + dz_{t+1} W_hh (+ dh_T at the last step),  dc += dh o (1 - tanh^2 c_t),
//   dz_i = dc g i(1-i), dz_f = dc c_{t-1} f(1-f), dz_g = dc i (1-g^2), dz_o = dh tanh(c_t) o(1-o),
//   dc <- dc f;  finally dh0 = dz_0 W_hh, dc0 = dc.
// The gates and c_t saved by the forward (fp32, only when gradients are needed) make each step
// elementwise but for dz_{t+1} W_hh, which reads W_hh by COLUMNS: the binding hands these
// kernels W_hh^T (H, 4H) contiguous, one copy per backward call. dW_ih, dW_hh, dx and the bias
// gradients do not recur: GEMMs and column sums over all steps at once (cuda_kernels/lstm.py).
//   v1  a step kernel per t (T + 1 launches): a warp per (unit, batch row), lanes along the
//       4H row of W_hh^T and of dz_{t+1}; dc carried in an fp32 (B, H) buffer.
//   v2  one persistent cooperative launch, the forward's partition: block k keeps W_hh^T's 4
//       rows of its units (4 x 4H) in shared memory, stages dz_{t+1} (B x 4H; in pieces of
//       its columns when whole rows do not fit) per step, and keeps dc in shared memory;
//       grid.sync() between steps. Its recurrent product runs on
//       CUDA cores at every dtype (fp32 accumulate): the block's M is 4 units, below a tensor
//       core tile. dz is stored in the input dtype (the GEMMs read it) and read back from there.
//
// Layouts (made so by cuda_kernels/lstm_binding.cpp and lstm.py): xp (rows, 4H) fp32, gates
// (rows, 4H) fp32, cs (rows, H) fp32 and dz (rows, 4H) contiguous, where the row of (batch b,
// step t) is b * rs_b + t * rs_t: (rs_b, rs_t) = (T, 1) when x was batch-major, (1, B) when it
// was a time-major view (its GEMM operand is then a view, no copy). out (B, T, H), h0, c0,
// h_n, c_n, dh_n, dc_n, dh0, dc0 (B, H), dout (B, T, H), w_hh (4H, H), W_hh^T (H, 4H) and
// b_hh (4H,) contiguous. Offsets into per-step tensors are int64.
#include "common.cuh"
#include "mma.cuh"

#include <cooperative_groups.h>

namespace levels_lstm {

using namespace levels_mma;
namespace cg = cooperative_groups;

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;  // v1: (unit, batch) pairs per block; v2: the K split
constexpr int UNITS = 4;             // v2: hidden units per block
constexpr int ROWS = 4 * UNITS;      // v2: gate rows per block = the M of mma.m16n8k16
constexpr int MAX_BN = 64;           // v2: batch rows per chunk (8 mma n-tiles)

// Both sizes are baked into the thread mappings below: one (unit, batch row) pair per thread.
static_assert(UNITS * MAX_BN <= THREADS, "v2 gives every (unit, batch row) of a chunk its own thread");
static_assert(ROWS == 16, "v2's block rows are the M of one m16n8k16 tile");

struct Gates {
  float i, f, g, o;
};

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// Pre-activations -> activations (accurate expf/tanhf: the fp32 bound is 1e-5).
__device__ __forceinline__ Gates activate(float zi, float zf, float zg, float zo) {
  return {sigmoid(zi), sigmoid(zf), tanhf(zg), sigmoid(zo)};
}

// Everything the forward kernels read and write (see the layouts above).
template <typename T>
struct FwdArgs {
  const float* xp;    // (rows, 4H) fp32: x W_ih^T + b_ih
  const T* h0;        // (B, H)
  const T* c0;        // (B, H)
  const T* w_hh;      // (4H, H)
  const T* b_hh;      // (4H,)
  T* out;             // (B, T, H): h_t for every step
  T* h_n;             // (B, H): h_T
  T* c_n;             // (B, H): c_T
  float* gates;       // (rows, 4H) fp32 activations i, f, g, o, or nullptr (no backward)
  float* cs;          // (rows, H) fp32 c_t, or nullptr
  float* c_buf;       // v1: (B, H) fp32, c between launches; v2: unused
  int64_t B, steps, H, rs_b, rs_t;
};

// Everything the backward kernels read and write.
template <typename T>
struct BwdArgs {
  const T* dout;      // (B, T, H): gradient of out
  const T* dh_n;      // (B, H): gradient of h_T
  const T* dc_n;      // (B, H): gradient of c_T
  const T* c0;        // (B, H)
  const T* wt;        // (H, 4H): W_hh^T
  const float* gates; // (rows, 4H) saved by the forward
  const float* cs;    // (rows, H) saved by the forward
  T* dz;              // (rows, 4H): gate pre-activation gradients, written and read back
  T* dh0;             // (B, H)
  T* dc0;             // (B, H)
  float* dc_buf;      // v1: (B, H) fp32, dc between launches; v2: unused
  int64_t B, steps, H, rs_b, rs_t;
};

// One cell step for one (unit, batch row): writes h_t, c_t (and the saved activations).
// Returns c_t. `row` is the per-step row of (b, t); j the unit.
template <typename T>
__device__ __forceinline__ float cell_forward(const FwdArgs<T>& a, float zi, float zf, float zg,
                                              float zo, float c_prev, int64_t b, int64_t t,
                                              int64_t j) {
  const Gates s = activate(zi, zf, zg, zo);
  const float c = s.f * c_prev + s.i * s.g;
  const float h = s.o * tanhf(c);
  const int64_t H = a.H;
  a.out[(b * a.steps + t) * H + j] = from_f32<T>(h);
  if (a.gates != nullptr) {
    const int64_t row = b * a.rs_b + t * a.rs_t;
    float* gr = a.gates + row * 4 * H + j;
    gr[0] = s.i;
    gr[H] = s.f;
    gr[2 * H] = s.g;
    gr[3 * H] = s.o;
    a.cs[row * H + j] = c;
  }
  if (t == a.steps - 1) {
    a.h_n[b * H + j] = from_f32<T>(h);
    a.c_n[b * H + j] = from_f32<T>(c);
  }
  return c;
}

// One backward cell step for one (unit j, batch row b) at step t >= 0, with dh the total
// gradient reaching h_t and dc the one reaching c_t from step t+1: writes dz_t, returns the
// gradient reaching c_{t-1}.
template <typename T>
__device__ __forceinline__ float cell_backward(const BwdArgs<T>& a, float dh, float dc, int64_t b,
                                               int64_t t, int64_t j) {
  const int64_t H = a.H;
  const int64_t row = b * a.rs_b + t * a.rs_t;
  const float* gr = a.gates + row * 4 * H + j;
  const float gi = gr[0], gf = gr[H], gg = gr[2 * H], go = gr[3 * H];
  const float tc = tanhf(a.cs[row * H + j]);
  const float c_prev = t > 0 ? a.cs[(row - a.rs_t) * H + j] : to_f32<T>(a.c0[b * H + j]);
  dc += dh * go * (1.0f - tc * tc);
  T* dzr = a.dz + row * 4 * H + j;
  dzr[0] = from_f32<T>(dc * gg * gi * (1.0f - gi));
  dzr[H] = from_f32<T>(dc * c_prev * gf * (1.0f - gf));
  dzr[2 * H] = from_f32<T>(dc * gi * (1.0f - gg * gg));
  dzr[3 * H] = from_f32<T>(dh * tc * go * (1.0f - go));
  return dc * gf;
}

// =========================================================================================
// v1: one fused step kernel per time step
// =========================================================================================

// Step t of the forward. A warp per (unit j, batch row b): consecutive warps take consecutive
// units of one batch row, so a block's 8 warps share their h_{t-1} row in L1.
template <typename T>
__global__ void __launch_bounds__(THREADS) lstm_fwd_step_v1(FwdArgs<T> a, int64_t t) {
  const int lane = threadIdx.x & 31;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * WARPS + (threadIdx.x >> 5);
  const int64_t H = a.H;
  if (pair >= a.B * H) return;  // the whole warp: this kernel has no block barrier
  const int64_t j = pair % H, b = pair / H;
  // h_{t-1}: h0 at t == 0, else the previous launch's row of out.
  const T* h = t == 0 ? a.h0 + b * H : a.out + (b * a.steps + t - 1) * H;
  const T* w = a.w_hh + j * H;  // row j of gate i; gate q is 4 blocks of H rows further
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t k = lane; k < H; k += 32) {
    const float hk = to_f32<T>(h[k]);
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] += hk * to_f32<T>(w[q * H * H + k]);
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) acc[q] = warp_sum(acc[q]);
  if (lane != 0) return;
  const float* xr = a.xp + (b * a.rs_b + t * a.rs_t) * 4 * H + j;
  float z[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) z[q] = acc[q] + xr[q * H] + to_f32<T>(a.b_hh[q * H + j]);
  const float c_prev = t == 0 ? to_f32<T>(a.c0[b * H + j]) : a.c_buf[b * H + j];
  a.c_buf[b * H + j] = cell_forward(a, z[0], z[1], z[2], z[3], c_prev, b, t, j);
}

// Step t of the backward (t = -1: the final launch, dh0 = dz_0 W_hh and dc0). A warp per
// (unit j, batch row b); lanes walk the 4H-long row j of W_hh^T and row (b, t+1) of dz.
template <typename T>
__global__ void __launch_bounds__(THREADS) lstm_bwd_step_v1(BwdArgs<T> a, int64_t t) {
  const int lane = threadIdx.x & 31;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * WARPS + (threadIdx.x >> 5);
  const int64_t H = a.H;
  if (pair >= a.B * H) return;
  const int64_t j = pair % H, b = pair / H;
  float rec = 0.0f;  // dz_{t+1} W_hh[:, j]: what h_t contributed to step t+1
  if (t + 1 < a.steps) {
    const T* dz = a.dz + (b * a.rs_b + (t + 1) * a.rs_t) * 4 * H;
    const T* w = a.wt + j * 4 * H;
    for (int64_t r = lane; r < 4 * H; r += 32) rec += to_f32<T>(dz[r]) * to_f32<T>(w[r]);
    rec = warp_sum(rec);
  }
  if (lane != 0) return;
  const int64_t bj = b * H + j;
  if (t < 0) {
    a.dh0[bj] = from_f32<T>(rec);
    a.dc0[bj] = from_f32<T>(a.dc_buf[bj]);
    return;
  }
  float dh = to_f32<T>(a.dout[(b * a.steps + t) * H + j]) + rec;
  float dc;
  if (t == a.steps - 1) {
    dh += to_f32<T>(a.dh_n[bj]);
    dc = to_f32<T>(a.dc_n[bj]);
  } else {
    dc = a.dc_buf[bj];
  }
  a.dc_buf[bj] = cell_backward(a, dh, dc, b, t, j);
}

// =========================================================================================
// v2: one persistent cooperative launch
// =========================================================================================

// rows x cols_pad of a (B, cols) matrix, batch rows b0.. b0+rows-1 (row b at src + b*stride),
// into shared memory with leading dimension ld; rows past B and columns past cols are zeros
// (the products over them then add exactly nothing). Loads go through L2 (ld.global.cg):
// these rows were written by OTHER blocks during this kernel, and L1 is not coherent.
// Called by all threads of the block.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, int ld, const T* src, int64_t stride, int64_t b0,
                                           int rows, int64_t B, int cols, int cols_pad) {
  constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte load
  const bool vec = cols % VEC == 0 && stride % VEC == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  if (vec) {
    const int per_row = cols_pad / VEC;
    for (int idx = threadIdx.x; idx < rows * per_row; idx += blockDim.x) {
      const int r = idx / per_row, k = (idx % per_row) * VEC;
      int4 v = make_int4(0, 0, 0, 0);
      if (b0 + r < B && k < cols) v = __ldcg(reinterpret_cast<const int4*>(src + (b0 + r) * stride + k));
      *reinterpret_cast<int4*>(dst + r * ld + k) = v;
    }
  } else {  // odd widths or misaligned rows: element by element, still coalesced along k
    for (int idx = threadIdx.x; idx < rows * cols_pad; idx += blockDim.x) {
      const int r = idx / cols_pad, k = idx % cols_pad;
      T v = from_f32<T>(0.0f);
      if (b0 + r < B && k < cols) v = __ldcg(src + (b0 + r) * stride + k);
      dst[r * ld + k] = v;
    }
  }
}

// Four neighbouring elements of shared memory as floats (4-element aligned).
template <typename T> __device__ __forceinline__ float4 load4(const T* p);
template <> __device__ __forceinline__ float4 load4<float>(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
template <> __device__ __forceinline__ float4 load4<__half>(const __half* p) {
  const __half2* q = reinterpret_cast<const __half2*>(p);
  const float2 lo = __half22float2(q[0]), hi = __half22float2(q[1]);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
template <> __device__ __forceinline__ float4 load4<__nv_bfloat16>(const __nv_bfloat16* p) {
  const __nv_bfloat162* q = reinterpret_cast<const __nv_bfloat162*>(p);
  const float2 lo = __bfloat1622float2(q[0]), hi = __bfloat1622float2(q[1]);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// Shared-memory geometry, the same formula on host and device. K is padded to whole
// 16-element mma steps; each row gets 16 more bytes so that rows start in different banks
// (ldmatrix and the B-fragment loads are then conflict free).
__host__ __device__ __forceinline__ int pad16(int64_t k) { return static_cast<int>((k + 15) / 16 * 16); }
template <typename T> __host__ __device__ __forceinline__ int lead(int kp) {
  return kp + 16 / static_cast<int>(sizeof(T));
}

// Forward: W_hh slice (16 x ld) | h_{t-1} chunk (bn x ld) | partial sums (8 x 16 x bn fp32) |
// c (B x 4 fp32).
template <typename T>
__host__ __device__ __forceinline__ size_t fwd_smem_bytes(int64_t H, int bn, int64_t B) {
  const int ld = lead<T>(pad16(H));
  return static_cast<size_t>(ROWS + bn) * ld * sizeof(T) + static_cast<size_t>(WARPS) * ROWS * bn * 4 +
         static_cast<size_t>(B) * UNITS * 4;
}

// Backward: W_hh^T slice (4 x ld4, ld4 from the padded 4H) | a piece of the dz_{t+1} chunk
// (bn x lead(kc): kc of the 4H columns at a time, so that a wide 4H does not need bn full
// rows on chip) | partial sums (8 x 4 x bn) | dc (B x 4 fp32).
template <typename T>
__host__ __device__ __forceinline__ size_t bwd_smem_bytes(int64_t H, int bn, int kc, int64_t B) {
  return static_cast<size_t>(UNITS) * lead<T>(pad16(4 * H)) * sizeof(T) +
         static_cast<size_t>(bn) * lead<T>(kc) * sizeof(T) + static_cast<size_t>(WARPS) * UNITS * bn * 4 +
         static_cast<size_t>(B) * UNITS * 4;
}

// The block's 16 gate rows times the staged h chunk, partial over this warp's share of K,
// stored as red[warp][row][n] (row = gate * 4 + unit). 16-bit: tensor cores. A = the W_hh
// rows (16 x 16 per step, ldmatrix from shared memory), B = h (16 x 8: h_s is (n, k) with k
// contiguous, which is the "col" layout mma wants, so each lane loads its two 32-bit pairs).
template <typename T>
__device__ __forceinline__ void fwd_partials(const T* w_s, const T* h_s, float* red, int ld, int kp,
                                             int bn) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ntn = bn / 8;  // 8-column n-tiles in this chunk
  float acc[MAX_BN / 8][4];
#pragma unroll
  for (int j = 0; j < MAX_BN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  // Warp w takes K steps w, w+8, ...: every warp gets work once H >= 128.
  for (int ks = warp; ks < kp / 16; ks += WARPS) {
    const int k0 = ks * 16;
    uint32_t a[4];
    ldmatrix_x4(a, smem_addr(w_s + (lane & 15) * ld + k0 + (lane >> 4) * 8));
#pragma unroll
    for (int j = 0; j < MAX_BN / 8; ++j) {
      if (j < ntn) {
        const T* hp = h_s + (j * 8 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(hp);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(hp + 8);
        mma_16816<T>(acc[j], a, b0, b1);
      }
    }
  }
  // Accumulator layout of m16n8: (row g, cols 2c, 2c+1) and (row g+8, same cols).
  const int g = lane >> 2, c2 = 2 * (lane & 3);
  float* mine = red + warp * ROWS * bn;
#pragma unroll
  for (int j = 0; j < MAX_BN / 8; ++j) {
    if (j < ntn) {
      const int n = j * 8 + c2;
      mine[g * bn + n] = acc[j][0];
      mine[g * bn + n + 1] = acc[j][1];
      mine[(g + 8) * bn + n] = acc[j][2];
      mine[(g + 8) * bn + n + 1] = acc[j][3];
    }
  }
}

// fp32: exact FMAs on the CUDA cores (no TF32). Lane (u = lane % 4, nl = lane / 4) computes
// the 4 gate rows of unit u for batch columns nl, nl+8, ...: per 4 elements of K it loads 4
// W rows and ntn h rows (16-byte loads) for 16 * ntn FMAs.
template <>
__device__ __forceinline__ void fwd_partials<float>(const float* w_s, const float* h_s, float* red,
                                                    int ld, int kp, int bn) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int u = lane & 3, nl = lane >> 2;
  const int ntn = bn / 8;
  float acc[MAX_BN / 8][4];
#pragma unroll
  for (int j = 0; j < MAX_BN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  for (int ks = warp; ks < kp / 16; ks += WARPS) {
#pragma unroll
    for (int kk = 0; kk < 16; kk += 4) {
      const int k = ks * 16 + kk;
      float4 w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) w[q] = load4<float>(w_s + (q * UNITS + u) * ld + k);
#pragma unroll
      for (int j = 0; j < MAX_BN / 8; ++j) {
        if (j < ntn) {
          const float4 h = load4<float>(h_s + (j * 8 + nl) * ld + k);
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[j][q] = dot4(w[q], h, acc[j][q]);
        }
      }
    }
  }
  float* mine = red + warp * ROWS * bn;
#pragma unroll
  for (int j = 0; j < MAX_BN / 8; ++j) {
    if (j < ntn) {
#pragma unroll
      for (int q = 0; q < 4; ++q) mine[(q * UNITS + u) * bn + j * 8 + nl] = acc[j][q];
    }
  }
}

// The whole forward sequence. Block k owns units 4k..4k+3; thread (u = tid % 4, n = tid / 4)
// owns (unit 4k+u, batch row b0+n) of each batch chunk, the same pair at every step, so its
// c needs no barrier. Launched cooperatively: grid.sync() is legal only then.
// __launch_bounds__(256, 2): at most 128 registers, so that registers never keep two blocks
// off an SM (the grid must be resident all at once; ptxas: no spills at that cap).
template <typename T>
__global__ void __launch_bounds__(THREADS, 2) lstm_fwd_persistent_v2(FwdArgs<T> a, int bn) {
  extern __shared__ __align__(16) unsigned char smem[];
  cg::grid_group grid = cg::this_grid();
  const int tid = threadIdx.x;
  const int64_t H = a.H, B = a.B;
  const int kp = pad16(H), ld = lead<T>(kp);
  T* w_s = reinterpret_cast<T*>(smem);
  T* h_s = w_s + ROWS * ld;
  float* red = reinterpret_cast<float*>(h_s + bn * ld);
  float* c_s = red + WARPS * ROWS * bn;  // c_s[b * 4 + u]
  const int64_t unit0 = static_cast<int64_t>(blockIdx.x) * UNITS;

  // Once: this block's 16 rows of W_hh (row q*4+u is W_hh's row q*H + unit), zero-padded.
  for (int idx = tid; idx < ROWS * kp; idx += THREADS) {
    const int r = idx / kp, k = idx % kp;
    const int64_t unit = unit0 + (r % UNITS);
    T v = from_f32<T>(0.0f);
    if (unit < H && k < H) v = a.w_hh[((r / UNITS) * H + unit) * H + k];
    w_s[r * ld + k] = v;
  }
  for (int idx = tid; idx < B * UNITS; idx += THREADS) {
    const int64_t unit = unit0 + (idx % UNITS);
    c_s[idx] = unit < H ? to_f32<T>(a.c0[(idx / UNITS) * H + unit]) : 0.0f;
  }
  const int u = tid & 3, n = tid >> 2;
  const int64_t unit = unit0 + u;
  float bias[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (unit < H) {
#pragma unroll
    for (int q = 0; q < 4; ++q) bias[q] = to_f32<T>(a.b_hh[q * H + unit]);
  }
  __syncthreads();  // w_s and c_s complete before any thread reads them

  for (int64_t t = 0; t < a.steps; ++t) {
    const T* h_src = t == 0 ? a.h0 : a.out + (t - 1) * H;  // row b at h_src + b * h_stride
    const int64_t h_stride = t == 0 ? H : a.steps * H;
    for (int64_t b0 = 0; b0 < B; b0 += bn) {
      const int64_t b = b0 + n;
      const bool mine = n < bn && b < B && unit < H;
      float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (mine) {  // issued before the staging and the products: its latency hides behind them
        const float* xr = a.xp + (b * a.rs_b + t * a.rs_t) * 4 * H + unit;
#pragma unroll
        for (int q = 0; q < 4; ++q) z[q] = xr[q * H] + bias[q];
      }
      __syncthreads();  // the previous chunk's readers of h_s and red are done
      stage_rows<T>(h_s, ld, h_src, h_stride, b0, bn, B, static_cast<int>(H), kp);
      __syncthreads();
      fwd_partials<T>(w_s, h_s, red, ld, kp, bn);
      __syncthreads();
      if (mine) {
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {  // fixed order: bitwise deterministic
#pragma unroll
          for (int q = 0; q < 4; ++q) z[q] += red[(w * ROWS + q * UNITS + u) * bn + n];
        }
        float* c = c_s + b * UNITS + u;
        *c = cell_forward(a, z[0], z[1], z[2], z[3], *c, b, t, unit);
      }
    }
    // h_t of every block is in global memory (grid.sync fences) before anyone reads it.
    if (t + 1 < a.steps) grid.sync();
  }
}

// Backward partial products: lane (u = lane % 4, nl = lane / 4) dots row u of the W_hh^T
// slice (columns k0.. of it) with the staged dz rows nl, nl+8, ... (columns 0..width of the
// piece), over this warp's share of the piece's K; accumulates into acc (kept across pieces).
template <typename T>
__device__ __forceinline__ void bwd_partials(const T* wt_s, int ld_w, int k0, const T* dz_s, int ld_z,
                                             int width, int bn, float (&acc)[MAX_BN / 8]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int u = lane & 3, nl = lane >> 2;
  const int ntn = bn / 8;
  for (int ks = warp; ks < width / 16; ks += WARPS) {
#pragma unroll
    for (int kk = 0; kk < 16; kk += 4) {
      const int k = ks * 16 + kk;
      const float4 w = load4<T>(wt_s + u * ld_w + k0 + k);
#pragma unroll
      for (int j = 0; j < MAX_BN / 8; ++j) {
        if (j < ntn) acc[j] = dot4(w, load4<T>(dz_s + (j * 8 + nl) * ld_z + k), acc[j]);
      }
    }
  }
}

// The whole backward sequence, steps T-1..0 and a last pass (t = -1) for dh0 and dc0.
// kc: the width of the dz pieces staged at a time (a multiple of 16; kp itself when whole
// rows fit).
template <typename T>
__global__ void __launch_bounds__(THREADS, 2) lstm_bwd_persistent_v2(BwdArgs<T> a, int bn, int kc) {
  extern __shared__ __align__(16) unsigned char smem[];
  cg::grid_group grid = cg::this_grid();
  const int tid = threadIdx.x;
  const int64_t H = a.H, B = a.B, G = 4 * a.H;
  const int kp = pad16(G), ld = lead<T>(kp), ld_z = lead<T>(kc);
  T* wt_s = reinterpret_cast<T*>(smem);
  T* dz_s = wt_s + UNITS * ld;
  float* red = reinterpret_cast<float*>(dz_s + bn * ld_z);
  float* dc_s = red + WARPS * UNITS * bn;  // dc_s[b * 4 + u]
  const int64_t unit0 = static_cast<int64_t>(blockIdx.x) * UNITS;

  // Once: W_hh^T's rows of this block's units (W_hh's columns), zero-padded; dc = dc_T.
  for (int idx = tid; idx < UNITS * kp; idx += THREADS) {
    const int r = idx / kp, k = idx % kp;
    const int64_t unit = unit0 + r;
    T v = from_f32<T>(0.0f);
    if (unit < H && k < G) v = a.wt[unit * G + k];
    wt_s[r * ld + k] = v;
  }
  for (int idx = tid; idx < B * UNITS; idx += THREADS) {
    const int64_t unit = unit0 + (idx % UNITS);
    dc_s[idx] = unit < H ? to_f32<T>(a.dc_n[(idx / UNITS) * H + unit]) : 0.0f;
  }
  const int u = tid & 3, n = tid >> 2;
  const int64_t unit = unit0 + u;
  __syncthreads();  // wt_s and dc_s complete before any thread reads them

  for (int64_t s = 0; s <= a.steps; ++s) {
    const int64_t t = a.steps - 1 - s;     // -1 on the last pass
    const bool recurrent = t + 1 < a.steps;  // dz_{t+1} exists
    for (int64_t b0 = 0; b0 < B; b0 += bn) {
      const int64_t b = b0 + n;
      const bool mine = n < bn && b < B && unit < H;
      float dh = 0.0f;
      if (mine && t >= 0) {  // issued early: hides behind the staging and the products
        dh = to_f32<T>(a.dout[(b * a.steps + t) * H + unit]);
        if (t == a.steps - 1) dh += to_f32<T>(a.dh_n[b * H + unit]);
      }
      if (recurrent) {  // the same value for the whole block: the barriers are uniform
        float acc[MAX_BN / 8];
#pragma unroll
        for (int j = 0; j < MAX_BN / 8; ++j) acc[j] = 0.0f;
        const T* dz_next = a.dz + (t + 1) * a.rs_t * G;  // row b at dz_next + b * rs_b * G
        for (int k0 = 0; k0 < kp; k0 += kc) {
          const int width = kp - k0 < kc ? kp - k0 : kc;
          const int valid = G - k0 < width ? static_cast<int>(G - k0) : width;
          __syncthreads();  // the previous readers of dz_s (and, at k0 = 0, of red) are done
          stage_rows<T>(dz_s, ld_z, dz_next + k0, a.rs_b * G, b0, bn, B, valid, width);
          __syncthreads();
          bwd_partials<T>(wt_s, ld, k0, dz_s, ld_z, width, bn, acc);
        }
        const int lane = tid & 31, warp = tid >> 5;
        float* part = red + warp * UNITS * bn;
#pragma unroll
        for (int j = 0; j < MAX_BN / 8; ++j) {
          if (j < bn / 8) part[(lane & 3) * bn + j * 8 + (lane >> 2)] = acc[j];
        }
        __syncthreads();
      }
      if (mine) {
        float rec = 0.0f;
        if (recurrent) {
#pragma unroll
          for (int w = 0; w < WARPS; ++w) rec += red[(w * UNITS + u) * bn + n];  // fixed order
        }
        float* dc = dc_s + b * UNITS + u;
        if (t < 0) {
          a.dh0[b * H + unit] = from_f32<T>(rec);
          a.dc0[b * H + unit] = from_f32<T>(*dc);
        } else {
          *dc = cell_backward(a, dh + rec, *dc, b, t, unit);
        }
      }
    }
    // dz_t of every block is in global memory before step t-1 reads it.
    if (s < a.steps) grid.sync();
  }
}

// =========================================================================================
// Launchers
// =========================================================================================

template <typename T>
int launch_fwd_v1(const FwdArgs<T>& a, cudaStream_t stream) {
  const int64_t blocks = levels_cdiv(a.B * a.H, WARPS);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  for (int64_t t = 0; t < a.steps; ++t) lstm_fwd_step_v1<T><<<(unsigned)blocks, THREADS, 0, stream>>>(a, t);
  return levels_launch_status();
}

template <typename T>
int launch_bwd_v1(const BwdArgs<T>& a, cudaStream_t stream) {
  const int64_t blocks = levels_cdiv(a.B * a.H, WARPS);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  for (int64_t t = a.steps - 1; t >= -1; --t)
    lstm_bwd_step_v1<T><<<(unsigned)blocks, THREADS, 0, stream>>>(a, t);
  return levels_launch_status();
}

// Cooperative launches with one block per 4 hidden units. The launcher picks the largest
// batch chunk bn (64, 32, 16 or 8 rows; never more than the batch needs) — and, backward, the
// widest dz piece kc (all of 4H, else 2048, 1024 or 512 columns) — whose shared memory fits a
// block and whose grid fits the GPU all at once, as the occupancy calculator counts it (so
// the cooperative launch cannot be refused for size). LEVELS_UNSUPPORTED if none does (W_hh
// too large to stay on chip) or the GPU cannot launch cooperatively: the binding turns that
// into a ValueError naming w_hh.
struct Gpu {
  int sms = 0, optin = 0;
};

inline int gpu_limits(Gpu& gpu) {
  int device = 0, coop = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&gpu.sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&gpu.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device);
  if (err != cudaSuccess) return static_cast<int>(err);
  return coop ? LEVELS_OK : LEVELS_UNSUPPORTED;
}

// Whether `blocks` blocks of `kernel` with `smem` bytes of shared memory each can be resident
// at once (`ok`); a CUDA error only if the occupancy query itself fails.
inline cudaError_t fits(const void* kernel, size_t smem, int64_t blocks, const Gpu& gpu, bool& ok) {
  ok = false;
  if (smem > static_cast<size_t>(gpu.optin)) return cudaSuccess;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
      cudaSuccess) {
    cudaGetLastError();  // this size is refused; a smaller one may not be
    return cudaSuccess;
  }
  int per_sm = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, smem);
  ok = err == cudaSuccess && static_cast<int64_t>(per_sm) * gpu.sms >= blocks;
  return err;
}

inline int cooperative(const void* kernel, int64_t blocks, size_t smem, void** params, cudaStream_t stream) {
  const cudaError_t err =
      cudaLaunchCooperativeKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(THREADS), params, smem, stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return static_cast<int>(err);
  }
  return levels_launch_status();
}

// The batch chunks to try, largest first.
inline int first_chunk(int64_t B) { return static_cast<int>(B >= MAX_BN ? MAX_BN : levels_cdiv(B, 8) * 8); }

template <typename T>
int launch_fwd_v2(const FwdArgs<T>& a, cudaStream_t stream) {
  Gpu gpu;
  if (const int status = gpu_limits(gpu)) return status;
  const void* kernel = reinterpret_cast<const void*>(&lstm_fwd_persistent_v2<T>);
  const int64_t blocks = levels_cdiv(a.H, UNITS);
  const int first = first_chunk(a.B);
  const int chunks[] = {first, 32, 16, 8};
  for (int bn : chunks) {
    if (bn > first) continue;
    const size_t smem = fwd_smem_bytes<T>(a.H, bn, a.B);
    bool ok = false;
    if (const cudaError_t err = fits(kernel, smem, blocks, gpu, ok)) return static_cast<int>(err);
    if (!ok) continue;
    FwdArgs<T> args = a;
    void* params[] = {&args, &bn};
    return cooperative(kernel, blocks, smem, params, stream);
  }
  return LEVELS_UNSUPPORTED;
}

template <typename T>
int launch_bwd_v2(const BwdArgs<T>& a, cudaStream_t stream) {
  Gpu gpu;
  if (const int status = gpu_limits(gpu)) return status;
  const void* kernel = reinterpret_cast<const void*>(&lstm_bwd_persistent_v2<T>);
  const int64_t blocks = levels_cdiv(a.H, UNITS);
  const int first = first_chunk(a.B), kp = pad16(4 * a.H);
  const int chunks[] = {first, 32, 16, 8}, pieces[] = {kp, 2048, 1024, 512};
  for (int bn : chunks) {
    if (bn > first) continue;
    for (int kc : pieces) {
      if (kc > kp) continue;
      const size_t smem = bwd_smem_bytes<T>(a.H, bn, kc, a.B);
      bool ok = false;
      if (const cudaError_t err = fits(kernel, smem, blocks, gpu, ok)) return static_cast<int>(err);
      if (!ok) continue;
      BwdArgs<T> args = a;
      void* params[] = {&args, &bn, &kc};
      return cooperative(kernel, blocks, smem, params, stream);
    }
  }
  return LEVELS_UNSUPPORTED;
}

template <typename T>
int launch_fwd(int version, const FwdArgs<T>& a, cudaStream_t stream) {
  switch (version) {
    case 1: return launch_fwd_v1<T>(a, stream);
    case 2: return launch_fwd_v2<T>(a, stream);
    default: return LEVELS_BAD_VERSION;
  }
}

template <typename T>
int launch_bwd(int version, const BwdArgs<T>& a, cudaStream_t stream) {
  switch (version) {
    case 1: return launch_bwd_v1<T>(a, stream);
    case 2: return launch_bwd_v2<T>(a, stream);
    default: return LEVELS_BAD_VERSION;
  }
}

}  // namespace levels_lstm

// Forward of the recurrence. xp (rows, 4H) fp32 = x W_ih^T + b_ih, made by the caller; gates
// and cs may be nullptr (no backward: nothing saved); c_buf (B, H) fp32 scratch for v1
// (nullptr is fine for v2). Row of (b, t) in xp/gates/cs: b * rs_b + t * rs_t.
extern "C" int levels_lstm_fwd(int dtype, int version, const float* xp, const void* h0, const void* c0,
                               const void* w_hh, const void* b_hh, void* out, void* h_n, void* c_n,
                               float* gates, float* cs, float* c_buf, int64_t B, int64_t T, int64_t H,
                               int64_t rs_b, int64_t rs_t, cudaStream_t stream) {
  using namespace levels_lstm;
  if (version < 1 || version > 2) return LEVELS_BAD_VERSION;
  if (B <= 0 || T <= 0 || H <= 0) return LEVELS_OK;
  if ((gates == nullptr) != (cs == nullptr)) return LEVELS_UNSUPPORTED;
  if (version == 1 && c_buf == nullptr) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, Tp, {
    const FwdArgs<Tp> a{xp, static_cast<const Tp*>(h0), static_cast<const Tp*>(c0),
                        static_cast<const Tp*>(w_hh), static_cast<const Tp*>(b_hh), static_cast<Tp*>(out),
                        static_cast<Tp*>(h_n), static_cast<Tp*>(c_n), gates, cs, c_buf, B, T, H, rs_b, rs_t};
    return launch_fwd<Tp>(version, a, stream);
  });
  return LEVELS_OK;  // not reached
}

// Backward of the recurrence: dz (rows, 4H) for the GEMMs, dh0, dc0 (B, H). wt = W_hh^T
// (H, 4H) contiguous; dc_buf (B, H) fp32 scratch for v1.
extern "C" int levels_lstm_bwd(int dtype, int version, const void* dout, const void* dh_n, const void* dc_n,
                               const void* c0, const void* wt, const float* gates, const float* cs, void* dz,
                               void* dh0, void* dc0, float* dc_buf, int64_t B, int64_t T, int64_t H,
                               int64_t rs_b, int64_t rs_t, cudaStream_t stream) {
  using namespace levels_lstm;
  if (version < 1 || version > 2) return LEVELS_BAD_VERSION;
  if (B <= 0 || T <= 0 || H <= 0) return LEVELS_OK;
  if (version == 1 && dc_buf == nullptr) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, Tp, {
    const BwdArgs<Tp> a{static_cast<const Tp*>(dout), static_cast<const Tp*>(dh_n), static_cast<const Tp*>(dc_n),
                        static_cast<const Tp*>(c0), static_cast<const Tp*>(wt), gates, cs, static_cast<Tp*>(dz),
                        static_cast<Tp*>(dh0), static_cast<Tp*>(dc0), dc_buf, B, T, H, rs_b, rs_t};
    return launch_bwd<Tp>(version, a, stream);
  });
  return LEVELS_OK;  // not reached
}
