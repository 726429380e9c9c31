// attention.cu — out = softmax(q kᵀ · scale) v over (B, H, N, D) tensors, optionally causal,
// forward and backward: Level 5's flash attention, a ladder of five versions.
//
//   v1  naive: one thread per query row; the row of scores goes to global memory (an fp32
//       scratch of B*H*Nq*Nk*4 bytes the binding allocates: 4.3 GB at B4 H16 N4096), then
//       softmax over it, then P·V. Every K/V element is read Nq times, the scores written
//       and read twice. Costs: O(N²) memory and traffic; no reuse at all.
//   v2  FlashAttention tiling on the CUDA cores: a block of 32 query rows (4 threads a row,
//       each a quarter of D) streams K/V tiles of 32 keys through shared memory and keeps a
//       running (online) softmax in fp32 registers: the N×N matrix never exists, each K/V
//       element is read once per 32 queries. Exact fp32 FMAs: this is also the declared
//       fp32 path of v3 and v4 (no TF32). Costs: 2 shuffles per score, no tensor cores.
//   v3  tensor cores: mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate) fed by ldmatrix
//       from padded (conflict-free) shared tiles; a warp owns 16 query rows, its Q
//       fragments stay in registers for the whole key loop, the S accumulators are
//       re-packed to 16-bit as the A operand of P·V without touching shared memory (the
//       FlashAttention-2 register trick), V arrives as the B operand via ldmatrix.trans.
//       Costs: 16-bit inputs only (fp32 runs v2), rows 16-byte aligned; loads are
//       synchronous (the tensor cores idle while a tile arrives); causal only masks.
//   v4  v3 + cp.async double buffering (the next K/V tile is in flight while this one is
//       computed) + causal block skipping (key blocks entirely above the diagonal are never
//       visited, blocks entirely below it run without the mask code). Costs: twice v3's
//       K/V shared memory; a second, unmasked copy of the tile step in the binary.
//   v5  v4 with 32 query rows a warp (two m16 tiles, FlashAttention-2's 4 warps x 32 rows):
//       each K and V fragment loaded by ldmatrix feeds two MMAs, half v4's shared-memory
//       reads per FLOP; 2 blocks an SM hide each other's barriers. Costs: O and S double
//       in registers, so Q's fragments are re-read from shared memory every k-step; a
//       64-row block of 2 warps for small grids. Backward: v4's.
//   v6  Hopper warpgroup MMA (sm_90 only): a warpgroup (4 warps) owns 64 query rows and
//       issues wgmma.mma_async for both products: S = Q Kᵀ with Q and K read by the tensor
//       cores straight from 128-byte-swizzled shared memory (descriptors: no ldmatrix, no Q
//       in registers), O += P V with P from registers (the S accumulators re-packed: wgmma's
//       A fragment is mma.sync's, one per warp) and V read N-major as it lies (imm-trans-b).
//       2 warpgroups (128 rows) a block, or 1 for small grids; 128-key tiles through a
//       3-stage cp.async ring. Costs: sm_90 only, D in {64, 128}, no RoPE (the launcher
//       refuses; Python picks v5 by default), 224 KB of shared memory at D = 128 (1 block
//       an SM); a warpgroup's softmax does not yet overlap its own MMAs (FlashAttention-3's
//       TMA producer and ping-pong are the next rung). Backward: v4's.
//       Measured on the H100 (forward, bf16, kernel time, reports/h100-attention6.json, FLASH
//       and v5 in the same run): B4 H16 N4096 D128 296 TFLOP/s = 0.86x SDPA FLASH (v5 0.70x),
//       B1 H32 N2048 D128 causal 0.96x (v5 0.71x); at D = 64 no gain (N1000-1024 1.25-1.46x
//       FLASH, v5 1.33-1.46x) and a loss at short sequences (N197 0.52x, v5 0.87x), so the
//       Python side's default is v6 on sm_90 for D = 128 only (attention.py default_version).
//   v7  a faster backward; forward: v6's on sm_90 at D = 128 without RoPE, v5's otherwise
//       (the measured best, so v7 runs every case v5 runs). ONE fused backward kernel per
//       key block (FlashAttention-2's own design): the dK/dV block, which holds dSᵀ for its
//       keys anyway, also computes its share of dQ = dS K (dS through a shared tile, read
//       back transposed by ldmatrix.trans) and adds it into an fp32 workspace with 8-byte
//       atomics; a small kernel turns the workspace into dq (x scale, RoPE turned back).
//       Removes the dQ kernel's recompute of S, P, dP and dS: 5 products instead of 7.
//       Costs: dq is NOT bitwise deterministic (the order of the fp32 atomic adds varies;
//       dk and dv still are: grouped heads summed in a loop, as v4); a workspace of 4 bytes
//       per element of q (134 MB at B4 H16 N4096 D128) zeroed per call; Nk/128 atomic adds
//       per dQ element; one more barrier a query tile. Versions 4-6 remain the deterministic
//       backward. ptxas (sm_90a, CUDA 13.0): 245 registers at D = 128, 206 at 64, 166 at 32,
//       128 at 16, no spills (v4's dK/dV kernel: 248 / 204 / 160 / 111); shared memory
//       115,200 bytes at D = 128 and 8 warps (v4's dK/dV kernel: 104,960): one block an SM,
//       as v4's. Section "v7's backward".
//
// Backward (FlashAttention-2: P is recomputed from the stored log-sum-exp, never stored):
//   preprocess delta_i = rowsum(dO_i · O_i), then a dK/dV kernel (one block per key block,
//   looping over query blocks) and a dQ kernel (one block per query block, looping over key
//   blocks): no atomics, every gradient element written once by one thread: deterministic.
//   (v7 trades that determinism of dq for the second kernel: see v7 above.)
//   forward v1, v2 (and fp32 at v3/v4)  ->  CUDA-core backward (exact fp32, v2's layout)
//   forward v3                           ->  mma.sync backward, synchronous loads, masking
//   forward v4, v5, v6                   ->  mma.sync backward, cp.async double buffering
//                                            and causal block skipping
//   v7 (16-bit)                          ->  the fused kernel (v4's dK/dV kernel + dQ by
//                                            atomics into fp32) and a dq conversion: dq
//                                            not deterministic, dk and dv are
//
// The log-sum-exp the forward stores is in base 2 of the scaled scores:
//   lse_i = log2 sum_j 2^(scale·log2(e)·q_i·k_j)   (= natural lse · log2(e))
// so that the backward's P = 2^(scale·log2(e)·q·k − lse) is one FMA and one exp2.
//
// Grown at every version:
//   grouped-query attention: k, v have H_kv heads, H_kv dividing H; query head h reads K/V
//       head h / group (group = H / H_kv), by index: no copy of K or V. dK/dV: the block that
//       owns a key block loops over the group's query heads itself, in a fixed order (no
//       atomics: deterministic); at v3/v4 one loop over (head, query tile) steps, so the
//       cp.async prefetch runs across heads as across tiles.
//   RoPE fused (ROPE flag of every kernel template; without it the kernels are what they
//       were): q and k rotated by their positions' angles as they are read (query i at table
//       row i + rope_qoff, key j at row j), dq and dk turned back by minus the angle before
//       the store; rotated q or k never reach global memory. The CUDA-core kernels turn
//       their fp32 shared tiles (rows they keep in registers go through a tile first); the
//       tensor-core kernels turn a 16-bit tile in shared memory after it has landed
//       (rope_tile: cp.async cannot rotate in flight) and the dq/dk accumulators in
//       registers (rope_unrotate_acc: a lane holds both features of each of its pairs).
//   causal with Nq != Nk and kv_lens (below) at v3-v6 too: each kernel takes its batch
//       element's [0, end) and diagonal shift (Keys), masks with them on the tiles that
//       straddle them and skips the tiles past them as it skips those above the diagonal; a
//       row that saw no key stores out 0 and lse +inf (the CUDA-core kernels' convention).
// Grown at v1, v2 and the CUDA-core backward only (the tensor-core versions take D in
// {16, 32, 64, 128}, and RoPE with D in {64, 128}; the Python side runs v2 for anything
// else when no version was asked for):
//   any head size up to 256: the CUDA-core kernels are templated on a tile width DT (a
//       power of two, 8..256) and read the D real columns of it (zeros beyond, never
//       stored); D > 128 uses 8 threads a row and 16-row tiles, so that k, v, dk and dv
//       (4 x D/8 floats a thread) stay in registers and the tiles fit static shared memory.
//   causal with Nq != Nk: query i sees key j <= i + shift, shift = 0 (top-left) or L - Nq
//       (bottom-right, L the element's key count); kv_lens: key j is seen only if j < L,
//       L = kv_lens[b] clipped to [0, Nk]. A query that sees no key outputs 0 and its lse is
//       +inf (so every recomputed P of it is 0).
//
// Layout: q, k, v, dO and O come with element strides for batch, head and row; the last
// dimension must have stride 1 (the Python side, cuda_kernels/attention.py, copies a tensor
// whose last dimension is strided). v3-v7 read 16-byte chunks, so for them every stride
// of a dimension of size > 1 must be a multiple of 8 elements and the base 16-byte aligned
// (else LEVELS_UNSUPPORTED; the Python side copies). Outputs out, lse, dq, dk, dv are
// contiguous, written only inside their own extent. Offsets are int64.
// Head dims D in {16, 32, 64, 128} at v2-v5 and v7 (one register tile spans D), {64, 128}
// at v6; v1 takes any D.

// Two translation units (the cold build's longest step, measured): this file's forward, and
// attention_backward.cu, which defines LEVELS_ATTENTION_BACKWARD_UNIT and includes this file
// for its backward. The kernels below are templates, compiled only where a launcher
// instantiates them, so the forward kernels become machine code in this file's nvcc process
// and the backward kernels in the other one; ninja runs the two at once. Alone, this file
// was 41 of the 42 s of the H100's cold build (cicc and ptxas of ~220 kernels); see
// cuda_kernels/build.py. The guard keeps the kernels to one copy where the loader's
// `inline` builder puts every .cu file into one unit.
#ifndef LEVELS_ATTENTION_KERNELS_
#define LEVELS_ATTENTION_KERNELS_

#include "common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

#include <limits.h>
#include <math.h>
#include <type_traits>

namespace levels_attention {

using namespace levels_mma;
using namespace levels_wgmma;

constexpr float LOG2E = 1.4426950408889634f;

// ---- candidates for common.cuh ----
__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// ---- end of candidates ----

// One (B, H, N, D) operand: element strides of batch, head and row; D has stride 1.
struct Operand {
  const void* ptr;
  int64_t sb, sh, sn;
};

struct Params {
  Operand q, k, v;        // inputs
  Operand o, dout;        // backward: the forward's output and the upstream gradient
  void* out;              // forward output (B, H, Nq, D), contiguous
  float* lse;             // (B, H, Nq) fp32, base 2 (see the top of the file)
  float* delta;           // (B, H, Nq) fp32: rowsum(dO · O), written by the preprocess
  float* scratch;         // v1 only: (B*H, Nq, Nk) fp32 scores
  void* dq;               // (B, H, Nq, D) contiguous
  void* dk;               // (B, H, Nk, D) contiguous
  void* dv;               // (B, H, Nk, D) contiguous
  float* dq_accum;        // v7's backward: (B, H, Nq, D) fp32, zeroed by the binding; dQ is
                          // added into it by every key block (atomics), then converted to dq
  int64_t H, BH, Nq, Nk;
  int64_t Hkv, group;     // K/V heads, and H / Hkv query heads reading each (1: multi-head)
  const int* kv_lens;     // (B,) int32 valid keys per batch element, or null (all Nk)
  int D;
  int causal;             // query i sees keys j <= i + shift
  int bottom_right;       // shift = L - Nq (bottom-right diagonal), else 0 (top-left)
  float scale;            // softmax scale
  float scale_log2;       // scale · log2(e): scores go straight to exp2
  // RoPE fused (the kernels instantiated with ROPE read these; rope_cos null: no rope):
  // tables (P, D/2) of the inputs' dtype with element strides (row, column); key j sits at
  // table row j, query i at row i + rope_qoff; pairs (2i, 2i+1) if rope_interleaved, else
  // (i, i + D/2).
  const void* rope_cos;
  const void* rope_sin;
  int64_t rope_cos_sr, rope_cos_sc, rope_sin_sr, rope_sin_sc, rope_qoff;
  int rope_interleaved;
};

// The (b, h) slice of an operand: b * stride_b + h * stride_h in int64.
template <typename T>
__device__ __forceinline__ const T* head_of(const Operand& t, int64_t bh, int64_t H) {
  return static_cast<const T*>(t.ptr) + (bh / H) * t.sb + (bh % H) * t.sh;
}

// The K/V slice that query slice bh reads: batch bh / H, K/V head (bh % H) / group.
template <typename T>
__device__ __forceinline__ const T* kv_head_of(const Operand& t, int64_t bh, int64_t H, int64_t group) {
  return static_cast<const T*>(t.ptr) + (bh / H) * t.sb + ((bh % H) / group) * t.sh;
}

// The keys batch element b has: [0, end), and the causal shift (query i sees key j <= i + shift).
struct Keys {
  int64_t end, shift;
  __device__ __forceinline__ bool visible(int64_t i, int64_t j, int causal) const {
    return j < end && !(causal && j > i + shift);
  }
  // The keys query i sees are [0, limit(i)); the queries key j is seen by are those >= first(j).
  // 32-bit (positions are below 2**30, the launchers' rule): a pair of 64-bit bounds live
  // across the inner loops is what made the CUDA-core backward spill.
  __device__ __forceinline__ int limit(int64_t i, int causal) const {
    return (int)(causal ? min(end, max(i + shift + 1, (int64_t)0)) : end);
  }
  __device__ __forceinline__ int first(int64_t j, int causal) const {
    return j >= end ? INT_MAX : (causal ? (int)max(j - shift, (int64_t)0) : 0);
  }
};

__device__ __forceinline__ Keys keys_of(const Params& p, int64_t b) {
  int64_t end = p.Nk;
  if (p.kv_lens != nullptr) end = min(max((int64_t)p.kv_lens[b], (int64_t)0), p.Nk);
  return Keys{end, p.bottom_right ? end - p.Nq : 0};
}

// ---- RoPE fused into the loads (docs: ROPE_API.md; levels.native.rope_math's math) ----
// A pair of features (x1, x2) turns by its position's angle: (x1 c - x2 s, x2 c + x1 s);
// the backward turns the gradient by minus the angle (sign -1). The kernels rotate q and k
// as they read them and never write a rotated tensor to memory.

// cos and sin of pair i at table row pos, in fp32.
template <typename T>
__device__ __forceinline__ float2 rope_cs(const Params& p, int64_t pos, int i) {
  return make_float2(to_f32(static_cast<const T*>(p.rope_cos)[pos * p.rope_cos_sr + i * p.rope_cos_sc]),
                     to_f32(static_cast<const T*>(p.rope_sin)[pos * p.rope_sin_sr + i * p.rope_sin_sc]));
}

// Feature d (of `width`) of the row at x, turned by `sign` times its position's angle, in
// fp32 (T: the tables' type; X: the row's, the input's or an fp32 staging row). What the
// CUDA-core kernels read instead of x[d]: each feature reads its partner as well.
template <typename T, typename X>
__device__ __forceinline__ float rope_feature(const Params& p, const X* x, int d, int width, int64_t pos,
                                              float sign) {
  const int half = width >> 1;
  const bool first = p.rope_interleaved ? (d & 1) == 0 : d < half;
  const int i = p.rope_interleaved ? d >> 1 : (first ? d : d - half);
  const int other = p.rope_interleaved ? d ^ 1 : (first ? d + half : d - half);
  const float2 cs = rope_cs<T>(p, pos, i);
  const float a = to_f32(x[d]), b = to_f32(x[other]), sn = sign * cs.y;
  return first ? a * cs.x - b * sn : a * cs.x + b * sn;
}

// Block -> (bh, block index along the sequence). Blocks of one head are consecutive (they
// share K/V in L2); `reverse` starts each head with its last block: the causal forward's
// heaviest query blocks go first and the cheap ones fill the tail of the grid.
__device__ __forceinline__ void block_coords(int64_t n_blocks, bool reverse, int64_t& bh, int64_t& blk) {
  const int64_t i = blockIdx.x;
  bh = i / n_blocks;
  blk = i % n_blocks;
  if (reverse) blk = n_blocks - 1 - blk;
}

// =====================================================================================
// v1: one thread per query row, the scores in global memory
// =====================================================================================
// Three passes over the row of scores: write q·k_j (and find the max), turn it into
// 2^(s - max) (and sum it), then out = sum_j p_j v_j / sum. Threads of a warp are
// consecutive rows of one head, so each k_j / v_j read is a broadcast; the score rows are
// Nk apart, so those accesses do not coalesce at all (the cost the tiled versions remove).
template <typename T, bool ROPE>
__global__ void attn_fwd_v1_kernel(Params p) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= p.BH * p.Nq) return;
  const int64_t bh = idx / p.Nq, i = idx % p.Nq;
  const T* q = head_of<T>(p.q, bh, p.H) + i * p.q.sn;
  const T* k = kv_head_of<T>(p.k, bh, p.H, p.group);
  const T* v = kv_head_of<T>(p.v, bh, p.H, p.group);
  const Keys keys = keys_of(p, bh / p.H);
  // ### BEGIN SOLUTION
  float* s = p.scratch + idx * p.Nk;
  const int D = p.D;
  float mx = -INFINITY;
  for (int64_t j = 0; j < p.Nk; ++j) {
    float dot = 0.0f;
    if constexpr (ROPE) {  // both rotated as read (v1 re-reads q for every key: no reuse, as the rest)
      for (int d = 0; d < D; ++d)
        dot += rope_feature<T>(p, q, d, D, i + p.rope_qoff, 1.0f) * rope_feature<T>(p, k + j * p.k.sn, d, D, j, 1.0f);
    } else {
      for (int d = 0; d < D; ++d) dot += to_f32(q[d]) * to_f32(k[j * p.k.sn + d]);
    }
    const float t = keys.visible(i, j, p.causal) ? dot * p.scale_log2 : -INFINITY;
    s[j] = t;
    mx = fmaxf(mx, t);
  }
  // A query that sees no key (mx = -inf): out = 0, lse = +inf (its P is 0 in the backward).
  const bool seen = mx > -INFINITY;
  float l = 0.0f;
  for (int64_t j = 0; j < p.Nk; ++j) {
    const float e = seen ? exp2f(s[j] - mx) : 0.0f;
    s[j] = e;
    l += e;
  }
  T* out = static_cast<T*>(p.out) + idx * D;
  for (int d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int64_t j = 0; j < p.Nk; ++j) acc += s[j] * to_f32(v[j * p.v.sn + d]);
    out[d] = from_f32<T>(seen ? acc / l : 0.0f);
  }
  p.lse[idx] = seen ? mx + log2f(l) : INFINITY;
  // ### END SOLUTION
}

