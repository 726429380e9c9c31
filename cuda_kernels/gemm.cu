// gemm.cu — C[M,N] (+)= A[M,K] · B[K,N] with a fused epilogue: Level 5's matrix product,
// a ladder of eight versions (serves the MLP now, conv and the LSTM later).
//
//   version 1  naive: one thread per output element, the K loop straight from global
//              memory. Threads of a warp take consecutive columns n, so the B and C accesses
//              coalesce when N is the contiguous dimension and A is a broadcast. Costs: every
//              A and B element is fetched from L2/DRAM M or N times over (~2 FLOPs per 8 bytes).
//   version 2  shared-memory tiles: a 32x32 block of threads stages a 32x32 tile of A and of
//              B in shared memory, then each thread does 32 FMAs from it. Every global element
//              is now read once per tile instead of once per thread: 32x less global traffic.
//              Costs: two barriers per K step, and still 2 shared loads per FMA.
//   version 3  register tiling (2-D block tiling): each of 256 threads computes an 8x8 patch
//              of a 128x128 block tile, from 8+8 values it keeps in registers per k: 64 FMAs
//              per 16 shared loads (float4, bank-conflict free). Exact fp32 FMAs on the CUDA
//              cores: this is also the fp32 path of version 4. Costs: 64 accumulator registers.
//   version 4  tensor cores (16-bit inputs): mma.sync m16n8k16 (bf16/fp16 in, fp32
//              accumulate) fed by ldmatrix from an XOR-swizzled shared layout (conflict free),
//              tiles copied global->shared with cp.async in a 3-stage pipeline, so the next
//              tiles are in flight while the tensor cores work on this one; grouped tile
//              order for L2 reuse; 128x256 block tiles (64x64 per warp) when there are
//              enough of them to fill the GPU, else 128x128 (2 blocks per SM).
//              Costs: layout rules — rows of A and of the (N,K) K-major B must be
//              contiguous along K with 16-byte aligned starts (else LEVELS_UNSUPPORTED,
//              and the Python side copies: cuda_kernels/mlp.py).
//              fp32 inputs in version 4 run version 3: exact fp32, no TF32 (the fp32 bound
//              1e-5 stays; a TF32 path would have to be declared and held to 4e-3).
//   version 5  Hopper warpgroup MMA (sm_90 only): wgmma.mma_async reads both operands
//              straight from the same swizzled shared memory through matrix descriptors
//              (no ldmatrix, no fragments), 64x128x16 per instruction per warpgroup, issued
//              asynchronously; twice version 4's tensor-core rate is available this way on
//              an H100. Costs: Hopper only (elsewhere LEVELS_BAD_ARCH: run version 4), the
//              descriptor encoding, 128 accumulator registers per thread.
//   version 6  TMA + warp specialization (sm_90 only): the tiles come from the Tensor
//              Memory Accelerator (one thread, one cp.async.bulk.tensor per tile, described
//              by a tensor map the host encodes; it writes version 5's swizzled layout and
//              zero-fills the M, N, K tails itself), issued by a producer warpgroup while two
//              consumer warpgroups run version 5's wgmma; a ring of shared-memory stages with
//              `full` / `empty` mbarriers and parity waits replaces the block-wide barriers,
//              and setmaxnreg moves registers from the producer (40) to the consumers (232).
//              Same epilogues, same tile choice (128x256 / 128x128; a 128x256 tile issues
//              one m64n256k16 per k16 slice, WIDE_MMA below). Costs: 384 threads per
//              block, a tensor-map encode per operand per launch on the host (a few us of
//              CPU), Hopper only, the mbarrier phase bookkeeping (a wrong parity is a hang:
//              -DLEVELS_GEMM6_TIMEOUT=n makes every wait trap after n million polls).
//              Transposed operands as they lie: A stored (K, M) with M contiguous (dYᵀ of a
//              weight gradient) and B stored (K, N) with N contiguous (an activation, or a
//              weight used untransposed) are loaded in 64-column boxes, "MN-major" tiles of
//              the same bytes in another order, which wgmma reads with its transpose flags
//              (imm-trans-a/b) through MN-major descriptors: the MLP's backward makes no
//              copies (versions 4, 5, 7, 8 copy such operands to K-major first).
//              Not here yet (the next rungs): a persistent grid (the epilogue of one tile
//              under the loads of the next: version 7), clusters with TMA multicast.
//              Measured on the H100 (bf16, reports/h100-gemm6.json, cuBLAS and version 5 in
//              the same run): 8192^3 661 TFLOP/s = 0.90x cuBLAS (version 5: 0.51x), 4096^3
//              0.93x (0.52x), the MLP's first GEMM with bias + GELU 0.91x (0.59x), M4096
//              1024->4096 0.80x (0.51x), M128 4096->11008 0.98x (0.77x); it passed every
//              GPU test of the MLP, SwiGLU and Newton–Schulz on its first run. The default on
//              sm_90 (mlp.py's HOPPER_VERSION).
//   version 7  persistent + warp specialized (sm_90 only): min(tiles, SMs) blocks, each
//              walking tiles blockIdx.x, +gridDim.x, ... in the grouped order; version 6's
//              producer runs ahead across tile boundaries (one running k-iteration counter
//              gives every ring stage and parity, never reset per tile), and the consumers'
//              epilogue stages through shared memory of its own (per warpgroup, 16 rows at a
//              time, fp32: version 6's epilogue code and bits), so the TMA loads of tile t+1
//              run under the epilogue of tile t instead of after it. Same epilogues, same tile
//              choice, the same ring depth (4 x 48 KB / 6 x 32 KB beside 33 / 17 KB of slabs).
//              Costs: the tensor cores still wait for each tile's epilogue (the MMAs of the
//              next tile are the same warps': ping-pong consumers would hide that too), 8
//              named-barrier waits per warpgroup per tile, and a persistent block may hold
//              one tile more than another (the last wave); the batched kernel runs 128x128
//              tiles only (4 stages). Hang trap: -DLEVELS_GEMM7_TIMEOUT=n.
//              Measured on the H100 (bf16, reports/h100-gemm7.json, cuBLAS and v5-v6 in the
//              same run): every check passed on the first run, bitwise version 6's results;
//              and no faster than version 6: 0.87-0.93x cuBLAS at 8192^3, 4096^3 and the MLP's
//              large GEMMs (v6 0.89-0.94x), 0.66-0.86x at the short-K ones (M4096 1024->4096,
//              M1000 768->3072; v6 0.69-0.89x). What the persistent grid alone buys is the
//              loads under the epilogue, and those were not the bottleneck: the MMAs wait for
//              the epilogue either way. The MLP's default stays version 6.
//   version 8  ping-pong consumers (sm_90 only): version 7's persistent producer and ring, but
//              the two consumer warpgroups no longer split a tile: each owns whole 128x128
//              tiles (two m64n128 MMAs per k16 slice, the same 128 accumulators per thread),
//              consumer 0 the block's even tiles, consumer 1 its odd ones, each skipping the
//              other's k-iterations on the running counter. A "math order" (a pair of
//              mbarriers) makes their mainloops alternate: tile i's MMAs start once tile
//              i-1's are all issued, so one consumer's epilogue runs while the other's MMAs
//              keep the tensor cores busy (version 7 hid only the loads). Costs: one tile
//              shape (128x128: a third more operand traffic per MAC than 128x256), a whole
//              tile's epilogue per warpgroup (hidden only while shorter than the other's
//              mainloop: short K shows it), consumer 1 idle where a block has one tile; no
//              batched kernel (Newton-Schulz keeps version 7).
//              Hang trap: -DLEVELS_GEMM8_TIMEOUT=n.
//              Measured on the H100 (bf16, reports/h100-gemm8.json, cuBLAS and v5-v7 in the
//              same run): every check passed on the first run, bitwise version 6's results;
//              and no faster: 0.84-0.90x cuBLAS at 8192^3, 4096^3 and the MLP's large GEMMs
//              (v6 0.85-0.95x in that run), 0.77x / 0.68x at M4096 1024->4096 / M1000
//              768->3072 (v6 0.76x / 0.69x). The 128x128 tiles' extra operand traffic costs
//              at long K what the overlap gains, and at short K the epilogue was not what held
//              it back. The next rung is clusters with TMA multicast (the shared operand read
//              once for two SMs) on 128x256 tiles.
//
// Every version ends in the same epilogue, applied to the fp32 accumulator before the
// single store — that is where fusion is free. Versions 1 and 2 apply it per element from
// registers; versions 3 and 4 first stage the block's tile in shared memory (store_tile):
// 16-byte stores of 8 neighbouring columns, and one copy of the epilogue code per kernel
// instead of one per accumulator (a 2.4x shorter compile of this file):
//   EPI_NONE       c = acc (+ bias[n])                   (+ old c when accumulate)
//   EPI_GELU       c = GELU(acc + bias[n])               exact GELU (erf), not the tanh one
//   EPI_GELU_SAVE  aux = acc + bias[n]; c = GELU(aux)    the pre-activation that backward needs
//   EPI_GELU_GRAD  c = acc * GELU'(aux[m, n])            dH = (dY · W2) ⊙ GELU'(H)
//   EPI_SWIGLU     c = silu(g) * u, with g, u the gate and up accumulators of one element
//                  (aux = g, aux2 = u when given: what backward needs)
//   EPI_SWIGLU_GRAD c = acc * u * silu'(g), c2 = acc * silu(g), g = aux, u = aux2:
//                  dG and dU from dA = dY · W_down in one pass
// The SwiGLU MLP's gate and up projections are ONE GEMM (levels_gemm_swiglu below): with a
// second B operand b2, a block's B tile is [BN/2 columns of B | the same BN/2 columns of b2]
// loaded side by side into shared memory, i.e. x · [W_gate; W_up]^T computed tile by tile
// without concatenating the weights in memory; the MMAs do not know (one BM x BN product),
// and the staged epilogue pairs column j with column j + BN/2 (store_swiglu). Versions 1
// and 2, which finish from registers, keep two accumulators per thread instead.
// Output C is the input dtype or fp32 (c_fp32: the LSTM's input projection wants fp32);
// aux is always the input dtype.
//
// Versions 5-7 also run batched (levels_gemm_batched, for newton_schulz.cu's versions 2-5):
// the same main loop (v5_main_loop / v6_main_loop / version 7's) in a sibling kernel with a batch axis (blockIdx.y; version 7: its tile index; a batch
// stride per operand), one more epilogue, EPI_AXPBY: c = alpha * acc + beta * y[m, n] (fp32
// math, stored in T), an optional transposed copy of the output (ct: the staged tile read
// column-wise, so its stores are 16-byte vectors along m too), and a symmetric tile
// schedule for products known to be symmetric (X X^T, A·A with A = A^T): only the tiles on
// and below the diagonal run, each stored at (i, j) and mirrored at (j, i), launched row by
// row, or in bands of 8 tile rows where X is larger than L2 (tile_order.h: Newton-Schulz
// at 8192^2 19.7 ms against 21.6 row by row, the same bits; reports/phased-rows-and-bands-
// 2026-11-27/call9-*). 16-bit only.
//
// Also: column_sum (bias gradients), x.sum(0) accumulated in fp32, deterministic.
//
// Strides are element strides, any value (0 for broadcast, transposed views...), except
// where version 4 says otherwise. Offsets are int64: operands may exceed 2**31 elements.

#include "common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"
// gemm's hang traps (-DLEVELS_GEMM6_TIMEOUT=n, or 7, 8) are mbarrier.cuh's wait trap.
#if !defined(LEVELS_MBAR_TIMEOUT) && defined(LEVELS_GEMM6_TIMEOUT)
#define LEVELS_MBAR_TIMEOUT LEVELS_GEMM6_TIMEOUT
#elif !defined(LEVELS_MBAR_TIMEOUT) && defined(LEVELS_GEMM7_TIMEOUT)
#define LEVELS_MBAR_TIMEOUT LEVELS_GEMM7_TIMEOUT
#elif !defined(LEVELS_MBAR_TIMEOUT) && defined(LEVELS_GEMM8_TIMEOUT)
#define LEVELS_MBAR_TIMEOUT LEVELS_GEMM8_TIMEOUT
#endif
#include "mbarrier.cuh"
#include "tile_order.h"

#include <cuda.h>  // CUtensorMap and its enums (types only: the driver function comes from the runtime)
#include <cstdio>

#include <type_traits>

