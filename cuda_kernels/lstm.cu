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
//   Measured on the H100 (2026-11-22, `python scripts/device_level5.py --only lstm` bench;
//   B=8, input 256, hidden 512, T=64, forward, nn.LSTM timed in the same run), v2 AS FIRST
//   WRITTEN (4 units a block, cooperative_groups' grid.sync): bf16 v1 0.670 ms (10.5 us/step,
//   2.47x nn.LSTM), v2 0.403 ms (6.3 us/step, 4.09x; nn.LSTM 1.65 ms; goal >= 5x, i.e.
//   ~5.1 us/step); fp32 v1 0.569 ms (2.01x), v2 0.449 ms (2.55x; goal >= 1.0x). B=64,
//   input 512, hidden 512, T=100: bf16 v2 1.16 ms (2.13x), fp32 v2 2.61 ms (0.97x). Forward
//   + backward, bf16, the first shape: v2 1.73 ms (2.37x).
//   v2 after tuning (the per-step latency work below: fatter blocks, the split flag barrier,
//   cp.async staging, xp prefetched across the barrier): see reports/h100-level5-attention-lstm.json.
//
// Versions (LEVELS_CUDA_VERSION_LSTM=1|2, or version=; neither: the PLAN, v2 where its plan
// fits this GPU — all its blocks resident at once with their W_hh rows on chip — else v1):
//   v1  one fused step kernel per time step, T launches: a warp per (hidden unit, batch row)
//       computes its 4 gate dot products over H (lanes stride along K: coalesced rows of W_hh
//       and of h_{t-1}, shuffle sums), then the gate nonlinearities and the cell update, all in
//       one kernel instead of Level 1's ~10 per step. W_hh is read from L2 every step; c travels
//       between launches through an fp32 (B, H) buffer. Works at any size. Costs: T launches
//       (launch-bound at small batch, above), W_hh re-read from L2 by every warp (B times).
//   v2  one PERSISTENT cooperative launch for the whole sequence. Block k owns U hidden units
//       (U = 8 up to batch 16; beyond, 16 in 16-bit over batch groups — the WIDE partition,
//       launch_fwd_v2 — and 4 in fp32; build knobs LEVELS_LSTM_V2_UNITS and _FAT_BATCH) —
//       all four gates of each, 4U rows of W_hh, whole tensor-core m16 tiles — and keeps them in
//       shared memory for all T steps; its c stays in shared memory (fp32). A step is a chain
//       of latencies, not of work, so v2 is built around its critical path:
//         wait for h_{t-1} -> stage it in shared memory (cp.async through L2: one round trip)
//         -> the warps split (m tile, K) and multiply (16-bit: mma.sync, batch as N in 8-column
//         tiles; fp32: exact FMAs on CUDA cores, no TF32) -> the partial sums meet in shared
//         memory (fixed order: deterministic, no atomics) -> one thread per (unit, batch row)
//         applies the gates and writes h_t -> arrive at the grid barrier -> prefetch xp_{t+1}
//         (it does not depend on h) while the other blocks arrive.
//       The barrier (knob LEVELS_LSTM_V2_BARRIER; default 2): each block publishes "step t
//       done" in its own word with st.release.gpu and waits by polling every block's word with
//       ld.acquire.gpu, one thread per word: no read-modify-write on one contended counter
//       (1: that counter, with red.release; 0: cooperative_groups' grid.sync()). Spinning is
//       safe because the launch guarantees co-residency (below). Fewer, fatter blocks at small
//       batch (8 units: 64 blocks at hidden 512) halve the barrier's participants and the
//       copies of h_{t-1} that the grid pulls from the same L2 lines every step, for twice the
//       (there tiny) work per block; at large batch the work is not tiny, and 4 units a block
//       spread it over twice the SMs. Costs: a grid barrier per step; ceil(H/U) blocks
//       that must ALL be resident at once — so the whole W_hh must fit in the GPU's combined
//       shared memory (on an H100 roughly hidden <= 1000 fp32 / 1500 bf16, less with a large
//       batch): beyond that an explicit version 2 refuses (a ValueError naming w_hh and
//       pointing at v1), never runs slowly or wrongly, and the plan runs v1. The grid is
//       launched with cudaLaunchCooperativeKernel and sized from
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
//   v2  one persistent cooperative launch: block k keeps W_hh^T's rows of its units in
//       shared memory, stages dz_{t+1} per step (in pieces of its columns when whole rows do
//       not fit), and keeps dc in shared memory; the forward's grid barrier between steps.
//       dz is stored in the input dtype (the GEMMs read it) and read back from there.
//       16-bit (lstm_bwd_persistent_v2_mma): 16 units a block, one m16 tile of W_hh^T rows,
//       so the recurrent product runs on the tensor cores (batch as N), and the batch split
//       over blocks in groups, each staging only its rows of dz_{t+1}, double-buffered.
//       fp32 (and odd H, and an H whose 16-row slice does not fit): 4 units a block, every
//       block staging all B rows, the product on CUDA cores (fp32 accumulate).
//       Measured (B64, hidden 1024, T64, bf16, H100; reports/lstm-recurrence/): the backward
//       kernel 4.9 -> 1.2 ms, then 1.0 once its copies stopped computing indices per copy
//       (copy_rows_async), 0.99 with the cells' loads issued before the product (load_saved);
//       the wide forward 1.3 -> 0.70 ms; forward+backward 6.5 -> 2.1 ms against nn.LSTM's
//       3.3-4.4 (its kernels alone ~1.5 ms: cuDNN launches ~5 a step from the host). The LSTM
//       LM's step at Level 5: 287k -> 757-803k tokens/s, 1.76-2.15x nn.LSTM's model in four
//       tables (torch's host-bound step moves between hosts).
//
// Layouts (made so by cuda_kernels/lstm_binding.cpp and lstm.py): xp (rows, 4H) fp32, gates
// (rows, 4H) fp32, cs (rows, H) fp32 and dz (rows, 4H) contiguous, where the row of (batch b,
// step t) is b * rs_b + t * rs_t: (rs_b, rs_t) = (T, 1) when x was batch-major, (1, B) when it
// was a time-major view (its GEMM operand is then a view, no copy). out (B, T, H), h0, c0,
// h_n, c_n, dh_n, dc_n, dh0, dc0 (B, H), dout (B, T, H), w_hh (4H, H), W_hh^T (H, 4H) and
// b_hh (4H,) contiguous. Offsets into per-step tensors are int64.
//
// As an exercise (`levels assignment build --levels cuda`, docs/grading.md "Level 5"): the
// solution regions marked below are the cell's math, forward and backward (cell_forward,
// cell_backward), which every version calls, as at Level 4. The recurrence's ladder stays.
#include "common.cuh"
#include "mma.cuh"

#include <algorithm>
#include <cooperative_groups.h>