// =====================================================================================
// v2: FlashAttention tiling on the CUDA cores (exact fp32)
// =====================================================================================
// 128 threads = 32 query rows x 4 threads; thread c of a row holds q and the output
// accumulator at d = c, c+4, c+8, ... (so the 4 threads of a row read 4 adjacent floats
// of a shared K/V row, and the 8 rows of a warp read the same ones: a broadcast, no bank
// conflict). Per key: 4 partial dot products, 2 xor-shuffles within the row's 4 lanes.
// Per tile of 32 keys: the scores in registers, one rescale of the accumulator by
// 2^(m_old - m_new) (the online softmax), then acc += p_j v_j.
// The template's D is the register tile's width (a power of two, 8..256); the real head
// size p.D <= D: columns past it are loaded as 0 and never stored. D > 128 takes 8 threads
// a row (16 rows a block) and 16-row shared tiles: registers (k, v, dk, dv of the dK/dV
// kernel are 4 x D / TPR floats a thread) and 48 KB of static shared memory are what bound
// a wide head (CcShape).
constexpr int CC_THREADS = 128;

template <int D>
struct CcShape {
  static constexpr int TPR = D > 128 ? 8 : 4;       // threads per row
  static constexpr int ROWS = CC_THREADS / TPR;      // rows a block owns
  static constexpr int TILE = D > 128 ? 16 : 32;     // streamed rows per shared tile
  static constexpr int PER = D / TPR;                // elements of a row a thread holds
  static_assert(D % TPR == 0, "a tile width the threads of a row share evenly");
};

// The sum of a row's TPR partial sums (lanes TPR·r .. TPR·r + TPR - 1): every lane of the row gets it.
template <int TPR>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int o = 1; o < TPR; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// rows [row0, row0 + TILE) of a (N, D) operand as fp32 into shared memory: zeros past the
// n rows and past the `width` real columns.
template <typename T, int D>
__device__ __forceinline__ void cc_load_tile(float (*dst)[D], const T* src, int64_t ld, int64_t row0, int64_t n,
                                             int width) {
  for (int e = threadIdx.x; e < CcShape<D>::TILE * D; e += CC_THREADS) {
    const int r = e / D, d = e % D;
    const int64_t row = row0 + r;
    dst[r][d] = row < n && d < width ? to_f32(src[row * ld + d]) : 0.0f;
  }
}

// The elements of a row thread c holds, d = c + TPR·e: zero past the real width (or for a
// row that does not exist).
template <typename T, int D>
__device__ __forceinline__ void cc_load_row(float (&r)[CcShape<D>::PER], const T* src, bool ok, int c, int width) {
#pragma unroll
  for (int e = 0; e < CcShape<D>::PER; ++e) {
    const int d = c + CcShape<D>::TPR * e;
    r[e] = ok && d < width ? to_f32(src[d]) : 0.0f;
  }
}

// mul · r into a contiguous row of `width` elements (the padded columns are not stored).
template <typename T, int D>
__device__ __forceinline__ void cc_store_row(T* dst, const float (&r)[CcShape<D>::PER], float mul, int c, int width) {
#pragma unroll
  for (int e = 0; e < CcShape<D>::PER; ++e) {
    const int d = c + CcShape<D>::TPR * e;
    if (d < width) dst[d] = from_f32<T>(r[e] * mul);
  }
}

// RoPE on the CUDA cores goes through the fp32 shared tiles: a feature's partner lives in
// another thread (or another register of a fully unrolled row), so the block turns whole
// tiles in a run-time loop over pairs instead (the unrolled alternative spilled).
// Rows [0, TILE) of `buf` in place, row r at table row row0 + r + pos_off, by sign x the
// angle; rows at or past n are left alone (zeros, maybe past the tables).
template <typename T, int D>
__device__ __forceinline__ void cc_turn_tile(float (*buf)[D], int64_t row0, int64_t n, int width, const Params& p,
                                             int64_t pos_off, float sign) {
  const int half = width >> 1;
#pragma unroll 1  // rare work beside the live row registers: kept small
  for (int e = threadIdx.x; e < CcShape<D>::TILE * half; e += CC_THREADS) {
    const int r = e / half, i = e % half;
    if (row0 + r >= n) continue;
    const float2 cs = rope_cs<T>(p, row0 + r + pos_off, i);
    float* x1 = &buf[r][p.rope_interleaved ? 2 * i : i];
    float* x2 = x1 + (p.rope_interleaved ? 1 : half);
    const float a = *x1, b = *x2, sn = sign * cs.y;
    *x1 = a * cs.x - b * sn;
    *x2 = b * cs.x + a * sn;
  }
}

// cc_load_tile, then (ROPE) the tile turned: the caller's barrier after it covers both.
template <typename T, int D, bool ROPE>
__device__ __forceinline__ void cc_load_tile_at(float (*dst)[D], const T* src, int64_t ld, int64_t row0, int64_t n,
                                                int width, const Params& p, int64_t pos_off) {
  cc_load_tile<T, D>(dst, src, ld, row0, n, width);
  if constexpr (ROPE) {
    __syncthreads();
    cc_turn_tile<T, D>(dst, row0, n, width, p, pos_off, 1.0f);
  }
}

// The block's own rows (row0 .. row0 + ROWS, one per TPR threads) rotated, into this
// thread's registers (cc_load_row's elements): through `buf` (a streamed tile: ROWS rows),
// which the caller must not touch again before a barrier.
template <typename T, int D>
__device__ __forceinline__ void cc_load_rows_turned(float (&r)[CcShape<D>::PER], float (*buf)[D], const T* src,
                                                    int64_t ld, int64_t row0, int64_t n, int c, int width,
                                                    const Params& p, int64_t pos_off) {
  using S = CcShape<D>;
  static_assert(S::TILE == S::ROWS, "buf is a streamed tile: one row of it per row of the block");
  cc_load_tile_at<T, D, true>(buf, src, ld, row0, n, width, p, pos_off);
  __syncthreads();
#pragma unroll
  for (int e = 0; e < S::PER; ++e) r[e] = buf[threadIdx.x / S::TPR][c + S::TPR * e];
}

// cc_store_row of a gradient with respect to rotated rows, turned back by minus the angle
// first (rope's backward), through `buf` as above. Every thread of the block calls it
// (barriers); those with ok false store nothing.
template <typename T, int D>
__device__ __forceinline__ void cc_store_rows_unturned(T* dst, const float (&r)[CcShape<D>::PER], float mul, int c,
                                                       int width, bool ok, float (*buf)[D], int64_t row0,
                                                       int64_t n, const Params& p, int64_t pos_off) {
  using S = CcShape<D>;
  static_assert(S::TILE == S::ROWS, "buf is a streamed tile: one row of it per row of the block");
  float* row = buf[threadIdx.x / S::TPR];
  __syncthreads();  // every thread is done reading buf as a tile
#pragma unroll
  for (int e = 0; e < S::PER; ++e) row[c + S::TPR * e] = r[e];
  __syncthreads();
  cc_turn_tile<T, D>(buf, row0, n, width, p, pos_off, -1.0f);
  __syncthreads();
  if (!ok) return;
#pragma unroll
  for (int e = 0; e < S::PER; ++e) {
    const int d = c + S::TPR * e;
    if (d < width) dst[d] = from_f32<T>(row[d] * mul);
  }
}

template <typename T, int D, bool ROPE>
__global__ void __launch_bounds__(CC_THREADS) attn_fwd_v2_kernel(Params p) {
  using S = CcShape<D>;
  constexpr int PER = S::PER, TPR = S::TPR, TILE = S::TILE;
  __shared__ float ks[TILE][D], vs[TILE][D];
  int64_t bh, mb;
  block_coords(cdiv(p.Nq, S::ROWS), p.causal, bh, mb);
  const int c = threadIdx.x % TPR;
  const int64_t row = mb * S::ROWS + threadIdx.x / TPR;
  const bool row_ok = row < p.Nq;
  const T* q = head_of<T>(p.q, bh, p.H) + (row_ok ? row : 0) * p.q.sn;
  const T* k = kv_head_of<T>(p.k, bh, p.H, p.group);
  const T* v = kv_head_of<T>(p.v, bh, p.H, p.group);
  const Keys keys = keys_of(p, bh / p.H);
  const int limit = keys.limit(row, p.causal);  // this row sees keys [0, limit)
  float qr[PER], acc[PER];
  if constexpr (ROPE) cc_load_rows_turned<T, D>(qr, ks, head_of<T>(p.q, bh, p.H), p.q.sn, mb * S::ROWS, p.Nq, c, p.D, p, p.rope_qoff);
  else cc_load_row<T, D>(qr, q, row_ok, c, p.D);
#pragma unroll
  for (int e = 0; e < PER; ++e) acc[e] = 0.0f;
  const float sl = p.scale_log2;
  float m = -INFINITY, l = 0.0f;  // running max (raw score units) and sum of 2^(s·sl - m·sl)
  for (int64_t n0 = 0; n0 < keys.end; n0 += TILE) {
    __syncthreads();  // every thread is done with the previous tile
    cc_load_tile_at<T, D, ROPE>(ks, k, p.k.sn, n0, keys.end, p.D, p, 0);
    cc_load_tile<T, D>(vs, v, p.v.sn, n0, keys.end, p.D);
    __syncthreads();
    // ### BEGIN SOLUTION
    float s[TILE];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < TILE; ++j) {
      float part = 0.0f;
#pragma unroll
      for (int e = 0; e < PER; ++e) part = fmaf(qr[e], ks[j][c + TPR * e], part);
      const float dot = row_sum<TPR>(part);
      s[j] = (int)n0 + j < limit ? dot : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    const float m_new = fmaxf(m, mx);
    // A row whose every key so far is masked has m_new = -inf: subtract 0 instead, so that
    // -inf - (-inf) never makes a NaN (its p are 0 either way).
    const float neg = m_new == -INFINITY ? 0.0f : -m_new * sl;
    const float alpha = exp2f(fmaf(m, sl, neg));  // 0 on the first tile (m = -inf)
    l *= alpha;
#pragma unroll
    for (int e = 0; e < PER; ++e) acc[e] *= alpha;
#pragma unroll
    for (int j = 0; j < TILE; ++j) {
      const float pj = exp2f(fmaf(s[j], sl, neg));
      l += pj;
#pragma unroll
      for (int e = 0; e < PER; ++e) acc[e] = fmaf(pj, vs[j][c + TPR * e], acc[e]);
    }
    m = m_new;
    // ### END SOLUTION
  }
  if (!row_ok) return;
  const int64_t orow = bh * p.Nq + row;
  // l >= 1 for a row that saw a key (its max contributes 2^0). One that saw none: out = 0,
  // lse = +inf (every P of it the backward recomputes is then 0).
  cc_store_row<T, D>(static_cast<T*>(p.out) + orow * p.D, acc, l > 0.0f ? 1.0f / l : 0.0f, c, p.D);
  if (c == 0) p.lse[orow] = l > 0.0f ? m * sl + log2f(l) : INFINITY;
}

// =====================================================================================
// v3 / v4: tensor cores (mma.sync m16n8k16), one kernel template, ASYNC = v4
// =====================================================================================
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A 16x16 (row):  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8  (col):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C 16x8 (fp32):  c0 c1 (g, 2t..2t+1)   c2 c3 (g+8, 2t..2t+1)
// Two adjacent n8 accumulator tiles of S (keys 16c..16c+15) therefore hold exactly the A
// fragment of P for k-chunk c: a0 = (S[2c].c0, c1), a1 = (S[2c].c2, c3), a2 = (S[2c+1].c0,
// c1), a3 = (S[2c+1].c2, c3). That is the register trick: P never leaves registers.
//
// Shared tiles are [rows][D + 8]: the 16-byte pad puts the 8 rows an ldmatrix reads at
// one chunk column into 8 different 16-byte bank groups for every D in {16, 32, 64, 128}
// (row stride 2D+16 bytes = 16·(odd) mod 128: conflict free), where an unpadded D = 64 or
// 128 row would put all 8 in the same banks (8-way conflict). Costs 8 elements a row.
template <int D> constexpr int ld_of() { return D + 8; }

// Rows [row0, row0 + rows) of a (N, D) operand (row stride ld, elements; ld % 8 == 0 and
// a 16-byte aligned base, checked by the launcher) into a padded shared tile, 16 bytes at
// a time; rows past n are zeros (cp.async's zero fill, or an explicit zero). ASYNC: cp.async,
// nothing waits here. Otherwise every thread first loads all its chunks into registers,
// then stores them: the loads are in flight together instead of one after another.
// MAX_ROWS bounds `rows` at compile time (the register buffer of the synchronous path).
template <typename T, int D, int MAX_ROWS, bool ASYNC>
__device__ __forceinline__ void load_tile(T* s, const T* __restrict__ g, int64_t ld, int row0, int n, int rows) {
  constexpr int CH = D / 8, LD = ld_of<D>();
  constexpr int MAXIT = (MAX_ROWS * CH + 127) / 128;  // blockDim.x >= 128
  constexpr int BATCH = MAXIT < 4 ? MAXIT : 4;         // loads in flight per thread (16 registers)
  const int total = rows * CH, nt = blockDim.x;
  if constexpr (ASYNC) {
#pragma unroll
    for (int i = 0; i < MAXIT; ++i) {
      const int e = threadIdx.x + i * nt;
      if (e < total) {
        const int r = e / CH, ch = e % CH;
        const bool ok = row0 + r < n;
        cp_async_16(smem_addr(s + r * LD + ch * 8), ok ? g + (int64_t)(row0 + r) * ld + ch * 8 : g, ok ? 16 : 0);
      }
    }
  } else {
#pragma unroll
    for (int i0 = 0; i0 < MAXIT; i0 += BATCH) {
      uint4 buf[BATCH];
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const int e = threadIdx.x + (i0 + i) * nt;
        const int r = e / CH, ch = e % CH;
        buf[i] = (i0 + i < MAXIT && e < total && row0 + r < n)
                     ? *reinterpret_cast<const uint4*>(g + (int64_t)(row0 + r) * ld + ch * 8)
                     : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const int e = threadIdx.x + (i0 + i) * nt;
        if (i0 + i < MAXIT && e < total) *reinterpret_cast<uint4*>(s + (e / CH) * LD + (e % CH) * 8) = buf[i];
      }
    }
  }
}

// ldmatrix address of lane `lane` for a 16x16 A tile at (row0, col0) of a padded tile, or
// equally for a 16(k) x 16(n) B tile stored [k][n] read with .trans (see mma.cuh).
template <int D>
__device__ __forceinline__ uint32_t a_addr(const void* tile_base, int row0, int col0, int lane) {
  const char* base = static_cast<const char*>(tile_base);
  return smem_addr(base + ((row0 + (lane & 15)) * ld_of<D>() + col0 + (lane >> 4) * 8) * 2);
}
// ... for a B operand stored [n][k] (k contiguous), two n8 tiles at n0, n0+8, k16 at k0:
// registers 0, 1 = b0, b1 of tile n0; 2, 3 = b0, b1 of tile n0+8.
template <int D>
__device__ __forceinline__ uint32_t b_addr(const void* tile_base, int n0, int k0, int lane) {
  const char* base = static_cast<const char*>(tile_base);
  return smem_addr(base + ((n0 + (lane & 7) + ((lane >> 4) << 3)) * ld_of<D>() + k0 + ((lane >> 3) & 1) * 8) * 2);
}

// RoPE at the tensor cores, on a tile that has landed in shared memory: rows [0, rows) of a
// padded tile, row r at table row row0 + r + pos_off, turned in place (fp32 math, rounded
// back to T: the MMA operands are 16-bit anyway). cp.async writes shared memory without
// passing through registers, so a K tile cannot be turned on its way in: the block turns it
// here, between the barrier that says it landed and a barrier before anyone reads it.
// Rows at or past n (zeros, maybe past the tables) are left alone. What it costs: one more
// pass over the tile and one more barrier a tile, a table read per pair.
template <typename T, int D>
__device__ __forceinline__ void rope_tile(T* s, int row0, int n, int rows, int64_t pos_off, const Params& p) {
  constexpr int LD = ld_of<D>(), HALF = D / 2;
  for (int e = threadIdx.x; e < rows * HALF; e += blockDim.x) {
    const int r = e / HALF, i = e % HALF;
    if (row0 + r >= n) continue;
    const float2 cs = rope_cs<T>(p, row0 + r + pos_off, i);
    T* x1 = s + r * LD + (p.rope_interleaved ? 2 * i : i);
    T* x2 = x1 + (p.rope_interleaved ? 1 : HALF);
    const float a = to_f32(*x1), b = to_f32(*x2);
    *x1 = from_f32<T>(a * cs.x - b * cs.y);
    *x2 = from_f32<T>(b * cs.x + a * cs.y);
  }
}