namespace levels_gemm {

using namespace levels_mma;
using namespace levels_wgmma;

// levels_cdiv of common.cuh is host-only; the kernels need it too.
// ---- candidates for common.cuh ----
__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// ---- end of candidates ----

enum Epilogue { EPI_NONE = 0, EPI_GELU = 1, EPI_GELU_SAVE = 2, EPI_GELU_GRAD = 3, EPI_SWIGLU = 4,
                EPI_SWIGLU_GRAD = 5 };

// Where and how the finished tile goes (shared by every version).
struct EpiArgs {
  void* c;                     // output (M, N), dtype TC
  int64_t stride_cm, stride_cn;
  const void* bias;            // (N,) dtype T, or nullptr
  int64_t stride_bias;
  void* aux;                   // (M, N) dtype T: written (GELU_SAVE) or read (GELU_GRAD)
  int64_t stride_xm, stride_xn;
  int kind;                    // Epilogue
  int accumulate;              // 1: add the old contents of c
  void* c2;                    // SWIGLU_GRAD: the second output (dU), c's strides; else nullptr
  void* aux2;                  // SWIGLU(_GRAD): u, aux's strides; else nullptr
};

// Exact GELU, x Phi(x), Phi from erf. (The result starts as NaN so that an exercise copy,
// where the lines between the markers are cut, compiles and fails the check clearly.)
__device__ __forceinline__ float gelu(float x) {
  float y = __int_as_float(0x7fc00000);
  // ### BEGIN SOLUTION (mlp)
  y = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  // ### END SOLUTION
  return y;
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x)
__device__ __forceinline__ float gelu_grad(float x) {
  float d = __int_as_float(0x7fc00000);
  // ### BEGIN SOLUTION (mlp)
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
  d = cdf + x * pdf;
  // ### END SOLUTION
  return d;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// dA -> (dG, dU) of one element: dG = dA u silu'(g), silu'(g) = s (1 + g (1 - s)); dU = dA g s.
__device__ __forceinline__ void swiglu_grad(float da, float g, float u, float& dg, float& du) {
  dg = du = __int_as_float(0x7fc00000);  // NaN until the lines between the markers are written
  // ### BEGIN SOLUTION (swiglu_mlp)
  const float s = sigmoid(g);
  dg = da * u * s * (1.0f + g * (1.0f - s));
  du = da * g * s;
  // ### END SOLUTION
}

// The SwiGLU forward of one element (m, n), both in range: gate g, up u (fp32 sums).
template <typename T>
__device__ __forceinline__ void finish_swiglu(float g, float u, int64_t m, int64_t n, const EpiArgs& ep) {
  if (ep.aux) {
    static_cast<T*>(ep.aux)[m * ep.stride_xm + n * ep.stride_xn] = from_f32<T>(g);
    static_cast<T*>(ep.aux2)[m * ep.stride_xm + n * ep.stride_xn] = from_f32<T>(u);
  }
  // ### BEGIN SOLUTION (swiglu_mlp)
  static_cast<T*>(ep.c)[m * ep.stride_cm + n * ep.stride_cn] = from_f32<T>(g * sigmoid(g) * u);
  // ### END SOLUTION
}

// The epilogue of one output element (m, n), both in range.
template <typename T, typename TC>
__device__ __forceinline__ void finish(float v, int64_t m, int64_t n, const EpiArgs& ep) {
  TC* c = static_cast<TC*>(ep.c) + m * ep.stride_cm + n * ep.stride_cn;
  if (ep.kind == EPI_SWIGLU_GRAD) {
    const int64_t x = m * ep.stride_xm + n * ep.stride_xn;
    float dg, du;
    swiglu_grad(v, to_f32<T>(static_cast<const T*>(ep.aux)[x]), to_f32<T>(static_cast<const T*>(ep.aux2)[x]), dg, du);
    static_cast<TC*>(ep.c2)[m * ep.stride_cm + n * ep.stride_cn] = from_f32<TC>(du);
    *c = from_f32<TC>(dg);
    return;
  }
  if (ep.accumulate) v += to_f32<TC>(*c);
  if (ep.bias) v += to_f32<T>(static_cast<const T*>(ep.bias)[n * ep.stride_bias]);
  if (ep.kind == EPI_GELU_SAVE) static_cast<T*>(ep.aux)[m * ep.stride_xm + n * ep.stride_xn] = from_f32<T>(v);
  if (ep.kind == EPI_GELU || ep.kind == EPI_GELU_SAVE) v = gelu(v);
  if (ep.kind == EPI_GELU_GRAD)
    v *= gelu_grad(to_f32<T>(static_cast<const T*>(ep.aux)[m * ep.stride_xm + n * ep.stride_xn]));
  *c = from_f32<TC>(v);
}

// Two 16-bit values <-> two floats (the packed types __half2 / __nv_bfloat162).
template <typename T> struct Pair;
template <> struct Pair<__half> {
  using V = __half2;
  static __device__ __forceinline__ V make(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float lo(V v) { return __low2float(v); }
  static __device__ __forceinline__ float hi(V v) { return __high2float(v); }
};
template <> struct Pair<__nv_bfloat16> {
  using V = __nv_bfloat162;
  static __device__ __forceinline__ V make(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ float lo(V v) { return __low2float(v); }
  static __device__ __forceinline__ float hi(V v) { return __high2float(v); }
};

// Eight neighbouring columns of one row as one (or two, for fp32) 16-byte access: what the
// staged epilogue below moves per thread where C (and aux) are contiguous along N.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  if constexpr (std::is_same<T, float>::value) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const typename Pair<T>::V* h = reinterpret_cast<const typename Pair<T>::V*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = Pair<T>::lo(h[i]);
      v[2 * i + 1] = Pair<T>::hi(h[i]);
    }
  }
}

template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  if constexpr (std::is_same<T, float>::value) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint4 raw;
    typename Pair<T>::V* h = reinterpret_cast<typename Pair<T>::V*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = Pair<T>::make(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The staged epilogue of versions 3 and 4: the block's finished accumulators sit in shared
// memory as a ROWS x COLS fp32 tile (row stride ld floats) for output rows m0.., columns
// n0..; every thread takes 8 consecutive columns of one row at a time, so a warp writes
// whole 128-byte segments of C with 16-byte stores — from registers, each thread would own
// scattered pairs of columns (the mma fragment layout) or 4-column strips (version 3).
// Second reason: the loop is written once. The unrolled alternative (one inlined copy of
// the epilogue per accumulator: 64 per thread, each with erff/expf) made gemm.cu take
// ~100 s to compile; this way a kernel holds one copy.
// Where C or aux is not contiguous along N, or unaligned, or the tile's right edge cuts
// the chunk, the chunk goes element by element through finish(): any strides work.
// tid: the thread's index among the THREADS that share the tile (threadIdx.x where the whole
// block does; version 7 gives each consumer warpgroup its own tile: threadIdx.x % 128).
// The SwiGLU forward's staged epilogue: columns [0, COLS/2) of the tile hold the gate sums
// of hidden units n0/2.., columns [COLS/2, COLS) the up sums of the same units (N is the
// virtual width 2 * hidden). Chunks of 8 units, each read from both halves.
template <typename T, int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void store_swiglu(const float* tile, int ld, int64_t m0, int64_t n0, int64_t M,
                                             int64_t N, const EpiArgs& ep, int tid) {
  constexpr int HALF = COLS / 2, CHUNKS = HALF / 8;
  static_assert(HALF % 8 == 0, "whole chunks of 8 columns in each half");
  const int64_t h0 = n0 / 2, hidden = N / 2;
#pragma unroll 1
  for (int e = tid; e < ROWS * CHUNKS; e += THREADS) {
    const int r = e / CHUNKS, c8 = (e % CHUNKS) * 8;
    const int64_t m = m0 + r, n = h0 + c8;
    if (m >= M || n >= hidden) continue;
    float g[8], u[8];
    load8<float>(tile + r * ld + c8, g);
    load8<float>(tile + r * ld + HALF + c8, u);
    T* c = static_cast<T*>(ep.c) + m * ep.stride_cm + n * ep.stride_cn;
    const int64_t x = m * ep.stride_xm + n * ep.stride_xn;
    const bool vec = n + 8 <= hidden && ep.stride_cn == 1 && aligned16(c) &&
                     (!ep.aux || (ep.stride_xn == 1 && aligned16(static_cast<T*>(ep.aux) + x) &&
                                  aligned16(static_cast<T*>(ep.aux2) + x)));
    if (!vec) {
#pragma unroll 1
      for (int j = 0; j < 8 && n + j < hidden; ++j) {
        float gj = g[0], uj = u[0];  // by selects, as store_tile (no local memory)
#pragma unroll
        for (int q = 1; q < 8; ++q) {
          gj = q == j ? g[q] : gj;
          uj = q == j ? u[q] : uj;
        }
        finish_swiglu<T>(gj, uj, m, n + j, ep);
      }
      continue;
    }
    if (ep.aux) {
      store8<T>(static_cast<T*>(ep.aux) + x, g);
      store8<T>(static_cast<T*>(ep.aux2) + x, u);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = g[j] * sigmoid(g[j]) * u[j];
    store8<T>(c, g);
  }
}

template <typename T, typename TC, int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void store_tile(const float* tile, int ld, int64_t m0, int64_t n0, int64_t M,
                                           int64_t N, const EpiArgs& ep, int tid) {
  static_assert(COLS % 8 == 0, "whole chunks of 8 columns");
  constexpr int CHUNKS = COLS / 8;
  const bool has_aux = ep.kind == EPI_GELU_SAVE || ep.kind == EPI_GELU_GRAD || ep.kind == EPI_SWIGLU_GRAD;
#pragma unroll 1
  for (int e = tid; e < ROWS * CHUNKS; e += THREADS) {
    const int r = e / CHUNKS, c8 = (e % CHUNKS) * 8;
    const int64_t m = m0 + r, n = n0 + c8;
    if (m >= M || n >= N) continue;
    float v[8];
    load8<float>(tile + r * ld + c8, v);
    TC* c = static_cast<TC*>(ep.c) + m * ep.stride_cm + n * ep.stride_cn;
    T* x = has_aux ? static_cast<T*>(ep.aux) + m * ep.stride_xm + n * ep.stride_xn : nullptr;
    const bool vec = n + 8 <= N && ep.stride_cn == 1 && aligned16(c) &&
                     (!has_aux || (ep.stride_xn == 1 && aligned16(x))) &&
                     (!ep.c2 || (aligned16(static_cast<TC*>(ep.c2) + (c - static_cast<TC*>(ep.c))) &&
                                 aligned16(static_cast<T*>(ep.aux2) + (x - static_cast<T*>(ep.aux)))));
    if (!vec) {
#pragma unroll 1
      for (int j = 0; j < 8 && n + j < N; ++j) {
        float vj = v[0];  // v[j] by selects: indexing v with a variable would put v in local memory
#pragma unroll
        for (int q = 1; q < 8; ++q) vj = q == j ? v[q] : vj;
        finish<T, TC>(vj, m, n + j, ep);
      }
      continue;
    }
    if (ep.accumulate) {
      float old[8];
      load8<TC>(c, old);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += old[j];
    }
    if (ep.bias) {
      const T* b = static_cast<const T*>(ep.bias) + n * ep.stride_bias;
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += to_f32<T>(b[j * ep.stride_bias]);  // 1-D, L1-resident
    }
    if (ep.kind == EPI_GELU_SAVE) store8<T>(x, v);
    if (ep.kind == EPI_GELU || ep.kind == EPI_GELU_SAVE) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = gelu(v[j]);
    }
    if (ep.kind == EPI_GELU_GRAD) {
      float h[8];
      load8<T>(x, h);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] *= gelu_grad(h[j]);
    }
    if (ep.kind == EPI_SWIGLU_GRAD) {
      float g[8], u[8], du[8];
      load8<T>(x, g);
      load8<T>(static_cast<T*>(ep.aux2) + (x - static_cast<T*>(ep.aux)), u);
#pragma unroll
      for (int j = 0; j < 8; ++j) swiglu_grad(v[j], g[j], u[j], v[j], du[j]);
      store8<TC>(static_cast<TC*>(ep.c2) + (c - static_cast<TC*>(ep.c)), du);
    }
    store8<TC>(c, v);
  }
}

// =====================================================================================
// version 1: naive, one thread per output
// =====================================================================================
template <typename T, typename TC, bool DUAL = false>
__global__ void gemm_v1_kernel(const T* __restrict__ A, int64_t stride_am, int64_t stride_ak,
                               const T* __restrict__ B, int64_t stride_bk, int64_t stride_bn,
                               int64_t M, int64_t N, int64_t K, EpiArgs ep, const T* __restrict__ B2) {
  // 1-D grid of 32x8 tiles (a 2-D grid would cap M at 65535 * 8 rows).
  const int64_t tiles_n = cdiv(N, 32);
  const int64_t m = (int64_t)(blockIdx.x / tiles_n) * 8 + threadIdx.y;
  const int64_t n = (int64_t)(blockIdx.x % tiles_n) * 32 + threadIdx.x;
  if (m >= M || n >= N) return;
  float acc = 0.0f;
  if constexpr (DUAL) {  // SwiGLU: gate and up sums of the same element, one read of A for both
    float acc2 = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const float a = to_f32<T>(A[m * stride_am + k * stride_ak]);
      acc = fmaf(a, to_f32<T>(B[k * stride_bk + n * stride_bn]), acc);
      acc2 = fmaf(a, to_f32<T>(B2[k * stride_bk + n * stride_bn]), acc2);
    }
    finish_swiglu<T>(acc, acc2, m, n, ep);
    return;
  }
  for (int64_t k = 0; k < K; ++k)
    acc = fmaf(to_f32<T>(A[m * stride_am + k * stride_ak]), to_f32<T>(B[k * stride_bk + n * stride_bn]), acc);
  finish<T, TC>(acc, m, n, ep);
}

// =====================================================================================
// version 2: 32x32 shared-memory tiles, one output per thread
// =====================================================================================
constexpr int V2_TILE = 32;