namespace levels_lstm {

using namespace levels_mma;
namespace cg = cooperative_groups;

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;  // v1: (unit, batch) pairs per block; v2: warps per block
constexpr int UNITS = 4;             // v2 backward: hidden units per block (W_hh^T rows)
constexpr int MAX_BN = 64;           // v2: batch rows per chunk (8 mma n-tiles)

// ---- v2's build knobs (LEVELS_CUDA_NVCC_FLAGS="-DLEVELS_LSTM_V2_UNITS=4" rebuilds with
// another value; the defaults are the ones judged best, the sweep in scripts/device_level5.py
// times the others) ----
//
// LEVELS_LSTM_V2_UNITS (4, 8 or 16): hidden units per forward block at SMALL batch, i.e. 4x
// that many gate rows = that many/4 mma m16 tiles. Fewer, fatter blocks: the per-step barrier
// has fewer participants, and h_{t-1}, which EVERY block reads from L2 at every step, is read
// by fewer blocks (at hidden 512: 64 blocks x 8 KB instead of 128 x 8 KB from the same few L2
// lines); the cost is more work per block per step, on fewer SMs. That is a win only while a
// step is latency-bound (small batch); past LEVELS_LSTM_V2_FAT_BATCH batch rows the step's
// work matters (fp32 at batch 64 is CUDA-core bound) and the forward keeps 4 units a block,
// twice the SMs.
#ifndef LEVELS_LSTM_V2_UNITS
#define LEVELS_LSTM_V2_UNITS 8
#endif
#ifndef LEVELS_LSTM_V2_FAT_BATCH
#define LEVELS_LSTM_V2_FAT_BATCH 16
#endif
// LEVELS_LSTM_V2_BARRIER: how the blocks meet between steps (see grid_arrive / grid_wait).
//   0  cooperative_groups' grid.sync(): one counter, atom.add.release + ld.acquire polling by
//      one thread a block (the previous default, kept to compare against);
//   1  one counter, split into arrive (red.release: fire and forget) and wait, with the next
//      step's independent loads (xp_{t+1}) issued in between;
//   2  a flag per block, written with st.release and polled with ld.acquire by one thread per
//      flag: no read-modify-write on one contended word at all, and the same split.
#ifndef LEVELS_LSTM_V2_BARRIER
#define LEVELS_LSTM_V2_BARRIER 2
#endif

constexpr int FAT_UNITS = LEVELS_LSTM_V2_UNITS;  // v2 forward's units a block up to FAT_BATCH rows
constexpr int THIN_UNITS = 4;                    // ... and beyond in fp32 (the M of one m16 tile)
constexpr int WIDE_UNITS = 16;                   // ... and in 16-bit, over batch groups

// The forward's partition for U units a block: gate rows q * U + u; warp w takes m16 tile
// w % M_TILES and K slice w / M_TILES; each thread owns PAIRS (unit, batch row) pairs.
template <int U>
struct FwdShape {
  static constexpr int UNITS = U, ROWS = 4 * U, M_TILES = ROWS / 16, K_SPLIT = WARPS / M_TILES,
                       PAIRS = U * MAX_BN / THREADS;
  static_assert(U == 4 || U == 8 || U == 16, "LEVELS_LSTM_V2_UNITS must be 4, 8 or 16");
  static_assert(PAIRS * THREADS == U * MAX_BN && WARPS % M_TILES == 0, "the forward's thread mappings");
};
static_assert(LEVELS_LSTM_V2_BARRIER >= 0 && LEVELS_LSTM_V2_BARRIER <= 2, "LEVELS_LSTM_V2_BARRIER must be 0, 1 or 2");
// The backward's mapping: one (unit, batch row) pair per thread, lanes as (unit, column).
static_assert(UNITS * MAX_BN <= THREADS && UNITS == 4, "v2 backward gives every pair its own thread");

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
  // NaN until computed: an exercise copy (the region cut) compiles, and fails the check.
  const float unset = __int_as_float(0x7fc00000);
  Gates s = {unset, unset, unset, unset};
  float c = unset, h = unset;
  // ### BEGIN SOLUTION
  s = activate(zi, zf, zg, zo);
  c = s.f * c_prev + s.i * s.g;
  h = s.o * tanhf(c);
  // ### END SOLUTION
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

// What the forward saved for one (unit j, batch row b) at step t: the four activations, c_t
// and c_{t-1}. Loaded apart from the cell's arithmetic so that a kernel can issue these loads
// before the recurrent product they do not depend on (the mma backward does).
struct Saved {
  float gi, gf, gg, go, c, c_prev;
};

template <typename T>
__device__ __forceinline__ Saved load_saved(const BwdArgs<T>& a, int64_t b, int64_t t, int64_t j) {
  const int64_t H = a.H;
  const int64_t row = b * a.rs_b + t * a.rs_t;
  const float* gr = a.gates + row * 4 * H + j;
  return {gr[0], gr[H], gr[2 * H], gr[3 * H], a.cs[row * H + j],
          t > 0 ? a.cs[(row - a.rs_t) * H + j] : to_f32<T>(a.c0[b * H + j])};
}

// One backward cell step for one (unit j, batch row b) at step t >= 0, with dh the total
// gradient reaching h_t and dc the one reaching c_t from step t+1: writes dz_t, returns the
// gradient reaching c_{t-1}.
template <typename T>
__device__ __forceinline__ float cell_backward(const BwdArgs<T>& a, const Saved& s, float dh, float dc,
                                               int64_t b, int64_t t, int64_t j) {
  const int64_t H = a.H;
  const int64_t row = b * a.rs_b + t * a.rs_t;
  const float gi = s.gi, gf = s.gf, gg = s.gg, go = s.go;
  const float tc = tanhf(s.c);
  const float c_prev = s.c_prev;
  const float unset = __int_as_float(0x7fc00000);  // as in cell_forward
  float dz_i = unset, dz_f = unset, dz_g = unset, dz_o = unset, dc_prev = unset;
  // ### BEGIN SOLUTION
  dc += dh * go * (1.0f - tc * tc);
  dz_i = dc * gg * gi * (1.0f - gi);
  dz_f = dc * c_prev * gf * (1.0f - gf);
  dz_g = dc * gi * (1.0f - gg * gg);
  dz_o = dh * tc * go * (1.0f - go);
  dc_prev = dc * gf;
  // ### END SOLUTION
  T* dzr = a.dz + row * 4 * H + j;
  dzr[0] = from_f32<T>(dz_i);
  dzr[H] = from_f32<T>(dz_f);
  dzr[2 * H] = from_f32<T>(dz_g);
  dzr[3 * H] = from_f32<T>(dz_o);
  return dc_prev;
}

template <typename T>
__device__ __forceinline__ float cell_backward(const BwdArgs<T>& a, float dh, float dc, int64_t b,
                                               int64_t t, int64_t j) {
  return cell_backward(a, load_saved(a, b, t, j), dh, dc, b, t, j);
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

// Issue (the caller commits and waits) the 16-byte cp.async copies of rows [b0, b0 + rows) x
// columns [0, cols_pad) of a (B, cols) matrix (row b at src + b * stride; cols, stride and src
// whole 16-byte pieces) into dst (leading dimension ld); rows past B and columns past cols
// become zeros. A thread keeps ONE 16-byte column and walks down the rows: a division per
// call, then additions. (Computing every copy's row and column from a flat index, two integer
// divisions and 64-bit products a copy, was most of the instructions of the backward's step:
// ncu found that kernel issue-bound, 5.8 cycles per instruction with nothing else saturated,
// reports/lstm-recurrence/ncu-backward-level4-level5.txt.)
template <typename T>
__device__ __forceinline__ void copy_rows_async(T* dst, int ld, const T* src, int64_t stride, int64_t b0,
                                                int rows, int64_t B, int cols, int cols_pad) {
  constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte copy
  const int per_row = cols_pad / VEC, threads = static_cast<int>(blockDim.x);
  if (per_row <= threads) {
    const int row_step = threads / per_row;  // rows a pass of the block covers
    const int r0 = static_cast<int>(threadIdx.x) / per_row;
    if (r0 >= row_step) return;  // the threads past row_step * per_row have no column
    const int k = (static_cast<int>(threadIdx.x) - r0 * per_row) * VEC;
    const bool column = k < cols;
    const T* s = src + (b0 + r0) * stride + k;
    uint32_t d = smem_addr(dst + r0 * ld + k);
    const int64_t s_step = static_cast<int64_t>(row_step) * stride;
    const uint32_t d_step = static_cast<uint32_t>(row_step * ld * sizeof(T));
    for (int r = r0; r < rows; r += row_step, s += s_step, d += d_step) {
      const bool inside = column && b0 + r < B;
      // Outside: 0 source bytes = 16 zero bytes, and the (unread) address stays src itself.
      cp_async_16(d, inside ? s : src, inside ? 16 : 0);
    }
  } else {  // rows wider than the block's threads x 16 bytes: a flat index
    for (int idx = threadIdx.x; idx < rows * per_row; idx += threads) {
      const int r = idx / per_row, k = (idx % per_row) * VEC;
      const bool inside = b0 + r < B && k < cols;
      cp_async_16(smem_addr(dst + r * ld + k), inside ? src + (b0 + r) * stride + k : src, inside ? 16 : 0);
    }
  }
}

// rows x cols_pad of a (B, cols) matrix, batch rows b0.. b0+rows-1 (row b at src + b*stride),
// into shared memory with leading dimension ld; rows past B and columns past cols are zeros
// (the products over them then add exactly nothing). These rows were written by OTHER blocks
// during this kernel, and L1 is not coherent: the loads go through L2 (cp.async.cg, or
// ld.global.cg for odd widths). cp.async puts every 16-byte piece of a thread in flight at
// once (no register round trip, no load-store dependence between the loop's iterations): the
// staging costs ONE L2 round trip, on the critical path of every step. Called by all threads
// of the block; each waits for its own copies, the caller's __syncthreads() publishes them.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, int ld, const T* src, int64_t stride, int64_t b0,
                                           int rows, int64_t B, int cols, int cols_pad) {
  constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte copy
  const bool vec = cols % VEC == 0 && stride % VEC == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  if (vec) {  // dst is 16-byte aligned: ld * sizeof(T) and the smem carve-up are multiples of 16
    copy_rows_async<T>(dst, ld, src, stride, b0, rows, B, cols, cols_pad);
    cp_async_commit();
    cp_async_wait<0>();
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

// Forward (U = FWD_UNITS units a block): W_hh slice (FWD_ROWS x ld) | h_{t-1} chunk (bn x ld) | partial sums (K_SPLIT x
// FWD_ROWS x bn fp32 = 8 x 16 x bn at every FWD_UNITS) | c (the group's rows x FWD_UNITS fp32).
template <typename T, int U>
__host__ __device__ __forceinline__ size_t fwd_smem_bytes(int64_t H, int bn, int64_t rows) {
  constexpr int FWD_UNITS = U, FWD_ROWS = FwdShape<U>::ROWS, K_SPLIT = FwdShape<U>::K_SPLIT;
  const int ld = lead<T>(pad16(H));
  return static_cast<size_t>(FWD_ROWS + bn) * ld * sizeof(T) + static_cast<size_t>(K_SPLIT) * FWD_ROWS * bn * 4 +
         static_cast<size_t>(rows) * FWD_UNITS * 4;
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

// ---- the grid barrier between steps ----
//
// Spinning on memory that other blocks write is safe ONLY if every block of the grid is
// resident at once: a block that waits for one that was never scheduled waits forever. The
// cooperative launch guarantees exactly that (cudaLaunchCooperativeKernel refuses a grid that
// cannot be co-resident), which is why v2 stays a cooperative launch even where it no longer
// calls grid.sync(). The memory-model pattern is cooperative_groups' own: every thread's h_t
// stores, then __syncthreads() (the block's stores are ordered before thread 0's next
// operation), then a RELEASE at GPU scope by one thread (it publishes everything the block
// wrote, release being cumulative); on the other side an ACQUIRE at GPU scope by the polling
// thread, then __syncthreads(), after which every thread of the block may read what was
// published (through L2: stage_rows). `sync` is zeroed memory per launch (the binding's
// at::zeros), `step` counts arrivals from 1.
//
// The barrier is split in two so that a step's loads that do not depend on the other blocks
// (xp_{t+1}) are issued between arrive and wait: their L2 latency hides behind the wait.

__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Whether a counter that only grows (modulo 2^32) has reached target: the signed difference,
// so that wrapping past 2^32 arrivals changes nothing.
__device__ __forceinline__ bool reached(unsigned value, unsigned target) {
  return static_cast<int>(value - target) >= 0;
}

// This block has written everything of step `step` (all threads call it).
__device__ __forceinline__ void grid_arrive(unsigned* sync, unsigned step) {
#if LEVELS_LSTM_V2_BARRIER == 0
  (void)sync;
  (void)step;  // grid.sync() arrives and waits in one call: grid_wait
#else
  __syncthreads();
  if (threadIdx.x == 0) {
#if LEVELS_LSTM_V2_BARRIER == 1
    (void)step;
    red_release_add(sync, 1u);  // no return value needed: a reduction, fire and forget
#else
    st_release(sync + blockIdx.x, step);  // this block's own word: nobody else writes it
#endif
  }
#endif
}

// Every block has arrived at `step` (all threads call it, after grid_arrive(sync, step)).
__device__ __forceinline__ void grid_wait(unsigned* sync, unsigned step) {
#if LEVELS_LSTM_V2_BARRIER == 0
  (void)sync;
  (void)step;
  cg::this_grid().sync();
#else
#if LEVELS_LSTM_V2_BARRIER == 1
  if (threadIdx.x == 0) {
    const unsigned target = step * gridDim.x;
    while (!reached(ld_acquire(sync), target)) {
    }
  }
#else
  // One thread per flag (a loop when the grid has more blocks than this block has threads).
  for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
    while (!reached(ld_acquire(sync + i), step)) {
    }
  }
#endif
  __syncthreads();  // the acquires happen before every thread's reads of the published data
#endif
}

__device__ __forceinline__ void grid_barrier(unsigned* sync, unsigned step) {
  grid_arrive(sync, step);
  grid_wait(sync, step);
}

// A warp's partial sums, ntn m16n8 accumulator tiles (rows: one m16 tile from row0; columns:
// batch rows), into its slice of `red`, rows bn floats apart. The m16n8 layout: lane l holds
// (row l/4, columns 2 (l % 4) and +1) and the same columns of row l/4 + 8.
__device__ __forceinline__ void store_partials(float* mine, int row0, int bn, int ntn,
                                               const float (&acc)[MAX_BN / 8][4]) {
  const int lane = threadIdx.x & 31;
  const int g = row0 + (lane >> 2), c2 = 2 * (lane & 3);
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

// The block's FWD_ROWS gate rows times the staged h chunk, partial over this warp's share of
// K, stored as red[kslice][row][n] (row = gate * FWD_UNITS + unit). Warp w takes m16 tile
// w % M_TILES and K steps w / M_TILES, + K_SPLIT, ... 16-bit: tensor cores. A = the W_hh rows
// (16 x 16 per step, ldmatrix from shared memory), B = h (16 x 8: h_s is (n, k) with k
// contiguous, which is the "col" layout mma wants, so each lane loads its two 32-bit pairs).
template <typename T, int U>
__device__ __forceinline__ void fwd_partials_mma(const T* w_s, const T* h_s, float* red, int ld, int kp,
                                                 int bn) {
  constexpr int FWD_ROWS = FwdShape<U>::ROWS, M_TILES = FwdShape<U>::M_TILES, K_SPLIT = FwdShape<U>::K_SPLIT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mt = warp % M_TILES, kw = warp / M_TILES;
  const int ntn = bn / 8;  // 8-column n-tiles in this chunk
  float acc[MAX_BN / 8][4];
#pragma unroll
  for (int j = 0; j < MAX_BN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  const T* a_rows = w_s + (mt * 16 + (lane & 15)) * ld + (lane >> 4) * 8;
  // Unrolled twice: the next step's ldmatrix and B loads issue while this step's mma runs.
#pragma unroll 2
  for (int ks = kw; ks < kp / 16; ks += K_SPLIT) {
    const int k0 = ks * 16;
    uint32_t a[4];
    ldmatrix_x4(a, smem_addr(a_rows + k0));
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
  store_partials(red + kw * FWD_ROWS * bn, mt * 16, bn, ntn, acc);
}

// fp32: exact FMAs on the CUDA cores (no TF32). Warp w takes the 4 units 4 * (w % M_TILES)..
// (16 rows: their 4 gates each) and K steps w / M_TILES, + K_SPLIT, ...; lane (u = lane % 4,
// nl = lane / 4) computes the 4 gate rows of its unit for batch columns nl, nl+8, ...: per 4
// elements of K it loads 4 W rows and up to JT h rows (16-byte loads) for 16 FMAs per h row.
// JT n-tiles per pass over K: all 8 (one pass, the fewest shared-memory loads per FMA; ptxas:
// no spill under the 128-register cap at every knob value). Should a change make this kernel
// spill, JT = 4 halves the accumulators for one more read of the W rows per chunk.
template <int U>
__device__ __forceinline__ void fwd_partials_f32(const float* w_s, const float* h_s, float* red, int ld, int kp,
                                                 int bn) {
  constexpr int FWD_UNITS = U, FWD_ROWS = FwdShape<U>::ROWS, M_TILES = FwdShape<U>::M_TILES,
                K_SPLIT = FwdShape<U>::K_SPLIT;
  constexpr int JT = MAX_BN / 8;  // n-tiles per pass
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kw = warp / M_TILES;
  const int u = 4 * (warp % M_TILES) + (lane & 3), nl = lane >> 2;
  const int ntn = bn / 8;
  float* mine = red + kw * FWD_ROWS * bn;
  for (int j0 = 0; j0 < ntn; j0 += JT) {
    float acc[JT][4];
#pragma unroll
    for (int j = 0; j < JT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int ks = kw; ks < kp / 16; ks += K_SPLIT) {
#pragma unroll
      for (int kk = 0; kk < 16; kk += 4) {
        const int k = ks * 16 + kk;
        float4 w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = load4<float>(w_s + (q * FWD_UNITS + u) * ld + k);
#pragma unroll
        for (int j = 0; j < JT; ++j) {
          if (j0 + j < ntn) {
            const float4 h = load4<float>(h_s + ((j0 + j) * 8 + nl) * ld + k);
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[j][q] = dot4(w[q], h, acc[j][q]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < JT; ++j) {
      if (j0 + j < ntn) {
#pragma unroll
        for (int q = 0; q < 4; ++q) mine[(q * FWD_UNITS + u) * bn + (j0 + j) * 8 + nl] = acc[j][q];
      }
    }
  }
}

template <typename T, int U>
__device__ __forceinline__ void fwd_partials(const T* w_s, const T* h_s, float* red, int ld, int kp, int bn) {
  if constexpr (std::is_same<T, float>::value) {
    fwd_partials_f32<U>(w_s, h_s, red, ld, kp, bn);
  } else {
    fwd_partials_mma<T, U>(w_s, h_s, red, ld, kp, bn);
  }
}

// xp_t + b_hh of this thread's (unit, batch row) pairs of the chunk at b0: the part of z_t
// that does not depend on h_{t-1}, loaded ahead of the barrier and the staging.
template <typename T, int U>
__device__ __forceinline__ void fwd_prefetch(const FwdArgs<T>& a, int64_t t, int64_t b0, int bn, int64_t row_end,
                                             int64_t unit, const float (&bias)[4],
                                             float (&z)[FwdShape<U>::PAIRS][4]) {
  constexpr int FWD_UNITS = U, PAIRS = FwdShape<U>::PAIRS;
  const int64_t H = a.H;
#pragma unroll
  for (int i = 0; i < PAIRS; ++i) {
    const int n = threadIdx.x / FWD_UNITS + i * (THREADS / FWD_UNITS);
    const int64_t b = b0 + n;
    const bool mine = n < bn && b < row_end && unit < H;
    const float* xr = a.xp + (b * a.rs_b + t * a.rs_t) * 4 * H + unit;
#pragma unroll
    for (int q = 0; q < 4; ++q) z[i][q] = mine ? xr[q * H] + bias[q] : 0.0f;
  }
}

// The whole forward sequence. Block k owns units (k % unit_blocks)*FWD_UNITS.. (+FWD_UNITS) of
// the batch rows of group k / unit_blocks (rows row0 = group * rows .. row0 + rows - 1; one group
// of all B rows but in the wide partition, launch_fwd_v2); thread tid owns the pairs (unit
// u = tid % FWD_UNITS, batch row n = tid / FWD_UNITS + i * THREADS/FWD_UNITS) of each batch
// chunk, the same pairs at every step. Per step (one chunk, B <= 64):
//   wait for h_{t-1} -> stage it (one L2 round trip) -> mma over this warp's K slice ->
//   partial sums meet in shared memory -> gates, c, h_t -> arrive; prefetch xp_{t+1}.
// Two __syncthreads a chunk plus the barrier's: each separates a writer of shared memory from
// its readers (stage -> mma: h_s; mma -> cells: red), and the same two order the readers of a
// chunk before the writers of the next chunk or step.
// __launch_bounds__(256, 2): at most 128 registers, so that registers never keep two blocks
// off an SM (the grid must be resident all at once; ptxas: no spills at that cap).
template <typename T, int U>
__global__ void __launch_bounds__(THREADS, 2) lstm_fwd_persistent_v2(FwdArgs<T> a, int bn, int unit_blocks,
                                                                     int rows, unsigned* sync) {
  constexpr int FWD_UNITS = U, FWD_ROWS = FwdShape<U>::ROWS, K_SPLIT = FwdShape<U>::K_SPLIT,
                PAIRS = FwdShape<U>::PAIRS;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x;
  const int64_t H = a.H, B = a.B;
  const int kp = pad16(H), ld = lead<T>(kp);
  T* w_s = reinterpret_cast<T*>(smem);
  T* h_s = w_s + FWD_ROWS * ld;
  float* red = reinterpret_cast<float*>(h_s + bn * ld);
  float* c_s = red + K_SPLIT * FWD_ROWS * bn;  // c_s[(b - row0) * FWD_UNITS + u]
  const int64_t unit0 = static_cast<int64_t>(blockIdx.x % unit_blocks) * FWD_UNITS;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / unit_blocks) * rows;
  const int64_t row_end = row0 + rows < B ? row0 + rows : B;

  // Once: this block's FWD_ROWS rows of W_hh (row q*FWD_UNITS+u is W_hh's row q*H + unit),
  // zero-padded; c = c0.
  for (int idx = tid; idx < FWD_ROWS * kp; idx += THREADS) {
    const int r = idx / kp, k = idx % kp;
    const int64_t unit = unit0 + (r % FWD_UNITS);
    T v = from_f32<T>(0.0f);
    if (unit < H && k < H) v = a.w_hh[((r / FWD_UNITS) * H + unit) * H + k];
    w_s[r * ld + k] = v;
  }
  for (int idx = tid; idx < rows * FWD_UNITS; idx += THREADS) {
    const int64_t unit = unit0 + (idx % FWD_UNITS), b = row0 + idx / FWD_UNITS;
    c_s[idx] = unit < H && b < B ? to_f32<T>(a.c0[b * H + unit]) : 0.0f;
  }
  const int u = tid % FWD_UNITS;  // THREADS is a multiple of FWD_UNITS: the same u for every pair
  const int64_t unit = unit0 + u;
  float bias[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (unit < H) {
#pragma unroll
    for (int q = 0; q < 4; ++q) bias[q] = to_f32<T>(a.b_hh[q * H + unit]);
  }
  float z[PAIRS][4];
  fwd_prefetch<T, U>(a, 0, row0, bn, row_end, unit, bias, z);
  __syncthreads();  // w_s and c_s complete before any thread reads them

  for (int64_t t = 0; t < a.steps; ++t) {
    // h_{t-1} of every block is in global memory before anyone stages it.
    if (t > 0) grid_wait(sync, static_cast<unsigned>(t));
    const T* h_src = t == 0 ? a.h0 : a.out + (t - 1) * H;  // row b at h_src + b * h_stride
    const int64_t h_stride = t == 0 ? H : a.steps * H;
    for (int64_t b0 = row0; b0 < row_end; b0 += bn) {
      // No barrier needed before restaging: the previous chunk's readers of h_s (the
      // partials) finished before its second __syncthreads, its readers of red (the cells)
      // finish before this chunk's first one, which precedes the next writes of red.
      if (b0 > row0) fwd_prefetch<T, U>(a, t, b0, bn, row_end, unit, bias, z);
      stage_rows<T>(h_s, ld, h_src, h_stride, b0, bn, row_end, static_cast<int>(H), kp);
      __syncthreads();
      fwd_partials<T, U>(w_s, h_s, red, ld, kp, bn);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < PAIRS; ++i) {
        const int n = tid / FWD_UNITS + i * (THREADS / FWD_UNITS);
        const int64_t b = b0 + n;
        if (n < bn && b < row_end && unit < H) {
#pragma unroll
          for (int w = 0; w < K_SPLIT; ++w) {  // fixed order: bitwise deterministic
#pragma unroll
            for (int q = 0; q < 4; ++q) z[i][q] += red[(w * FWD_ROWS + q * FWD_UNITS + u) * bn + n];
          }
          float* c = c_s + (b - row0) * FWD_UNITS + u;
          *c = cell_forward(a, z[i][0], z[i][1], z[i][2], z[i][3], *c, b, t, unit);
        }
      }
    }
    if (t + 1 < a.steps) {
      grid_arrive(sync, static_cast<unsigned>(t + 1));
      fwd_prefetch<T, U>(a, t + 1, row0, bn, row_end, unit, bias, z);  // in flight while the others finish
    }
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
__global__ void __launch_bounds__(THREADS, 2) lstm_bwd_persistent_v2(BwdArgs<T> a, int bn, int kc,
                                                                     unsigned* sync) {
  extern __shared__ __align__(16) unsigned char smem[];
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
    // dz_t of every block is in global memory before step t-1 reads it (the forward's
    // barrier, arrive and wait at once: nothing of the next pass is independent of it but dh,
    // which is loaded early anyway).
    if (s < a.steps) grid_barrier(sync, static_cast<unsigned>(s + 1));
  }
}

// ---- v2's backward on the tensor cores (16-bit; LEVELS_LSTM_V2_BWD_MMA, default on) ----
//
// The CUDA-core backward above gives a block 4 units, below one m16 tile, so its recurrent
// product runs on FMAs, and every one of its ceil(H/4) blocks stages ALL of dz_{t+1} (B x 4H)
// every step: at B64 H1024 that is 256 blocks x 512 KB = 128 MB through L2 per step, 4.8 ms a
// layer on an H100 where the forward takes 1.3 (reports/lstm-recurrence/). This kernel:
//   * 16 units a block (MMA_UNITS): the W_hh^T slice (16 x 4H) is one m16 row of A tiles
//     (ldmatrix from shared memory, resident for all T steps), dz rows are the "col" B operand
//     (batch as N, 8 rows an n-tile), mma.sync m16n8k16 with fp32 accumulators; the 8 warps
//     split K and their partial sums meet in shared memory in a fixed order, as in the forward;
//   * the batch split over blocks too: block = (unit block, batch group), so a block stages
//     only its group's rows of dz_{t+1} (at B64 H1024: 64 unit blocks x 2 groups of 32 rows,
//     256 KB a block a step, 32 MB in all, a quarter of the bytes);
//   * dz pieces double-buffered: the cp.async copy of piece p+1 is in flight while the
//     tensor cores work on piece p, so a step pays one L2 round trip, not one per piece.
// Costs: 16 x 4H elements of W_hh^T in every block's shared memory (at most ~1400 hidden units
// in bf16 on an H100: beyond, the launcher runs the CUDA-core kernel), and every batch group
// waits at the same grid barrier although the groups never read each other's rows.
#ifndef LEVELS_LSTM_V2_BWD_MMA
#define LEVELS_LSTM_V2_BWD_MMA 1
#endif
constexpr int MMA_UNITS = 16;
constexpr int MMA_PAIRS = MMA_UNITS * MAX_BN / THREADS;  // (unit, batch row) pairs a thread
static_assert(MMA_PAIRS * THREADS == MMA_UNITS * MAX_BN, "the mma backward's pair mapping");

// Shared memory of the mma backward: W_hh^T slice (16 x ld4) | two dz pieces (2 x bn x
// lead(kc)) | partial sums (8 warps x 16 x bn fp32) | dc of the group's rows (rows x 16 fp32).
template <typename T>
__host__ __device__ __forceinline__ size_t bwd_mma_smem_bytes(int64_t H, int bn, int kc, int64_t rows) {
  return static_cast<size_t>(MMA_UNITS) * lead<T>(pad16(4 * H)) * sizeof(T) +
         2 * static_cast<size_t>(bn) * lead<T>(kc) * sizeof(T) +
         static_cast<size_t>(WARPS) * MMA_UNITS * bn * 4 + static_cast<size_t>(rows) * MMA_UNITS * 4;
}

// Block b: unit block b % unit_blocks, batch group b / unit_blocks (rows group*rows ..).
template <typename T>
__global__ void __launch_bounds__(THREADS, 1) lstm_bwd_persistent_v2_mma(BwdArgs<T> a, int bn, int kc,
                                                                         int unit_blocks, int rows,
                                                                         unsigned* sync) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t H = a.H, B = a.B, G = 4 * a.H;
  const int kp = pad16(G), ld = lead<T>(kp), ld_z = lead<T>(kc);
  T* wt_s = reinterpret_cast<T*>(smem);
  T* dz_s = wt_s + MMA_UNITS * ld;  // two buffers of bn x ld_z
  float* red = reinterpret_cast<float*>(dz_s + 2 * bn * ld_z);
  float* dc_s = red + WARPS * MMA_UNITS * bn;  // dc_s[r * 16 + u], r = row within the group
  const int64_t unit0 = static_cast<int64_t>(blockIdx.x % unit_blocks) * MMA_UNITS;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / unit_blocks) * rows;
  const int64_t row_end = row0 + rows < B ? row0 + rows : B;

  for (int idx = tid; idx < MMA_UNITS * kp; idx += THREADS) {
    const int r = idx / kp, k = idx % kp;
    const int64_t unit = unit0 + r;
    wt_s[r * ld + k] = unit < H && k < G ? a.wt[unit * G + k] : from_f32<T>(0.0f);
  }
  for (int idx = tid; idx < rows * MMA_UNITS; idx += THREADS) {
    const int64_t unit = unit0 + (idx % MMA_UNITS), b = row0 + idx / MMA_UNITS;
    dc_s[idx] = unit < H && b < B ? to_f32<T>(a.dc_n[b * H + unit]) : 0.0f;
  }
  const int u = tid % MMA_UNITS;
  const int64_t unit = unit0 + u;
  const T* a_rows = wt_s + (lane & 15) * ld + (lane >> 4) * 8;  // ldmatrix rows of the A tiles
  const int pieces = (kp + kc - 1) / kc;
  __syncthreads();

  for (int64_t s = 0; s <= a.steps; ++s) {
    const int64_t t = a.steps - 1 - s;  // -1 on the last pass: dh0 and dc0
    const bool recurrent = t + 1 < a.steps;
    for (int64_t b0 = row0; b0 < row_end; b0 += bn) {
      // Everything the cells read but the product's result is loaded first: its latency (the
      // saved activations come from HBM) hides behind the staging and the products.
      float dh[MMA_PAIRS];
      Saved saved[MMA_PAIRS];
#pragma unroll
      for (int i = 0; i < MMA_PAIRS; ++i) {
        const int64_t b = b0 + tid / MMA_UNITS + i * (THREADS / MMA_UNITS);
        dh[i] = 0.0f;
        saved[i] = Saved{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (tid / MMA_UNITS + i * (THREADS / MMA_UNITS) < bn && b < row_end && unit < H && t >= 0) {
          dh[i] = to_f32<T>(a.dout[(b * a.steps + t) * H + unit]);
          if (t == a.steps - 1) dh[i] += to_f32<T>(a.dh_n[b * H + unit]);
          saved[i] = load_saved(a, b, t, unit);
        }
      }
      if (recurrent) {
        const T* dz_next = a.dz + (t + 1) * a.rs_t * G;  // row b at dz_next + b * rs_b * G
        float acc[MAX_BN / 8][4];
#pragma unroll
        for (int j = 0; j < MAX_BN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        const int ntn = bn / 8;
        __syncthreads();  // the previous chunk's readers of dz_s and red are done
        // Piece 0 (columns 0 .. kc of the padded 4H, the real ones < G), then each next piece
        // while the current one is multiplied.
        copy_rows_async<T>(dz_s, ld_z, dz_next, a.rs_b * G, b0, bn, row_end, static_cast<int>(G < kc ? G : kc),
                           kc < kp ? kc : kp);
        cp_async_commit();
        for (int p = 0; p < pieces; ++p) {
          const int k0 = p * kc;
          const int width = kp - k0 < kc ? kp - k0 : kc;
          if (p + 1 < pieces) {  // the next piece into the other buffer, then wait for this one
            const int k1 = k0 + kc;
            const int w1 = kp - k1 < kc ? kp - k1 : kc;
            const int valid = G - k1 < w1 ? static_cast<int>(G - k1) : w1;
            copy_rows_async<T>(dz_s + ((p + 1) & 1) * bn * ld_z, ld_z, dz_next + k1, a.rs_b * G, b0, bn,
                               row_end, valid, w1);
            cp_async_commit();
            cp_async_wait<1>();
          } else {
            cp_async_wait<0>();
          }
          __syncthreads();  // piece p is in shared memory for every warp
          const T* zb = dz_s + (p & 1) * bn * ld_z;
#pragma unroll 2
          for (int ks = warp; ks < width / 16; ks += WARPS) {
            uint32_t af[4];
            ldmatrix_x4(af, smem_addr(a_rows + k0 + ks * 16));
#pragma unroll
            for (int j = 0; j < MAX_BN / 8; ++j) {
              if (j < ntn) {
                const T* zp = zb + (j * 8 + (lane >> 2)) * ld_z + ks * 16 + 2 * (lane & 3);
                mma_16816<T>(acc[j], af, *reinterpret_cast<const uint32_t*>(zp),
                             *reinterpret_cast<const uint32_t*>(zp + 8));
              }
            }
          }
          __syncthreads();  // every warp is done with buffer p & 1 before piece p + 2 lands in it
        }
        store_partials(red + warp * MMA_UNITS * bn, 0, bn, ntn, acc);
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < MMA_PAIRS; ++i) {
        const int n = tid / MMA_UNITS + i * (THREADS / MMA_UNITS);
        const int64_t b = b0 + n;
        if (n >= bn || b >= row_end || unit >= H) continue;
        float rec = 0.0f;
        if (recurrent) {
#pragma unroll
          for (int w = 0; w < WARPS; ++w) rec += red[(w * MMA_UNITS + u) * bn + n];  // fixed order
        }
        float* dc = dc_s + (b - row0) * MMA_UNITS + u;
        if (t < 0) {
          a.dh0[b * H + unit] = from_f32<T>(rec);
          a.dc0[b * H + unit] = from_f32<T>(*dc);
        } else {
          *dc = cell_backward(a, saved[i], dh[i] + rec, *dc, b, t, unit);
        }
      }
    }
    if (s < a.steps) grid_barrier(sync, static_cast<unsigned>(s + 1));
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

// Cooperative launches with one block per FWD_UNITS (forward) or 4 (backward) hidden units.
// `sync`: zeroed words for the grid barrier, one per block (LEVELS_LSTM_V2_BARRIER 2) or one
// (1); the binding allocates them. The launcher picks the largest
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

// Batch groups (the wide forward and the mma backward, whose blocks hold 16 units and fill
// most of a multiprocessor's shared memory): as many as the GPU holds such blocks at once
// (one a multiprocessor), at least 8 rows each, and never more blocks than the binding's
// ceil(H/4) barrier words. A group's blocks stage only the group's rows of h_{t-1} or dz_{t+1}
// per step: twice the groups, half the bytes a block pulls from L2.
inline int64_t max_groups(int64_t B, int64_t H, int64_t unit_blocks, const Gpu& gpu) {
  const int64_t by_sms = std::min<int64_t>(gpu.sms, levels_cdiv(H, 4)) / unit_blocks;
  return std::min<int64_t>(by_sms, levels_cdiv(B, 8));
}

// Rows of a group when the batch is split in `groups` (whole 8-row n-tiles), and the groups
// that makes.
inline int group_rows(int64_t B, int64_t groups) {
  return static_cast<int>(levels_cdiv(levels_cdiv(B, groups), 8) * 8);
}

// v2 forward with U units a block, all B rows one group (grouped = false) or as many groups as
// fit (true, the wide partition): LEVELS_UNSUPPORTED if no batch chunk fits.
template <typename T, int U>
int launch_fwd_v2_units(const FwdArgs<T>& a, unsigned* sync, const Gpu& gpu, cudaStream_t stream, bool grouped) {
  const void* kernel = reinterpret_cast<const void*>(&lstm_fwd_persistent_v2<T, U>);
  int unit_blocks = static_cast<int>(levels_cdiv(a.H, U));
  for (int64_t groups = grouped ? max_groups(a.B, a.H, unit_blocks, gpu) : 1; groups >= 1; --groups) {
    int rows = grouped ? group_rows(a.B, groups) : static_cast<int>(a.B);
    const int64_t blocks = unit_blocks * levels_cdiv(a.B, rows);
    const int first = first_chunk(rows);
    for (int bn : {first, 32, 16, 8}) {
      if (bn > first) continue;
      const size_t smem = fwd_smem_bytes<T, U>(a.H, bn, rows);
      bool ok = false;
      if (const cudaError_t err = fits(kernel, smem, blocks, gpu, ok)) return static_cast<int>(err);
      if (!ok) continue;
      FwdArgs<T> args = a;
      void* params[] = {&args, &bn, &unit_blocks, &rows, &sync};
      return cooperative(kernel, blocks, smem, params, stream);
    }
  }
  return LEVELS_UNSUPPORTED;
}

// Fat blocks (FAT_UNITS) at small batch, where a step is a chain of latencies. Beyond, 16-bit
// runs the WIDE partition: 16 units a block (64 gate rows of W_hh on chip, 4 m16 tiles) and
// the batch split into groups, so that each block stages only its group's rows of h_{t-1}:
// at B64 H1024, 64 unit blocks x 2 groups pull 64 KB each a step, where 256 blocks of 4 units
// pulled 128 KB each (reports/lstm-recurrence/). fp32 (whose 16-unit slice would not fit)
// keeps 4 units a block over twice the SMs. If the preferred partition does not fit, the
// others may (thinner blocks need less shared memory each, fatter ones fewer SMs).
template <typename T>
int launch_fwd_v2(const FwdArgs<T>& a, unsigned* sync, cudaStream_t stream) {
  Gpu gpu;
  if (const int status = gpu_limits(gpu)) return status;
  const bool fat = a.B <= LEVELS_LSTM_V2_FAT_BATCH;
  int status = LEVELS_UNSUPPORTED;
  if constexpr (!std::is_same<T, float>::value) {
    if (!fat) status = launch_fwd_v2_units<T, WIDE_UNITS>(a, sync, gpu, stream, true);
  }
  if (status != LEVELS_UNSUPPORTED) return status;
  status = fat ? launch_fwd_v2_units<T, FAT_UNITS>(a, sync, gpu, stream, false)
               : launch_fwd_v2_units<T, THIN_UNITS>(a, sync, gpu, stream, false);
  if (status == LEVELS_UNSUPPORTED && FAT_UNITS != THIN_UNITS) {
    status = fat ? launch_fwd_v2_units<T, THIN_UNITS>(a, sync, gpu, stream, false)
                 : launch_fwd_v2_units<T, FAT_UNITS>(a, sync, gpu, stream, false);
  }
  return status;
}

// The mma backward (16-bit, even H: every dz row and piece is whole 16-byte copies): the most
// batch groups (max_groups), then the widest chunk and dz piece that fit beside the W_hh^T
// slice. LEVELS_UNSUPPORTED if nothing fits (a wide H): the caller runs the CUDA-core kernel.
template <typename T>
int launch_bwd_v2_mma(const BwdArgs<T>& a, unsigned* sync, const Gpu& gpu, cudaStream_t stream) {
  const void* kernel = reinterpret_cast<const void*>(&lstm_bwd_persistent_v2_mma<T>);
  int unit_blocks = static_cast<int>(levels_cdiv(a.H, MMA_UNITS));
  const int kp = pad16(4 * a.H);
  for (int64_t groups = max_groups(a.B, a.H, unit_blocks, gpu); groups >= 1; --groups) {
    int rows = group_rows(a.B, groups);
    const int64_t blocks = unit_blocks * levels_cdiv(a.B, rows);
    const int first = first_chunk(rows);
    for (int bn : {first, 32, 16, 8}) {  // the widest chunk, then the widest piece, that fit
      if (bn > first) continue;
      for (int kc : {kp, 2048, 1024, 512, 256}) {
        if (kc > kp) continue;
        const size_t smem = bwd_mma_smem_bytes<T>(a.H, bn, kc, rows);
        bool ok = false;
        if (const cudaError_t err = fits(kernel, smem, blocks, gpu, ok)) return static_cast<int>(err);
        if (!ok) continue;
        BwdArgs<T> args = a;
        void* params[] = {&args, &bn, &kc, &unit_blocks, &rows, &sync};
        return cooperative(kernel, blocks, smem, params, stream);
      }
    }
  }
  return LEVELS_UNSUPPORTED;
}

template <typename T>
int launch_bwd_v2(const BwdArgs<T>& a, unsigned* sync, cudaStream_t stream) {
  Gpu gpu;
  if (const int status = gpu_limits(gpu)) return status;
#if LEVELS_LSTM_V2_BWD_MMA
  if constexpr (!std::is_same<T, float>::value) {
    if (a.H % 2 == 0) {
      const int status = launch_bwd_v2_mma<T>(a, sync, gpu, stream);
      if (status != LEVELS_UNSUPPORTED) return status;
    }
  }
#endif
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
      void* params[] = {&args, &bn, &kc, &sync};
      return cooperative(kernel, blocks, smem, params, stream);
    }
  }
  return LEVELS_UNSUPPORTED;
}

// Version 0 is the PLAN the Python entry asks for when the caller chose no version: v2 where
// its plan fits this GPU (its launcher returns LEVELS_UNSUPPORTED before launching anything
// when no batch chunk fits on chip at once, or the GPU cannot launch cooperatively), else v1,
// which runs at any size. An explicit version 2 that does not fit refuses instead (the
// binding's ValueError naming w_hh). Forward and backward decide independently: both read and
// write the same layouts, so a v2 forward may pair with a v1 backward.
template <typename T>
int launch_fwd(int version, const FwdArgs<T>& a, unsigned* sync, cudaStream_t stream) {
  switch (version) {
    case 0: {
      const int status = launch_fwd_v2<T>(a, sync, stream);
      return status == LEVELS_UNSUPPORTED ? launch_fwd_v1<T>(a, stream) : status;
    }
    case 1: return launch_fwd_v1<T>(a, stream);
    case 2: return launch_fwd_v2<T>(a, sync, stream);
    default: return LEVELS_BAD_VERSION;
  }
}

template <typename T>
int launch_bwd(int version, const BwdArgs<T>& a, unsigned* sync, cudaStream_t stream) {
  switch (version) {
    case 0: {
      const int status = launch_bwd_v2<T>(a, sync, stream);
      return status == LEVELS_UNSUPPORTED ? launch_bwd_v1<T>(a, stream) : status;
    }
    case 1: return launch_bwd_v1<T>(a, stream);
    case 2: return launch_bwd_v2<T>(a, sync, stream);
    default: return LEVELS_BAD_VERSION;
  }
}

}  // namespace levels_lstm

// Forward of the recurrence. xp (rows, 4H) fp32 = x W_ih^T + b_ih, made by the caller; gates
// and cs may be nullptr (no backward: nothing saved); c_buf (B, H) fp32 scratch for v1
// (nullptr is fine for v2); sync: ceil(H/4) ZEROED words for v2's grid barrier (nullptr is
// fine for v1). version 0: the plan, v2 where it fits, else v1 (needs both). Row of (b, t) in
// xp/gates/cs: b * rs_b + t * rs_t.
extern "C" int levels_lstm_fwd(int dtype, int version, const float* xp, const void* h0, const void* c0,
                               const void* w_hh, const void* b_hh, void* out, void* h_n, void* c_n,
                               float* gates, float* cs, float* c_buf, unsigned* sync, int64_t B, int64_t T,
                               int64_t H, int64_t rs_b, int64_t rs_t, cudaStream_t stream) {
  using namespace levels_lstm;
  if (version < 0 || version > 2) return LEVELS_BAD_VERSION;
  if (B <= 0 || T <= 0 || H <= 0) return LEVELS_OK;
  if ((gates == nullptr) != (cs == nullptr)) return LEVELS_UNSUPPORTED;
  if ((version != 2 && c_buf == nullptr) || (version != 1 && sync == nullptr)) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, Tp, {
    const FwdArgs<Tp> a{xp, static_cast<const Tp*>(h0), static_cast<const Tp*>(c0),
                        static_cast<const Tp*>(w_hh), static_cast<const Tp*>(b_hh), static_cast<Tp*>(out),
                        static_cast<Tp*>(h_n), static_cast<Tp*>(c_n), gates, cs, c_buf, B, T, H, rs_b, rs_t};
    return launch_fwd<Tp>(version, a, sync, stream);
  });
  return LEVELS_OK;  // not reached
}

// Backward of the recurrence: dz (rows, 4H) for the GEMMs, dh0, dc0 (B, H). wt = W_hh^T
// (H, 4H) contiguous; dc_buf (B, H) fp32 scratch for v1; sync as the forward's (its own
// zeroed words: the barrier counts from 1 again); version 0 as the forward's.
extern "C" int levels_lstm_bwd(int dtype, int version, const void* dout, const void* dh_n, const void* dc_n,
                               const void* c0, const void* wt, const float* gates, const float* cs, void* dz,
                               void* dh0, void* dc0, float* dc_buf, unsigned* sync, int64_t B, int64_t T,
                               int64_t H, int64_t rs_b, int64_t rs_t, cudaStream_t stream) {
  using namespace levels_lstm;
  if (version < 0 || version > 2) return LEVELS_BAD_VERSION;
  if (B <= 0 || T <= 0 || H <= 0) return LEVELS_OK;
  if ((version != 2 && dc_buf == nullptr) || (version != 1 && sync == nullptr)) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, Tp, {
    const BwdArgs<Tp> a{static_cast<const Tp*>(dout), static_cast<const Tp*>(dh_n), static_cast<const Tp*>(dc_n),
                        static_cast<const Tp*>(c0), static_cast<const Tp*>(wt), gates, cs, static_cast<Tp*>(dz),
                        static_cast<Tp*>(dh0), static_cast<Tp*>(dc0), dc_buf, B, T, H, rs_b, rs_t};
    return launch_bwd<Tp>(version, a, sync, stream);
  });
  return LEVELS_OK;  // not reached
}