// A warp's 16-row gradient accumulator (C fragments, D/8 n8 tiles: lane holds rows g, g + 8,
// columns 2t, 2t + 1 of each tile) with respect to rotated rows, turned back by minus the
// angle of table row (row + pos_off), in registers, before store_rows rounds it. The lane
// that holds a feature holds its partner too: interleaved, (2i, 2i + 1) are c0, c1 of one
// tile; half-split, column c of tile dt pairs with column c of tile dt + D/16. Rows >= n
// (never stored) are left alone.
template <typename T, int D>
__device__ __forceinline__ void rope_unrotate_acc(float (&acc)[D / 8][4], int row_g, int n, int64_t pos_off,
                                                  const Params& p, int lane) {
  const int t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_g + 8 * h;
    if (row < n) {
      const int64_t pos = row + pos_off;
      if (p.rope_interleaved) {
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          const float2 cs = rope_cs<T>(p, pos, dt * 4 + t);
          const float a = acc[dt][2 * h], b = acc[dt][2 * h + 1];
          acc[dt][2 * h] = a * cs.x + b * cs.y;
          acc[dt][2 * h + 1] = b * cs.x - a * cs.y;
        }
      } else {
#pragma unroll
        for (int dt = 0; dt < D / 16; ++dt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float2 cs = rope_cs<T>(p, pos, dt * 8 + 2 * t + e);
            const float a = acc[dt][2 * h + e], b = acc[dt + D / 16][2 * h + e];
            acc[dt][2 * h + e] = a * cs.x + b * cs.y;
            acc[dt + D / 16][2 * h + e] = b * cs.x - a * cs.y;
          }
      }
    }
  }
}

// A warp's 16 rows x D of a padded tile, converted from fp32 fragments (C layout, DT n8
// tiles across D, times `mul`), written to global memory (contiguous rows of D) through
// the same 16 rows of shared memory that only this warp uses: 16-byte coalesced stores
// instead of 4-byte scattered ones. Rows >= n are not written.
template <typename T, int D>
__device__ __forceinline__ void store_rows(T* stage, const float (&acc)[D / 8][4], float mul0, float mul1,
                                           T* __restrict__ dst, int row0, int n, int lane) {
  constexpr int LD = ld_of<D>(), CH = D / 8;
  __syncwarp();  // every lane is done reading these rows as an operand
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = dt * 8 + 2 * (lane & 3), r = lane >> 2;
    *reinterpret_cast<uint32_t*>(stage + r * LD + col) = pack2<T>(acc[dt][0] * mul0, acc[dt][1] * mul0);
    *reinterpret_cast<uint32_t*>(stage + (r + 8) * LD + col) = pack2<T>(acc[dt][2] * mul1, acc[dt][3] * mul1);
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < (16 * CH + 31) / 32; ++i) {
    const int e = lane + 32 * i;
    if (e < 16 * CH) {
      const int r = e / CH, ch = e % CH;
      if (row0 + r < n)
        *reinterpret_cast<uint4*>(dst + (int64_t)(row0 + r) * D + ch * 8) = *reinterpret_cast<const uint4*>(stage + r * LD + ch * 8);
    }
  }
}

// Sᵀ (or dPᵀ) = X Yᵀ for this warp's 16 rows of X (keys: K or V) and the QT rows of Y
// (queries: Q or dO). The k-loop over D indexes no register array, so it is not unrolled:
// unrolled, ptxas hoists every ldmatrix of it ahead of the mma's (8 x 12 registers at
// D = 128) and the kernel spills next to dK and dV's 128 accumulator registers.
template <typename T, int D, int QN>
__device__ __forceinline__ void warp_xyt(float (&acc)[QN][4], const T* sx, const T* sy, int warp, int lane) {
#pragma unroll
  for (int j = 0; j < QN; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll 1
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a[4];
    ldmatrix_x4(a, a_addr<D>(sx, warp * 16, kc * 16, lane));
#pragma unroll
    for (int j = 0; j < QN; j += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_addr<D>(sy, j * 8, kc * 16, lane));
      mma_16816<T>(acc[j], a, b[0], b[1]);
      mma_16816<T>(acc[j + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x D) += A (16 x 16 KN, fp32 C fragments re-packed to 16-bit: the register trick)
// times Y (16 KN x D, stored [k][d]: read with ldmatrix.trans).
template <typename T, int D, int KN>
__device__ __forceinline__ void warp_acc_py(float (&acc)[D / 8][4], const float (&pa)[KN][4], const T* sy, int lane) {
#pragma unroll
  for (int kc = 0; kc < KN / 2; ++kc) {
    uint32_t a[4];
    a[0] = pack2<T>(pa[2 * kc][0], pa[2 * kc][1]);
    a[1] = pack2<T>(pa[2 * kc][2], pa[2 * kc][3]);
    a[2] = pack2<T>(pa[2 * kc + 1][0], pa[2 * kc + 1][1]);
    a[3] = pack2<T>(pa[2 * kc + 1][2], pa[2 * kc + 1][3]);
#pragma unroll
    for (int dt = 0; dt < D / 8; dt += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, a_addr<D>(sy, kc * 16, dt * 8, lane));
      mma_16816<T>(acc[dt], a, b[0], b[1]);
      mma_16816<T>(acc[dt + 1], a, b[2], b[3]);
    }
  }
}

// ---------------------------------------------------------------- forward (v3, v4) --
constexpr int FWD_BN = 64;  // keys per tile

// One key tile for one warp: S = Q Kᵀ, online softmax, O += P V. MASK: apply the causal
// and Nk-edge masks (v3 always; v4 only on tiles that straddle the diagonal or the edge).
template <typename T, int D, bool MASK>
__device__ __forceinline__ void fwd_tile(const uint32_t (&qf)[D / 16][4], float (&o)[D / 8][4], float (&m)[2],
                                         float (&l)[2], const T* sk, const T* sv, int n0, int row_g,
                                         int end, int shift, int causal, float sl, int lane) {
  constexpr int NT = FWD_BN / 8;
  // ### BEGIN SOLUTION
  float s[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_addr<D>(sk, nt * 8, kc * 16, lane));
      mma_16816<T>(s[nt], qf[kc], b[0], b[1]);
      mma_16816<T>(s[nt + 1], qf[kc], b[2], b[3]);
    }
  }
  if constexpr (MASK) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
        const int row = row_g + (e >> 1) * 8;
        if (key >= end || (causal && key > row + shift)) s[nt][e] = -INFINITY;
      }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // rows g and g + 8
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a row
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
    const float neg = m_new == -INFINITY ? 0.0f : -m_new * sl;  // no -inf - -inf
    const float alpha = exp2_approx(fmaf(m[h], sl, neg));
    m[h] = m_new;
    // l stays a per-lane partial sum (this lane's columns): alpha is the same for the 4
    // lanes of a row, so the 4 partials are added once, after the loop.
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][2 * h] = exp2_approx(fmaf(s[nt][2 * h], sl, neg));
      s[nt][2 * h + 1] = exp2_approx(fmaf(s[nt][2 * h + 1], sl, neg));
      sum += s[nt][2 * h] + s[nt][2 * h + 1];
    }
    l[h] = l[h] * alpha + sum;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][2 * h] *= alpha;
      o[dt][2 * h + 1] *= alpha;
    }
  }
  warp_acc_py<T, D, NT>(o, s, sv, lane);  // O += P V: P straight from the S registers
  // ### END SOLUTION
}

// Block: W warps (4 or 8, blockDim.x = 32 W), BLOCK_M = 16 W query rows, 16 per warp.
// Shared: Q [BLOCK_M][D+8], then STAGES x K [64][D+8], STAGES x V [64][D+8].
// Positions inside a head (rows, keys) are int (the launcher checks N < 2**30); offsets
// are int64 (b, h and row times their strides).
template <typename T, int D, bool ASYNC, bool ROPE>
__global__ void __launch_bounds__(256) attn_fwd_mma_kernel(Params p) {
  constexpr int LD = ld_of<D>(), STAGES = ASYNC ? 2 : 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = blockDim.x >> 5, block_m = warps * 16;
  T* sq = reinterpret_cast<T*>(smem_raw);
  T* sk = sq + block_m * LD;
  T* sv = sk + STAGES * FWD_BN * LD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int Nq = (int)p.Nq, Nk = (int)p.Nk, causal = p.causal;
  const float sl = p.scale_log2;
  int64_t bh, mb;
  block_coords(cdiv(Nq, block_m), causal, bh, mb);
  const int m0 = (int)mb * block_m;
  const T* q = head_of<T>(p.q, bh, p.H);
  const T* k = kv_head_of<T>(p.k, bh, p.H, p.group);  // grouped-query: read in place
  const T* v = kv_head_of<T>(p.v, bh, p.H, p.group);

  // The keys this batch element has, [0, end), and the causal diagonal's shift (Keys).
  const Keys keys = keys_of(p, bh / p.H);
  const int end = (int)keys.end, shift = (int)keys.shift;
  // v4 visits key tiles up to the block's last row's diagonal only (causal); v3 all up to end.
  const int kv_end = (ASYNC && causal) ? max(0, min(end, m0 + block_m + shift)) : end;
  const int n_tiles = (kv_end + FWD_BN - 1) / FWD_BN;

  load_tile<T, D, 128, ASYNC>(sq, q, p.q.sn, m0, Nq, block_m);
  if constexpr (ASYNC) {
    cp_async_commit();  // group: Q
    load_tile<T, D, FWD_BN, true>(sk, k, p.k.sn, 0, Nk, FWD_BN);
    load_tile<T, D, FWD_BN, true>(sv, v, p.v.sn, 0, Nk, FWD_BN);
    cp_async_commit();  // group: K/V tile 0 (stays in flight while Q goes to registers)
    cp_async_wait<1>();
  }
  __syncthreads();
  if constexpr (ROPE) {  // Q turned once, in shared memory, before it goes to registers
    rope_tile<T, D>(sq, m0, Nq, block_m, p.rope_qoff, p);
    __syncthreads();
  }
  uint32_t qf[D / 16][4];  // this warp's 16 rows of Q, in registers for the whole loop
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) ldmatrix_x4(qf[kc], a_addr<D>(sq, warp * 16, kc * 16, lane));

  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int warp_row0 = m0 + warp * 16, row_g = warp_row0 + (lane >> 2);

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = ASYNC ? (t & 1) : 0;
    const int n0 = t * FWD_BN;
    if constexpr (ASYNC) {
      // Tile t+1 goes in flight into the other stage (free: the barrier at the end of the
      // previous iteration saw every warp finish with it), then we wait for tile t only.
      if (t + 1 < n_tiles) {
        const int ns = (t + 1) & 1;
        load_tile<T, D, FWD_BN, true>(sk + ns * FWD_BN * LD, k, p.k.sn, n0 + FWD_BN, Nk, FWD_BN);
        load_tile<T, D, FWD_BN, true>(sv + ns * FWD_BN * LD, v, p.v.sn, n0 + FWD_BN, Nk, FWD_BN);
      }
      cp_async_commit();  // possibly empty: "wait until 1 group is pending" = tile t landed
      cp_async_wait<1>();
    } else {
      load_tile<T, D, FWD_BN, false>(sk, k, p.k.sn, n0, Nk, FWD_BN);
      load_tile<T, D, FWD_BN, false>(sv, v, p.v.sn, n0, Nk, FWD_BN);
    }
    __syncthreads();
    if constexpr (ROPE) {  // this K tile, turned where it landed (rope_tile says why)
      rope_tile<T, D>(sk + stage * FWD_BN * LD, n0, Nk, FWD_BN, 0, p);
      __syncthreads();
    }
    const T* skt = sk + stage * FWD_BN * LD;
    const T* svt = sv + stage * FWD_BN * LD;
    if constexpr (ASYNC) {
      // Warp-uniform decisions: no work above this warp's diagonal, no mask code where
      // every (row, key) of the tile is visible and inside Nk.
      const bool above = causal && n0 > warp_row0 + 15 + shift;
      const bool needs_mask = n0 + FWD_BN > end || (causal && n0 + FWD_BN - 1 > warp_row0 + shift);
      if (!above) {
        if (needs_mask) fwd_tile<T, D, true>(qf, o, m, l, skt, svt, n0, row_g, end, shift, causal, sl, lane);
        else fwd_tile<T, D, false>(qf, o, m, l, skt, svt, n0, row_g, end, shift, causal, sl, lane);
      }
    } else {
      fwd_tile<T, D, true>(qf, o, m, l, skt, svt, n0, row_g, end, shift, causal, sl, lane);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  if constexpr (ASYNC) cp_async_wait<0>();

  // The 4 lanes of a row hold partial sums; l > 0 for a row that saw a key. One that saw
  // none (kv_lens, a bottom-right diagonal): out 0, lse +inf (its backward P is then 0).
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
  }
  T* out = static_cast<T*>(p.out) + bh * p.Nq * D;
  store_rows<T, D>(sq + warp * 16 * LD, o, inv[0], inv[1], out, warp_row0, Nq, lane);
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_g + 8 * h;
      if (row < Nq) p.lse[bh * p.Nq + row] = l[h] > 0.0f ? m[h] * sl + log2f(l[h]) : INFINITY;
    }
  }
}

// =====================================================================================
// v5: 32 query rows a warp (two m16 tiles): every K/V fragment feeds two MMAs
// =====================================================================================
// v4's warp owns 16 rows, so for every 16 rows it reads the whole K tile (S = Q Kᵀ) and
// the whole V tile (O += P V) from shared memory: one ldmatrix.x4 per two MMAs. Here a warp
// owns 32 rows as two m16 tiles (FlashAttention-2's 4 warps x 32 rows): one ldmatrix.x4 of
// K or V gives the B fragments of two n8 tiles and each feeds both row tiles: four MMAs,
// half the K/V reads per FLOP. What it costs is registers: two row tiles double O (128
// fp32 a thread at D = 128) and S, so Q no longer fits next to them: its A fragments are
// re-read from shared memory at every k-step (2 ldmatrix.x4 per k-step). A warp's tile at
// D = 64 (32 rows x 64 keys): 8 (Q) + 16 (K) + 16 (V) loads for 128 MMAs, 0.31 a MMA
// against v4's 0.5; at D = 128 with the 32-key tiles below, 16 + 16 + 16 for 128: 0.375.
// The block is 4 warps (128 rows) with __launch_bounds__(128, 2): two blocks an SM (<= 255
// registers a thread; 68 KB of shared memory each at D = 128), so one block's barrier
// waits and tile loads hide behind the other's MMAs; 2 warps (64 rows) when 128-row
// blocks would leave SMs idle. Same double-buffered cp.async K/V pipeline, causal block
// skipping, unmasked interior tiles and base-2 lse as v4, so v4's backward serves v5.
// Keys per tile: 64, and 32 at D = 128, where O is already 128 fp32 registers a thread:
// S of 2 x 64 keys (64 more) plus the fragments and addresses in flight leaves ptxas short
// of registers (it spilled ~100 bytes); S of 2 x 32 keys fits (240 registers, no spill).
// Where it stands (ncu on an H100, bf16 B4 H16 N4096 D128; reports/h100-level5-ncu-attention.json):
// 0.73x SDPA's FLASH kernel, and the counters say why: not memory (DRAM 4% of peak, L2 hits
// 95%) and not the tensor cores (issue slots busy 46%), but latency. 240 registers leave 2
// blocks = 8 warps an SM, 2 per scheduler, and a warp issues every 4.2 cycles: the chains
// ldmatrix -> mma -> max/exp -> mma stall both warps at once more than half the time. The
// next rungs would buy warps or overlap: fewer live registers (a third block an SM), or the
// next tile's Q Kᵀ issued while this tile's softmax runs (FlashAttention-3's ping-pong).
template <int D> constexpr int v5_bn() { return D == 128 ? 32 : 64; }

// rows [row0, row0 + rows) of a (N, D) operand into a padded shared tile with cp.async
// (zero fill past n), strided over the block's threads (v5 blocks are 64 or 128 threads,
// so the loop bound is the run-time blockDim rather than load_tile's 128-thread unroll).
template <typename T, int D>
__device__ __forceinline__ void v5_load(T* s, const T* __restrict__ g, int64_t ld, int row0, int n, int rows) {
  constexpr int CH = D / 8, LD = ld_of<D>();
  const int total = rows * CH;
#pragma unroll 4
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const int r = e / CH, ch = e % CH;
    const bool ok = row0 + r < n;
    cp_async_16(smem_addr(s + r * LD + ch * 8), ok ? g + (int64_t)(row0 + r) * ld + ch * 8 : g, ok ? 16 : 0);
  }
}