template <typename T, typename TC, bool DUAL = false>
__global__ void gemm_v2_kernel(const T* __restrict__ A, int64_t stride_am, int64_t stride_ak,
                               const T* __restrict__ B, int64_t stride_bk, int64_t stride_bn,
                               int64_t M, int64_t N, int64_t K, EpiArgs ep, const T* __restrict__ B2) {
  // +1 column of padding: the transposed stores below (a column per warp) hit 32 banks.
  __shared__ float As[V2_TILE][V2_TILE + 1];  // [m][k]
  __shared__ float Bs[V2_TILE][V2_TILE + 1];  // [k][n]
  __shared__ float B2s[DUAL ? V2_TILE : 1][V2_TILE + 1];  // [k][n] of B2 (SwiGLU's up weight)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles_n = cdiv(N, V2_TILE);
  const int64_t m0 = (int64_t)(blockIdx.x / tiles_n) * V2_TILE;
  const int64_t n0 = (int64_t)(blockIdx.x % tiles_n) * V2_TILE;
  // Coalescing: the 32 threads of a warp (same ty, tx = 0..31) must walk the operand's
  // contiguous dimension. A is (M,K): along k if stride_ak == 1, else along m. B is (K,N):
  // along n if stride_bn == 1 (B row-major), else along k (the nn.Linear weight, W^T view).
  const bool a_k_fast = stride_ak == 1;
  const bool b_n_fast = stride_bn == 1 || stride_bk != 1;
  float acc = 0.0f, acc2 = 0.0f;  // acc2: SwiGLU's up sum (B2 given)
  for (int64_t k0 = 0; k0 < K; k0 += V2_TILE) {
    {
      const int r = a_k_fast ? ty : tx, kk = a_k_fast ? tx : ty;
      const int64_t m = m0 + r, k = k0 + kk;
      As[r][kk] = (m < M && k < K) ? to_f32<T>(A[m * stride_am + k * stride_ak]) : 0.0f;
    }
    {
      const int kk = b_n_fast ? ty : tx, cn = b_n_fast ? tx : ty;
      const int64_t k = k0 + kk, n = n0 + cn;
      Bs[kk][cn] = (k < K && n < N) ? to_f32<T>(B[k * stride_bk + n * stride_bn]) : 0.0f;
      if constexpr (DUAL) B2s[kk][cn] = (k < K && n < N) ? to_f32<T>(B2[k * stride_bk + n * stride_bn]) : 0.0f;
    }
    __syncthreads();
    if constexpr (DUAL) {
#pragma unroll
      for (int kk = 0; kk < V2_TILE; ++kk) {
        acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
        acc2 = fmaf(As[ty][kk], B2s[kk][tx], acc2);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < V2_TILE; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
    }
    __syncthreads();  // the next iteration overwrites the tiles
  }
  const int64_t m = m0 + ty, n = n0 + tx;
  if (m < M && n < N) {
    if constexpr (DUAL)
      finish_swiglu<T>(acc, acc2, m, n, ep);
    else
      finish<T, TC>(acc, m, n, ep);
  }
}

// =====================================================================================
// version 3: 128x128 block tile, 8x8 outputs per thread in registers (exact fp32 FMAs)
// =====================================================================================
constexpr int V3_BM = 128, V3_BN = 128, V3_BK = 8, V3_TM = 8, V3_TN = 8;
constexpr int V3_THREADS = (V3_BM / V3_TM) * (V3_BN / V3_TN);  // 256
constexpr int V3_LD = V3_BN + 4;  // staged rows padded: a thread's float4 stores hit distinct banks
constexpr int V3_SMEM = (V3_BM / 2) * V3_LD > V3_BK * (V3_BM + V3_BN) ? (V3_BM / 2) * V3_LD : V3_BK * (V3_BM + V3_BN);

template <typename T, typename TC, bool DUAL = false>
__global__ void __launch_bounds__(V3_THREADS)
gemm_v3_kernel(const T* __restrict__ A, int64_t stride_am, int64_t stride_ak,
               const T* __restrict__ B, int64_t stride_bk, int64_t stride_bn,
               int64_t M, int64_t N, int64_t K, EpiArgs ep, const T* __restrict__ B2) {
  // Both tiles k-major in shared memory, so that for one k a thread reads its 8 rows of A
  // and its 8 columns of B as contiguous float4s.
  // One buffer, two uses: the A and B tiles during the K loop, then half of the output
  // tile (64 rows) at a time for the staged epilogue (store_tile).
  __shared__ __align__(16) float smem[V3_SMEM];
  float (*As)[V3_BM] = reinterpret_cast<float (*)[V3_BM]>(smem);
  float (*Bs)[V3_BN] = reinterpret_cast<float (*)[V3_BN]>(smem + V3_BK * V3_BM);
  const int tid = threadIdx.x;
  const int tx = tid % (V3_BN / V3_TN), ty = tid / (V3_BN / V3_TN);  // 16 x 16 threads
  const int64_t tiles_n = cdiv(N, V3_BN);
  const int64_t m0 = (int64_t)(blockIdx.x / tiles_n) * V3_BM;
  const int64_t n0 = (int64_t)(blockIdx.x % tiles_n) * V3_BN;
  const bool a_k_fast = stride_ak == 1;
  const bool b_n_fast = stride_bn == 1 || stride_bk != 1;

  // A thread's 8 rows are two groups of 4 (ty*4 + i and 64 + ty*4 + i), likewise its
  // columns: 8 neighbouring threads then read 8 consecutive float4s = 128 bytes, one
  // conflict-free shared-memory wavefront (8 consecutive columns each would be 2-way).
  float acc[V3_TM][V3_TN] = {};
  for (int64_t k0 = 0; k0 < K; k0 += V3_BK) {
    // 128x8 elements of each operand, 4 per thread, walking the contiguous dimension.
#pragma unroll
    for (int i = 0; i < (V3_BM * V3_BK) / V3_THREADS; ++i) {
      const int e = tid + i * V3_THREADS;
      const int r = a_k_fast ? e / V3_BK : e % V3_BM, kk = a_k_fast ? e % V3_BK : e / V3_BM;
      const int64_t m = m0 + r, k = k0 + kk;
      As[kk][r] = (m < M && k < K) ? to_f32<T>(A[m * stride_am + k * stride_ak]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < (V3_BN * V3_BK) / V3_THREADS; ++i) {
      const int e = tid + i * V3_THREADS;
      const int cn = b_n_fast ? e % V3_BN : e / V3_BK, kk = b_n_fast ? e / V3_BN : e % V3_BK;
      const int64_t k = k0 + kk;
      // SwiGLU (B2 given, N = 2 * hidden): columns [0, 64) of the tile are B's units
      // n0/2.., columns [64, 128) B2's same units (see the top of the file).
      const T* src = DUAL && cn >= V3_BN / 2 ? B2 : B;
      const int64_t n = DUAL ? n0 / 2 + cn % (V3_BN / 2) : n0 + cn, width = DUAL ? N / 2 : N;
      Bs[kk][cn] = (k < K && n < width) ? to_f32<T>(src[k * stride_bk + n * stride_bn]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < V3_BK; ++kk) {
      float a[V3_TM], b[V3_TN];
      *reinterpret_cast<float4*>(&a[0]) = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
      *reinterpret_cast<float4*>(&a[4]) = *reinterpret_cast<const float4*>(&As[kk][64 + ty * 4]);
      *reinterpret_cast<float4*>(&b[0]) = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
      *reinterpret_cast<float4*>(&b[4]) = *reinterpret_cast<const float4*>(&Bs[kk][64 + tx * 4]);
#pragma unroll
      for (int i = 0; i < V3_TM; ++i)
#pragma unroll
        for (int j = 0; j < V3_TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  // Epilogue in two halves (rows 0-63: acc[0..3], rows 64-127: acc[4..7]) through shared
  // memory; the K loop's last barrier already freed the tiles.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float* row = smem + (ty * 4 + i) * V3_LD;
      const float* a = acc[half * 4 + i];
      *reinterpret_cast<float4*>(row + tx * 4) = make_float4(a[0], a[1], a[2], a[3]);
      *reinterpret_cast<float4*>(row + 64 + tx * 4) = make_float4(a[4], a[5], a[6], a[7]);
    }
    __syncthreads();
    if constexpr (DUAL)
      store_swiglu<T, V3_BM / 2, V3_BN, V3_THREADS>(smem, V3_LD, m0 + half * 64, n0, M, N, ep, threadIdx.x);
    else
      store_tile<T, TC, V3_BM / 2, V3_BN, V3_THREADS>(smem, V3_LD, m0 + half * 64, n0, M, N, ep, threadIdx.x);
    __syncthreads();  // the second half overwrites the buffer
  }
}

// =====================================================================================
// version 4: tensor cores — mma.sync + ldmatrix + cp.async multi-stage pipeline
// =====================================================================================
// The PTX wrappers (smem_addr, cp_async_16, ldmatrix_x4, mma_16816) are in mma.cuh: the
// attention and LSTM kernels use them too.

constexpr int V4_BK = 64;       // 64 bf16 = 128 bytes: one shared row is 8 chunks of 16 bytes
constexpr int V4_GROUP_M = 8;   // grouped tile order: 8 tile-rows share the B columns in L2

// Shared layout of a (rows x 64) tile: row r, 16-byte chunk c is stored at chunk c ^ (r % 8).
// ldmatrix reads one chunk column of 8 consecutive rows: unswizzled they would all sit in
// the same 4 banks (rows are 128 bytes apart), 8-way conflict; swizzled, 8 different chunks.
__device__ __forceinline__ int swizzle(int row, int chunk) { return row * V4_BK + ((chunk ^ (row & 7)) << 3); }

// Copy a (ROWS x 64) tile of a K-contiguous operand (row stride ld) into shared memory.
// Chunks past the last row or past K are zero-filled (see cp_async_16).
// Thread t always copies chunk t % 8 of rows t / 8 + i * THREADS / 8: the column, the K
// test and the swizzle ((r + 32 i) % 8 == r % 8) are the same for all its chunks, so
// each chunk costs an add, a compare and the cp.async (the first version recomputed a
// 64-bit address and branched per chunk: ~450 integer instructions per k-tile and warp
// next to 128 HMMA).
template <typename T, int ROWS, int THREADS>
__device__ __forceinline__ void v4_load_tile(T* s, const T* __restrict__ g, int64_t ld, int64_t row0,
                                             int64_t rows, int64_t k0, int64_t K) {
  constexpr int PASS = THREADS / 8;  // rows per pass of the whole block
  static_assert(ROWS % PASS == 0, "each thread copies whole chunks");
  const int r = threadIdx.x >> 3, ch = threadIdx.x & 7;
  const int64_t k = k0 + ch * 8;
  const int bytes = k < K ? (int)(K - k < 8 ? K - k : 8) * (int)sizeof(T) : 0;
  const T* src = g + (row0 + r) * ld + k;  // only dereferenced where the row exists
  const uint32_t dst = smem_addr(s + swizzle(r, ch));
#pragma unroll
  for (int i = 0; i < ROWS / PASS; ++i) {
    const bool ok = bytes > 0 && row0 + r + i * PASS < rows;
    // a valid address (g) even when nothing is read
    cp_async_16(dst + i * PASS * V4_BK * (int)sizeof(T), ok ? src + (int64_t)i * PASS * ld : g, ok ? bytes : 0);
  }
}

// Stage `stage` of the pipeline gets k-tile `kt` of both operands (versions 4 and 5).
// With B2 (SwiGLU, N = 2 * hidden), the B tile's rows [0, BN/2) are B's units n0/2.. and
// rows [BN/2, BN) B2's same units: one (BM x BN) product computes both projections.
template <typename T, int BM, int BN, int THREADS, bool DUAL = false>
__device__ __forceinline__ void v4_load_stage(T* sA, T* sB, int stage, const T* __restrict__ A, int64_t lda,
                                              const T* __restrict__ B, int64_t ldb, int64_t m0, int64_t n0,
                                              int64_t M, int64_t N, int kt, int64_t K,
                                              const T* __restrict__ B2 = nullptr) {
  v4_load_tile<T, BM, THREADS>(sA + stage * BM * V4_BK, A, lda, m0, M, (int64_t)kt * V4_BK, K);
  if constexpr (!DUAL) {
    v4_load_tile<T, BN, THREADS>(sB + stage * BN * V4_BK, B, ldb, n0, N, (int64_t)kt * V4_BK, K);
  } else {
    v4_load_tile<T, BN / 2, THREADS>(sB + stage * BN * V4_BK, B, ldb, n0 / 2, N / 2, (int64_t)kt * V4_BK, K);
    v4_load_tile<T, BN / 2, THREADS>(sB + stage * BN * V4_BK + (BN / 2) * V4_BK, B2, ldb, n0 / 2, N / 2,
                                     (int64_t)kt * V4_BK, K);
  }
}

// Grouped tile order (as Level 4's grouped_tile): V4_GROUP_M tile-rows share the B columns
// in L2. Tile number pid starts at (m0, n0) (version 7's persistent blocks walk several).
template <int BM, int BN>
__device__ __forceinline__ void grouped_tile_at(int64_t pid, int64_t M, int64_t N, int64_t& m0, int64_t& n0) {
  const int64_t grid_m = cdiv(M, BM), grid_n = cdiv(N, BN);
  const int64_t group = V4_GROUP_M * grid_n;
  const int64_t first_m = (pid / group) * V4_GROUP_M;
  const int64_t rows_in_group = grid_m - first_m < V4_GROUP_M ? grid_m - first_m : V4_GROUP_M;
  m0 = (first_m + (pid % group) % rows_in_group) * BM;
  n0 = ((pid % group) / rows_in_group) * BN;
}

// The block's own tile (one tile per block: versions 4-6).
template <int BM, int BN>
__device__ __forceinline__ void grouped_tile(int64_t M, int64_t N, int64_t& m0, int64_t& n0) {
  grouped_tile_at<BM, BN>(blockIdx.x, M, N, m0, n0);
}

// Block tile BM x BN, WARPS_M x WARPS_N warps, each a (BM/WARPS_M) x (BN/WARPS_N) warp tile
// of m16n8 accumulators. A: (M, K) rows contiguous (row stride lda); B: (N, K) K-major
// (row stride ldb), i.e. B[k][n] of the contract at B + n*ldb + k.
template <typename T, typename TC, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool DUAL = false>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
gemm_v4_kernel(const T* __restrict__ A, int64_t lda, const T* __restrict__ B, int64_t ldb,
               int64_t M, int64_t N, int64_t K, EpiArgs ep, const T* __restrict__ B2) {
  constexpr int THREADS = WARPS_M * WARPS_N * 32;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
  constexpr int MT = WTM / 16, NT = WTN / 8;
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile: whole m16 tiles, pairs of n8 tiles");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);  // [STAGES][BM][BK], swizzled
  T* sB = sA + STAGES * BM * V4_BK;         // [STAGES][BN][BK], swizzled

  int64_t m0, n0;
  grouped_tile<BM, BN>(M, N, m0, n0);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int KT = (int)cdiv(K, V4_BK);

  float acc[MT][NT][4] = {};

  // Prologue: STAGES-1 tiles in flight. Every step commits one group, empty or not, so
  // that "wait until at most STAGES-2 groups are pending" always means "tile kt landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) {
      v4_load_stage<T, BM, BN, THREADS, DUAL>(sA, sB, s, A, lda, B, ldb, m0, n0, M, N, s, K, B2);
    }
    cp_async_commit();
  }

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    // One barrier does two jobs: tile kt is visible to every warp, and every warp is done
    // with tile kt-1, whose stage the prefetch below overwrites.
    __syncthreads();
    const int next = kt + STAGES - 1;
    if (next < KT) {
      const int s = next % STAGES;
      v4_load_stage<T, BM, BN, THREADS, DUAL>(sA, sB, s, A, lda, B, ldb, m0, n0, M, N, next, K, B2);
    }
    cp_async_commit();

    const T* a_s = sA + (kt % STAGES) * BM * V4_BK;
    const T* b_s = sB + (kt % STAGES) * BN * V4_BK;
#pragma unroll
    for (int kk = 0; kk < V4_BK / 16; ++kk) {
      uint32_t af[MT][4], bf[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        // matrices: rows 0-7 / 8-15 (lanes 0-15) at k 0-7, then the same at k 8-15
        const int r = wm * WTM + mt * 16 + (lane & 15);
        ldmatrix_x4(af[mt], smem_addr(a_s + swizzle(r, kk * 2 + (lane >> 4))));
      }
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15):
        // b0, b1 of the n8 tile nt, then of nt+1
        const int r = wn * WTN + nt * 8 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t q[4];
        ldmatrix_x4(q, smem_addr(b_s + swizzle(r, kk * 2 + ((lane >> 3) & 1))));
        bf[nt][0] = q[0];
        bf[nt][1] = q[1];
        bf[nt + 1][0] = q[2];
        bf[nt + 1][1] = q[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_16816<T>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
  }
  cp_async_wait<0>();  // nothing useful is pending; leave no copy in flight at exit
  __syncthreads();     // every warp is done reading the last tiles: the buffer is free

  // Epilogue: the accumulator fragments go to shared memory as an fp32 BM x BN tile (a
  // lane holds rows g and g+8, g = lane/4, columns 2*(lane%4) and +1 of each m16n8 tile),
  // then store_tile applies bias/GELU and writes C in 16-byte chunks. Rows are padded by 8
  // floats: the float2 stores of a half-warp (rows g..g+3) then fall in distinct banks.
  constexpr int LD = BN + 8;
  static_assert(BM * LD * 4 <= STAGES * (BM + BN) * V4_BK * (int)sizeof(T), "staged tile fits");
  float* tile = reinterpret_cast<float*>(smem_raw);
  levels_mma::stage_acc<MT, NT>(tile, LD, acc, wm * WTM, wn * WTN, lane);
  __syncthreads();
  if constexpr (DUAL)
    store_swiglu<T, BM, BN, THREADS>(tile, LD, m0, n0, M, N, ep, threadIdx.x);
  else
    store_tile<T, TC, BM, BN, THREADS>(tile, LD, m0, n0, M, N, ep, threadIdx.x);
}

// =====================================================================================
// version 5: Hopper warpgroup MMA (wgmma) — sm_90a only
// =====================================================================================
// What changes from version 4:
//   * the unit of work is a warpgroup (4 warps, 128 threads), and one instruction,
//     wgmma.mma_async m64n128k16, multiplies a 64x16 tile of A by a 16x128 tile of B into
//     64 fp32 registers per thread. On an H100 this is the only way to the tensor cores'
//     full rate: mma.sync (version 4) issues at about half of it;
//   * both operands are read by the tensor cores straight from shared memory, described
//     by a 64-bit "matrix descriptor" (address, strides, swizzle mode) — no ldmatrix, no
//     fragments in registers. The shared layout is version 4's XOR swizzle, which is
//     exactly the 128-byte swizzle the hardware understands (rows of 64 bf16 = 128 bytes,
//     16-byte chunk c of row r at chunk c ^ (r % 8), 8-row groups 1024 bytes apart);
//   * the instruction is asynchronous: issued, then committed as a group, then waited for
//     (wgmma.commit_group / wait_group), so a warp can run ahead of its tensor cores.
// Block tile 128 x BN (BN = 256 or 128), K step 64, two warpgroups (256 threads), each
// owning 64 rows and all BN columns (BN/128 instructions per k16 step); all 256 threads
// load tiles with version 4's cp.async pipeline (STAGES deep), and one group of MMAs stays
// in flight across the loop's barrier.
// Costs and limits: sm_90 only (other GPUs: LEVELS_BAD_ARCH, so version 4 is the one to
// run there); 128 accumulator registers per thread at BN = 256; the same K-major layout
// rules as version 4. Not here (the next rungs, fast.cu's path to 1.0x cuBLAS): TMA for the
// loads, producer/consumer warpgroups with mbarriers so loads and MMAs overlap without
// block-wide barriers (version 6, below), a persistent grid, clusters with TMA multicast.

// (LEVELS_HAS_WGMMA and the wgmma wrappers: wgmma.cuh, shared with attention.cu.)

// STAGES: 4 x 48 KB at BN = 256 (5 would not fit in 227 KB). A build-time knob
// (-DLEVELS_GEMM_V5_STAGES=n through LEVELS_CUDA_NVCC_FLAGS) for scripts/device_level5.py's sweep.
#ifndef LEVELS_GEMM_V5_STAGES
#define LEVELS_GEMM_V5_STAGES 4
#endif
constexpr int V5_STAGES = LEVELS_GEMM_V5_STAGES;
static_assert(V5_STAGES >= 3, "one stage being read, one in flight, one being filled");

// The tiles of the pipeline in the kernel's dynamic shared memory. The swizzle pattern
// repeats every 1024 bytes and the descriptors assume tiles start on that boundary: align by
// hand (the launchers ask for 1 KB extra).
template <typename T, int BN>
__device__ __forceinline__ void v5_tiles(unsigned char* smem_raw, T*& sA, T*& sB) {
  const uint32_t raw = smem_addr(smem_raw);
  sA = reinterpret_cast<T*>(smem_raw + ((1024 - (raw & 1023)) & 1023));  // [STAGES][128][64]
  sB = sA + V5_STAGES * 128 * V4_BK;                                     // [STAGES][BN][64]
}

// The version-5 main loop, shared by the plain kernel (gemm_v5_kernel) and the batched one
// (gemm_v5_batched_kernel): acc = the (128 x BN) tile at (m0, n0) of A · B^T, A (M, K) and
// B (N, K) K-major. Returns with every copy landed and every warp past the last tile, so the
// caller may reuse the pipeline's shared memory for its epilogue.
template <typename T, int BN, bool DUAL>
__device__ __forceinline__ void v5_main_loop(T* sA, T* sB, const T* __restrict__ A, int64_t lda,
                                             const T* __restrict__ B, int64_t ldb, int64_t m0, int64_t n0,
                                             int64_t M, int64_t N, int64_t K, const T* __restrict__ B2,
                                             float (&acc)[BN / 128][64]) {
  constexpr int BM = 128, THREADS = 256, NB = BN / 128;  // NB: m64n128 instructions per k16 step
  const int wg = threadIdx.x / 128;  // warpgroup: rows wg*64 .. wg*64+63 of the tile
  const int KT = (int)cdiv(K, V4_BK);
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;

  // The pipeline keeps one group of MMAs in flight across iterations (wait_group 1): the
  // tensor cores work on tile kt while the warps pass the barrier and start the copies of
  // a later tile. So a stage may be refilled only once the MMAs two tiles back are done:
  // copies run STAGES-2 tiles ahead (version 4: STAGES-1).
#pragma unroll
  for (int s = 0; s < V5_STAGES - 2; ++s) {
    if (s < KT) {
      v4_load_stage<T, BM, BN, THREADS, DUAL>(sA, sB, s, A, lda, B, ldb, m0, n0, M, N, s, K, B2);
    }
    cp_async_commit();
  }

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<V5_STAGES - 3>();  // this thread's copies of tile kt have landed
    fence_proxy_async();
    // After the barrier: tile kt is complete and visible to the async proxy, and every
    // warpgroup has waited (below, one iteration ago) for its MMAs on tile kt-2, whose
    // stage the copies below refill.
    __syncthreads();
    const int next = kt + V5_STAGES - 2;
    if (next < KT) {
      const int s = next % V5_STAGES;
      v4_load_stage<T, BM, BN, THREADS, DUAL>(sA, sB, s, A, lda, B, ldb, m0, n0, M, N, next, K, B2);
    }
    cp_async_commit();

    const uint32_t a_base = smem_addr(sA + (kt % V5_STAGES) * BM * V4_BK + wg * 64 * V4_BK);
    const uint32_t b_base = smem_addr(sB + (kt % V5_STAGES) * BN * V4_BK);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < V4_BK / 16; ++kk)       // 4 k16 slices: +32 bytes each
#pragma unroll
      for (int j = 0; j < NB; ++j)                // B rows j*128.. (128 rows x 128 B apart)
        wgmma_m64n128k16<T>(acc[j], wgmma_desc(a_base + kk * 32), wgmma_desc(b_base + j * 128 * 128 + kk * 32));
    wgmma_commit();
    wgmma_wait<1>();  // the MMAs of tile kt-1 are done; tile kt's may still run
  }
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 64; ++i) keep(acc[j][i]);
  cp_async_wait<0>();
  __syncthreads();
}

// Column c of staged row r sits at column c ^ swizzle_t(r) when the tile is also read
// column-wise (the transposed store below): rows 8 apart then fall in different banks. The
// XOR flips bits 2-4 only, so groups of 4 columns stay together (float2 / float4 access).
__device__ __forceinline__ int swizzle_t(int r) { return ((r >> 3) & 7) << 2; }

// A warp's 16 rows of accumulators into shared memory, rows row0.. of a fp32 tile of row
// stride BN + 8. The accumulator layout of m64nN is mma.sync's m16n8 layout repeated: warp w
// of the warpgroup owns rows 16w..16w+15; in register i, n8 block i/4, row (lane/4) +
// 8*((i/2)%2), column 2*(lane%4) + i%2. TRANSPOSABLE: columns swizzled by swizzle_t.
template <int BN, bool TRANSPOSABLE>
__device__ __forceinline__ void stage_fragments(const float (&acc)[BN / 128][64], float* tile, int row0) {
  constexpr int LD = BN + 8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < BN / 128; ++j)
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const int r = row0 + (lane >> 2) + 8 * ((i / 2) % 2);
      const int col = j * 128 + (i / 4) * 8 + (lane & 3) * 2;
      *reinterpret_cast<float2*>(tile + r * LD + (TRANSPOSABLE ? col ^ swizzle_t(r) : col)) =
          make_float2(acc[j][i], acc[j][i + 1]);
    }
}

// The whole 128 x BN tile, each warp its rows (versions 5 and 6).
template <int BN, bool TRANSPOSABLE>
__device__ __forceinline__ void v5_stage(const float (&acc)[BN / 128][64], float* tile) {
  stage_fragments<BN, TRANSPOSABLE>(acc, tile, (threadIdx.x / 128) * 64 + ((threadIdx.x / 32) % 4) * 16);
}

template <typename T, typename TC, int BN, bool DUAL = false>
__global__ void __launch_bounds__(256, 1)
gemm_v5_kernel(const T* __restrict__ A, int64_t lda, const T* __restrict__ B, int64_t ldb,
               int64_t M, int64_t N, int64_t K, EpiArgs ep, const T* __restrict__ B2) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BM = 128, THREADS = 256;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T *sA, *sB;
  v5_tiles<T, BN>(smem_raw, sA, sB);
  int64_t m0, n0;
  grouped_tile<BM, BN>(M, N, m0, n0);
  float acc[BN / 128][64];
  v5_main_loop<T, BN, DUAL>(sA, sB, A, lda, B, ldb, m0, n0, M, N, K, B2, acc);

  // Epilogue through shared memory, as version 4.
  constexpr int LD = BN + 8;
  float* tile = reinterpret_cast<float*>(sA);
  v5_stage<BN, false>(acc, tile);
  __syncthreads();
  if constexpr (DUAL)
    store_swiglu<T, BM, BN, THREADS>(tile, LD, m0, n0, M, N, ep, threadIdx.x);
  else
    store_tile<T, TC, BM, BN, THREADS>(tile, LD, m0, n0, M, N, ep, threadIdx.x);
#endif
}

// =====================================================================================
// version 5, batched: a batch of products, the AXPBY epilogue, a transposed copy of the
// output, and the symmetric tile schedule (Newton–Schulz: newton_schulz.cu's version 2)
// =====================================================================================
// The same main loop as gemm_v5_kernel (v5_main_loop); what differs is around it:
//   * blockIdx.y is the matrix of the batch: A, B, C, C^T and Y each move by their batch
//     stride (0: one matrix shared by the whole batch);
//   * EPI_AXPBY: c = alpha * acc + beta * y[m, n] in fp32, stored in T (beta = 0 or no y:
//     y is not read);
//   * ct: the result written a second time, transposed (element (m, n) at
//     ct[n * stride_tn + m * stride_tm]). A thread of the staged epilogue reads 8 rows of one
//     column of the tile (swizzled columns: no bank conflicts), so the transposed stores are
//     16-byte vectors along m too, not 2-byte stores scattered over 8 rows;
//   * symmetric: for a product known to be symmetric (X X^T, A A with A = A^T), only the
//     T (T + 1) / 2 tiles on and below the diagonal are launched (T = M / 128 rounded up);
//     the block of tile (i, j) stores it at (i, j) and, when i != j, again transposed at
//     (j, i): the ct path with ct = c and c's strides swapped. Half the MMAs of a full GEMM.
struct BatchArgs {
  int64_t stride_ab, stride_bb;          // batch strides of the operands
  void* c;                               // (M, N), or nullptr: not written
  int64_t stride_cb, stride_cm, stride_cn;
  void* ct;                              // (N, M), the transpose, or nullptr
  int64_t stride_tb, stride_tn, stride_tm;
  const void* y;                         // (M, N) read by the epilogue, or nullptr
  int64_t stride_yb, stride_ym, stride_yn;
  float alpha, beta;
  int symmetric;
  int band;  // symmetric: the launch order's band of tile rows (tile_order.h; 1: row by row)
};

// Row-wise pass of the batched epilogue over the staged (transposable) tile: each thread
// takes 8 neighbouring columns of one row, applies c = alpha * acc + beta * y, stores c
// (16 bytes where c is contiguous and aligned, else element by element) and, when `keep`,
// writes the value, rounded to T, back into the tile for the transposed pass (so the two
// copies of an element hold the same bits).
template <typename T, int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void store_axpby(float* tile, int64_t m0, int64_t n0, int64_t M, int64_t N, T* c,
                                            const T* y, const BatchArgs& ba, bool keep, int tid) {
  constexpr int LD = COLS + 8, CHUNKS = COLS / 8;
  const bool read_y = y != nullptr && ba.beta != 0.0f;
#pragma unroll 1
  for (int e = tid; e < ROWS * CHUNKS; e += THREADS) {
    const int r = e / CHUNKS, c8 = (e % CHUNKS) * 8;
    const int64_t m = m0 + r, n = n0 + c8;
    if (m >= M || n >= N) continue;
    const bool full = n + 8 <= N;
    float4* p0 = reinterpret_cast<float4*>(tile + r * LD + (c8 ^ swizzle_t(r)));
    float4* p1 = reinterpret_cast<float4*>(tile + r * LD + ((c8 + 4) ^ swizzle_t(r)));
    const float4 lo = *p0, hi = *p1;
    float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float yv[8] = {};
    if (read_y) {
      const T* yp = y + m * ba.stride_ym + n * ba.stride_yn;
      if (full && ba.stride_yn == 1 && aligned16(yp)) {
        load8<T>(yp, yv);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (n + j < N) yv[j] = to_f32<T>(yp[j * ba.stride_yn]);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_f32<T>(from_f32<T>(ba.alpha * v[j] + ba.beta * yv[j]));
    if (c != nullptr) {
      T* cp = c + m * ba.stride_cm + n * ba.stride_cn;
      if (full && ba.stride_cn == 1 && aligned16(cp)) {
        store8<T>(cp, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (n + j < N) cp[j * ba.stride_cn] = from_f32<T>(v[j]);
      }
    }
    if (keep) {
      *p0 = make_float4(v[0], v[1], v[2], v[3]);
      *p1 = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

// Column-wise pass: element (m, n) of the tile to ct[n * stn + m * stm]. A warp takes 4
// columns x 8 chunks of 8 rows (64 rows): for each column 8 threads store 128 contiguous
// bytes of ct's row n; reading row 8t + q of column g*4 + u, a thread hits bank
// 8q + 4 (g ^ t) + u (mod 32): the 32 lanes, 32 banks.
template <typename T, int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void store_transposed(const float* tile, int64_t m0, int64_t n0, int64_t M, int64_t N,
                                                 T* ct, int64_t stn, int64_t stm, int tid) {
  constexpr int LD = COLS + 8, HALVES = ROWS / 64;  // 64-row halves of a column (version 7: one)
  static_assert(ROWS % 64 == 0 && THREADS % 32 == 0, "a warp: 4 columns x 64 rows");
#pragma unroll 1
  for (int e = tid; e < COLS * (ROWS / 8); e += THREADS) {
    const int lane = e & 31, w = e >> 5;
    const int r0 = ((w % HALVES) * 8 + (lane & 7)) * 8, col = (w / HALVES) * 4 + (lane >> 3);
    const int64_t m = m0 + r0, n = n0 + col;
    if (m >= M || n >= N) continue;
    float v[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = tile[(r0 + q) * LD + (col ^ swizzle_t(r0 + q))];
    T* p = ct + n * stn + m * stm;
    if (m + 8 <= M && stm == 1 && aligned16(p)) {
      store8<T>(p, v);
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q)
        if (m + q < M) p[q * stm] = from_f32<T>(v[q]);
    }
  }
}

// Tile number p of one matrix in the batched schedule: grouped order, or (symmetric) tile
// (i, j) of the lower triangle, whose mirror goes to c itself at (j, i) through the ct path.
template <int BM, int BN>
__device__ __forceinline__ void batched_tile(int64_t p, int64_t M, int64_t N, const BatchArgs& ba, void* c,
                                             int64_t& m0, int64_t& n0, void*& ct, int64_t& stn, int64_t& stm) {
  if (ba.symmetric) {
    int64_t i, j;
    if (ba.band > 1)
      levels_tiles::banded_lower_tile(p, cdiv(M, BM), ba.band, i, j);
    else
      levels_tiles::lower_tile(p, i, j);
    m0 = i * BM;
    n0 = j * BN;
    ct = i != j ? c : nullptr;
    stn = ba.stride_cm;
    stm = ba.stride_cn;
  } else {
    grouped_tile_at<BM, BN>(p, M, N, m0, n0);
  }
}

// A barrier over the 256 threads that run the epilogue: the whole block (version 5), or
// the two consumer warpgroups alone (version 6: its producer warpgroup has left, so
// __syncthreads would wait for it forever). Named barrier 1, 256 threads.
template <bool CONSUMERS_ONLY>
__device__ __forceinline__ void epilogue_sync() {
  if constexpr (CONSUMERS_ONLY)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
  else
    __syncthreads();
}

// The batched epilogue of a finished 128 x BN tile (threads 0..255; the pipeline's shared
// memory is free): stage, c = alpha acc + beta y, then the transposed copy if any.
template <typename T, int BN, bool CONSUMERS_ONLY>
__device__ __forceinline__ void batched_epilogue(const float (&acc)[BN / 128][64], float* tile, int64_t m0,
                                                 int64_t n0, int64_t M, int64_t N, void* c, void* ct,
                                                 int64_t stn, int64_t stm, const T* y, const BatchArgs& ba) {
  constexpr int BM = 128, THREADS = 256;
  v5_stage<BN, true>(acc, tile);
  epilogue_sync<CONSUMERS_ONLY>();
  store_axpby<T, BM, BN, THREADS>(tile, m0, n0, M, N, static_cast<T*>(c), y, ba, ct != nullptr, threadIdx.x);
  if (ct != nullptr) {  // uniform over the block: the barrier is reached by all or none
    epilogue_sync<CONSUMERS_ONLY>();
    store_transposed<T, BM, BN, THREADS>(tile, m0, n0, M, N, static_cast<T*>(ct), stn, stm, threadIdx.x);
  }
}

template <typename T, int BN>
__global__ void __launch_bounds__(256, 1)
gemm_v5_batched_kernel(const T* __restrict__ A, int64_t lda, const T* __restrict__ B, int64_t ldb,
                       int64_t M, int64_t N, int64_t K, BatchArgs ba) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BM = 128;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T *sA, *sB;
  v5_tiles<T, BN>(smem_raw, sA, sB);
  const int64_t b = blockIdx.y;
  A += b * ba.stride_ab;
  B += b * ba.stride_bb;
  void* c = ba.c ? static_cast<T*>(ba.c) + b * ba.stride_cb : nullptr;
  void* ct = ba.ct ? static_cast<T*>(ba.ct) + b * ba.stride_tb : nullptr;
  const T* y = ba.y ? static_cast<const T*>(ba.y) + b * ba.stride_yb : nullptr;
  int64_t m0, n0, stn = ba.stride_tn, stm = ba.stride_tm;
  batched_tile<BM, BN>(blockIdx.x, M, N, ba, c, m0, n0, ct, stn, stm);
  float acc[BN / 128][64];
  v5_main_loop<T, BN, false>(sA, sB, A, lda, B, ldb, m0, n0, M, N, K, nullptr, acc);
  batched_epilogue<T, BN, false>(acc, reinterpret_cast<float*>(sA), m0, n0, M, N, c, ct, stn, stm, y, ba);
#endif
}

// =====================================================================================
// version 6: TMA loads, producer/consumer warpgroups, mbarrier pipeline — sm_90a only
// =====================================================================================
// What changes from version 5 (the next rungs of the public step-by-step Hopper GEMM,
// pranjalssh/fast.cu: TMA + wgmma -> warp specialization -> mbarrier parity waits):
//   * TMA: one thread asks the Tensor Memory Accelerator for a whole (rows x 64) tile with
//     one instruction (cp.async.bulk.tensor), described by a CUtensorMap the host encodes
//     (base, sizes, row stride, box, 128-byte swizzle). The copy engine writes the tile in
//     exactly version 5's swizzled layout (the wgmma descriptor does not change), and
//     zero-fills rows and columns past the matrix's edges itself: the M, N and K tails
//     (K need not be a multiple of 64) cost no instruction. Version 5 spent 256 threads x
//     ~10 instructions per tile on cp.async addresses; here it is one thread, one instruction.
//   * warp specialization: the block is three warpgroups (384 threads). Warpgroup 2 is the
//     producer: one thread issues the TMA loads and nothing else, so it gives most of its
//     registers back (setmaxnreg.dec 40). Warpgroups 0 and 1 are the consumers, 64 rows
//     each of the 128 x BN tile (as version 5), and take the registers (setmaxnreg.inc
//     232): 128 fp32 accumulators at BN = 256 plus addresses with room to spare.
//   * mbarriers instead of __syncthreads: a ring of STAGES shared-memory stages, each with
//     a `full` barrier (the producer announces the bytes it expects; the TMA's completion
//     counts them down; the consumers wait on it) and an `empty` barrier (each consumer
//     warp arrives once the MMAs that read the stage are done; the producer waits on it
//     before refilling). A wait names the phase's parity (round r of the ring waits for
//     parity r % 2), so barriers are reused without re-initialising. No block-wide barrier
//     in the main loop: each side stalls only on what it needs.
// The consumers' epilogue is version 5's (v5_stage + store_tile / store_swiglu / the
// batched AXPBY and transposed stores), with a named barrier over the 256 consumer threads.
// Costs and limits: sm_90 only (LEVELS_BAD_ARCH elsewhere), 16-bit inputs (fp32 runs version
// 3), version 4's K-major rules or their transposes (an output of the inputs' dtype: an fp32
// output copies them as version 4 does); TMA also wants row strides that are multiples of 16 bytes
// (8 elements: version 4's rule already) and row/column counts below 2**31 (32-bit
// coordinates). Host cost: two or three cuTensorMapEncodeTiled calls per launch (a few
// microseconds of CPU, no GPU work; nothing is cached). Not here yet: a persistent grid
// (one block per SM walking the tiles, the epilogue of one tile overlapping the loads of
// the next), clusters with TMA multicast, and a 2-consumer x 128-row (256 x BN) tile.
// Debug: -DLEVELS_GEMM6_TIMEOUT=n (through LEVELS_CUDA_NVCC_FLAGS) makes every mbarrier
// wait trap after n million polls instead of hanging the GPU.

constexpr int V6_THREADS = 384;  // consumer warpgroups 0, 1; producer warpgroup 2

// Stages: as many as fit next to nothing else (the epilogue reuses the ring): 4 x 48 KB at
// BN = 256, 6 x 32 KB at BN = 128.
template <int BN> __host__ __device__ constexpr int v6_stages() { return BN == 256 ? 4 : 6; }
template <int BN> __host__ __device__ constexpr int v6_smem() { return v6_stages<BN>() * (128 + BN) * V4_BK * 2 + 1024; }

// The barrier helpers (mbar_init, mbar_expect_tx, mbar_arrive, mbar_wait) are mbarrier.cuh's,
// shared with layer_norm.cu's version 6.
using levels_mbarrier::mbar_arrive;
using levels_mbarrier::mbar_expect_tx;
using levels_mbarrier::mbar_init;
using levels_mbarrier::mbar_wait;

// TMA: the (box) tile at coordinates (k, row, batch) of the tensor map into shared memory at
// dst, completing `bar`'s transaction count by the box's bytes (out-of-bounds parts are
// zeros and count as well).
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int k, int row, int batch,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(batch),
        "r"(smem_addr(bar))
      : "memory");
}

// Which tiles the producer loads: operand maps and the batch coordinate of each (0 for an
// operand shared by the whole batch). DUAL (SwiGLU): the B tile's two halves from b and b2.
struct V6Operands {
  const CUtensorMap* a;
  const CUtensorMap* b;
  const CUtensorMap* b2;
  int batch_a, batch_b;
};

// The ring's barriers, initialised by thread 0 (the caller then syncs the block).
template <int STAGES>
__device__ __forceinline__ void ring_init(uint64_t* full, uint64_t* empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);      // the producer's expect_tx arrival (+ the TMA bytes)
      mbar_init(&empty[s], 8);     // one arrival per consumer warp
    }
    // make the initialised barriers visible to the async proxy (the TMA unit)
    levels_mbarrier::mbar_init_fence();
  }
}

// The producer's TMA loads of k-tile k (an element offset along K) of the tile at (m0, n0)
// into stage s, counted on `bar` (the stage's full barrier).
// A_MN / B_MN (version 6's transposed operands): the operand is stored with M (N) contiguous,
// a (K, M) matrix, so a box is 64 columns of M (N) x 64 k-rows: one "atom" of 8 KB, written
// with the same 128-byte swizzle. A tile of 128 rows is 2 atoms, a B tile of BN columns
// BN / 64; the stage holds the same bytes as the K-major tile, in another order
// (wgmma_stage's MN-major descriptors read it as it lies).
template <typename T, int BN, bool DUAL, bool A_MN = false, bool B_MN = false>
__device__ __forceinline__ void tma_load_stage(T* sA, T* sB, int s, const V6Operands& op, int k, int64_t m0,
                                               int64_t n0, uint64_t* bar) {
  constexpr int BM = 128;
  static_assert(!(DUAL && B_MN), "SwiGLU's dual B is K-major");
  if constexpr (A_MN) {
#pragma unroll
    for (int i = 0; i < BM / 64; ++i) tma_load(sA + s * BM * V4_BK + i * 64 * V4_BK, op.a, (int)m0 + 64 * i, k, op.batch_a, bar);
  } else {
    tma_load(sA + s * BM * V4_BK, op.a, k, (int)m0, op.batch_a, bar);
  }
  if constexpr (B_MN) {
#pragma unroll
    for (int i = 0; i < BN / 64; ++i) tma_load(sB + s * BN * V4_BK + i * 64 * V4_BK, op.b, (int)n0 + 64 * i, k, op.batch_b, bar);
  } else if constexpr (!DUAL) {
    tma_load(sB + s * BN * V4_BK, op.b, k, (int)n0, op.batch_b, bar);
  } else {
    tma_load(sB + s * BN * V4_BK, op.b, k, (int)(n0 / 2), op.batch_b, bar);
    tma_load(sB + s * BN * V4_BK + (BN / 2) * V4_BK, op.b2, k, (int)(n0 / 2), op.batch_b, bar);
  }
}

// Version 6's (and 7's) instruction width. A 128x256 tile's consumer issued two m64n128k16 per
// k16 slice; it now issues one m64n256k16, which reads the A slice from shared memory once
// instead of twice: per stage of 64 k the two consumers read 80 KB instead of 96 KB, beside
// the TMA's 48 KB of writes. A count of bytes (128 a cycle, ~1024 tensor-core cycles a stage)
// said shared memory would run short first. The A/B says it did not: the same bits, and
// +0.6-1.2% TFLOP/s at 8192^3, 4096^3 and the MLP's GEMMs, inside the run-to-run spread
// (reports/level5-gemm-users-and-norms-2026-11-27/). Kept: one issue instead of two, the
// instruction the public Hopper GEMMs use. -DLEVELS_WGMMA_N128=1 builds the two-instruction
// form again.
#if defined(LEVELS_WGMMA_N128) && LEVELS_WGMMA_N128
constexpr bool WIDE_MMA = false;
#else
constexpr bool WIDE_MMA = true;
#endif