// One key tile for one warp's 32 rows (row tiles i = 0, 1): S = Q Kᵀ, online softmax per
// row, O += P V. Row of accumulator element e of tile i: row_g + 16 i + 8 (e >> 1).
// qa, ka, va: this lane's ldmatrix addresses (32-bit shared) of the warp's first Q row
// tile, of the K tile (B pattern of b_addr) and of the V tile (A pattern of a_addr, read
// .trans), each at row/column 0: every fragment is then base + a compile-time offset, so
// no address is kept per fragment (at D = 128, O and S alone are 192 of the 255 registers).
template <typename T, int D, bool MASK>
__device__ __forceinline__ void fwd_tile_v5(uint32_t qa, uint32_t ka, uint32_t va, float (&o)[2][D / 8][4],
                                            float (&m)[2][2], float (&l)[2][2], int n0, int row_g, int end,
                                            int shift, int causal, float sl, int lane) {
  constexpr int NT = v5_bn<D>() / 8, LD = ld_of<D>();
  // ### BEGIN SOLUTION
  float s[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[i][nt][0] = s[i][nt][1] = s[i][nt][2] = s[i][nt][3] = 0.0f;
  // Not unrolled (the k-step only moves the addresses, each fragment is used right away):
  // unrolled, ptxas hoists the loads of later k-steps ahead and spills at D = 128.
#pragma unroll 1
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a0[4], a1[4];  // Q rows 0-15 and 16-31 of this warp, columns 16 kc .. 16 kc + 15
    ldmatrix_x4(a0, qa + kc * 16 * 2);
    ldmatrix_x4(a1, qa + (16 * LD + kc * 16) * 2);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t b[4];  // keys nt*8 .. nt*8 + 15: one load, four MMAs
      ldmatrix_x4(b, ka + (nt * 8 * LD + kc * 16) * 2);
      mma_16816<T>(s[0][nt], a0, b[0], b[1]);
      mma_16816<T>(s[0][nt + 1], a0, b[2], b[3]);
      mma_16816<T>(s[1][nt], a1, b[0], b[1]);
      mma_16816<T>(s[1][nt + 1], a1, b[2], b[3]);
    }
  }
  if constexpr (MASK) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
          const int row = row_g + 16 * i + (e >> 1) * 8;
          if (key >= end || (causal && key > row + shift)) s[i][nt][e] = -INFINITY;
        }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // rows g + 16 i and g + 16 i + 8: v4's online softmax
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[i][nt][2 * h], s[i][nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[i][h], mx);
      const float neg = m_new == -INFINITY ? 0.0f : -m_new * sl;  // no -inf - -inf
      const float alpha = exp2_approx(fmaf(m[i][h], sl, neg));
      m[i][h] = m_new;
      float sum = 0.0f;  // this lane's columns only; the row's 4 lanes are added at the end
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s[i][nt][2 * h] = exp2_approx(fmaf(s[i][nt][2 * h], sl, neg));
        s[i][nt][2 * h + 1] = exp2_approx(fmaf(s[i][nt][2 * h + 1], sl, neg));
        sum += s[i][nt][2 * h] + s[i][nt][2 * h + 1];
      }
      l[i][h] = l[i][h] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[i][dt][2 * h] *= alpha;
        o[i][dt][2 * h + 1] *= alpha;
      }
    }
  // O += P V, P re-packed from the S registers (the register trick, as warp_acc_py), and
  // every V fragment (ldmatrix.trans: two n8 tiles of D) feeds both row tiles.
#pragma unroll
  for (int kc = 0; kc < NT / 2; ++kc) {
    uint32_t pa[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      pa[i][0] = pack2<T>(s[i][2 * kc][0], s[i][2 * kc][1]);
      pa[i][1] = pack2<T>(s[i][2 * kc][2], s[i][2 * kc][3]);
      pa[i][2] = pack2<T>(s[i][2 * kc + 1][0], s[i][2 * kc + 1][1]);
      pa[i][3] = pack2<T>(s[i][2 * kc + 1][2], s[i][2 * kc + 1][3]);
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; dt += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, va + (kc * 16 * LD + dt * 8) * 2);
      mma_16816<T>(o[0][dt], pa[0], b[0], b[1]);
      mma_16816<T>(o[0][dt + 1], pa[0], b[2], b[3]);
      mma_16816<T>(o[1][dt], pa[1], b[0], b[1]);
      mma_16816<T>(o[1][dt + 1], pa[1], b[2], b[3]);
    }
  }
  // ### END SOLUTION
}

// Block: W warps (2 or 4, blockDim.x = 32 W), BLOCK_M = 32 W query rows, 32 per warp.
// Shared: Q [BLOCK_M][D+8] (read by its own warp only), then 2 x K [64][D+8], 2 x V [64][D+8].
template <typename T, int D, bool ROPE>
__global__ void __launch_bounds__(128, 2) attn_fwd_v5_kernel(Params p) {
  constexpr int LD = ld_of<D>(), V5_BN = v5_bn<D>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = blockDim.x >> 5, block_m = warps * 32;
  T* sq = reinterpret_cast<T*>(smem_raw);
  T* sk = sq + block_m * LD;
  T* sv = sk + 2 * V5_BN * LD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int Nq = (int)p.Nq, Nk = (int)p.Nk, causal = p.causal;
  const float sl = p.scale_log2;
  int64_t bh, mb;
  block_coords(cdiv(Nq, block_m), causal, bh, mb);
  const int m0 = (int)mb * block_m;
  const T* k = kv_head_of<T>(p.k, bh, p.H, p.group);
  const T* v = kv_head_of<T>(p.v, bh, p.H, p.group);
  const Keys keys = keys_of(p, bh / p.H);  // [0, end) and the diagonal's shift, as v4
  const int end = (int)keys.end, shift = (int)keys.shift;
  const int kv_end = causal ? max(0, min(end, m0 + block_m + shift)) : end;
  const int n_tiles = (kv_end + V5_BN - 1) / V5_BN;

  // One group: Q and K/V tile 0 (the first iteration's wait<1> lands both).
  v5_load<T, D>(sq, head_of<T>(p.q, bh, p.H), p.q.sn, m0, Nq, block_m);
  v5_load<T, D>(sk, k, p.k.sn, 0, Nk, V5_BN);
  v5_load<T, D>(sv, v, p.v.sn, 0, Nk, V5_BN);
  cp_async_commit();

  float o[2][D / 8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[i][dt][0] = o[i][dt][1] = o[i][dt][2] = o[i][dt][3] = 0.0f;
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
  float l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  const int warp_row0 = m0 + warp * 32, row_g = warp_row0 + (lane >> 2);
  // This lane's ldmatrix addresses at row/column 0 (a_addr / b_addr's lane patterns).
  const uint32_t qa = a_addr<D>(sq, warp * 32, 0, lane);
  const uint32_t ka0 = b_addr<D>(sk, 0, 0, lane), va0 = a_addr<D>(sv, 0, 0, lane);
  constexpr uint32_t STAGE_BYTES = V5_BN * LD * sizeof(T);

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1, n0 = t * V5_BN;
    if (t + 1 < n_tiles) {  // into the other stage: the barrier closing t-1 freed it
      const int ns = stage ^ 1;
      v5_load<T, D>(sk + ns * V5_BN * LD, k, p.k.sn, n0 + V5_BN, Nk, V5_BN);
      v5_load<T, D>(sv + ns * V5_BN * LD, v, p.v.sn, n0 + V5_BN, Nk, V5_BN);
    }
    cp_async_commit();  // possibly empty: "at most 1 group pending" = tile t has landed
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (ROPE) {  // Q (with tile 0: one group) and this K tile, turned where they landed
      if (t == 0) rope_tile<T, D>(sq, m0, Nq, block_m, p.rope_qoff, p);
      rope_tile<T, D>(sk + stage * V5_BN * LD, n0, Nk, V5_BN, 0, p);
      __syncthreads();
    }
    const uint32_t ka = ka0 + stage * STAGE_BYTES, va = va0 + stage * STAGE_BYTES;
    const bool above = causal && n0 > warp_row0 + 31 + shift;  // warp-uniform, as v4's
    const bool needs_mask = n0 + V5_BN > end || (causal && n0 + V5_BN - 1 > warp_row0 + shift);
    if (!above) {
      if (needs_mask) fwd_tile_v5<T, D, true>(qa, ka, va, o, m, l, n0, row_g, end, shift, causal, sl, lane);
      else fwd_tile_v5<T, D, false>(qa, ka, va, o, m, l, n0, row_g, end, shift, causal, sl, lane);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();
  // No tile at all (a block whose rows see no key): other threads' copies into this warp's
  // Q rows, where the output is staged, are only known to have landed after a barrier.
  if (n_tiles == 0) __syncthreads();

  T* out = static_cast<T*>(p.out) + bh * p.Nq * D;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[i][h] += __shfl_xor_sync(0xffffffffu, l[i][h], 1);
      l[i][h] += __shfl_xor_sync(0xffffffffu, l[i][h], 2);
      inv[h] = l[i][h] > 0.0f ? 1.0f / l[i][h] : 0.0f;  // a row that saw no key: 0 (and lse +inf)
    }
    // Staged through this warp's own Q rows (no other warp reads them).
    store_rows<T, D>(sq + (warp * 32 + 16 * i) * LD, o[i], inv[0], inv[1], out, warp_row0 + 16 * i, Nq, lane);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_g + 16 * i + 8 * h;
        if (row < Nq) p.lse[bh * p.Nq + row] = l[i][h] > 0.0f ? m[i][h] * sl + log2f(l[i][h]) : INFINITY;
      }
    }
  }
}

// =====================================================================================
// v6: Hopper warpgroup MMA (wgmma) for both products — sm_90a only
// =====================================================================================
// What changes from v5:
//   * the unit of work is a warpgroup (4 warps, 128 threads) owning 64 query rows, and one
//     instruction, wgmma.mma_async m64nNk16, multiplies its 64 x 16 slice of the left
//     operand by a 16 x N slice of the right one into N/2 fp32 registers a thread. On an
//     H100 mma.sync (v3-v5) issues at about half the tensor cores' rate; wgmma is the way to
//     the rest (gemm.cu version 5 says the same for the GEMM).
//   * S = Q Kᵀ reads BOTH operands from shared memory through descriptors (wgmma.cuh): Q and
//     K are K-major (D, the reduction, is contiguous), stored in the 128-byte swizzle that
//     gemm.cu's versions 5-6 use: [D/64 atoms][rows][64], 16-byte chunk c of row r at chunk
//     c ^ (r % 8) — no ldmatrix, no Q fragments in registers (v5 re-read them every k-step).
//   * O += P V takes P FROM REGISTERS (wgmma's register-A form) and V from shared memory.
//     The fragment algebra that makes this free (PTX ISA, wgmma register fragments; CUTLASS
//     writes the same as its SM90 C and A layouts): in a m64nN fp32 accumulator, warp w of
//     the warpgroup holds rows 16w..16w+15 and lane (g = lane/4, t = lane%4) holds
//         d[i]:  row 16w + g + 8·((i/2) % 2),   column 8·(i/4) + 2t + (i % 2)
//     and the 16-bit A fragment of m64nNk16 is, per warp, mma.sync's m16n8k16 A fragment:
//         a0,a1 (g, 2t..2t+1)   a2,a3 (g+8, 2t..)   a4,a5 (g, 2t+8..)   a6,a7 (g+8, 2t+8..)
//     So the A fragment of P for keys 16c..16c+15 is S's d[8c..8c+7] in order, packed in
//     pairs: register j = (d[8c+2j], d[8c+2j+1]). v3's register trick, one warpgroup wide.
//   * V is the B operand of P V, (keys x D) with D contiguous: "N-major" for B. wgmma reads
//     it as it lies with imm-trans-b = 1 (allowed for 16-bit types) and an MN-major
//     descriptor (wgmma_desc_mn): V's tile is written by the same swizzled loader as K's,
//     byte for byte, and only the descriptor's two offsets change meaning (the next 64
//     columns of D: the next atom, BN·128 bytes on; the next 8 keys: 1024 bytes on). The
//     other way, V transposed through shared memory into a K-major tile, would cost a pass
//     over every V tile and a barrier; the descriptor costs nothing.
//   * the softmax runs on the S accumulators where the MMA left them (the d[i] layout above):
//     a lane holds 2 columns of 2 rows per 8 keys, a row's 4 lanes are a quad, so a row max
//     or sum is this lane's values then 2 shuffles (xor 1, 2), as v3-v5. exp2 with the scale
//     folded in: p = 2^(s·scale·log2e − m·scale·log2e), one FMA and one MUFU per score.
// Block: 2 consumer warpgroups (128 query rows), or 1 (64 rows) where 128-row blocks would
// leave SMs idle; key tiles of BN = 128. Loads: cp.async by every thread into a 3-stage ring
// (tile t+2 is copied while tile t is computed; one block barrier a tile), the K-major
// swizzled layout written by address arithmetic. Why cp.async and not TMA + a producer
// warpgroup (gemm.cu version 6): q, k, v come with any batch/head/row strides (stride 0 of
// an expanded head included) that TMA's tensor maps would have to describe per call, and
// the cp.async path is the one that can be reasoned correct without a GPU to try it on;
// TMA and warp specialization are the next rung (FlashAttention-3's), with the softmax of
// one warpgroup overlapping the other's MMAs ("ping-pong"). What a tile does: S's wgmmas
// issued, waited for; the softmax; P V's wgmmas issued, waited for — the two warpgroups of a
// block and the block's loads run beside each other, one warpgroup's MMAs do not (yet)
// overlap its own softmax.
// Shared memory: Q [D/64][block_m][64], then 3 x K [D/64][128][64], 3 x V [D/64][128][64],
// all 1024-byte aligned (the swizzle's period): 224 KB at D = 128 and 128 rows (1 block an
// SM), 112 KB at D = 64.
// Costs and limits: sm_90 only (LEVELS_BAD_ARCH elsewhere: v5 is the one to run there),
// D in {64, 128} (a 128-byte swizzle row is 64 elements; smaller D would need the 32/64-byte
// swizzles), 16-bit inputs (fp32 runs v2, as v3-v5), no RoPE (v5 fuses it); the same
// 16-byte-chunk operand rules as v3-v5. Same lse (base 2) and outputs as v4/v5, so v4/v5's
// backward serves v6. Causal: tiles past a warpgroup's diagonal are skipped, tiles wholly
// below it run without the mask code (v4's rule per warpgroup).
constexpr int V6_BN = 128;     // keys per tile (the N of S's m64n128k16)
constexpr int V6_STAGES = 3;   // K/V ring depth

// Rows [row0, row0 + rows) of an (N, D) operand (row stride ld) into a swizzled K-major tile
// [D/64][rows][64] with cp.async: row r's 16-byte chunk ch (8 elements) goes to atom ch / 8,
// chunk (ch % 8) ^ (r % 8) of the atom's row r. Rows past n are zeros (zero fill). Threads
// take consecutive chunks of a row: coalesced reads, and the 8 chunks of a 128-byte row land
// in 8 different bank groups.
template <typename T, int D>
__device__ __forceinline__ void v6_load(T* s, const T* __restrict__ g, int64_t ld, int row0, int n, int rows) {
  constexpr int CH = D / 8;
  const int total = rows * CH;
#pragma unroll 4
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const int r = e / CH, ch = e % CH;
    const bool ok = row0 + r < n;
    T* dst = s + (ch >> 3) * rows * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
    cp_async_16(smem_addr(dst), ok ? g + (int64_t)(row0 + r) * ld + ch * 8 : g, ok ? 16 : 0);
  }
}

// One key tile for one warpgroup's 64 rows: S = Q Kᵀ, online softmax, O += P V.
// q_base: this warpgroup's first Q row in atom 0 (shared address), q_atom: bytes from atom 0
// to atom 1 of Q (block_m · 128); k_base, v_base: the stage's K and V tiles. s: the S
// accumulators (m64n128: 64 a thread), o: O's (m64nD: D/2), m, l: rows row_g and row_g + 8.
template <typename T, int D, bool MASK>
__device__ __forceinline__ void fwd_tile_v6(uint32_t q_base, uint32_t q_atom, uint32_t k_base, uint32_t v_base,
                                            float (&s)[V6_BN / 2], float (&o)[D / 2], float (&m)[2], float (&l)[2],
                                            int n0, int row_g, int end, int shift, int causal, float sl, int lane) {
  constexpr int BN = V6_BN, ATOM = BN * 128;  // K/V: bytes from one 64-column atom to the next
  // S = Q Kᵀ: D/16 k-steps; k-step kk is atom kk/4, 32 bytes a k16 slice inside the atom
  // (the hardware applies the swizzle to the address it computes, as in gemm.cu). The first
  // k-step overwrites S (scale-d 0): no zeroing pass.
  wgmma_fence();  // S's registers were read by the previous tile's softmax
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_m64n128k16<T>(s, wgmma_desc(q_base + (kk >> 2) * q_atom + (kk & 3) * 32),
                        wgmma_desc(k_base + (kk >> 2) * ATOM + (kk & 3) * 32), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) keep(s[i]);

  // s[i] is (row row_g + 8·((i/2) % 2), key n0 + 8·(i/4) + 2·(lane % 4) + i % 2).
  if constexpr (MASK) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const int key = n0 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
      const int row = row_g + 8 * ((i >> 1) & 1);
      if (key >= end || (causal && key > row + shift)) s[i] = -INFINITY;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // row row_g + 8h: elements 4j + 2h and 4j + 2h + 1
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the row's quad
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
    const float neg = m_new == -INFINITY ? 0.0f : -m_new * sl;  // no -inf - -inf
    const float alpha = exp2_approx(fmaf(m[h], sl, neg));
    m[h] = m_new;
    float sum = 0.0f;  // this lane's columns; the quad's partials are added once, at the end
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      s[4 * j + 2 * h] = exp2_approx(fmaf(s[4 * j + 2 * h], sl, neg));
      s[4 * j + 2 * h + 1] = exp2_approx(fmaf(s[4 * j + 2 * h + 1], sl, neg));
      sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
    }
    l[h] = l[h] * alpha + sum;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j + 2 * h] *= alpha;
      o[4 * j + 2 * h + 1] *= alpha;
    }
  }

  // O += P V: P's A fragment for keys 16c..16c+15 is s[8c..8c+7] in pairs (the top of this
  // section); V's k-slice c starts 16 rows (2048 bytes, a multiple of the 1024-byte period)
  // into the tile, so its descriptor needs no intra-atom offset.
  uint32_t pa[BN / 16][4];
#pragma unroll
  for (int c = 0; c < BN / 16; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) pa[c][j] = pack2<T>(s[8 * c + 2 * j], s[8 * c + 2 * j + 1]);
  wgmma_fence();  // O was rescaled and P written by ordinary instructions just now