// A consumer warpgroup's MMAs on stage s: its 64 rows of A times all BN rows of B, 4 k16
// slices, issued (and committed) asynchronously. K-major tiles: a k16 slice is 32 bytes into
// each 128-byte row. MN-major tiles (A_MN, B_MN): a k16 slice is 16 k-rows, 2048 bytes into
// an atom (a multiple of the swizzle's 1024-byte period), and the next 64 columns are the
// next atom, 8 KB on (wgmma_desc_mn's leading offset); the warpgroup's 64 rows of A are its
// own atom, the same 8 KB offset as its 64 K-major rows.
template <typename T, int BN, bool A_MN = false, bool B_MN = false>
__device__ __forceinline__ void wgmma_stage(const T* sA, const T* sB, int s, int wg, float (&acc)[BN / 128][64]) {
  constexpr int BM = 128, NB = BN / 128, ATOM = 64 * V4_BK * (int)sizeof(T);
  const uint32_t a_base = smem_addr(sA + s * BM * V4_BK + wg * 64 * V4_BK);
  const uint32_t b_base = smem_addr(sB + s * BN * V4_BK);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < V4_BK / 16; ++kk) {
    const uint64_t da = A_MN ? wgmma_desc_mn(a_base + kk * 16 * 128, ATOM) : wgmma_desc(a_base + kk * 32);
    if constexpr (WIDE_MMA && NB == 2) {
      // one m64n256k16 over the whole B tile: its rows (K-major: 256 rows of 128 bytes) or
      // its four 64-column atoms (MN-major, ATOM apart) are what one descriptor walks; the
      // accumulators acc[0][i], acc[1][i] are its d[i], d[64 + i] (wgmma.cuh)
      const uint64_t db = B_MN ? wgmma_desc_mn(b_base + kk * 16 * 128, ATOM) : wgmma_desc(b_base + kk * 32);
      wgmma_m64n256k16<T, A_MN, B_MN>(reinterpret_cast<float(&)[128]>(acc), da, db);
    } else {
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        const uint64_t db = B_MN ? wgmma_desc_mn(b_base + j * 2 * ATOM + kk * 16 * 128, ATOM)
                                 : wgmma_desc(b_base + j * 128 * 128 + kk * 32);
        wgmma_m64n128k16<T, A_MN, B_MN>(acc[j], da, db);
      }
    }
  }
  wgmma_commit();
}

// The version-6 main loop of one 128 x BN tile at (m0, n0), shared by the plain and the
// batched kernel. Every thread of the block calls it; it returns false on the producer
// warpgroup (which should then leave) and true on the consumers, whose acc then holds the
// tile, every stage's TMA writes landed and read: the ring's memory is free for the epilogue
// once the consumers pass an epilogue_sync<true>().
template <typename T, int BN, bool DUAL, bool A_MN = false, bool B_MN = false>
__device__ __forceinline__ bool v6_main_loop(T* sA, T* sB, uint64_t* full, uint64_t* empty, const V6Operands& op,
                                             int64_t m0, int64_t n0, int64_t K, float (&acc)[BN / 128][64]) {
  constexpr int BM = 128, NB = BN / 128, STAGES = v6_stages<BN>();
  constexpr uint32_t STAGE_BYTES = (BM + BN) * V4_BK * sizeof(T);
  const int KT = (int)cdiv(K, V4_BK);
  const int wg = threadIdx.x / 128;
  ring_init<STAGES>(full, empty);
  __syncthreads();  // the last block-wide barrier: the producer leaves after its loop

  if (wg == 2) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 256) {
      for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        if (kt >= STAGES) mbar_wait(&empty[s], (kt / STAGES - 1) & 1);  // round r-1's readers are done
        mbar_expect_tx(&full[s], STAGE_BYTES);
        tma_load_stage<T, BN, DUAL, A_MN, B_MN>(sA, sB, s, op, kt * V4_BK, m0, n0, &full[s]);
      }
    }
    return false;
  }

  // ---- consumers: warpgroup wg owns rows wg*64 .. wg*64+63 ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;
  const bool warp_leader = (threadIdx.x & 31) == 0;
  for (int kt = 0; kt < KT; ++kt) {
    const int s = kt % STAGES;
    mbar_wait(&full[s], (kt / STAGES) & 1);  // round kt / STAGES of stage s has landed
    wgmma_stage<T, BN, A_MN, B_MN>(sA, sB, s, wg, acc);
    // Tile kt's MMAs stay in flight; tile kt-1's are done, so its stage goes back.
    wgmma_wait<1>();
    if (kt > 0) {
      __syncwarp();
      if (warp_leader) mbar_arrive(&empty[(kt - 1) % STAGES]);
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 64; ++i) keep(acc[j][i]);
  return true;
}

// The ring in dynamic shared memory, 1024-byte aligned (the swizzle's period, as version 5);
// the barriers are static shared memory, out of the epilogue's way.
template <typename T, int BN>
__device__ __forceinline__ void v6_tiles(unsigned char* smem_raw, T*& sA, T*& sB) {
  const uint32_t raw = smem_addr(smem_raw);
  sA = reinterpret_cast<T*>(smem_raw + ((1024 - (raw & 1023)) & 1023));  // [STAGES][128][64]
  sB = sA + v6_stages<BN>() * 128 * V4_BK;                               // [STAGES][BN][64]
}

// A_MN / B_MN: that operand is read transposed, as it lies (tma_load_stage, wgmma_stage).
template <typename T, typename TC, int BN, bool DUAL = false, bool A_MN = false, bool B_MN = false>
__global__ void __launch_bounds__(V6_THREADS, 1)
gemm_v6_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
               const __grid_constant__ CUtensorMap map_b2, int64_t M, int64_t N, int64_t K, EpiArgs ep) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BM = 128, THREADS = 256;  // the epilogue's threads: the consumers
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[v6_stages<BN>()], empty[v6_stages<BN>()];
  T *sA, *sB;
  v6_tiles<T, BN>(smem_raw, sA, sB);
  int64_t m0, n0;
  grouped_tile<BM, BN>(M, N, m0, n0);
  float acc[BN / 128][64];
  const V6Operands op{&map_a, &map_b, &map_b2, 0, 0};
  if (!v6_main_loop<T, BN, DUAL, A_MN, B_MN>(sA, sB, full, empty, op, m0, n0, K, acc)) return;
  constexpr int LD = BN + 8;
  float* tile = reinterpret_cast<float*>(sA);
  epilogue_sync<true>();  // both consumer warpgroups are done reading the ring
  v5_stage<BN, false>(acc, tile);
  epilogue_sync<true>();
  if constexpr (DUAL)
    store_swiglu<T, BM, BN, THREADS>(tile, LD, m0, n0, M, N, ep, threadIdx.x);
  else
    store_tile<T, TC, BM, BN, THREADS>(tile, LD, m0, n0, M, N, ep, threadIdx.x);
#endif
}

// The batched version 6 (newton_schulz.cu's versions 3 and 5): gemm_v5_batched_kernel's
// schedule and epilogue on the TMA / warp-specialized loop; the batch is the tensor maps' third
// coordinate. B_MN: b is a (K, N) matrix with N contiguous, read as it lies (version 6's
// MN-major tiles: newton_schulz.cu's version 5 reads X itself as the B of B·X).
template <typename T, int BN, bool B_MN = false>
__global__ void __launch_bounds__(V6_THREADS, 1)
gemm_v6_batched_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                       int64_t M, int64_t N, int64_t K, BatchArgs ba) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BM = 128;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[v6_stages<BN>()], empty[v6_stages<BN>()];
  T *sA, *sB;
  v6_tiles<T, BN>(smem_raw, sA, sB);
  const int64_t b = blockIdx.y;
  void* c = ba.c ? static_cast<T*>(ba.c) + b * ba.stride_cb : nullptr;
  void* ct = ba.ct ? static_cast<T*>(ba.ct) + b * ba.stride_tb : nullptr;
  const T* y = ba.y ? static_cast<const T*>(ba.y) + b * ba.stride_yb : nullptr;
  int64_t m0, n0, stn = ba.stride_tn, stm = ba.stride_tm;
  batched_tile<BM, BN>(blockIdx.x, M, N, ba, c, m0, n0, ct, stn, stm);
  float acc[BN / 128][64];
  const V6Operands op{&map_a, &map_b, &map_b, ba.stride_ab ? (int)b : 0, ba.stride_bb ? (int)b : 0};
  if (!v6_main_loop<T, BN, false, false, B_MN>(sA, sB, full, empty, op, m0, n0, K, acc)) return;
  epilogue_sync<true>();
  batched_epilogue<T, BN, true>(acc, reinterpret_cast<float*>(sA), m0, n0, M, N, c, ct, stn, stm, y, ba);
#endif
}

// =====================================================================================
// version 7: a persistent grid; the epilogue of one tile under the loads of the next — sm_90a
// =====================================================================================
// What changes from version 6 (the next rung of the public Hopper GEMMs: a persistent,
// warp-specialized kernel, as CUTLASS's "warp-specialized persistent" schedules):
//   * a persistent grid: min(tiles, SMs) blocks, one per SM; block b computes tiles b,
//     b + gridDim.x, b + 2 gridDim.x, ... of the grouped order (the running blocks always
//     hold ~#SMs consecutive tiles of that order, so version 4's L2 grouping still holds).
//     The barriers are set up once per SM, not once per tile;
//   * the producer never stops between tiles: its loop over (tile, k-tile) is ONE stream of
//     k-iterations, and both sides derive stage and parity from one running counter `it`
//     (stage it % STAGES, round it / STAGES), never reset at a tile boundary. While the
//     consumers run the epilogue of tile t, the producer is already filling the ring with
//     tile t+1's first k-tiles, so t+1's MMAs start on data that has landed;
//   * so that it can, the epilogue has shared memory of its own. Version 6 staged the
//     finished tile in the ring, which it could only do once every consumer was done with
//     the ring: the next tile's loads would have had to wait for the whole epilogue. Here
//     each consumer warpgroup owns a slab of SLAB rows x BN fp32 (row stride BN + 8, version
//     5's staging layout) and stages its 64 rows through it SLAB rows at a time, with a named
//     barrier of its own (bar 2 + warpgroup, 128 threads): the two consumer warpgroups no
//     longer wait for each other in the epilogue. The staging stays fp32 and the epilogues
//     are version 6's code (store_tile, store_swiglu, the batched AXPBY and transposed
//     stores), so version 7 rounds exactly where version 6 does: the same bits;
//   * a consumer hands a tile's LAST stage back after its final wgmma_wait<0> (version 6
//     never did: its block ended there, and a persistent block would wait for it forever).
// Shared memory (227 KB a block on sm_90): the slabs take 2 x 16 x 264 x 4 = 33 KB at
// BN = 256, 17 KB at BN = 128; the ring gets what remains, v7_stages(): 4 stages of 48 KB or
// 6 of 32 KB, as version 6. The batched kernel (Newton–Schulz) stages whole 64-row halves
// (SLAB = 64: its transposed store reads 8 rows of a column per thread) and runs 128x128
// tiles only: 4 stages.
// Costs and limits: version 6's, plus: the tensor cores still idle during a tile's epilogue
// (the next tile's MMAs are the same warps'; overlapping those too is the "ping-pong"
// schedule, each consumer warpgroup on its own tile, not here); 2 x 64/SLAB named-barrier
// waits per warpgroup per tile; the last wave is as uneven as version 6's (tiles / SMs need
// not be whole: a block may do one tile more than another). A wrong parity hangs as in
// version 6: -DLEVELS_GEMM7_TIMEOUT=n (or LEVELS_GEMM6_TIMEOUT) traps instead.
// Not here yet (the next rungs): ping-pong consumers (the epilogue under the other
// warpgroup's MMAs: version 8), the staged tile written by a TMA store (cp.async.bulk.tensor
// from shared memory: 16-bit staging, fence.proxy.async), clusters with TMA multicast of the
// shared operand.

constexpr int V7_THREADS = 384;            // as version 6: consumer warpgroups 0, 1; producer 2
constexpr int V7_SMEM_LIMIT = 227 * 1024;  // the most shared memory (static + dynamic) of a block, sm_90
constexpr int V7_SLAB = 16;                // the plain kernel's slab: one warp's rows per pass

template <int BN> __host__ __device__ constexpr int v7_stage_bytes() { return (128 + BN) * V4_BK * 2; }
template <int BN, int SLAB> __host__ __device__ constexpr int v7_slab_bytes() { return 2 * SLAB * (BN + 8) * 4; }
// As many stages as fit beside the slabs, the 1 KB alignment slack and the static shared
// memory: the barriers, 16 bytes a stage, which ptxas pads to 1 KB (it reports 1024 bytes of
// static shared memory: the dynamic area after them is declared 1024-byte aligned).
constexpr int V7_STATIC_SMEM = 1024;
template <int BN, int SLAB> __host__ __device__ constexpr int v7_stages() {
  return (V7_SMEM_LIMIT - v7_slab_bytes<BN, SLAB>() - 1024 - V7_STATIC_SMEM) / v7_stage_bytes<BN>();
}
template <int BN, int SLAB> __host__ __device__ constexpr int v7_smem() {  // the dynamic part
  return v7_stages<BN, SLAB>() * v7_stage_bytes<BN>() + v7_slab_bytes<BN, SLAB>() + 1024;
}
static_assert(v7_stages<256, V7_SLAB>() == 4 && v7_stages<128, V7_SLAB>() == 6 && v7_stages<128, 64>() == 4,
              "the ring depths the header states");
static_assert(v7_smem<256, V7_SLAB>() + V7_STATIC_SMEM <= V7_SMEM_LIMIT &&
                  v7_smem<128, V7_SLAB>() + V7_STATIC_SMEM <= V7_SMEM_LIMIT &&
                  v7_smem<128, 64>() + V7_STATIC_SMEM <= V7_SMEM_LIMIT,
              "ring + slabs + barriers fit in a block's shared memory");

// The dynamic shared memory: the ring (1024-byte aligned, version 6's layout), then the two
// consumer warpgroups' slabs.
template <typename T, int BN, int STAGES>
__device__ __forceinline__ void v7_layout(unsigned char* smem_raw, T*& sA, T*& sB, float*& slabs) {
  const uint32_t raw = smem_addr(smem_raw);
  sA = reinterpret_cast<T*>(smem_raw + ((1024 - (raw & 1023)) & 1023));  // [STAGES][128][64]
  sB = sA + STAGES * 128 * V4_BK;                                        // [STAGES][BN][64]
  slabs = reinterpret_cast<float*>(sB + STAGES * BN * V4_BK);            // [2][SLAB][BN + 8]
}

// The producer's k-tiles of one output tile at (m0, n0). `it` counts the block's
// k-iterations over all its tiles so far; this advances it by KT. Stage it % STAGES is
// refilled once its previous round (iteration it - STAGES, of this tile or an earlier one)
// has been given back by all 8 consumer warps: that round's empty phase, parity
// (it / STAGES - 1) & 1.
template <typename T, int BN, int STAGES, bool DUAL>
__device__ __forceinline__ void v7_produce(T* sA, T* sB, uint64_t* full, uint64_t* empty, const V6Operands& op,
                                           int64_t m0, int64_t n0, int KT, int& it) {
  constexpr uint32_t STAGE_BYTES = (128 + BN) * V4_BK * sizeof(T);
  for (int kt = 0; kt < KT; ++kt, ++it) {
    const int s = it % STAGES;
    if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES - 1) & 1);
    mbar_expect_tx(&full[s], STAGE_BYTES);
    tma_load_stage<T, BN, DUAL>(sA, sB, s, op, kt * V4_BK, m0, n0, &full[s]);
  }
}

// The consumers' k-tiles of one output tile: acc = the tile (this warpgroup's 64 rows), on
// the same running counter as the producer's. Every stage read is given back exactly once:
// iteration it - 1 after the wgmma_wait<1> of iteration it (inside the tile), the tile's last
// one after the final wgmma_wait<0> — nothing of this tile is left for the next to release.
template <typename T, int BN, int STAGES>
__device__ __forceinline__ void v7_consume(const T* sA, const T* sB, uint64_t* full, uint64_t* empty, int KT,
                                           int& it, float (&acc)[BN / 128][64]) {
  const int wg = threadIdx.x / 128;
  const bool warp_leader = (threadIdx.x & 31) == 0;
#pragma unroll
  for (int j = 0; j < BN / 128; ++j)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;
  for (int kt = 0; kt < KT; ++kt, ++it) {
    const int s = it % STAGES;
    mbar_wait(&full[s], (it / STAGES) & 1);  // round it / STAGES of stage s has landed
    wgmma_stage<T, BN>(sA, sB, s, wg, acc);
    wgmma_wait<1>();  // iteration it - 1's MMAs are done; this one's may still run
    if (kt > 0) {
      __syncwarp();
      if (warp_leader) mbar_arrive(&empty[(it - 1) % STAGES]);
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < BN / 128; ++j)
#pragma unroll
    for (int i = 0; i < 64; ++i) keep(acc[j][i]);
  if (KT > 0) {  // the tile's last stage (iteration it - 1: `it` has moved past it)
    __syncwarp();
    if (warp_leader) mbar_arrive(&empty[(it - 1) % STAGES]);
  }
}

// The barrier of one consumer warpgroup alone (named barriers 2 and 3; 0 is __syncthreads,
// 1 version 6's epilogue_sync): its 4 warps share a slab, nothing else.
__device__ __forceinline__ void warpgroup_sync(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory"); }

// Pass `pass` of staging a consumer warpgroup's 64 rows: rows pass*SLAB .. +SLAB-1 into its
// slab. Warp w holds rows 16w..16w+15, so a pass is whole warps; the others skip it.
template <int BN, int SLAB, bool TRANSPOSABLE>
__device__ __forceinline__ void v7_stage(const float (&acc)[BN / 128][64], float* slab, int pass) {
  static_assert(SLAB % 16 == 0 && 64 % SLAB == 0, "whole warps per pass");
  const int w = (threadIdx.x / 32) % 4;
  if (w * 16 / SLAB == pass) stage_fragments<BN, TRANSPOSABLE>(acc, slab, w * 16 - pass * SLAB);
}

// The persistent tile loop both roles walk: the same tiles in the same order, so the producer
// loads exactly the k-tiles the consumers wait for, and both stop together.
#define LEVELS_V7_FOR_EACH_TILE(t, tiles) for (int64_t t = blockIdx.x; t < (tiles); t += gridDim.x)

template <typename T, typename TC, int BN, bool DUAL = false>
__global__ void __launch_bounds__(V7_THREADS, 1)
gemm_v7_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
               const __grid_constant__ CUtensorMap map_b2, int64_t M, int64_t N, int64_t K, EpiArgs ep) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BM = 128, SLAB = V7_SLAB, STAGES = v7_stages<BN, SLAB>(), LD = BN + 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
  T *sA, *sB;
  float* slabs;
  v7_layout<T, BN, STAGES>(smem_raw, sA, sB, slabs);
  const int64_t tiles = cdiv(M, BM) * cdiv(N, BN);
  const int KT = (int)cdiv(K, V4_BK), wg = threadIdx.x / 128;
  ring_init<STAGES>(full, empty);
  __syncthreads();  // the only block-wide barrier
  int it = 0;       // this thread's count of the block's k-iterations (see v7_produce)
  if (wg == 2) {
    // ---- producer: one thread issues every TMA load of every tile of the block ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 256) {
      const V6Operands op{&map_a, &map_b, &map_b2, 0, 0};
      LEVELS_V7_FOR_EACH_TILE(t, tiles) {
        int64_t m0, n0;
        grouped_tile_at<BM, BN>(t, M, N, m0, n0);
        v7_produce<T, BN, STAGES, DUAL>(sA, sB, full, empty, op, m0, n0, KT, it);
      }
    }
    return;
  }
  // ---- consumers: MMAs of a tile, then its epilogue while the producer runs ahead ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  float* slab = slabs + wg * SLAB * LD;
  const int tid = threadIdx.x % 128;  // the thread's index in its warpgroup: the epilogue's
  float acc[BN / 128][64];
  LEVELS_V7_FOR_EACH_TILE(t, tiles) {
    int64_t m0, n0;
    grouped_tile_at<BM, BN>(t, M, N, m0, n0);
    v7_consume<T, BN, STAGES>(sA, sB, full, empty, KT, it, acc);
#pragma unroll 1
    for (int pass = 0; pass < 64 / SLAB; ++pass) {
      const int64_t r0 = m0 + wg * 64 + pass * SLAB;  // the slab's first output row
      v7_stage<BN, SLAB, false>(acc, slab, pass);
      warpgroup_sync(wg);
      if constexpr (DUAL)
        store_swiglu<T, SLAB, BN, 128>(slab, LD, r0, n0, M, N, ep, tid);
      else
        store_tile<T, TC, SLAB, BN, 128>(slab, LD, r0, n0, M, N, ep, tid);
      warpgroup_sync(wg);  // the slab is read before the next pass (or tile) writes it
    }
  }
#endif
}

// The batched version 7 (newton_schulz.cu's version 4): the persistent tile index walks
// (matrix, tile) pairs, matrix-major: t = b * per + p, p a tile of matrix b in the batched
// schedule (grouped, or the lower triangle when symmetric). 128x128 tiles.
template <typename T>
__global__ void __launch_bounds__(V7_THREADS, 1)
gemm_v7_batched_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                       int64_t batch, int64_t M, int64_t N, int64_t K, BatchArgs ba) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BM = 128, BN = 128, SLAB = 64, STAGES = v7_stages<BN, SLAB>(), LD = BN + 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
  T *sA, *sB;
  float* slabs;
  v7_layout<T, BN, STAGES>(smem_raw, sA, sB, slabs);
  const int64_t tm = cdiv(M, BM);
  const int64_t per = ba.symmetric ? tm * (tm + 1) / 2 : tm * cdiv(N, BN), tiles = batch * per;
  const int KT = (int)cdiv(K, V4_BK), wg = threadIdx.x / 128;
  ring_init<STAGES>(full, empty);
  __syncthreads();
  int it = 0;
  int64_t m0, n0, stn, stm;
  void* ct;
  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 256) {
      LEVELS_V7_FOR_EACH_TILE(t, tiles) {
        const int b = (int)(t / per);
        batched_tile<BM, BN>(t % per, M, N, ba, nullptr, m0, n0, ct, stn, stm);
        const V6Operands op{&map_a, &map_b, &map_b, ba.stride_ab ? b : 0, ba.stride_bb ? b : 0};
        v7_produce<T, BN, STAGES, false>(sA, sB, full, empty, op, m0, n0, KT, it);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  float* slab = slabs + wg * SLAB * LD;
  const int tid = threadIdx.x % 128;
  float acc[BN / 128][64];
  LEVELS_V7_FOR_EACH_TILE(t, tiles) {
    const int64_t b = t / per;
    void* c = ba.c ? static_cast<T*>(ba.c) + b * ba.stride_cb : nullptr;
    ct = ba.ct ? static_cast<T*>(ba.ct) + b * ba.stride_tb : nullptr;
    const T* y = ba.y ? static_cast<const T*>(ba.y) + b * ba.stride_yb : nullptr;
    stn = ba.stride_tn;
    stm = ba.stride_tm;
    batched_tile<BM, BN>(t % per, M, N, ba, c, m0, n0, ct, stn, stm);
    v7_consume<T, BN, STAGES>(sA, sB, full, empty, KT, it, acc);
    // the warpgroup's 64 rows, one pass: c = alpha acc + beta y, then the transposed copy
    const int64_t r0 = m0 + wg * 64;
    v7_stage<BN, SLAB, true>(acc, slab, 0);
    warpgroup_sync(wg);
    store_axpby<T, SLAB, BN, 128>(slab, r0, n0, M, N, static_cast<T*>(c), y, ba, ct != nullptr, tid);
    if (ct != nullptr) {  // uniform over the warpgroup (and the block)
      warpgroup_sync(wg);
      store_transposed<T, SLAB, BN, 128>(slab, r0, n0, M, N, static_cast<T*>(ct), stn, stm, tid);
    }
    warpgroup_sync(wg);  // the slab is read before the next tile writes it
  }
#endif
}

// =====================================================================================
// version 8: ping-pong consumers; one tile's epilogue under the other tile's MMAs — sm_90a
// =====================================================================================
// What changes from version 7 (the next rung of the public Hopper GEMMs: CUTLASS's
// "warp-specialized ping-pong" schedule):
//   * the two consumer warpgroups no longer split a tile: each owns whole 128 x 128 tiles,
//     both 64-row halves of A against the same 128 rows of B (two m64n128k16 per k16 slice
//     into acc[2][1][64]: the 128 fp32 accumulators per thread that version 7 held for its
//     64 x 256 share). The block walks version 7's tiles (blockIdx.x, + gridDim.x, ...);
//     numbering them i = 0, 1, 2, ... within the block, consumer 0 takes the even i,
//     consumer 1 the odd ones;
//   * the producer is version 7's, unchanged: tile 0's k-tiles, then tile 1's, ... on one
//     running counter, so the ring carries the two consumers' k-tiles one tile after the
//     other: tile i's k-iterations are i KT .. i KT + KT - 1. A consumer starts its counter
//     at wg KT and, after each of its tiles, skips KT (the other consumer's tile); stage and
//     parity then come from `it` exactly as in version 7. Each round of a stage is read by ONE
//     warpgroup now, so its empty barrier counts 4 warp arrivals, not 8;
//   * a "math order" between the consumers, two mbarriers of 4 arrivals: tile i's MMAs start
//     once every MMA of tile i-1 has been issued. Consumer wg waits on order[wg] (phase
//     (i-1)/2, the other consumer's previous tile) before its first k-tile; after issuing
//     its last k-tile, before waiting for those MMAs, it arrives on order[1-wg]. So the
//     mainloops alternate 0, 1, 0, 1, ... and while one consumer runs its tile's epilogue
//     (its own slab, its own named barrier, version 7's code) the other's MMAs keep the
//     tensor cores busy. (CUTLASS orders the two epilogues as well: they share its TMA-store
//     pipeline; here the epilogues share nothing, so they need no order.) Without the order,
//     both consumers' MMAs would share the tensor cores and their epilogues fall into the
//     same gaps: version 7's timeline with two tiles in flight. The order is also what keeps
//     the full barriers' parity waits exact: a consumer skips the other's rounds of a stage,
//     and a parity wait cannot tell round r+1 from round r-1 not yet landed; with the order,
//     every k-iteration before tile i has landed (its full phase completed: its consumer
//     waited for it) before tile i's first wait, so no wait is ever two phases ahead.
// Tile: 128 x 128 at every size (no 128 x 256: 256 accumulators per thread do not fit; 64 x 256
// per consumer would load 40 KB per stage for the MMAs that 128 x 128 gets from 32 KB, and
// leave the ring 4 stages). A block holds two tiles, one per consumer, as version 7 held one
// 128 x 256; the ring is version 7's at BN = 128: 6 stages of 32 KB beside two 16-row slabs.
// Costs and limits: version 7's, plus: a consumer's epilogue is a whole 128-row tile (8 slab
// passes, 16 named-barrier waits), hidden only while it is shorter than the other consumer's
// mainloop — at short K (a few k-tiles) the tensor cores wait again. One tile shape, smaller
// than version 7's where tiles are plentiful: 32 KB of operands per 128x128x64 k-tile (1M
// MACs) where 128x256x64 needs 48 KB per 2M, a third more L2 -> shared memory traffic per
// MAC, which at large sizes (long K: little epilogue to hide) may cost more than the overlap
// gains (2-SM clusters multicasting the shared operand would win it back). A block with an
// odd number of tiles leaves consumer 1 idle during its last one, and with fewer tiles than
// SMs every block runs consumer 0 alone (one warpgroup's MMAs on one tile per SM). Two more
// barrier operations per tile. The batched kernel is not ported: Newton–Schulz version 4
// stays on version 7. Hang trap as version 7's (-DLEVELS_GEMM8_TIMEOUT=n, or the GEMM6 /
// GEMM7 names).
// Not here yet (the next rungs): clusters with TMA multicast, the epilogue's stores by TMA,
// a batched ping-pong kernel.
// Measured: see the ladder at the top of the file (no faster than version 6 on the H100).

constexpr int V8_THREADS = 384;  // consumer warpgroups 0 and 1 (a tile each), producer 2
constexpr int V8_BN = 128;       // every tile 128 x 128
constexpr int V8_STAGES = v7_stages<V8_BN, V7_SLAB>();
static_assert(V8_STAGES == 6 && v7_smem<V8_BN, V7_SLAB>() + V7_STATIC_SMEM <= V7_SMEM_LIMIT,
              "6 ring stages of 32 KB and the two 16-row slabs fit in 227 KB (with 1 KB of barriers)");

// Version 8's barriers, set up by thread 0 (the caller then syncs the block): the ring's,
// with one consumer warpgroup per round of a stage, and the math order.
template <int STAGES>
__device__ __forceinline__ void v8_init(uint64_t* full, uint64_t* empty, uint64_t* order) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);   // the producer's expect_tx arrival (+ the TMA bytes)
      mbar_init(&empty[s], 4);  // the 4 warps of the one consumer that read this round
    }
    mbar_init(&order[0], 4);    // consumer 1's warps: its tile's MMAs are issued, consumer 0 may go
    mbar_init(&order[1], 4);    // consumer 0's warps, for consumer 1
    levels_mbarrier::mbar_init_fence();
  }
}

// A consumer warpgroup's MMAs on stage s for its whole 128 x 128 tile: both 64-row halves
// of the stage's A (8 KB apart) against all 128 rows of B, 4 k16 slices, one commit group.
template <typename T>
__device__ __forceinline__ void wgmma_stage_tile(const T* sA, const T* sB, int s, float (&acc)[2][1][64]) {
  constexpr int BM = 128, BN = V8_BN;
  const uint32_t a_base = smem_addr(sA + s * BM * V4_BK);
  const uint32_t b_base = smem_addr(sB + s * BN * V4_BK);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < V4_BK / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wgmma_m64n128k16<T>(acc[h][0], wgmma_desc(a_base + h * 64 * 128 + kk * 32), wgmma_desc(b_base + kk * 32));
  wgmma_commit();
}

// One consumer's k-tiles of one of its tiles: acc = the whole tile. Version 7's loop (stage
// and parity from the running counter `it`, which this advances by KT; every stage given back
// exactly once, the last after the final wgmma_wait<0>), plus the math order's hand-over:
// `done` (the other consumer's order barrier) is arrived on once every MMA of the tile is issued.
template <typename T, int STAGES>
__device__ __forceinline__ void v8_consume(const T* sA, const T* sB, uint64_t* full, uint64_t* empty,
                                           uint64_t* done, int KT, int& it, float (&acc)[2][1][64]) {
  const bool warp_leader = (threadIdx.x & 31) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[h][0][i] = 0.0f;
  for (int kt = 0; kt < KT; ++kt, ++it) {
    const int s = it % STAGES;
    mbar_wait(&full[s], (it / STAGES) & 1);  // round it / STAGES of stage s has landed
    wgmma_stage_tile<T>(sA, sB, s, acc);
    wgmma_wait<1>();  // iteration it - 1's MMAs are done; this one's may still run
    if (kt > 0) {
      __syncwarp();
      if (warp_leader) mbar_arrive(&empty[(it - 1) % STAGES]);
    }
  }
  __syncwarp();
  if (warp_leader) mbar_arrive(done);  // every MMA of the tile issued: the other consumer's turn
  wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) keep(acc[h][0][i]);
  if (KT > 0) {  // the tile's last stage (iteration it - 1: `it` has moved past it)
    __syncwarp();
    if (warp_leader) mbar_arrive(&empty[(it - 1) % STAGES]);
  }
}

template <typename T, typename TC, bool DUAL = false>
__global__ void __launch_bounds__(V8_THREADS, 1)
gemm_v8_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
               const __grid_constant__ CUtensorMap map_b2, int64_t M, int64_t N, int64_t K, EpiArgs ep) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BM = 128, BN = V8_BN, SLAB = V7_SLAB, STAGES = V8_STAGES, LD = BN + 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES], order[2];
  T *sA, *sB;
  float* slabs;
  v7_layout<T, BN, STAGES>(smem_raw, sA, sB, slabs);
  const int64_t tiles = cdiv(M, BM) * cdiv(N, BN);
  const int KT = (int)cdiv(K, V4_BK), wg = threadIdx.x / 128;
  v8_init<STAGES>(full, empty, order);
  __syncthreads();  // the only block-wide barrier
  if (wg == 2) {
    // ---- producer: version 7's, every tile of the block in order (both consumers') ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 256) {
      int it = 0;
      const V6Operands op{&map_a, &map_b, &map_b2, 0, 0};
      LEVELS_V7_FOR_EACH_TILE(t, tiles) {
        int64_t m0, n0;
        grouped_tile_at<BM, BN>(t, M, N, m0, n0);
        v7_produce<T, BN, STAGES, DUAL>(sA, sB, full, empty, op, m0, n0, KT, it);
      }
    }
    return;
  }
  // ---- consumer wg: the block's tiles i = wg, wg + 2, ... (t: the same tile in the grid) ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  float* slab = slabs + wg * SLAB * LD;
  const int tid = threadIdx.x % 128;  // the thread's index in its warpgroup: the epilogue's
  float acc[2][1][64];                // [64-row half][the one n128 block][registers]
  int it = wg * KT;                   // tile i's k-iterations start at i KT
  const int64_t step = 2 * (int64_t)gridDim.x;
  for (int64_t i = wg, t = blockIdx.x + wg * (int64_t)gridDim.x; t < tiles; i += 2, t += step) {
    int64_t m0, n0;
    grouped_tile_at<BM, BN>(t, M, N, m0, n0);
    if (i > 0) mbar_wait(&order[wg], (int)((i - 1) / 2) & 1);  // tile i-1's MMAs are all issued
    v8_consume<T, STAGES>(sA, sB, full, empty, &order[1 - wg], KT, it, acc);
    it += KT;  // tile i+1 is the other consumer's
    // The epilogue, while the other consumer's MMAs run: 128 rows, SLAB at a time.
#pragma unroll 1
    for (int pass = 0; pass < BM / SLAB; ++pass) {
      const int sub = pass % (64 / SLAB);  // the pass within its 64-row half
      if (pass < 64 / SLAB)                // acc's halves by compile-time index (no local memory)
        v7_stage<BN, SLAB, false>(acc[0], slab, sub);
      else
        v7_stage<BN, SLAB, false>(acc[1], slab, sub);
      warpgroup_sync(wg);
      const int64_t r0 = m0 + pass * SLAB;  // the slab's first output row
      if constexpr (DUAL)
        store_swiglu<T, SLAB, BN, 128>(slab, LD, r0, n0, M, N, ep, tid);
      else
        store_tile<T, TC, SLAB, BN, 128>(slab, LD, r0, n0, M, N, ep, tid);
      warpgroup_sync(wg);  // the slab is read before the next pass (or tile) writes it
    }
  }
#endif
}