#pragma unroll
  for (int c = 0; c < BN / 16; ++c) wgmma_rs_m64nNk16<T, D>(o, pa[c], wgmma_desc_mn(v_base + c * 16 * 128, ATOM));
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < D / 2; ++i) keep(o[i]);
#pragma unroll
  for (int c = 0; c < BN / 16; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) keep(pa[c][j]);  // P's registers stay P's until the MMAs read them
}

// Block: 1 or 2 warpgroups (blockDim.x = 128 or 256), 64 query rows each.
template <typename T, int D>
__global__ void __launch_bounds__(256, 1) attn_fwd_v6_kernel(Params p) {
#ifdef LEVELS_HAS_WGMMA
  constexpr int BN = V6_BN, STAGES = V6_STAGES;
  static_assert(D == 64 || D == 128, "a swizzled row is 64 elements: D is one or two atoms");
  extern __shared__ __align__(16) unsigned char smem_raw[];  // (the other kernels' declaration)
  const uint32_t raw = smem_addr(smem_raw);  // the swizzle's period, 1 KB: aligned by hand (+1 KB asked)
  T* sq = reinterpret_cast<T*>(smem_raw + ((1024 - (raw & 1023)) & 1023));
  const int block_m = (blockDim.x >> 7) * 64;
  T* sk = sq + block_m * D;
  T* sv = sk + STAGES * BN * D;
  const int lane = threadIdx.x & 31, wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
  const int Nq = (int)p.Nq, Nk = (int)p.Nk, causal = p.causal;
  const float sl = p.scale_log2;
  int64_t bh, mb;
  block_coords(cdiv(Nq, block_m), causal, bh, mb);
  const int m0 = (int)mb * block_m;
  const T* k = kv_head_of<T>(p.k, bh, p.H, p.group);
  const T* v = kv_head_of<T>(p.v, bh, p.H, p.group);
  const Keys keys = keys_of(p, bh / p.H);  // [0, end) and the diagonal's shift, as v4/v5
  const int end = (int)keys.end, shift = (int)keys.shift;
  const int kv_end = causal ? max(0, min(end, m0 + block_m + shift)) : end;
  const int n_tiles = (kv_end + BN - 1) / BN;

  // Group 0: Q and tile 0; group 1: tile 1 (possibly empty). Iteration t waits for "at most
  // one group pending" (tile t landed, t+1 may be in flight), then refills the stage of
  // tile t-1 with tile t+2.
  v6_load<T, D>(sq, head_of<T>(p.q, bh, p.H), p.q.sn, m0, Nq, block_m);
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < n_tiles) {
      v6_load<T, D>(sk + t * BN * D, k, p.k.sn, t * BN, Nk, BN);
      v6_load<T, D>(sv + t * BN * D, v, p.v.sn, t * BN, Nk, BN);
    }
    cp_async_commit();
  }

  float o[D / 2], s[BN / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int wg_row0 = m0 + wg * 64, row_g = wg_row0 + warp * 16 + (lane >> 2);
  const uint32_t q_base = smem_addr(sq + wg * 64 * 64), q_atom = block_m * 128;

  for (int t = 0, stage = 0; t < n_tiles; ++t, stage = stage == STAGES - 1 ? 0 : stage + 1) {
    cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed
    fence_proxy_async();          // ... and are visible to wgmma's (async proxy) reads
    // After the barrier: tile t is complete, and every warpgroup is past tile t-1 (its MMAs
    // waited for), whose stage the copies below refill.
    __syncthreads();
    if (t + STAGES - 1 < n_tiles) {
      const int ns = stage == 0 ? STAGES - 1 : stage - 1;  // (t + 2) % 3 = (t - 1) % 3
      v6_load<T, D>(sk + ns * BN * D, k, p.k.sn, (t + STAGES - 1) * BN, Nk, BN);
      v6_load<T, D>(sv + ns * BN * D, v, p.v.sn, (t + STAGES - 1) * BN, Nk, BN);
    }
    cp_async_commit();  // possibly empty: keeps "one group a tile"
    const int n0 = t * BN;
    // Warpgroup-uniform (wgmma is .sync.aligned over the warpgroup): no work for rows past
    // Nq or keys past this warpgroup's diagonal; no mask code where every (row, key) is seen.
    const bool skip = wg_row0 >= Nq || (causal && n0 > wg_row0 + 63 + shift);
    if (!skip) {
      const uint32_t kb = smem_addr(sk + stage * BN * D), vb = smem_addr(sv + stage * BN * D);
      const bool needs_mask = n0 + BN > end || (causal && n0 + BN - 1 > wg_row0 + shift);
      if (needs_mask) fwd_tile_v6<T, D, true>(q_base, q_atom, kb, vb, s, o, m, l, n0, row_g, end, shift, causal, sl, lane);
      else fwd_tile_v6<T, D, false>(q_base, q_atom, kb, vb, s, o, m, l, n0, row_g, end, shift, causal, sl, lane);
    }
  }
  cp_async_wait<0>();  // nothing left in flight when the block exits

  // Out straight from the accumulators: lane (g, t) holds columns 8j + 2t, 2t+1 of rows
  // row_g and row_g + 8 (4-byte stores; a row's quad writes 16 contiguous bytes). Once per
  // row against BN·D MMAs a tile: no staging through shared memory.
  T* out = static_cast<T*>(p.out) + bh * p.Nq * D;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int row = row_g + 8 * h;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;  // a row that saw no key: 0 (and lse +inf)
    if (row < Nq) {
      T* dst = out + (int64_t)row * D + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack2<T>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      if ((lane & 3) == 0) p.lse[bh * p.Nq + row] = l[h] > 0.0f ? m[h] * sl + log2f(l[h]) : INFINITY;
    }
  }
#endif
}

// =====================================================================================
// backward: preprocess (every version)
// =====================================================================================
// delta_i = sum_d dO_id O_id, one warp per row (O as stored, i.e. rounded to its dtype:
// that is the O whose gradient the caller asked for).
template <typename T>
__global__ void attn_bwd_preprocess_kernel(Params p) {
  const int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.BH * p.Nq) return;  // whole warps leave together
  const int64_t bh = row / p.Nq, i = row % p.Nq;
  const T* o = head_of<T>(p.o, bh, p.H) + i * p.o.sn;
  const T* dout = head_of<T>(p.dout, bh, p.H) + i * p.dout.sn;
  float acc = 0.0f;
  for (int d = threadIdx.x & 31; d < p.D; d += 32) acc = fmaf(to_f32(o[d]), to_f32(dout[d]), acc);
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) p.delta[row] = acc;
}

// =====================================================================================
// backward on the CUDA cores (exact fp32): serves v1, v2 and fp32 inputs at v3/v4
// =====================================================================================
// With s = q·k (raw), P = 2^(s·scale·log2e - lse), dP = dO·v, dS = P (dP - delta):
//   dV_j = sum_i P_ij dO_i      dK_j = scale sum_i dS_ij q_i      dQ_i = scale sum_j dS_ij k_j

// dK/dV: a block owns ROWS keys of one (batch, K/V head) (TPR threads a key, as v2's rows)
// with k, v, dk, dv in registers, and streams TILE-query tiles of Q and dO (fp32 in shared
// memory) past them. Grouped-query attention: the block walks the query tiles of each of
// the group's query heads in turn, one after the other, into the same dk and dv.
template <typename T, int D, bool ROPE>
__global__ void __launch_bounds__(CC_THREADS) attn_bwd_dkdv_cc_kernel(Params p) {
  using S = CcShape<D>;
  constexpr int PER = S::PER, TPR = S::TPR, TILE = S::TILE;
  __shared__ float qs[TILE][D], dos[TILE][D];
  __shared__ float lse_s[TILE], delta_s[TILE];
  int64_t bhk, nb;  // bhk: batch x K/V head
  block_coords(cdiv(p.Nk, S::ROWS), false, bhk, nb);
  const int c = threadIdx.x % TPR;
  const int64_t key = nb * S::ROWS + threadIdx.x / TPR;
  const bool key_ok = key < p.Nk;
  const int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv;
  const Keys keys = keys_of(p, b);
  const T* kp = static_cast<const T*>(p.k.ptr) + b * p.k.sb + hk * p.k.sh + (key_ok ? key : 0) * p.k.sn;
  const T* vp = static_cast<const T*>(p.v.ptr) + b * p.v.sb + hk * p.v.sh + (key_ok ? key : 0) * p.v.sn;
  const int first = keys.first(key, p.causal);  // queries >= first see this key
  float kr[PER], vr[PER], dk[PER], dv[PER];
  if constexpr (ROPE) {
    cc_load_rows_turned<T, D>(kr, qs, static_cast<const T*>(p.k.ptr) + b * p.k.sb + hk * p.k.sh, p.k.sn,
                              nb * S::ROWS, p.Nk, c, p.D, p, 0);
  } else {
    cc_load_row<T, D>(kr, kp, key_ok, c, p.D);
  }
  cc_load_row<T, D>(vr, vp, key_ok, c, p.D);
#pragma unroll
  for (int e = 0; e < PER; ++e) dk[e] = dv[e] = 0.0f;
  const float sl = p.scale_log2;
  for (int64_t g = 0; g < p.group; ++g) {
    const int64_t bh = b * p.H + hk * p.group + g;  // a query head that reads this K/V head
    const T* q = head_of<T>(p.q, bh, p.H);
    const T* dout = head_of<T>(p.dout, bh, p.H);
    for (int64_t m0 = 0; m0 < p.Nq; m0 += TILE) {
      __syncthreads();
      cc_load_tile_at<T, D, ROPE>(qs, q, p.q.sn, m0, p.Nq, p.D, p, p.rope_qoff);
      cc_load_tile<T, D>(dos, dout, p.dout.sn, m0, p.Nq, p.D);
      if (threadIdx.x < TILE) {
        const int64_t i = m0 + threadIdx.x;
        lse_s[threadIdx.x] = i < p.Nq ? p.lse[bh * p.Nq + i] : 0.0f;
        delta_s[threadIdx.x] = i < p.Nq ? p.delta[bh * p.Nq + i] : 0.0f;
      }
      __syncthreads();
      // ### BEGIN SOLUTION
      for (int i = 0; i < TILE; ++i) {
        float part = 0.0f;
#pragma unroll
        for (int e = 0; e < PER; ++e) part = fmaf(kr[e], qs[i][c + TPR * e], part);
        const float s = row_sum<TPR>(part);
        const int64_t qi = m0 + i;
        const bool visible = qi < p.Nq && (int)qi >= first;
        const float pr = visible ? exp2f(fmaf(s, sl, -lse_s[i])) : 0.0f;
        part = 0.0f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
          dv[e] = fmaf(pr, dos[i][c + TPR * e], dv[e]);
          part = fmaf(vr[e], dos[i][c + TPR * e], part);
        }
        const float ds = pr * (row_sum<TPR>(part) - delta_s[i]);
#pragma unroll
        for (int e = 0; e < PER; ++e) dk[e] = fmaf(ds, qs[i][c + TPR * e], dk[e]);
      }
      // ### END SOLUTION
    }
  }
  const int64_t orow = (bhk * p.Nk + (key_ok ? key : 0)) * p.D;  // dk, dv: contiguous (B, H_kv, Nk, D)
  // dk is the gradient of the rotated k: turned back before the store
  if constexpr (ROPE)
    cc_store_rows_unturned<T, D>(static_cast<T*>(p.dk) + orow, dk, p.scale, c, p.D, key_ok, qs, nb * S::ROWS, p.Nk, p, 0);
  if (!key_ok) return;
  if constexpr (!ROPE) cc_store_row<T, D>(static_cast<T*>(p.dk) + orow, dk, p.scale, c, p.D);
  cc_store_row<T, D>(static_cast<T*>(p.dv) + orow, dv, 1.0f, c, p.D);
}

// dQ: a block owns ROWS queries (q, dO, dq in registers) and streams TILE-key tiles of K, V.
template <typename T, int D, bool ROPE>
__global__ void __launch_bounds__(CC_THREADS) attn_bwd_dq_cc_kernel(Params p) {
  using S = CcShape<D>;
  constexpr int PER = S::PER, TPR = S::TPR, TILE = S::TILE;
  __shared__ float ks[TILE][D], vs[TILE][D];
  int64_t bh, mb;
  block_coords(cdiv(p.Nq, S::ROWS), p.causal, bh, mb);
  const int c = threadIdx.x % TPR;
  const int64_t row = mb * S::ROWS + threadIdx.x / TPR;
  const bool row_ok = row < p.Nq;
  const T* qp = head_of<T>(p.q, bh, p.H) + (row_ok ? row : 0) * p.q.sn;
  const T* dop = head_of<T>(p.dout, bh, p.H) + (row_ok ? row : 0) * p.dout.sn;
  const T* k = kv_head_of<T>(p.k, bh, p.H, p.group);
  const T* v = kv_head_of<T>(p.v, bh, p.H, p.group);
  const Keys keys = keys_of(p, bh / p.H);
  const int limit = row_ok ? keys.limit(row, p.causal) : 0;  // this row sees keys [0, limit)
  float qr[PER], dor[PER], dq[PER];
  if constexpr (ROPE) cc_load_rows_turned<T, D>(qr, ks, head_of<T>(p.q, bh, p.H), p.q.sn, mb * S::ROWS, p.Nq, c, p.D, p, p.rope_qoff);
  else cc_load_row<T, D>(qr, qp, row_ok, c, p.D);
  cc_load_row<T, D>(dor, dop, row_ok, c, p.D);
#pragma unroll
  for (int e = 0; e < PER; ++e) dq[e] = 0.0f;
  const float lse = row_ok ? p.lse[bh * p.Nq + row] : 0.0f;
  const float delta = row_ok ? p.delta[bh * p.Nq + row] : 0.0f;
  const float sl = p.scale_log2;
  for (int64_t n0 = 0; n0 < keys.end; n0 += TILE) {
    __syncthreads();
    cc_load_tile_at<T, D, ROPE>(ks, k, p.k.sn, n0, keys.end, p.D, p, 0);
    cc_load_tile<T, D>(vs, v, p.v.sn, n0, keys.end, p.D);
    __syncthreads();
    // ### BEGIN SOLUTION
    const int visible_here = limit - (int)n0;  // keys j < this of the tile are seen
    for (int j = 0; j < TILE; ++j) {
      float ps = 0.0f, pd = 0.0f;
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        ps = fmaf(qr[e], ks[j][c + TPR * e], ps);
        pd = fmaf(dor[e], vs[j][c + TPR * e], pd);
      }
      const float s = row_sum<TPR>(ps), dp = row_sum<TPR>(pd);
      const bool visible = j < visible_here;
      const float ds = visible ? exp2f(fmaf(s, sl, -lse)) * (dp - delta) : 0.0f;
#pragma unroll
      for (int e = 0; e < PER; ++e) dq[e] = fmaf(ds, ks[j][c + TPR * e], dq[e]);
    }
    // ### END SOLUTION
  }
  T* dqp = static_cast<T*>(p.dq) + (bh * p.Nq + (row_ok ? row : 0)) * p.D;
  if constexpr (ROPE) {  // the gradient of the rotated q: turned back before the store
    cc_store_rows_unturned<T, D>(dqp, dq, p.scale, c, p.D, row_ok, ks, mb * S::ROWS, p.Nq, p, p.rope_qoff);
  } else {
    if (!row_ok) return;
    cc_store_row<T, D>(dqp, dq, p.scale, c, p.D);
  }
}

// =====================================================================================
// backward on the tensor cores (v3, v4; ASYNC = v4)
// =====================================================================================
// dK/dV works in the transposed frame: a warp owns 16 keys (rows) and computes
// Sᵀ = K Qᵀ (keys x queries), so that Pᵀ and dSᵀ come out of the accumulators already
// in the A-fragment layout of dV += Pᵀ dO and dK += dSᵀ Q (the register trick again);
// Q and dO are the B operands, read plainly for Sᵀ, dPᵀ (stored [query][d] = [n][k]) and
// with ldmatrix.trans for dV, dK (stored [query][d] = [k][n]).
// The streamed query tile: 64 queries for D <= 64, 32 for D = 128, where dK and dV are
// already 128 fp32 registers a thread (keeps Sᵀ + dPᵀ + dK + dV within 255: no spills).
template <int D> constexpr int bwd_tile() { return D == 128 ? 32 : 64; }