// =====================================================================================
// column sums: out[n] = sum_m x[m, n] in fp32 (bias gradients)
// =====================================================================================
// One block per 32 columns; its 32x32 threads stride down the rows (a warp reads 32
// neighbouring columns of one row), then fold the 32 partial sums per column through
// shared memory. Each block owns its columns: no atomics, the same result every run.
template <typename T, typename TO>
__global__ void column_sum_kernel(const T* __restrict__ x, int64_t stride_xm, int64_t stride_xn,
                                  TO* __restrict__ out, int64_t M, int64_t N) {
  __shared__ float part[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t n = (int64_t)blockIdx.x * 32 + tx;
  float s = 0.0f;
  if (n < N)
    for (int64_t m = ty; m < M; m += 32) s += to_f32<T>(x[m * stride_xm + n * stride_xn]);
  part[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && n < N) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) t += part[i][tx];
    out[n] = from_f32<TO>(t);
  }
}

// =====================================================================================
// launchers
// =====================================================================================
inline int num_sms() {
  static int sms = 0;  // one device per process is all Level 5 uses; benign race
  if (sms == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (sms <= 0) sms = 1;
  }
  return sms;
}

// The GPU's L2 bytes (the symmetric schedule's band rule), asked once as num_sms.
inline int64_t l2_bytes() {
  static int bytes = 0;
  if (bytes == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev);
    if (bytes <= 0) bytes = 50 << 20;
  }
  return bytes;
}

template <typename T, typename TC>
int launch_v1(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream, const T* B2 = nullptr) {
  const int64_t blocks = cdiv(M, 8) * cdiv(N, 32);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  // B2: SwiGLU's second weight (the DUAL kernels exist for an output of the input dtype only)
  if constexpr (std::is_same<T, TC>::value) {
    if (B2) {
      gemm_v1_kernel<T, TC, true><<<(unsigned)blocks, dim3(32, 8), 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep, B2);
      return levels_launch_status();
    }
  }
  if (B2) return LEVELS_UNSUPPORTED;
  gemm_v1_kernel<T, TC><<<(unsigned)blocks, dim3(32, 8), 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep, B2);
  return levels_launch_status();
}

template <typename T, typename TC>
int launch_v2(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream, const T* B2 = nullptr) {
  const int64_t blocks = cdiv(M, V2_TILE) * cdiv(N, V2_TILE);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  if constexpr (std::is_same<T, TC>::value) {
    if (B2) {
      gemm_v2_kernel<T, TC, true><<<(unsigned)blocks, dim3(V2_TILE, V2_TILE), 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep, B2);
      return levels_launch_status();
    }
  }
  if (B2) return LEVELS_UNSUPPORTED;
  gemm_v2_kernel<T, TC><<<(unsigned)blocks, dim3(V2_TILE, V2_TILE), 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep, B2);
  return levels_launch_status();
}

template <typename T, typename TC>
int launch_v3(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream, const T* B2 = nullptr) {
  if (B2) N *= 2;  // SwiGLU: the virtual width of x [B; B2]^T, B2's half in each tile
  const int64_t blocks = cdiv(M, V3_BM) * cdiv(N, V3_BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  if constexpr (std::is_same<T, TC>::value) {
    if (B2) {
      gemm_v3_kernel<T, TC, true><<<(unsigned)blocks, V3_THREADS, 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep, B2);
      return levels_launch_status();
    }
  }
  if (B2) return LEVELS_UNSUPPORTED;
  gemm_v3_kernel<T, TC><<<(unsigned)blocks, V3_THREADS, 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep, B2);
  return levels_launch_status();
}

// Above 48 KB of dynamic shared memory a kernel must opt in: once per device, kernel and size
// (levels_smem_opt_in_once, common.cuh; a per-process flag would leave a second GPU without it).
template <typename Kernel>
int opt_in_smem(Kernel kernel, int smem) {
  return (int)levels_smem_opt_in_once(reinterpret_cast<const void*>(kernel), smem);
}

template <typename T, typename TC, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool DUAL = false>
int launch_v4_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N, int64_t K,
                     const EpiArgs& ep, cudaStream_t stream, const T* B2) {
  constexpr int smem = STAGES * (BM + BN) * V4_BK * (int)sizeof(T);
  auto kernel = gemm_v4_kernel<T, TC, BM, BN, WARPS_M, WARPS_N, STAGES, DUAL>;
  if (int err = opt_in_smem(kernel, smem)) return err;
  const int64_t blocks = cdiv(M, BM) * cdiv(N, BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  kernel<<<(unsigned)blocks, WARPS_M * WARPS_N * 32, smem, stream>>>(A, lda, B, ldb, M, N, K, ep, B2);
  return levels_launch_status();
}

template <typename T, typename TC>
int launch_v4(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, int tile, cudaStream_t stream,
              const T* B2 = nullptr) {
  if constexpr (std::is_same<T, float>::value) {
    return launch_v3<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);  // exact fp32
  } else {
    // cp.async moves 16-byte chunks along K: rows must be contiguous along K (for B: the
    // (N,K) K-major matrix, stride_bk == 1) and start on 16-byte boundaries.
    const bool rows_ok = sak == 1 && sbk == 1 && sam % 8 == 0 && sbn % 8 == 0;
    const bool base_ok = reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(B) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(B2) % 16 == 0;
    if (!rows_ok || !base_ok) return LEVELS_UNSUPPORTED;
    if (B2) N *= 2;  // SwiGLU: x [B; B2]^T, each tile half B's columns, half B2's
    // Tile shape (the `tile` argument pins one, for the bench's sweep; 0: auto):
    //   1: 128x256, 8 warps of 64x64, 3 stages (144 KB, one block per SM)  [measured]
    //   2: the same with 4 stages (192 KB): more loads in flight per SM   [not measured yet]
    //   3: 128x128, 8 warps of 64x32, 3 stages (96 KB, two blocks per SM) [measured]
    // A 64x64 warp tile does twice the tensor-core work per byte read from shared memory of
    // a 64x32 one. Auto: the big tile only when its tiles fill every SM at least once.
    // Every shape here is 4 more kernels to compile (2 dtypes x 2 output dtypes): the sweep
    // stays short on purpose (build time).
    if (tile == 0) tile = cdiv(M, 128) * cdiv(N, 256) >= num_sms() ? 1 : 3;
    if constexpr (std::is_same<T, TC>::value) {  // SwiGLU: the two tiles tile 0 picks, no sweep
      if (B2) {
        if (tile == 1) return launch_v4_config<T, TC, 128, 256, 2, 4, 3, true>(A, sam, B, sbn, M, N, K, ep, stream, B2);
        if (tile == 3) return launch_v4_config<T, TC, 128, 128, 2, 4, 3, true>(A, sam, B, sbn, M, N, K, ep, stream, B2);
      }
    }
    if (B2) return LEVELS_UNSUPPORTED;
    switch (tile) {
      case 1: return launch_v4_config<T, TC, 128, 256, 2, 4, 3>(A, sam, B, sbn, M, N, K, ep, stream, B2);
      case 2: return launch_v4_config<T, TC, 128, 256, 2, 4, 4>(A, sam, B, sbn, M, N, K, ep, stream, B2);
      case 3: return launch_v4_config<T, TC, 128, 128, 2, 4, 3>(A, sam, B, sbn, M, N, K, ep, stream, B2);
      default: return LEVELS_UNSUPPORTED;
    }
  }
}

template <typename T, typename TC, int BN, bool DUAL = false>
int launch_v5_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N, int64_t K,
                     const EpiArgs& ep, cudaStream_t stream, const T* B2) {
  constexpr int smem = V5_STAGES * (128 + BN) * V4_BK * (int)sizeof(T) + 1024;  // + alignment slack
  static_assert(128 * (BN + 8) * 4 <= smem - 1024, "the staged epilogue tile fits");
  auto kernel = gemm_v5_kernel<T, TC, BN, DUAL>;
  if (int err = opt_in_smem(kernel, smem)) return err;
  const int64_t blocks = cdiv(M, 128) * cdiv(N, BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  kernel<<<(unsigned)blocks, 256, smem, stream>>>(A, lda, B, ldb, M, N, K, ep, B2);
  return levels_launch_status();
}

// ---- version 6's host side: the tensor maps ----
// cuTensorMapEncodeTiled is a driver (libcuda) function; the runtime hands out its address,
// so the library links nothing beyond what torch's extension build already links.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encode_tiled() {
  static EncodeTiled fn = nullptr;  // looked up once per process; benign race (same answer)
  if (fn == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (err == cudaSuccess && found == cudaDriverEntryPointSuccess) fn = reinterpret_cast<EncodeTiled>(p);
  }
  return fn;
}

// The tensor map of a K-major operand: `batch` matrices of (rows, K), row stride ld, batch
// stride bstride (elements; batch 1 or bstride 0: one matrix), read in boxes of
// (box_rows x 64) elements = box_rows rows of 128 bytes, written to shared memory with the
// 128-byte swizzle — version 5's layout, what wgmma_desc describes. Elements past K or past
// the last row read as zeros (the TMA's out-of-bounds fill).
template <typename T>
int make_map(CUtensorMap* map, const T* base, int64_t rows, int64_t K, int64_t ld, int64_t batch,
             int64_t bstride, int box_rows) {
  if (rows > INT32_MAX || K > INT32_MAX || batch > INT32_MAX) return LEVELS_UNSUPPORTED;  // 32-bit coordinates
  EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return (int)cudaErrorNotSupported;
  const int64_t k = K > 0 ? K : 1;  // K = 0: the map is never read; keep it encodable
  if (rows == 1) ld = cdiv(k, 8) * 8;  // one row: its stride is never used
  if (batch == 1 || bstride == 0) {
    batch = 1;
    bstride = rows * ld;
  }
  const cuuint64_t dims[3] = {(cuuint64_t)k, (cuuint64_t)rows, (cuuint64_t)batch};
  const cuuint64_t strides[2] = {(cuuint64_t)ld * sizeof(T), (cuuint64_t)bstride * sizeof(T)};  // bytes, dims 1, 2
  const cuuint32_t box[3] = {(cuuint32_t)V4_BK, (cuuint32_t)box_rows, 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encode(map, dt, 3, const_cast<T*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? LEVELS_OK : LEVELS_UNSUPPORTED;  // e.g. a row stride of 0 (broadcast rows)
}

// The plain kernels' three tensor maps (versions 6 and 7). DUAL: N is the virtual width
// 2 * hidden; b and b2 have hidden rows each, half a tile per box. Not DUAL: map_b2 = map_b,
// unused.
// A_MN / B_MN: that operand is a (K, M) / (K, N) matrix with M / N contiguous, lda / ldb its
// k-row stride, read in boxes of 64 columns x 64 k-rows (tma_load_stage).
template <typename T, int BN, bool DUAL, bool A_MN = false, bool B_MN = false>
int plain_maps(const T* A, int64_t lda, const T* B, int64_t ldb, const T* B2, int64_t M, int64_t N, int64_t K,
               CUtensorMap& map_a, CUtensorMap& map_b, CUtensorMap& map_b2) {
  const int64_t rows_b = DUAL ? N / 2 : N;
  constexpr int box_b = DUAL ? BN / 2 : BN;
  int status = A_MN ? make_map<T>(&map_a, A, K, M, lda, 1, 0, V4_BK) : make_map<T>(&map_a, A, M, K, lda, 1, 0, 128);
  if (status == LEVELS_OK)
    status = B_MN ? make_map<T>(&map_b, B, K, rows_b, ldb, 1, 0, V4_BK)
                  : make_map<T>(&map_b, B, rows_b, K, ldb, 1, 0, box_b);
  if (status == LEVELS_OK) status = DUAL ? make_map<T>(&map_b2, B2, rows_b, K, ldb, 1, 0, box_b) : LEVELS_OK;
  if (!DUAL) map_b2 = map_b;
  return status;
}

template <typename T, typename TC, int BN, bool DUAL = false, bool A_MN = false, bool B_MN = false>
int launch_v6_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N, int64_t K,
                     const EpiArgs& ep, cudaStream_t stream, const T* B2) {
  constexpr int smem = v6_smem<BN>();
  static_assert(128 * (BN + 8) * 4 <= smem - 1024, "the staged epilogue tile fits in the ring");
  auto kernel = gemm_v6_kernel<T, TC, BN, DUAL, A_MN, B_MN>;
  int status = opt_in_smem(kernel, smem);
  const int64_t blocks = cdiv(M, 128) * cdiv(N, BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  CUtensorMap map_a, map_b, map_b2;
  if (status == LEVELS_OK)
    status = plain_maps<T, BN, DUAL, A_MN, B_MN>(A, lda, B, ldb, B2, M, N, K, map_a, map_b, map_b2);
  if (status != LEVELS_OK) return status;
  kernel<<<(unsigned)blocks, V6_THREADS, smem, stream>>>(map_a, map_b, map_b2, M, N, K, ep);
  return levels_launch_status();
}

// Versions 7 and 8: 384 threads on min(tiles, SMs) persistent blocks (the SM count is queried
// once per process: num_sms), 128 x BN tiles, version 7's shared memory (ring + slabs).
template <typename T, int BN, bool DUAL, typename Kernel>
int launch_persistent(Kernel kernel, const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M,
                      int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream, const T* B2) {
  static_assert(V7_THREADS == V8_THREADS, "one block shape for both");
  constexpr int smem = v7_smem<BN, V7_SLAB>();
  int status = opt_in_smem(kernel, smem);
  const int64_t tiles = cdiv(M, 128) * cdiv(N, BN);
  const int64_t blocks = tiles < num_sms() ? tiles : num_sms();
  CUtensorMap map_a, map_b, map_b2;
  if (status == LEVELS_OK) status = plain_maps<T, BN, DUAL>(A, lda, B, ldb, B2, M, N, K, map_a, map_b, map_b2);
  if (status != LEVELS_OK) return status;
  kernel<<<(unsigned)blocks, V7_THREADS, smem, stream>>>(map_a, map_b, map_b2, M, N, K, ep);
  return levels_launch_status();
}

// Version 7: as version 6, on persistent blocks.
template <typename T, typename TC, int BN, bool DUAL = false>
int launch_v7_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N, int64_t K,
                     const EpiArgs& ep, cudaStream_t stream, const T* B2) {
  return launch_persistent<T, BN, DUAL>(gemm_v7_kernel<T, TC, BN, DUAL>, A, lda, B, ldb, M, N, K, ep,
                                        stream, B2);
}

// Version 8: 128 x 128 tiles whatever the size (its one tile shape), a block's tiles shared out
// between the two ping-pong consumers.
template <typename T, typename TC, bool DUAL = false>
int launch_v8(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N, int64_t K,
              const EpiArgs& ep, cudaStream_t stream, const T* B2) {
  return launch_persistent<T, V8_BN, DUAL>(gemm_v8_kernel<T, TC, DUAL>, A, lda, B, ldb, M, N, K, ep,
                                           stream, B2);
}

// One tile shape of version VERSION (5, 6, 7) of the plain GEMM; version 8 has one shape of its
// own (BN is not its choice: launch_v8).
template <typename T, typename TC, int VERSION, int BN, bool DUAL = false>
int launch_hopper_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N, int64_t K,
                         const EpiArgs& ep, cudaStream_t stream, const T* B2) {
  if constexpr (VERSION == 8) return launch_v8<T, TC, DUAL>(A, lda, B, ldb, M, N, K, ep, stream, B2);
  if constexpr (VERSION == 7) return launch_v7_config<T, TC, BN, DUAL>(A, lda, B, ldb, M, N, K, ep, stream, B2);
  if constexpr (VERSION == 6) return launch_v6_config<T, TC, BN, DUAL>(A, lda, B, ldb, M, N, K, ep, stream, B2);
  return launch_v5_config<T, TC, BN, DUAL>(A, lda, B, ldb, M, N, K, ep, stream, B2);
}

// Versions 5-8 (VERSION): the same checks and (5-7) the same tile choice, different kernels.
template <typename T, typename TC, int VERSION>
int launch_hopper(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
                  int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream, const T* B2 = nullptr) {
  if constexpr (std::is_same<T, float>::value) {
    return launch_v3<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);  // exact fp32
  } else {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major != 9) return LEVELS_BAD_ARCH;  // wgmma exists on sm_90 only
    const bool a_k = sak == 1 && sam % 8 == 0, b_k = sbk == 1 && sbn % 8 == 0;
    const bool base_ok = reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(B) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(B2) % 16 == 0;
    if (!base_ok) return LEVELS_UNSUPPORTED;
    if (B2) N *= 2;  // SwiGLU, as version 4
    // 128x256 tiles when there are enough of them to give every SM one, else 128x128.
    const bool big = cdiv(M, 128) * cdiv(N, 256) >= num_sms();
    if constexpr (VERSION == 6 && std::is_same<T, TC>::value) {
      // Version 6 reads a transposed operand as it lies: A as a (K, M) matrix with M
      // contiguous (a weight gradient's dYᵀ), B as (K, N) with N contiguous (an activation, or
      // an nn.Linear weight used untransposed): MN-major tiles, no copy (tma_load_stage).
      const bool a_mn = !a_k && K > 0 && sam == 1 && sak % 8 == 0;
      const bool b_mn = !b_k && K > 0 && sbn == 1 && sbk % 8 == 0;
      if (!B2 && (a_mn || b_mn) && (a_k || a_mn) && (b_k || b_mn)) {
        const int64_t lda = a_mn ? sak : sam, ldb = b_mn ? sbk : sbn;
        if (a_mn && b_mn)
          return big ? launch_v6_config<T, TC, 256, false, true, true>(A, lda, B, ldb, M, N, K, ep, stream, B2)
                     : launch_v6_config<T, TC, 128, false, true, true>(A, lda, B, ldb, M, N, K, ep, stream, B2);
        if (a_mn)
          return big ? launch_v6_config<T, TC, 256, false, true, false>(A, lda, B, ldb, M, N, K, ep, stream, B2)
                     : launch_v6_config<T, TC, 128, false, true, false>(A, lda, B, ldb, M, N, K, ep, stream, B2);
        return big ? launch_v6_config<T, TC, 256, false, false, true>(A, lda, B, ldb, M, N, K, ep, stream, B2)
                   : launch_v6_config<T, TC, 128, false, false, true>(A, lda, B, ldb, M, N, K, ep, stream, B2);
      }
    }
    if (!a_k || !b_k) return LEVELS_UNSUPPORTED;
    if constexpr (std::is_same<T, TC>::value) {
      if (B2)
        return big ? launch_hopper_config<T, TC, VERSION, 256, true>(A, sam, B, sbn, M, N, K, ep, stream, B2)
                   : launch_hopper_config<T, TC, VERSION, 128, true>(A, sam, B, sbn, M, N, K, ep, stream, B2);
    }
    if (B2) return LEVELS_UNSUPPORTED;
    return big ? launch_hopper_config<T, TC, VERSION, 256>(A, sam, B, sbn, M, N, K, ep, stream, B2)
               : launch_hopper_config<T, TC, VERSION, 128>(A, sam, B, sbn, M, N, K, ep, stream, B2);
  }
}