template <typename T, int D, bool MASK>
__device__ __forceinline__ void dkdv_tile_ds(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                             float (&dpt)[bwd_tile<D>() / 8][4], const T* sk, const T* sv,
                                             const T* sq, const T* sdo, const float* slse,
                                             const float* sdelta, int warp, int m0, int key_g, int Nq,
                                             int end, int shift, int causal, float sl, int lane) {
  constexpr int QN = bwd_tile<D>() / 8;
  // ### BEGIN SOLUTION
  float st[QN][4];  // Sᵀ, then Pᵀ
  warp_xyt<T, D, QN>(st, sk, sq, warp, lane);
#pragma unroll
  for (int j = 0; j < QN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = j * 8 + 2 * (lane & 3) + (e & 1);  // query m0 + col; key key_g + 8 (e >> 1)
      float pr = exp2_approx(fmaf(st[j][e], sl, -slse[col]));
      if constexpr (MASK) {
        const int qi = m0 + col, key = key_g + (e >> 1) * 8;
        if (qi >= Nq || key >= end || (causal && qi + shift < key)) pr = 0.0f;
      }
      st[j][e] = pr;
    }
  warp_acc_py<T, D, QN>(dv, st, sdo, lane);  // dV += Pᵀ dO
  warp_xyt<T, D, QN>(dpt, sv, sdo, warp, lane);  // dPᵀ = V dOᵀ, then dSᵀ in place
#pragma unroll
  for (int j = 0; j < QN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[j][e] = st[j][e] * (dpt[j][e] - sdelta[j * 8 + 2 * (lane & 3) + (e & 1)]);
  warp_acc_py<T, D, QN>(dk, dpt, sq, lane);  // dK += dSᵀ Q (scale applied once, at the end)
  // ### END SOLUTION
}

// Version 4's step: dS is used for dK only and dropped (version 7's fused_tile keeps it).
template <typename T, int D, bool MASK>
__device__ __forceinline__ void dkdv_tile(float (&dk)[D / 8][4], float (&dv)[D / 8][4], const T* sk, const T* sv,
                                          const T* sq, const T* sdo, const float* slse, const float* sdelta,
                                          int warp, int m0, int key_g, int Nq, int end, int shift, int causal,
                                          float sl, int lane) {
  float ds[bwd_tile<D>() / 8][4];
  dkdv_tile_ds<T, D, MASK>(dk, dv, ds, sk, sv, sq, sdo, slse, sdelta, warp, m0, key_g, Nq, end,
                           shift, causal, sl, lane);
}

// Stage `stage` gets query tile m0: Q and dO rows (16-byte chunks) and the tile's lse and
// delta (fp32, 4 bytes each: their rows are not 16-byte aligned). Rows past Nq are zeros.
template <typename T, int D, bool ASYNC>
__device__ __forceinline__ void dkdv_load_queries(T* sq, T* sdo, float* slse, float* sdelta, const T* q,
                                                  const T* dout, int64_t bh, int m0, const Params& p) {
  constexpr int QT = bwd_tile<D>();
  const int Nq = (int)p.Nq;
  load_tile<T, D, QT, ASYNC>(sq, q, p.q.sn, m0, Nq, QT);
  load_tile<T, D, QT, ASYNC>(sdo, dout, p.dout.sn, m0, Nq, QT);
  const int i = threadIdx.x;  // blockDim.x >= 128 >= 2 QT
  if (i < 2 * QT) {
    const int r = i % QT;
    const bool ok = m0 + r < Nq;
    const float* src = (i < QT ? p.lse : p.delta) + bh * p.Nq + (ok ? m0 + r : 0);
    float* dst = (i < QT ? slse : sdelta) + r;
    if constexpr (ASYNC) cp_async_4(smem_addr(dst), src, ok ? 4 : 0);
    else *dst = ok ? *src : 0.0f;
  }
}

// Block: W warps (4 or 8), 16 W keys. Shared: K, V [16 W][D+8] (loaded once); then
// STAGES x (Q [QT][D+8], dO [QT][D+8]); then STAGES x (lse [QT], delta [QT]) fp32.
template <typename T, int D, bool ASYNC, bool ROPE>
__global__ void __launch_bounds__(256) attn_bwd_dkdv_mma_kernel(Params p) {
  constexpr int LD = ld_of<D>(), QT = bwd_tile<D>(), STAGES = ASYNC ? 2 : 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = blockDim.x >> 5, block_n = warps * 16;
  T* sk = reinterpret_cast<T*>(smem_raw);
  T* sv = sk + block_n * LD;
  T* sq = sv + block_n * LD;           // [STAGES][QT][LD]
  T* sdo = sq + STAGES * QT * LD;      // [STAGES][QT][LD]
  float* slse = reinterpret_cast<float*>(sdo + STAGES * QT * LD);  // [STAGES][QT]
  float* sdelta = slse + STAGES * QT;                               // [STAGES][QT]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int Nq = (int)p.Nq, Nk = (int)p.Nk, causal = p.causal;
  const float sl = p.scale_log2;
  int64_t bhk, nb;  // bhk: batch x K/V head
  block_coords(cdiv(Nk, block_n), false, bhk, nb);  // causal: low key blocks (the heaviest) first
  const int n0 = (int)nb * block_n;
  // Grouped-query attention: the query heads bh0 .. bh0 + group - 1 read this K/V head.
  const int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv, bh0 = b * p.H + hk * p.group;

  const Keys keys = keys_of(p, b);  // [0, end) and the diagonal's shift (query i sees j <= i + shift)
  const int end = (int)keys.end, shift = (int)keys.shift;
  // Causal (v4): queries before n0 - shift never see these keys; start at the tile holding it.
  const int t_first = (ASYNC && causal) ? max(0, n0 - shift) / QT : 0;
  const int t_end = (Nq + QT - 1) / QT;
  // One loop over (query head of the group, query tile): step s is head s / per_head,
  // tile t_first + s % per_head. The prefetch of step s + 1 crosses heads like tiles.
  // Keys past the batch element's length: no step, dK = dV = 0.
  const int per_head = n0 < end ? max(0, t_end - t_first) : 0, steps = (int)p.group * per_head;

  const int64_t k_off = b * p.k.sb + hk * p.k.sh, v_off = b * p.v.sb + hk * p.v.sh;
  load_tile<T, D, 128, ASYNC>(sk, static_cast<const T*>(p.k.ptr) + k_off, p.k.sn, n0, Nk, block_n);
  load_tile<T, D, 128, ASYNC>(sv, static_cast<const T*>(p.v.ptr) + v_off, p.v.sn, n0, Nk, block_n);
  if constexpr (ASYNC) {
    dkdv_load_queries<T, D, true>(sq, sdo, slse, sdelta, head_of<T>(p.q, bh0, p.H), head_of<T>(p.dout, bh0, p.H),
                                  bh0, t_first * QT, p);
    cp_async_commit();  // group: K, V and query tile t_first of the first head
  }
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;
  const int warp_key0 = n0 + warp * 16, key_g = warp_key0 + (lane >> 2);

  for (int step = 0; step < steps; ++step) {
    const int stage = ASYNC ? (step & 1) : 0;
    const int m0 = (t_first + step % per_head) * QT;
    if constexpr (ASYNC) {
      if (step + 1 < steps) {
        const int ns = stage ^ 1;
        const int64_t nbh = bh0 + (step + 1) / per_head;
        dkdv_load_queries<T, D, true>(sq + ns * QT * LD, sdo + ns * QT * LD, slse + ns * QT, sdelta + ns * QT,
                                      head_of<T>(p.q, nbh, p.H), head_of<T>(p.dout, nbh, p.H), nbh,
                                      (t_first + (step + 1) % per_head) * QT, p);
      }
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      const int64_t bh = bh0 + step / per_head;
      dkdv_load_queries<T, D, false>(sq, sdo, slse, sdelta, head_of<T>(p.q, bh, p.H), head_of<T>(p.dout, bh, p.H),
                                     bh, m0, p);
    }
    __syncthreads();
    if constexpr (ROPE) {  // K once (it landed with the first step), and each Q tile
      if (step == 0) rope_tile<T, D>(sk, n0, Nk, block_n, 0, p);
      rope_tile<T, D>(sq + stage * QT * LD, m0, Nq, QT, p.rope_qoff, p);
      __syncthreads();
    }
    const T* sqt = sq + stage * QT * LD;
    const T* sdot = sdo + stage * QT * LD;
    const float* slt = slse + stage * QT;
    const float* sdt = sdelta + stage * QT;
    if constexpr (ASYNC) {
      // no query of the tile sees these keys (or they are past the length)
      const bool above = warp_key0 >= end || (causal && m0 + QT - 1 + shift < warp_key0);
      const bool needs_mask = m0 + QT > Nq || warp_key0 + 15 >= end || (causal && m0 + shift < warp_key0 + 15);
      if (!above) {
        if (needs_mask)
          dkdv_tile<T, D, true>(dk, dv, sk, sv, sqt, sdot, slt, sdt, warp, m0, key_g, Nq, end, shift, causal, sl, lane);
        else
          dkdv_tile<T, D, false>(dk, dv, sk, sv, sqt, sdot, slt, sdt, warp, m0, key_g, Nq, end, shift, causal, sl, lane);
      }
    } else {
      dkdv_tile<T, D, true>(dk, dv, sk, sv, sqt, sdot, slt, sdt, warp, m0, key_g, Nq, end, shift, causal, sl, lane);
    }
    __syncthreads();
  }
  if constexpr (ASYNC) cp_async_wait<0>();
  // No step (keys no query sees): K is staged over below, where other threads' loads of it
  // are only known to have landed after a barrier.
  if (steps == 0) __syncthreads();
  const int64_t out0 = bhk * p.Nk * D;  // dk, dv: contiguous (B, H_kv, Nk, D)
  if constexpr (ROPE) rope_unrotate_acc<T, D>(dk, key_g, Nk, 0, p, lane);  // dk of the rotated k
  store_rows<T, D>(sk + warp * 16 * LD, dk, p.scale, p.scale, static_cast<T*>(p.dk) + out0, warp_key0, Nk, lane);
  store_rows<T, D>(sv + warp * 16 * LD, dv, 1.0f, 1.0f, static_cast<T*>(p.dv) + out0, warp_key0, Nk, lane);
}

// dQ: a warp owns 16 queries; Q and dO fragments stay in registers (A operands of S = Q Kᵀ
// and dP = dO Vᵀ); dQ += dS K with dS re-packed from the accumulators and K read with
// ldmatrix.trans. Key tiles of 64 for D <= 64, 32 for D = 128 (registers, as above).
template <typename T, int D, bool MASK>
__device__ __forceinline__ void dq_tile(float (&dq)[D / 8][4], const uint32_t (&qf)[D / 16][4],
                                        const uint32_t (&df)[D / 16][4], const T* sk, const T* sv,
                                        const float (&lse)[2], const float (&delta)[2], int n0, int row_g,
                                        int end, int shift, int causal, float sl, int lane) {
  constexpr int KT = bwd_tile<D>(), KN = KT / 8;
  // ### BEGIN SOLUTION
  float s[KN][4], dp[KN][4];
#pragma unroll
  for (int j = 0; j < KN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
    for (int j = 0; j < KN; j += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_addr<D>(sk, j * 8, kc * 16, lane));
      mma_16816<T>(s[j], qf[kc], b[0], b[1]);
      mma_16816<T>(s[j + 1], qf[kc], b[2], b[3]);
      ldmatrix_x4(b, b_addr<D>(sv, j * 8, kc * 16, lane));
      mma_16816<T>(dp[j], df[kc], b[0], b[1]);
      mma_16816<T>(dp[j + 1], df[kc], b[2], b[3]);
    }
#pragma unroll
  for (int j = 0; j < KN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1;
      float pr = exp2_approx(fmaf(s[j][e], sl, -lse[h]));
      if constexpr (MASK) {
        const int key = n0 + j * 8 + 2 * (lane & 3) + (e & 1), row = row_g + 8 * h;
        if (key >= end || (causal && key > row + shift)) pr = 0.0f;
      }
      s[j][e] = pr * (dp[j][e] - delta[h]);  // dS
    }
  warp_acc_py<T, D, KN>(dq, s, sk, lane);  // dQ += dS K (scale applied once, at the end)
  // ### END SOLUTION
}

// Block: W warps, 16 W queries. Shared: Q, dO [16 W][D+8]; then STAGES x (K, V [KT][D+8]).
template <typename T, int D, bool ASYNC, bool ROPE>
__global__ void __launch_bounds__(256) attn_bwd_dq_mma_kernel(Params p) {
  constexpr int LD = ld_of<D>(), KT = bwd_tile<D>(), STAGES = ASYNC ? 2 : 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = blockDim.x >> 5, block_m = warps * 16;
  T* sq = reinterpret_cast<T*>(smem_raw);
  T* sdo = sq + block_m * LD;
  T* sk = sdo + block_m * LD;           // [STAGES][KT][LD]
  T* sv = sk + STAGES * KT * LD;        // [STAGES][KT][LD]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int Nq = (int)p.Nq, Nk = (int)p.Nk, causal = p.causal;
  const float sl = p.scale_log2;
  int64_t bh, mb;
  block_coords(cdiv(Nq, block_m), causal, bh, mb);
  const int m0 = (int)mb * block_m;
  const T* k = kv_head_of<T>(p.k, bh, p.H, p.group);
  const T* v = kv_head_of<T>(p.v, bh, p.H, p.group);
  const Keys keys = keys_of(p, bh / p.H);  // [0, end) and the diagonal's shift, as the forward
  const int end = (int)keys.end, shift = (int)keys.shift;
  const int kv_end = (ASYNC && causal) ? max(0, min(end, m0 + block_m + shift)) : end;
  const int n_tiles = (kv_end + KT - 1) / KT;

  load_tile<T, D, 128, ASYNC>(sq, head_of<T>(p.q, bh, p.H), p.q.sn, m0, Nq, block_m);
  load_tile<T, D, 128, ASYNC>(sdo, head_of<T>(p.dout, bh, p.H), p.dout.sn, m0, Nq, block_m);
  if constexpr (ASYNC) {
    cp_async_commit();  // group: Q, dO
    load_tile<T, D, KT, true>(sk, k, p.k.sn, 0, Nk, KT);
    load_tile<T, D, KT, true>(sv, v, p.v.sn, 0, Nk, KT);
    cp_async_commit();  // group: K/V tile 0
    cp_async_wait<1>();
  }
  __syncthreads();
  if constexpr (ROPE) {
    rope_tile<T, D>(sq, m0, Nq, block_m, p.rope_qoff, p);
    __syncthreads();
  }
  uint32_t qf[D / 16][4], df[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    ldmatrix_x4(qf[kc], a_addr<D>(sq, warp * 16, kc * 16, lane));
    ldmatrix_x4(df[kc], a_addr<D>(sdo, warp * 16, kc * 16, lane));
  }
  const int warp_row0 = m0 + warp * 16, row_g = warp_row0 + (lane >> 2);
  float lse[2], delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_g + 8 * h;
    lse[h] = row < Nq ? p.lse[bh * p.Nq + row] : 0.0f;
    delta[h] = row < Nq ? p.delta[bh * p.Nq + row] : 0.0f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = ASYNC ? (t & 1) : 0;
    const int n0 = t * KT;
    if constexpr (ASYNC) {
      if (t + 1 < n_tiles) {
        const int ns = (t + 1) & 1;
        load_tile<T, D, KT, true>(sk + ns * KT * LD, k, p.k.sn, n0 + KT, Nk, KT);
        load_tile<T, D, KT, true>(sv + ns * KT * LD, v, p.v.sn, n0 + KT, Nk, KT);
      }
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      load_tile<T, D, KT, false>(sk, k, p.k.sn, n0, Nk, KT);
      load_tile<T, D, KT, false>(sv, v, p.v.sn, n0, Nk, KT);
    }
    __syncthreads();
    if constexpr (ROPE) {
      rope_tile<T, D>(sk + stage * KT * LD, n0, Nk, KT, 0, p);
      __syncthreads();
    }
    const T* skt = sk + stage * KT * LD;
    const T* svt = sv + stage * KT * LD;
    if constexpr (ASYNC) {
      const bool above = causal && n0 > warp_row0 + 15 + shift;
      const bool needs_mask = n0 + KT > end || (causal && n0 + KT - 1 > warp_row0 + shift);
      if (!above) {
        if (needs_mask) dq_tile<T, D, true>(dq, qf, df, skt, svt, lse, delta, n0, row_g, end, shift, causal, sl, lane);
        else dq_tile<T, D, false>(dq, qf, df, skt, svt, lse, delta, n0, row_g, end, shift, causal, sl, lane);
      }
    } else {
      dq_tile<T, D, true>(dq, qf, df, skt, svt, lse, delta, n0, row_g, end, shift, causal, sl, lane);
    }
    __syncthreads();
  }
  if constexpr (ASYNC) cp_async_wait<0>();
  if constexpr (ROPE) rope_unrotate_acc<T, D>(dq, row_g, Nq, p.rope_qoff, p, lane);  // dq of the rotated q
  store_rows<T, D>(sq + warp * 16 * LD, dq, p.scale, p.scale, static_cast<T*>(p.dq) + bh * p.Nq * D, warp_row0,
                   Nq, lane);
}

// =====================================================================================
// v7's backward: one fused kernel per key block, dQ added into an fp32 workspace
// =====================================================================================
// What the profile of v4's backward said (reports/h100-level5-ncu-attention.json, bf16,
// B4 H16 N4096 D128): the dK/dV kernel took 4.96 ms and the dQ kernel 3.01 ms, both at
// 12.5% occupancy (one 256-thread block an SM: 244-246 registers a thread), issue slots
// 29-31% busy, L1/shared 61-63% busy (ldmatrix), no spills. The dQ kernel spends its time
// recomputing what the dK/dV kernel already had: S = Q Kᵀ, P, dP = dO Vᵀ and dS — two of
// its three products. 7 matrix products run where the backward's FLOP count has 5.
// v7 removes the second kernel (FlashAttention-2's own design): the dK/dV block, which has
// dSᵀ for its keys x the query tile in registers anyway, also computes that tile's share of
// dQ = dS K and adds it into a (B, H, Nq, D) fp32 workspace with atomics. Per query tile:
//   1. Sᵀ, Pᵀ, dV += Pᵀ dO, dPᵀ, dSᵀ, dK += dSᵀ Q         (v4's dK/dV tile, unchanged)
//   2. every warp writes its 16 keys' dSᵀ (16-bit: the same rounding dK used) into a shared
//      [keys][queries] tile; one barrier
//   3. dQ_tile (QT x D) = dS (QT x keys) K (keys x D): the warps split it into 16 x 32
//      jobs; dS arrives as the A operand by ldmatrix.trans from the [keys][queries] tile
//      (b_addr's lane pattern: the transpose of an A tile is a B tile), K as the B operand
//      by ldmatrix.trans as in dK's product. Keys past the length or the diagonal of the
//      job's 16 queries are not visited.
//   4. red.global.add of the job's fp32 results (two adjacent columns at a time: sm_90's
//      8-byte float2 atomicAdd) into the workspace row of the query.
// Then a small kernel turns the workspace into dq: times the scale, (RoPE) turned back by
// minus the query's angle, rounded to the dtype.
// Key blocks of one head start their query loop at different tiles (block nb at tile
// nb mod the tile count): blocks running side by side add into different dQ rows instead of
// queueing on the same addresses at L2.
// Costs: NOT DETERMINISTIC in dq — the fp32 additions of the key blocks happen in whatever
// order the blocks reach them, so dq can differ in its last bits from run to run (dk and
// dv are still one block's own sums: deterministic, grouped heads included). Versions 4-6
// keep the deterministic two-kernel backward. Also: the workspace (4 bytes per element of
// q, 134 MB at the bench shape) and its zeroing; Nk/block_n atomic adds per dQ element
// (32 at the bench shape); one more barrier and a dS tile (block_n x (QT + 8) 16-bit) of
// shared memory per block.
template <typename T, int D, bool MASK>
__device__ __forceinline__ void fused_tile(float (&dk)[D / 8][4], float (&dv)[D / 8][4], T* sds, const T* sk,
                                           const T* sv, const T* sq, const T* sdo, const float* slse,
                                           const float* sdelta, int warp, int m0, int key_g, int Nq, int end,
                                           int shift, int causal, float sl, int lane) {
  constexpr int QN = bwd_tile<D>() / 8, LDS = ld_of<bwd_tile<D>()>();
  float dst[QN][4];  // dSᵀ: version 4's step, which this one extends by storing it for dQ
  dkdv_tile_ds<T, D, MASK>(dk, dv, dst, sk, sv, sq, sdo, slse, sdelta, warp, m0, key_g, Nq, end,
                           shift, causal, sl, lane);
  // ### BEGIN SOLUTION
  // dSᵀ rows of this warp's keys, queries along the row: 32-bit stores of a lane's pairs
  const int r = warp * 16 + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < QN; ++j) {
    *reinterpret_cast<uint32_t*>(sds + r * LDS + j * 8 + c) = pack2<T>(dst[j][0], dst[j][1]);
    *reinterpret_cast<uint32_t*>(sds + (r + 8) * LDS + j * 8 + c) = pack2<T>(dst[j][2], dst[j][3]);
  }
  // ### END SOLUTION
}

// A warp's rows of the dS tile for keys no query of the tile sees: zeros (step 3 reads
// every key row of the block up to the job's bound).
template <typename T, int D>
__device__ __forceinline__ void fused_zero_ds(T* sds, int warp, int lane) {
  constexpr int LDS = ld_of<bwd_tile<D>()>();
  for (int e = lane; e < 16 * bwd_tile<D>() / 2; e += 32) {
    const int r = e / (bwd_tile<D>() / 2), c = 2 * (e % (bwd_tile<D>() / 2));
    *reinterpret_cast<uint32_t*>(sds + (warp * 16 + r) * LDS + c) = 0u;
  }
}

// Two adjacent fp32 values added into global memory: one 8-byte red on sm_90, two elsewhere.
__device__ __forceinline__ void add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// Step 3 and 4 for query tile m0 of head bh: dQ_tile += dS K over this block's keys
// [n0, n0 + block_n), the warps taking 16-query x JW-column jobs in turn.
template <typename T, int D>
__device__ __forceinline__ void fused_dq(const T* sds, const T* sk, float* __restrict__ dq_head, int m0, int n0,
                                         int block_n, int Nq, int end, int shift, int causal, int warp,
                                         int warps, int lane) {
  constexpr int QT = bwd_tile<D>(), JW = D < 32 ? D : 32, NJ = JW / 8, CJ = D / JW, JOBS = (QT / 16) * CJ;
  static_assert(NJ % 2 == 0, "K's ldmatrix.trans gives two n8 tiles at a time");
  for (int job = warp; job < JOBS; job += warps) {
    const int mt = job / CJ, c0 = (job % CJ) * JW, q0 = m0 + mt * 16;
    // the keys these 16 queries can see, of the block's: [n0, n0 + kend)
    int kend = min(block_n, end - n0);
    if (causal) kend = min(kend, q0 + 15 + shift - n0 + 1);
    if (q0 >= Nq || kend <= 0) continue;
    float acc[NJ][4];
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj) acc[nj][0] = acc[nj][1] = acc[nj][2] = acc[nj][3] = 0.0f;
#pragma unroll 1
    for (int kc = 0; kc < (kend + 15) / 16; ++kc) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, b_addr<QT>(sds, kc * 16, mt * 16, lane));  // dS (queries x keys) as A
#pragma unroll
      for (int nj = 0; nj < NJ; nj += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, a_addr<D>(sk, kc * 16, c0 + nj * 8, lane));  // K (keys x D) as B
        mma_16816<T>(acc[nj], a, b[0], b[1]);
        mma_16816<T>(acc[nj + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + (lane >> 2) + 8 * h;
      if (row < Nq) {
#pragma unroll
        for (int nj = 0; nj < NJ; ++nj)
          add2(dq_head + (int64_t)row * D + c0 + nj * 8 + 2 * (lane & 3), acc[nj][2 * h], acc[nj][2 * h + 1]);
      }
    }
  }
}

// Block: W warps (4 or 8), 16 W keys: v4's dK/dV kernel (ASYNC) plus steps 2-4 above.
// Shared: K, V [16 W][D+8]; 2 x (Q, dO [QT][D+8]); 2 x (lse, delta [QT]) fp32; then the dS
// tile [16 W][QT+8].
template <typename T, int D, bool ROPE>
__global__ void __launch_bounds__(256) attn_bwd_fused_kernel(Params p) {
  constexpr int LD = ld_of<D>(), QT = bwd_tile<D>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = blockDim.x >> 5, block_n = warps * 16;
  T* sk = reinterpret_cast<T*>(smem_raw);
  T* sv = sk + block_n * LD;
  T* sq = sv + block_n * LD;           // [2][QT][LD]
  T* sdo = sq + 2 * QT * LD;           // [2][QT][LD]
  float* slse = reinterpret_cast<float*>(sdo + 2 * QT * LD);  // [2][QT]
  float* sdelta = slse + 2 * QT;                               // [2][QT]
  T* sds = reinterpret_cast<T*>(sdelta + 2 * QT);              // [block_n][QT + 8]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int Nq = (int)p.Nq, Nk = (int)p.Nk, causal = p.causal;
  const float sl = p.scale_log2;
  int64_t bhk, nb;  // bhk: batch x K/V head
  block_coords(cdiv(Nk, block_n), false, bhk, nb);
  const int n0 = (int)nb * block_n;
  const int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv, bh0 = b * p.H + hk * p.group;
  const Keys keys = keys_of(p, b);
  const int end = (int)keys.end, shift = (int)keys.shift;
  const int t_first = causal ? max(0, n0 - shift) / QT : 0;
  const int t_end = (Nq + QT - 1) / QT;
  const int per_head = n0 < end ? max(0, t_end - t_first) : 0, steps = (int)p.group * per_head;
  // step s: head s / per_head, tile t_first + (s + rot) % per_head (the staggered start)
  const int rot = per_head > 0 ? (int)(nb % per_head) : 0;
  auto tile_of = [&](int s) { return t_first + (s % per_head + rot) % per_head; };

  const int64_t k_off = b * p.k.sb + hk * p.k.sh, v_off = b * p.v.sb + hk * p.v.sh;
  load_tile<T, D, 128, true>(sk, static_cast<const T*>(p.k.ptr) + k_off, p.k.sn, n0, Nk, block_n);
  load_tile<T, D, 128, true>(sv, static_cast<const T*>(p.v.ptr) + v_off, p.v.sn, n0, Nk, block_n);
  if (steps > 0)
    dkdv_load_queries<T, D, true>(sq, sdo, slse, sdelta, head_of<T>(p.q, bh0, p.H), head_of<T>(p.dout, bh0, p.H),
                                  bh0, tile_of(0) * QT, p);
  cp_async_commit();  // group: K, V and the first query tile
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;
  const int warp_key0 = n0 + warp * 16, key_g = warp_key0 + (lane >> 2);

  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
    const int64_t bh = bh0 + step / per_head;
    const int m0 = tile_of(step) * QT;
    if (step + 1 < steps) {
      const int ns = stage ^ 1;
      const int64_t nbh = bh0 + (step + 1) / per_head;
      dkdv_load_queries<T, D, true>(sq + ns * QT * LD, sdo + ns * QT * LD, slse + ns * QT, sdelta + ns * QT,
                                    head_of<T>(p.q, nbh, p.H), head_of<T>(p.dout, nbh, p.H), nbh,
                                    tile_of(step + 1) * QT, p);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (ROPE) {  // K once (it landed with the first step), and each Q tile
      if (step == 0) rope_tile<T, D>(sk, n0, Nk, block_n, 0, p);
      rope_tile<T, D>(sq + stage * QT * LD, m0, Nq, QT, p.rope_qoff, p);
      __syncthreads();
    }
    const T* sqt = sq + stage * QT * LD;
    const T* sdot = sdo + stage * QT * LD;
    const float* slt = slse + stage * QT;
    const float* sdt = sdelta + stage * QT;
    const bool above = warp_key0 >= end || (causal && m0 + QT - 1 + shift < warp_key0);
    const bool needs_mask = m0 + QT > Nq || warp_key0 + 15 >= end || (causal && m0 + shift < warp_key0 + 15);
    if (above)
      fused_zero_ds<T, D>(sds, warp, lane);
    else if (needs_mask)
      fused_tile<T, D, true>(dk, dv, sds, sk, sv, sqt, sdot, slt, sdt, warp, m0, key_g, Nq, end, shift, causal, sl,
                             lane);
    else
      fused_tile<T, D, false>(dk, dv, sds, sk, sv, sqt, sdot, slt, sdt, warp, m0, key_g, Nq, end, shift, causal, sl,
                              lane);
    __syncthreads();  // the dS tile is whole
    fused_dq<T, D>(sds, sk, p.dq_accum + bh * p.Nq * D, m0, n0, block_n, Nq, end, shift, causal, warp, warps, lane);
    __syncthreads();  // the stage and the dS tile are free again
  }
  cp_async_wait<0>();
  if (steps == 0) __syncthreads();  // K's loads by other threads landed before it is staged over
  const int64_t out0 = bhk * p.Nk * D;
  if constexpr (ROPE) rope_unrotate_acc<T, D>(dk, key_g, Nk, 0, p, lane);
  store_rows<T, D>(sk + warp * 16 * LD, dk, p.scale, p.scale, static_cast<T*>(p.dk) + out0, warp_key0, Nk, lane);
  store_rows<T, D>(sv + warp * 16 * LD, dv, 1.0f, 1.0f, static_cast<T*>(p.dv) + out0, warp_key0, Nk, lane);
}

// dq = scale · dq_accum, (RoPE) turned back by minus the query's angle, rounded to T: one
// thread per pair of features (the pair RoPE turns together; without RoPE two adjacent ones).
template <typename T, bool ROPE>
__global__ void attn_bwd_dq_convert_kernel(Params p) {
  const int half = p.D >> 1;
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= p.BH * p.Nq * half) return;
  const int64_t row = idx / half;
  const int i = (int)(idx % half);
  const float* acc = p.dq_accum + row * p.D;
  T* dq = static_cast<T*>(p.dq) + row * p.D;
  if constexpr (ROPE) {
    const int f1 = p.rope_interleaved ? 2 * i : i, f2 = p.rope_interleaved ? 2 * i + 1 : i + half;
    const float2 cs = rope_cs<T>(p, row % p.Nq + p.rope_qoff, i);
    const float a = acc[f1], b = acc[f2];
    dq[f1] = from_f32<T>((a * cs.x + b * cs.y) * p.scale);
    dq[f2] = from_f32<T>((b * cs.x - a * cs.y) * p.scale);
  } else {
    const float2 a = reinterpret_cast<const float2*>(acc)[i];
    reinterpret_cast<uint32_t*>(dq)[i] = pack2<T>(a.x * p.scale, a.y * p.scale);
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

// Warps per block of the tensor-core kernels: 8 (128 rows) when the 128-row blocks alone
// give every SM at least one, else 4 (64 rows: twice the blocks for a small problem).
inline int mma_warps(int64_t BH, int64_t N) { return BH * cdiv(N, 128) >= num_sms() ? 8 : 4; }

// Above 48 KB of dynamic shared memory a kernel must opt in: once per device, kernel and size
// (levels_smem_opt_in_once, common.cuh).
template <typename K>
int opt_in(K kernel, int bytes) {
  if (bytes <= 48 * 1024) return 0;
  return (int)levels_smem_opt_in_once(reinterpret_cast<const void*>(kernel), bytes);
}

inline bool grid_ok(int64_t blocks) { return blocks > 0 && blocks <= 0x7fffffff; }

template <typename T, int D, bool ROPE>
int launch_fwd_v2(const Params& p, cudaStream_t stream) {
  const int64_t blocks = p.BH * cdiv(p.Nq, CcShape<D>::ROWS);
  if (!grid_ok(blocks)) return LEVELS_UNSUPPORTED;
  attn_fwd_v2_kernel<T, D, ROPE><<<(unsigned)blocks, CC_THREADS, 0, stream>>>(p);
  return levels_launch_status();
}

template <typename T, int D, bool ASYNC, bool ROPE>
int launch_fwd_mma(const Params& p, cudaStream_t stream) {
  const int warps = mma_warps(p.BH, p.Nq), block_m = warps * 16, stages = ASYNC ? 2 : 1;
  const int smem = (block_m + 2 * stages * FWD_BN) * ld_of<D>() * (int)sizeof(T);
  const int smem_max = (128 + 2 * stages * FWD_BN) * ld_of<D>() * (int)sizeof(T);
  if (int err = opt_in(attn_fwd_mma_kernel<T, D, ASYNC, ROPE>, smem_max)) return err;
  const int64_t blocks = p.BH * cdiv(p.Nq, block_m);
  if (!grid_ok(blocks)) return LEVELS_UNSUPPORTED;
  attn_fwd_mma_kernel<T, D, ASYNC, ROPE><<<(unsigned)blocks, warps * 32, smem, stream>>>(p);
  return levels_launch_status();
}

// v5: 4 warps (128 rows) when the 128-row blocks give every SM at least one, else 2 (64).
inline int v5_warps(int64_t BH, int64_t N) { return BH * cdiv(N, 128) >= num_sms() ? 4 : 2; }

template <typename T, int D, bool ROPE>
int launch_fwd_v5(const Params& p, cudaStream_t stream) {
  constexpr int V5_BN = v5_bn<D>();
  const int warps = v5_warps(p.BH, p.Nq), block_m = warps * 32;
  const int smem = (block_m + 4 * V5_BN) * ld_of<D>() * (int)sizeof(T);
  const int smem_max = (128 + 4 * V5_BN) * ld_of<D>() * (int)sizeof(T);
  if (int err = opt_in(attn_fwd_v5_kernel<T, D, ROPE>, smem_max)) return err;
  const int64_t blocks = p.BH * cdiv(p.Nq, block_m);
  if (!grid_ok(blocks)) return LEVELS_UNSUPPORTED;
  attn_fwd_v5_kernel<T, D, ROPE><<<(unsigned)blocks, warps * 32, smem, stream>>>(p);
  return levels_launch_status();
}

// v6: 2 warpgroups (128 rows) when the 128-row blocks give every SM at least one, else 1
// (64 rows), as v5. Hopper only: checked here, before anything is launched.
inline int v6_warpgroups(int64_t BH, int64_t N) { return BH * cdiv(N, 128) >= num_sms() ? 2 : 1; }
template <int D> constexpr int v6_smem(int block_m) {
  return (block_m + 2 * V6_STAGES * V6_BN) * D * 2 + 1024;  // + the 1 KB alignment slack
}

inline bool on_sm90() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major == 9;
}

template <typename T, int D>
int launch_fwd_v6(const Params& p, cudaStream_t stream) {
  if (!on_sm90()) return LEVELS_BAD_ARCH;  // wgmma exists on sm_90 only
  const int wgs = v6_warpgroups(p.BH, p.Nq), block_m = wgs * 64;
  static_assert(v6_smem<128>(128) <= 227 * 1024, "the 3-stage ring fits an H100's shared memory");
  if (int err = opt_in(attn_fwd_v6_kernel<T, D>, v6_smem<D>(128))) return err;
  const int64_t blocks = p.BH * cdiv(p.Nq, block_m);
  if (!grid_ok(blocks)) return LEVELS_UNSUPPORTED;
  attn_fwd_v6_kernel<T, D><<<(unsigned)blocks, wgs * 128, v6_smem<D>(block_m), stream>>>(p);
  return levels_launch_status();
}

template <typename T, int D, bool ROPE>
int launch_bwd_cc(const Params& p, cudaStream_t stream) {
  const int64_t kblocks = p.BH / p.group * cdiv(p.Nk, CcShape<D>::ROWS);  // per K/V head
  const int64_t qblocks = p.BH * cdiv(p.Nq, CcShape<D>::ROWS);
  if (!grid_ok(kblocks) || !grid_ok(qblocks)) return LEVELS_UNSUPPORTED;
  attn_bwd_dkdv_cc_kernel<T, D, ROPE><<<(unsigned)kblocks, CC_THREADS, 0, stream>>>(p);
  attn_bwd_dq_cc_kernel<T, D, ROPE><<<(unsigned)qblocks, CC_THREADS, 0, stream>>>(p);
  return levels_launch_status();
}