template <typename T, int BN>
int launch_v5_batched_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t batch, int64_t M,
                             int64_t N, int64_t K, const BatchArgs& ba, cudaStream_t stream) {
  constexpr int smem = V5_STAGES * (128 + BN) * V4_BK * (int)sizeof(T) + 1024;  // + alignment slack
  static_assert(128 * (BN + 8) * 4 <= smem - 1024, "the staged epilogue tile fits");
  auto kernel = gemm_v5_batched_kernel<T, BN>;
  if (int err = opt_in_smem(kernel, smem)) return err;
  const int64_t t = cdiv(M, 128);
  const int64_t blocks = ba.symmetric ? t * (t + 1) / 2 : t * cdiv(N, BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  kernel<<<dim3((unsigned)blocks, (unsigned)batch), 256, smem, stream>>>(A, lda, B, ldb, M, N, K, ba);
  return levels_launch_status();
}

// B_MN: b is (K, N) with N contiguous and ldb its k-row stride (64-column boxes, as plain_maps).
template <typename T, int BN, bool B_MN = false>
int launch_v6_batched_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t batch, int64_t M,
                             int64_t N, int64_t K, const BatchArgs& ba, cudaStream_t stream) {
  constexpr int smem = v6_smem<BN>();
  static_assert(128 * (BN + 8) * 4 <= smem - 1024, "the staged epilogue tile fits in the ring");
  auto kernel = gemm_v6_batched_kernel<T, BN, B_MN>;
  int status = opt_in_smem(kernel, smem);
  const int64_t t = cdiv(M, 128);
  const int64_t blocks = ba.symmetric ? t * (t + 1) / 2 : t * cdiv(N, BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  CUtensorMap map_a, map_b;
  if (status == LEVELS_OK) status = make_map<T>(&map_a, A, M, K, lda, batch, ba.stride_ab, 128);
  if (status == LEVELS_OK)
    status = B_MN ? make_map<T>(&map_b, B, K, N, ldb, batch, ba.stride_bb, V4_BK)
                  : make_map<T>(&map_b, B, N, K, ldb, batch, ba.stride_bb, BN);
  if (status != LEVELS_OK) return status;
  kernel<<<dim3((unsigned)blocks, (unsigned)batch), V6_THREADS, smem, stream>>>(map_a, map_b, M, N, K, ba);
  return levels_launch_status();
}

// The batched version 7: 128x128 tiles always (its 64-row slabs at BN = 256 would leave
// the ring one stage), on min(tiles, SMs) persistent blocks, tiles over the whole batch.
template <typename T>
int launch_v7_batched(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t batch, int64_t M, int64_t N,
                      int64_t K, const BatchArgs& ba, cudaStream_t stream) {
  constexpr int BN = 128, smem = v7_smem<BN, 64>();
  auto kernel = gemm_v7_batched_kernel<T>;
  int status = opt_in_smem(kernel, smem);
  const int64_t t = cdiv(M, 128);
  const int64_t tiles = batch * (ba.symmetric ? t * (t + 1) / 2 : t * cdiv(N, BN));
  const int64_t blocks = tiles < num_sms() ? tiles : num_sms();
  CUtensorMap map_a, map_b;
  if (status == LEVELS_OK) status = make_map<T>(&map_a, A, M, K, lda, batch, ba.stride_ab, 128);
  if (status == LEVELS_OK) status = make_map<T>(&map_b, B, N, K, ldb, batch, ba.stride_bb, BN);
  if (status != LEVELS_OK) return status;
  kernel<<<(unsigned)blocks, V7_THREADS, smem, stream>>>(map_a, map_b, batch, M, N, K, ba);
  return levels_launch_status();
}

// b_mn: b is MN-major (version 6 only: levels_gemm_batched checks).
template <typename T, int VERSION>
int launch_hopper_batched(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t batch, int64_t M, int64_t N,
                          int64_t K, const BatchArgs& ba, cudaStream_t stream, bool b_mn = false) {
  // The symmetric schedule needs square tiles (tile (i, j)'s mirror is tile (j, i)); the
  // plain one takes 128x256 tiles when they give every SM one, as launch_hopper.
  const bool small = ba.symmetric || batch * cdiv(M, 128) * cdiv(N, 256) < num_sms();
  if constexpr (VERSION == 7) return launch_v7_batched<T>(A, lda, B, ldb, batch, M, N, K, ba, stream);
  if constexpr (VERSION == 6) {
    if (b_mn)
      return small ? launch_v6_batched_config<T, 128, true>(A, lda, B, ldb, batch, M, N, K, ba, stream)
                   : launch_v6_batched_config<T, 256, true>(A, lda, B, ldb, batch, M, N, K, ba, stream);
    return small ? launch_v6_batched_config<T, 128>(A, lda, B, ldb, batch, M, N, K, ba, stream)
                 : launch_v6_batched_config<T, 256>(A, lda, B, ldb, batch, M, N, K, ba, stream);
  }
  return small ? launch_v5_batched_config<T, 128>(A, lda, B, ldb, batch, M, N, K, ba, stream)
               : launch_v5_batched_config<T, 256>(A, lda, B, ldb, batch, M, N, K, ba, stream);
}

template <typename T, typename TC>
int launch(int version, int v4_tile, const void* a, int64_t sam, int64_t sak, const void* b, int64_t sbk,
           int64_t sbn, int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream,
           const void* b2 = nullptr) {
  const T* A = static_cast<const T*>(a);
  const T* B = static_cast<const T*>(b);
  const T* B2 = static_cast<const T*>(b2);  // SwiGLU's up weight (N: hidden), else nullptr
  switch (version) {
    case 1: return launch_v1<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);
    case 2: return launch_v2<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);
    case 3: return launch_v3<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);
    case 4: return launch_v4<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, v4_tile, stream, B2);
    case 5: return launch_hopper<T, TC, 5>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);
    case 6: return launch_hopper<T, TC, 6>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);
    case 7: return launch_hopper<T, TC, 7>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);
    case 8: return launch_hopper<T, TC, 8>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream, B2);
    default: return LEVELS_BAD_VERSION;
  }
}

}  // namespace levels_gemm

// C[M,N] (+)= A[M,K] · B[K,N], then the epilogue (see the top of the file).
// Element strides for every matrix; bias (N,) with its own stride; aux (M, N) is read or
// written only by the GELU_SAVE / GELU_GRAD epilogues. c_fp32: C is float32 (else the input
// dtype). accumulate: C += instead of C =. Versions 4-8 need stride_ak == stride_bk == 1, row
// strides (stride_am, stride_bn) multiples of 8 and 16-byte aligned A, B (cuda_kernels/mlp.py
// makes them so), else LEVELS_UNSUPPORTED (versions 6-8 also: fewer than 2**31 rows and K, and
// a row stride the TMA accepts — not 0). M, N or K may be 0. v4_tile pins version 4's
// tile shape (1, 2, 3: see launch_v4; 0: chosen from the size); other versions ignore it.
extern "C" int levels_gemm_matmul(int dtype, int version, int v4_tile,
                                  const void* a, int64_t stride_am, int64_t stride_ak,
                                  const void* b, int64_t stride_bk, int64_t stride_bn,
                                  void* c, int64_t stride_cm, int64_t stride_cn, int c_fp32,
                                  const void* bias, int64_t stride_bias,
                                  void* aux, int64_t stride_xm, int64_t stride_xn,
                                  int epilogue, int accumulate,
                                  int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  using namespace levels_gemm;
  if (version < 1 || version > 8) return LEVELS_BAD_VERSION;
  if (epilogue < EPI_NONE || epilogue > EPI_GELU_GRAD) return LEVELS_UNSUPPORTED;
  if ((epilogue == EPI_GELU_SAVE || epilogue == EPI_GELU_GRAD) && aux == nullptr) return LEVELS_UNSUPPORTED;
  if (M <= 0 || N <= 0) return LEVELS_OK;  // nothing to write
  const EpiArgs ep{c, stride_cm, stride_cn, bias, stride_bias, aux, stride_xm, stride_xn, epilogue, accumulate,
                   nullptr, nullptr};
  if (v4_tile < 0 || v4_tile > 3) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, T,
                  return c_fp32 ? launch<T, float>(version, v4_tile, a, stride_am, stride_ak, b, stride_bk, stride_bn, M, N, K, ep, stream)
                                : launch<T, T>(version, v4_tile, a, stride_am, stride_ak, b, stride_bk, stride_bn, M, N, K, ep, stream));
  return LEVELS_OK;  // not reached
}

// The SwiGLU MLP's two fused GEMMs (M, N, K as the product's: N = hidden), output dtype =
// input dtype, the same stride rules as levels_gemm_matmul (b2 has b's strides; c2 c's; aux2
// aux's):
//   grad = 0: c = silu(a · b) * (a · b2), one GEMM of a with [b | b2]; aux, aux2 (both or
//             neither) receive a · b and a · b2 (G and U, for backward)
//   grad = 1: with d = a · b (dA = dY · W_down): c = d * aux2 * silu'(aux), c2 = d * silu(aux)
extern "C" int levels_gemm_swiglu(int dtype, int version, int grad,
                                  const void* a, int64_t stride_am, int64_t stride_ak,
                                  const void* b, const void* b2, int64_t stride_bk, int64_t stride_bn,
                                  void* c, void* c2, int64_t stride_cm, int64_t stride_cn,
                                  void* aux, void* aux2, int64_t stride_xm, int64_t stride_xn,
                                  int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  using namespace levels_gemm;
  if (version < 1 || version > 8) return LEVELS_BAD_VERSION;
  if ((aux == nullptr) != (aux2 == nullptr) || (grad && (aux == nullptr || c2 == nullptr)) ||
      (!grad && b2 == nullptr))
    return LEVELS_UNSUPPORTED;
  if (M <= 0 || N <= 0) return LEVELS_OK;
  const EpiArgs ep{c, stride_cm, stride_cn, nullptr, 0, aux, stride_xm, stride_xn,
                   grad ? EPI_SWIGLU_GRAD : EPI_SWIGLU, 0, grad ? c2 : nullptr, aux2};
  LEVELS_DISPATCH(dtype, T,
                  return launch<T, T>(version, 0, a, stride_am, stride_ak, b, stride_bk, stride_bn, M, N, K, ep,
                                      stream, grad ? nullptr : b2));
  return LEVELS_OK;  // not reached
}

// out[n] = sum over m of x[m, n], fp32 accumulation; out is (N,) contiguous, float32 when
// out_fp32 else the input dtype. One kernel serves every version (1-8) of the GEMM.
extern "C" int levels_gemm_column_sum(int dtype, int version, const void* x, int64_t stride_xm,
                                      int64_t stride_xn, void* out, int out_fp32, int64_t M, int64_t N,
                                      cudaStream_t stream) {
  using namespace levels_gemm;
  if (version < 1 || version > 8) return LEVELS_BAD_VERSION;
  if (N <= 0) return LEVELS_OK;
  const int64_t blocks = levels_cdiv(N, 32);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, T, {
    const T* xp = static_cast<const T*>(x);
    if (out_fp32)
      column_sum_kernel<T, float><<<(unsigned)blocks, dim3(32, 32), 0, stream>>>(xp, stride_xm, stride_xn, static_cast<float*>(out), M, N);
    else
      column_sum_kernel<T, T><<<(unsigned)blocks, dim3(32, 32), 0, stream>>>(xp, stride_xm, stride_xn, static_cast<T*>(out), M, N);
  });
  return levels_launch_status();
}

// A batch of products on version 5's wgmma main loop or version 6's TMA / warp-specialized
// one (version: 5 or 6; sm_90 only), for newton_schulz.cu's versions 2 and 3: for matrix b < batch (batch strides *_b, 0 = shared by the whole batch),
//   r[m, n] = alpha * sum_k a[m, k] b[n, k] + beta * y[m, n]     (fp32 math, stored in T)
// written to c (M, N) if c is given, and to ct (the N x M transpose: r[m, n] at
// ct[n * stride_tn + m * stride_tm]) if ct is given. b is the (N, K) K-major operand (the
// product is a · b^T). y may be nullptr (or beta 0: y is not read). symmetric = 1: the
// caller promises r is symmetric (M == N; X X^T, or A A with A symmetric and y symmetric):
// only the tiles on and below the diagonal run, each stored at (i, j) and mirrored at (j, i)
// into c; ct must be nullptr. Rules, else a status and nothing launched:
//   fp16 / bf16 only (wgmma has no fp32 path: LEVELS_BAD_DTYPE); an sm_90 GPU
//   (LEVELS_BAD_ARCH); a and b K-major: stride_ak == stride_bk == 1, row strides and batch
//   strides multiples of 8 elements, 16-byte aligned bases (LEVELS_UNSUPPORTED, version 4's
//   rule), except that version 6 also reads a non-symmetric product's b as it lies when b is
//   MN-major (stride_bn == 1, stride_bk a multiple of 8: the (K, N) matrix itself, as
//   version 6's plain kernels do); batch <= 65535 (grid y). c, ct and y take any strides
//   (16-byte stores where contiguous and aligned). M, N, K or batch may be 0.
extern "C" int levels_gemm_batched(int dtype, int version, int symmetric, int64_t batch, int64_t M, int64_t N, int64_t K,
                                   const void* a, int64_t stride_ab, int64_t stride_am, int64_t stride_ak,
                                   const void* b, int64_t stride_bb, int64_t stride_bn, int64_t stride_bk,
                                   void* c, int64_t stride_cb, int64_t stride_cm, int64_t stride_cn,
                                   void* ct, int64_t stride_tb, int64_t stride_tn, int64_t stride_tm,
                                   const void* y, int64_t stride_yb, int64_t stride_ym, int64_t stride_yn,
                                   float alpha, float beta, cudaStream_t stream) {
  using namespace levels_gemm;
  if (version < 5 || version > 7) return LEVELS_BAD_VERSION;
  if (dtype != LEVELS_F16 && dtype != LEVELS_BF16) return LEVELS_BAD_DTYPE;
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 9) return LEVELS_BAD_ARCH;  // wgmma exists on sm_90 only
  if (symmetric && (M != N || ct != nullptr)) return LEVELS_UNSUPPORTED;
  const bool b_k = stride_bk == 1 && stride_bn % 8 == 0;
  // version 6 also reads b as a (K, N) matrix with N contiguous (MN-major: not symmetric)
  const bool b_mn = version == 6 && !symmetric && !b_k && stride_bn == 1 && stride_bk % 8 == 0;
  const bool rows_ok = stride_ak == 1 && stride_am % 8 == 0 && (b_k || b_mn) && stride_ab % 8 == 0 &&
                       stride_bb % 8 == 0;
  if (!rows_ok || !levels_aligned16(a) || !levels_aligned16(b) || batch > 65535) return LEVELS_UNSUPPORTED;
  if (batch <= 0 || M <= 0 || N <= 0) return LEVELS_OK;  // nothing to write
  // A symmetric product's tiles in bands where its X (a, M x K) is larger than L2 (tile_order.h)
  const int band = symmetric ? (int)levels_tiles::sym_band(cdiv(M, 128), M * K * 2, l2_bytes()) : 1;
  const BatchArgs ba{stride_ab, stride_bb, c, stride_cb, stride_cm, stride_cn, ct, stride_tb, stride_tn,
                     stride_tm, y, stride_yb, stride_ym, stride_yn, alpha, beta, symmetric, band};
  const __half* ah = static_cast<const __half*>(a);
  const __half* bh = static_cast<const __half*>(b);
  const __nv_bfloat16* ab = static_cast<const __nv_bfloat16*>(a);
  const __nv_bfloat16* bb = static_cast<const __nv_bfloat16*>(b);
  if (version == 7)
    return dtype == LEVELS_F16 ? launch_hopper_batched<__half, 7>(ah, stride_am, bh, stride_bn, batch, M, N, K, ba, stream)
                               : launch_hopper_batched<__nv_bfloat16, 7>(ab, stride_am, bb, stride_bn, batch, M, N, K, ba, stream);
  if (version == 6) {
    const int64_t ldb = b_mn ? stride_bk : stride_bn;
    return dtype == LEVELS_F16
               ? launch_hopper_batched<__half, 6>(ah, stride_am, bh, ldb, batch, M, N, K, ba, stream, b_mn)
               : launch_hopper_batched<__nv_bfloat16, 6>(ab, stride_am, bb, ldb, batch, M, N, K, ba, stream, b_mn);
  }
  return dtype == LEVELS_F16 ? launch_hopper_batched<__half, 5>(ah, stride_am, bh, stride_bn, batch, M, N, K, ba, stream)
                             : launch_hopper_batched<__nv_bfloat16, 5>(ab, stride_am, bb, stride_bn, batch, M, N, K, ba, stream);
}