template <typename T, int D, bool ASYNC, bool ROPE>
int launch_bwd_mma(const Params& p, cudaStream_t stream) {
  constexpr int LD = ld_of<D>(), QT = bwd_tile<D>(), S = ASYNC ? 2 : 1;
  // dK/dV: K, V blocks + staged Q, dO tiles + staged lse, delta
  const int64_t BHkv = p.BH / p.group;  // the dK/dV grid: one block per key block of a K/V head
  const int wk = mma_warps(BHkv, p.Nk), wq = mma_warps(p.BH, p.Nq);
  const int smem_kv = (2 * wk * 16 + 2 * S * QT) * LD * (int)sizeof(T) + 2 * S * QT * 4;
  const int smem_kv_max = (2 * 128 + 2 * S * QT) * LD * (int)sizeof(T) + 2 * S * QT * 4;
  const int smem_q = (2 * wq * 16 + 2 * S * QT) * LD * (int)sizeof(T);
  const int smem_q_max = (2 * 128 + 2 * S * QT) * LD * (int)sizeof(T);
  if (int err = opt_in(attn_bwd_dkdv_mma_kernel<T, D, ASYNC, ROPE>, smem_kv_max)) return err;
  if (int err = opt_in(attn_bwd_dq_mma_kernel<T, D, ASYNC, ROPE>, smem_q_max)) return err;
  const int64_t kblocks = BHkv * cdiv(p.Nk, wk * 16), qblocks = p.BH * cdiv(p.Nq, wq * 16);
  if (!grid_ok(kblocks) || !grid_ok(qblocks)) return LEVELS_UNSUPPORTED;
  attn_bwd_dkdv_mma_kernel<T, D, ASYNC, ROPE><<<(unsigned)kblocks, wk * 32, smem_kv, stream>>>(p);
  attn_bwd_dq_mma_kernel<T, D, ASYNC, ROPE><<<(unsigned)qblocks, wq * 32, smem_q, stream>>>(p);
  return levels_launch_status();
}

// v7's backward: the fused kernel over key blocks (warps as v4's dK/dV kernel), then the
// workspace -> dq conversion. The binding hands over dq_accum zeroed.
template <typename T, int D, bool ROPE>
int launch_bwd_fused(const Params& p, cudaStream_t stream) {
  constexpr int LD = ld_of<D>(), QT = bwd_tile<D>();
  if (p.dq_accum == nullptr) return LEVELS_UNSUPPORTED;
  const int64_t BHkv = p.BH / p.group;
  const int wk = mma_warps(BHkv, p.Nk);
  auto smem_of = [](int block_n) {
    return (2 * block_n + 4 * QT) * LD * (int)sizeof(T) + 4 * QT * 4 + block_n * ld_of<QT>() * (int)sizeof(T);
  };
  if (int err = opt_in(attn_bwd_fused_kernel<T, D, ROPE>, smem_of(128))) return err;
  const int64_t kblocks = BHkv * cdiv(p.Nk, wk * 16), pairs = p.BH * p.Nq * (p.D / 2);
  if (!grid_ok(kblocks) || !grid_ok(cdiv(pairs, 256))) return LEVELS_UNSUPPORTED;
  attn_bwd_fused_kernel<T, D, ROPE><<<(unsigned)kblocks, wk * 32, smem_of(wk * 16), stream>>>(p);
  attn_bwd_dq_convert_kernel<T, ROPE><<<(unsigned)cdiv(pairs, 256), 256, 0, stream>>>(p);
  return levels_launch_status();
}

// v3/v4 read every operand in 16-byte chunks: the base 16-byte aligned and every stride of
// a dimension longer than 1 a multiple of 8 elements (a size-1 dimension's stride is
// never multiplied by anything but 0).
inline bool chunks_ok(const Operand& t, int64_t B, int64_t H, int64_t N) {
  return reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && (B == 1 || t.sb % 8 == 0) &&
         (H == 1 || t.sh % 8 == 0) && (N == 1 || t.sn % 8 == 0);
}

// The head dim D as a template argument: one register tile spans it.
#define LEVELS_ATTN_HEAD_DIM(D_RUNTIME, D, ...)   \
  switch (D_RUNTIME) {                            \
    case 16: { constexpr int D = 16; __VA_ARGS__; } \
    case 32: { constexpr int D = 32; __VA_ARGS__; } \
    case 64: { constexpr int D = 64; __VA_ARGS__; } \
    case 128: { constexpr int D = 128; __VA_ARGS__; } \
    default: return LEVELS_UNSUPPORTED;           \
  }

// The same with RoPE: the head sizes models rotate (Llama's 64 and 128) only, so that the
// flag doubles a quarter of the tensor-core kernels and not all of them (build time).
#define LEVELS_ATTN_ROPE_HEAD_DIM(D_RUNTIME, D, ...)  \
  switch (D_RUNTIME) {                                \
    case 64: { constexpr int D = 64; __VA_ARGS__; }   \
    case 128: { constexpr int D = 128; __VA_ARGS__; } \
    default: return LEVELS_UNSUPPORTED;               \
  }
#define LEVELS_ATTN_TC_HEAD_DIM(ROPE, D_RUNTIME, D, ...)                          \
  if constexpr (ROPE) { LEVELS_ATTN_ROPE_HEAD_DIM(D_RUNTIME, D, __VA_ARGS__) } \
  else { LEVELS_ATTN_HEAD_DIM(D_RUNTIME, D, __VA_ARGS__) }

// The CUDA-core kernels' tile width: the head size rounded up to a power of two (8..256).
#define LEVELS_ATTN_CC_TILE(D_RUNTIME, D, ...)          \
  if (D_RUNTIME <= 8) { constexpr int D = 8; __VA_ARGS__; }     \
  if (D_RUNTIME <= 16) { constexpr int D = 16; __VA_ARGS__; }   \
  if (D_RUNTIME <= 32) { constexpr int D = 32; __VA_ARGS__; }   \
  if (D_RUNTIME <= 64) { constexpr int D = 64; __VA_ARGS__; }   \
  if (D_RUNTIME <= 128) { constexpr int D = 128; __VA_ARGS__; } \
  if (D_RUNTIME <= 256) { constexpr int D = 256; __VA_ARGS__; } \
  return LEVELS_UNSUPPORTED;

// What only v1, v2 and the CUDA-core backward run (the top of the file): a head size the
// tensor-core kernels are not instantiated for.
inline bool grown(const Params& p) { return !(p.D == 16 || p.D == 32 || p.D == 64 || p.D == 128); }

template <typename T, bool ROPE>
int forward_with(int version, const Params& p, int64_t B, cudaStream_t stream) {
  if (version == 1) {
    const int64_t blocks = cdiv(p.BH * p.Nq, 128);
    if (!grid_ok(blocks)) return LEVELS_UNSUPPORTED;
    attn_fwd_v1_kernel<T, ROPE><<<(unsigned)blocks, 128, 0, stream>>>(p);
    return levels_launch_status();
  }
  // fp32 at v3-v5 runs v2: exact fp32 FMAs, declared in cuda_kernels/attention.py
  if (version == 2 || std::is_same<T, float>::value) {
    LEVELS_ATTN_CC_TILE(p.D, D, return launch_fwd_v2<T, D, ROPE>(p, stream));
  }
  if (grown(p)) return LEVELS_UNSUPPORTED;  // cuda_kernels/attention.py says why, and runs v2
  if constexpr (!std::is_same<T, float>::value) {
    if (!chunks_ok(p.q, B, p.H, p.Nq) || !chunks_ok(p.k, B, p.Hkv, p.Nk) || !chunks_ok(p.v, B, p.Hkv, p.Nk))
      return LEVELS_UNSUPPORTED;
    if (version == 3) { LEVELS_ATTN_TC_HEAD_DIM(ROPE, p.D, D, return launch_fwd_mma<T, D, false, ROPE>(p, stream)); }
    if (version == 5) { LEVELS_ATTN_TC_HEAD_DIM(ROPE, p.D, D, return launch_fwd_v5<T, D, ROPE>(p, stream)); }
    // v7's forward is the fastest measured one (attention.py default_version): v6's on sm_90
    // at D = 128 without RoPE, v5's for everything else (v7 adds a backward, not a forward)
    if (version == 7) {
      if (!ROPE && p.D == 128 && on_sm90()) return launch_fwd_v6<T, 128>(p, stream);
      LEVELS_ATTN_TC_HEAD_DIM(ROPE, p.D, D, return launch_fwd_v5<T, D, ROPE>(p, stream));
    }
    if (version == 6) {  // no RoPE and D in {64, 128} (the top of v6's section says why)
      if constexpr (ROPE) return LEVELS_UNSUPPORTED;
      if (p.D == 64) return launch_fwd_v6<T, 64>(p, stream);
      if (p.D == 128) return launch_fwd_v6<T, 128>(p, stream);
      return LEVELS_UNSUPPORTED;
    }
    LEVELS_ATTN_TC_HEAD_DIM(ROPE, p.D, D, return launch_fwd_mma<T, D, true, ROPE>(p, stream));
  }
  return LEVELS_UNSUPPORTED;  // not reached
}

// Every kernel exists twice: without RoPE (the code it was before RoPE came) and with it.
template <typename T>
int forward(int version, const Params& p, int64_t B, cudaStream_t stream) {
  return p.rope_cos != nullptr ? forward_with<T, true>(version, p, B, stream)
                               : forward_with<T, false>(version, p, B, stream);
}

template <typename T, bool ROPE>
int backward_with(int version, const Params& p, int64_t B, cudaStream_t stream) {
  const int64_t pre_blocks = cdiv(p.BH * p.Nq, 8);
  if (!grid_ok(pre_blocks)) return LEVELS_UNSUPPORTED;
  attn_bwd_preprocess_kernel<T><<<(unsigned)pre_blocks, 256, 0, stream>>>(p);
  if (int err = levels_launch_status()) return err;
  if (version <= 2 || std::is_same<T, float>::value) {
    LEVELS_ATTN_CC_TILE(p.D, D, return launch_bwd_cc<T, D, ROPE>(p, stream));
  }
  if (grown(p)) return LEVELS_UNSUPPORTED;
  if constexpr (!std::is_same<T, float>::value) {
    if (!chunks_ok(p.q, B, p.H, p.Nq) || !chunks_ok(p.k, B, p.Hkv, p.Nk) || !chunks_ok(p.v, B, p.Hkv, p.Nk) ||
        !chunks_ok(p.dout, B, p.H, p.Nq))
      return LEVELS_UNSUPPORTED;
    if (version == 3) { LEVELS_ATTN_TC_HEAD_DIM(ROPE, p.D, D, return launch_bwd_mma<T, D, false, ROPE>(p, stream)); }
    if (version == 7) { LEVELS_ATTN_TC_HEAD_DIM(ROPE, p.D, D, return launch_bwd_fused<T, D, ROPE>(p, stream)); }
    // v4, v5 and v6 (same lse and outputs): the double-buffered, causal-skipping mma backward
    LEVELS_ATTN_TC_HEAD_DIM(ROPE, p.D, D, return launch_bwd_mma<T, D, true, ROPE>(p, stream));
  }
  return LEVELS_UNSUPPORTED;  // not reached
}

template <typename T>
int backward(int version, const Params& p, int64_t B, cudaStream_t stream) {
  return p.rope_cos != nullptr ? backward_with<T, true>(version, p, B, stream)
                               : backward_with<T, false>(version, p, B, stream);
}

inline Operand operand(const void* ptr, int64_t sb, int64_t sh, int64_t sn) { return Operand{ptr, sb, sh, sn}; }

// The RoPE tables into p (cos null: no rope). False if the kernels cannot take them: an odd
// head size or a negative query offset (the binding refuses both with a message first).
inline bool set_rope(Params& p, const void* cos, int64_t csr, int64_t csc, const void* sin, int64_t ssr,
                     int64_t ssc, int64_t qoff, int interleaved) {
  p.rope_cos = cos;
  p.rope_sin = sin;
  p.rope_cos_sr = csr;
  p.rope_cos_sc = csc;
  p.rope_sin_sr = ssr;
  p.rope_sin_sc = ssc;
  p.rope_qoff = qoff;
  p.rope_interleaved = interleaved ? 1 : 0;
  return cos == nullptr || (sin != nullptr && p.D % 2 == 0 && qoff >= 0);
}

}  // namespace levels_attention
#endif  // LEVELS_ATTENTION_KERNELS_

#ifndef LEVELS_ATTENTION_BACKWARD_UNIT  // this file alone: the forward

// Forward: out (B, H, Nq, D) contiguous and lse (B, H, Nq) fp32 (base 2, see the top).
// q (B, H, Nq, D), k and v (B, H, Nk, D) with element strides (batch, head, row) and
// stride 1 along D (k, v: Hkv heads, Hkv dividing H). scratch: v1 only, B*H*Nq*Nk fp32 (may
// be null for other versions). kv_lens: (B,) int32 or null; bottom_right: the causal diagonal's
// alignment. Returns a LevelsStatus (LEVELS_UNSUPPORTED: a grown case at v3-v6, or RoPE or
// D not in {64, 128} at v6; LEVELS_BAD_ARCH: v6 off sm_90).
extern "C" int levels_attention_fwd(int dtype, int version,
                                    const void* q, int64_t sqb, int64_t sqh, int64_t sqn,
                                    const void* k, int64_t skb, int64_t skh, int64_t skn,
                                    const void* v, int64_t svb, int64_t svh, int64_t svn,
                                    void* out, float* lse, float* scratch,
                                    int64_t B, int64_t H, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t D,
                                    int causal, int bottom_right, const int* kv_lens, float scale,
                                    const void* rope_cos, int64_t scr, int64_t scc,
                                    const void* rope_sin, int64_t ssr, int64_t ssc,
                                    int64_t rope_qoff, int rope_interleaved,
                                    cudaStream_t stream) {
  using namespace levels_attention;
  if (version < 1 || version > 7) return LEVELS_BAD_VERSION;
  // Nothing to compute (the binding fills an output with no key to see): no empty grid.
  if (B <= 0 || H <= 0 || Nq <= 0 || Nk <= 0) return LEVELS_OK;
  // Positions inside a head are int in the tensor-core kernels: sequences below 2**30.
  if (Hkv <= 0 || H % Hkv != 0 || D <= 0 || D > 256 || Nq >= (1 << 30) || Nk >= (1 << 30) ||
      (version == 1 && scratch == nullptr))
    return LEVELS_UNSUPPORTED;
  Params p{};
  p.q = operand(q, sqb, sqh, sqn);
  p.k = operand(k, skb, skh, skn);
  p.v = operand(v, svb, svh, svn);
  p.out = out;
  p.lse = lse;
  p.scratch = scratch;
  p.H = H;
  p.BH = B * H;
  p.Hkv = Hkv;
  p.group = H / Hkv;
  p.kv_lens = kv_lens;
  p.bottom_right = bottom_right ? 1 : 0;
  p.Nq = Nq;
  p.Nk = Nk;
  p.D = (int)D;
  p.causal = causal ? 1 : 0;
  p.scale = scale;
  p.scale_log2 = scale * LOG2E;
  if (!set_rope(p, rope_cos, scr, scc, rope_sin, ssr, ssc, rope_qoff, rope_interleaved)) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, T, return forward<T>(version, p, B, stream));
  return LEVELS_OK;  // not reached
}

#else  // included by attention_backward.cu: the backward
// Backward: dq (B, H, Nq, D), dk and dv (B, H, Nk, D), contiguous. dout and out (B, H,
// Nq, D) with strides like q; lse from the forward; delta a (B*H*Nq) fp32 scratch.
// Version 1-2 (and fp32): the CUDA-core kernels; 3: mma.sync; 4, 5 and 6: mma.sync +
// cp.async + causal block skipping; 7 (16-bit): the fused kernel, which adds dQ into
// dq_accum, a zeroed (B, H, Nq, D) fp32 workspace (null for the others: LEVELS_UNSUPPORTED
// at 7). Returns a LevelsStatus.
extern "C" int levels_attention_bwd(int dtype, int version,
                                    const void* dout, int64_t sdb, int64_t sdh, int64_t sdn,
                                    const void* q, int64_t sqb, int64_t sqh, int64_t sqn,
                                    const void* k, int64_t skb, int64_t skh, int64_t skn,
                                    const void* v, int64_t svb, int64_t svh, int64_t svn,
                                    const void* out, int64_t sob, int64_t soh, int64_t son,
                                    const float* lse, float* delta, void* dq, void* dk, void* dv, float* dq_accum,
                                    int64_t B, int64_t H, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t D,
                                    int causal, int bottom_right, const int* kv_lens, float scale,
                                    const void* rope_cos, int64_t scr, int64_t scc,
                                    const void* rope_sin, int64_t ssr, int64_t ssc,
                                    int64_t rope_qoff, int rope_interleaved,
                                    cudaStream_t stream) {
  using namespace levels_attention;
  if (version < 1 || version > 7) return LEVELS_BAD_VERSION;
  if (B <= 0 || H <= 0 || Nq <= 0 || Nk <= 0) return LEVELS_OK;  // the binding zeroes the gradients
  if (Hkv <= 0 || H % Hkv != 0 || D <= 0 || D > 256 || Nq >= (1 << 30) || Nk >= (1 << 30))
    return LEVELS_UNSUPPORTED;
  Params p{};
  p.q = operand(q, sqb, sqh, sqn);
  p.k = operand(k, skb, skh, skn);
  p.v = operand(v, svb, svh, svn);
  p.o = operand(out, sob, soh, son);
  p.dout = operand(dout, sdb, sdh, sdn);
  p.lse = const_cast<float*>(lse);  // read only by the backward kernels
  p.delta = delta;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.dq_accum = dq_accum;  // v7 (16-bit): zeroed (B, H, Nq, D) fp32; null otherwise
  p.H = H;
  p.BH = B * H;
  p.Hkv = Hkv;
  p.group = H / Hkv;
  p.kv_lens = kv_lens;
  p.bottom_right = bottom_right ? 1 : 0;
  p.Nq = Nq;
  p.Nk = Nk;
  p.D = (int)D;
  p.causal = causal ? 1 : 0;
  p.scale = scale;
  p.scale_log2 = scale * LOG2E;
  if (!set_rope(p, rope_cos, scr, scc, rope_sin, ssr, ssc, rope_qoff, rope_interleaved)) return LEVELS_UNSUPPORTED;
  LEVELS_DISPATCH(dtype, T, return backward<T>(version, p, B, stream));
  return LEVELS_OK;  // not reached
}
#endif  // LEVELS_ATTENTION_BACKWARD_UNIT
