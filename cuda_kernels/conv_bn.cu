// conv_bn.cu — Conv2d followed by BatchNorm2d, in CUDA C++ (Level 5). Pure CUDA: no torch header.
//
// The convolution is the expensive part (2 * P * C_out * K flops with P = N*H_out*W_out output
// pixels and K = kH*kW*C_in); BatchNorm is per-channel arithmetic around it. The ladder is a
// ladder of convolution kernels:
//
//   v1  direct convolution, one thread per output element (n, h, w, o): the formula,
//       literally. Every thread re-reads its kH*kW*C_in inputs and weights from global
//       memory (L1/L2 absorb most of it); nothing is shared between threads.
//       Costs: about 2 loads per multiply-add. Exact fp32 arithmetic.
//   v2  implicit GEMM with shared-memory tiles on CUDA cores: out[p, o] = sum_k A[p, k]
//       B[k, o] with A = im2col(x), which is never built: each 64x64 block of outputs
//       gathers its 64x16 slice of A straight from x (zeros at the padding) and its
//       16x64 slice of B from the weight into shared memory, and every thread computes
//       a 4x4 register tile from them, so one load from global memory now feeds 64
//       (A) or 64 (B) multiply-adds instead of one. Exact fp32 arithmetic.
//       Costs: a gather with an index decode per element; CUDA cores only (~60 TFLOP/s
//       peak fp32 on an H100, against ~990 dense bf16 on the tensor cores).
//   v3  implicit GEMM on the tensor cores (WMMA 16x16x16 fragments, fp16/bf16 operands,
//       fp32 accumulation), 128x128x32 block tiles, the A and B tiles copied global ->
//       shared with cp.async (16 bytes per copy, zero-filled at the padding) in a
//       4-stage pipeline, so the copies of tiles t+1..t+3 are in flight while the tensor cores
//       work on tile t; BatchNorm (eval) folded into the weight and a per-channel bias
//       added in the epilogue. Costs: 16-byte copies need C_in % 8 == 0 and 16-byte
//       aligned rows (otherwise a scalar gather path fills the same tiles, slower);
//       80 KB of shared memory per block. fp32 inputs fall back to v2 (exact
//       fp32, see "fp32 and TF32" below). Its backward is version 2's.
//   v4  v3 plus the backward on the tensor cores, and 1x1 convolutions as plain GEMMs.
//       Everything else is v3's; three things change (16-bit inputs, sm_80+):
//       * dgrad (dx, a transposed convolution) is an implicit GEMM over the input pixels
//         with the reduction over (tap, C_out), gathered from dy with cp.async. With stride
//         > 1 an input pixel only meets the taps of its *phase* (h mod sh, w mod sw), so one
//         GEMM runs per phase, over that phase's pixels and taps only (dgrad_kernel): no
//         product with a zero is spent, no tap is masked. The weight is read in place as
//         the (tap, C_out) x C_in operand: 8 neighbouring input channels of w are 16 bytes.
//       * wgrad (dw) is the GEMM G = dy^T im2col(x) with the reduction over the pixels,
//         split into chunks (about two blocks per SM) whose fp32 partials
//         wgrad_finish_kernel adds (deterministic). Both operands arrive pixel-major, and
//         the tiles stay that way in shared memory (col_major / row_major fragments).
//       * 1x1 stride-1 unpadded convolutions (half of ResNet-50's) skip the gather: the
//         forward out = x w^T and the dgrad dx = dy w are gemm.cu's levels_gemm_matmul at
//         its best version for the GPU (6: TMA + wgmma on sm_90, else 4: mma.sync), which
//         reads K-major operands only: x (P, C_in) and w as they are, w^T made by a small
//         transpose kernel. 1x1 wgrad stays wgrad_kernel: its two operands run along the
//         pixels (N-major for a GEMM over C_out x C_in), which the GEMM could read only
//         after transposing both activations (3x the memory traffic of a product that is
//         memory-bound), and it needs the pixel split, which the GEMM has not. Strided 1x1
//         convolutions (ResNet's downsampling shortcuts) take the implicit kernels: their
//         pixels are no single-stride matrix; their dgrad is the phase (0, 0) GEMM over
//         C_out, the other phases a write of zeros.
//       Costs: more launches (sh*sw for dgrad, a transpose for 1x1 dgrad), an fp32 partial
//       (splits x C_out x K) for wgrad, the eval 1x1 bias rounded to the input dtype once
//       (gemm.cu's bias operand), and the layout rules of v3 (C_in or C_out % 8 == 0 and
//       aligned rows for the 16-byte copies; else scalar gathers fill the same tiles).
//   v5  v4 with a forward whose tiles fit the problem. v3's one 128x128 tile wastes half its
//       width on C_out = 64 and leaves most SMs idle on ResNet's 14x14 and 7x7 layers (98
//       and 52 blocks on 132 SMs; H100: 0.57x, 0.48x, 0.22x cuDNN at 56x56 64ch, 14x14 and
//       7x7). Two ideas (16-bit inputs on the 16-byte path; "Version 5" below):
//       * the tile is chosen per call from P, C_out and the SM count (conv_bn_plan.h, one
//         rule a CPU test checks): 128x128 when its blocks fill the GPU, else 128x64, else
//         64x64; when even 64x64 does not, K is cut into slices (split-K), each block one
//         (tile, slice) pair writing fp32 partials, added in order by a finish kernel that
//         also applies the folded-BN bias (deterministic: no atomics);
//       * the tensor cores are fed by mma.sync m16n8k16 + ldmatrix from XOR-swizzled tiles
//         (gemm.cu version 4's layout and fragment code, mma.cuh), 64 k per stage: half
//         WMMA's instructions per multiply-add, no bank conflicts, no padding.
//       Costs: 12 more kernels in the build; with split-K, splits x P x C_out fp32 partials
//       written and read back (and the workspace for them); the scalar-gather forward (C_in
//       % 8 != 0, misaligned x: the stem's C_in = 3) stays v3's kernel, 1x1 stride-1 convs
//       with C_out >= 128 stay gemm.cu's, the backward stays v4's. ptxas (sm_90a, -O3):
//       128x128 126 registers, 128x64 168, 64x64 117, no spills; 96, 72, 64 KB of shared
//       memory (2, 3, 3 blocks per SM).
//       Measured (H100, bf16 channels_last, eval forward, reports/h100-conv-bn6.json): 1.33x,
//       1.16x, 0.86x, 0.62x cuDNN at the 3x3s of 56x56, 56x56/2, 14x14, 7x7 (v4: 0.58x, 0.64x,
//       0.45x, 0.24x); 1x1 64-channel 1.52x (0.98x). Level 4 (Triton, whose tl.dot is wgmma on
//       sm_90) is 1.12x and 0.86x at 14x14 and 7x7: wgmma is the next rung.
//   v6  v5 with the backward on mma.sync + ldmatrix too, its tiles fitted to the problem
//       (16-bit inputs, C_out % 8 == 0, aligned dy; conv_dgrad_v6, mma_conv::wgrad_kernel).
//       v4's backward runs one fixed 128x128 WMMA tile: C_in or C_out = 64 wastes half of it,
//       ResNet's 7x7 layer gives its dgrad 52 blocks for 132 SMs, the stem's C_in = 3 uses 3
//       of its 128 dgrad columns (H100, training: 0.47x, 0.57x and 0.31x cuDNN). Two ideas:
//       * dgrad: a stride phase of a transposed convolution *is* a forward convolution.
//         Within phase (a, b), dx[n, a + sh t, b + sw u, :] sums dy[n, t + base_h - ti,
//         u + base_w - tj, :] against the phase's taps; flipping them (ti' = nti - 1 - ti)
//         makes that a stride-1 convolution of dy with padding nti - 1 - base_h (negative: the
//         window may start inside dy) and the weight w' (C_in, nti, ntj, C_out) = those taps
//         transposed. So each phase runs v5's mma_conv::conv_kernel unchanged, its rows
//         scattered into dx (a template flag: the forward's kernels are untouched), with v5's
//         rule for tile and K slices (conv_bn_plan.h's cb_dgrad_plan: M = the phase's pixels,
//         N = C_in, K = taps x C_out) plus one tile for N <= 16, 128x16: the stem's dx then
//         wastes 13 of 16 columns instead of 125 of 128 (its cost is gathering dy, the same
//         bytes for any tile width; a CUDA-core direct kernel would re-read dy as often per
//         multiply-add at ~1/15 of the tensor cores' rate: not worth a third code path).
//         1x1 stride-1 dgrads keep gemm.cu's GEMM only for C_in >= 128 (the forward's rule).
//       * wgrad (mma_conv::wgrad_kernel): v4's pixel-major tiles, read by ldmatrix.trans
//         from 64-column swizzled panels; 128x64 where C_out > 64, else 64x64, and as many
//         pixel splits as the forward's cost model prefers (cb_wgrad_plan: a small GEMM with
//         a long reduction, e.g. 9 tiles and 100352 pixels at layer1's 3x3, gets its
//         parallelism from the splits); each thread steps its rows' pixels 64 at a time
//         instead of dividing; the element-gather variant serves C_in % 8 != 0 (the stem).
//       Costs: w' written once per backward (C_out x K 16-bit, in the workspace that held the
//       1x1 path's w^T), fp32 partials for split dgrad phases (their largest one's room in
//       the workspace, which is therefore sized from the whole geometry), 22 more kernels in
//       the build. ptxas (sm_90a, -O2), no spills: the scattering conv_kernel 128x128 128
//       registers, 128x64 168, 64x64 118, 128x16 110 (108 writing fp32 partials; 72 KB of
//       shared memory, 3 blocks per SM); wgrad_kernel 128x64 166 (168 gathering elements),
//       64x64 140 (164). No 128x128 wgrad: at 2 blocks per SM it spilled 48-336 bytes.
//       Measured (H100, training forward+backward, reports/h100-conv-bn7.json, v5 in the same
//       run): 1.05-2.9x v5, 0.45-1.03x cuDNN + BatchNorm: the stem 0.90x (v5 0.31x: its dgrad
//       2.95 -> 0.46 ms), 3x3s 0.45x, 0.60x, 0.87x, 0.69x (v5 0.35x, 0.53x, 0.62x, 0.42x).
//
// Around the convolution (the same kernels for every version):
//   eval   BatchNorm is an affine map per output channel, so it folds into the convolution:
//          w' = w * gamma / sqrt(var + eps),  b' = (b - mean) * gamma / sqrt(var + eps) + beta.
//          One small kernel folds (fold_bn_kernel); the convolution then writes the final
//          output: no pass over the activations for BN.
//   train  the convolution writes y (without its bias) in fp32; stats_partial_kernel computes
//          each chunk of rows' per-channel mean and M2 (sum of squared deviations) in two passes
//          over the chunk (it is still in L2 for the second), stats_finalize_kernel merges the
//          chunks with Chan's formula (exact: no E[y^2] - E[y]^2 cancellation), writes the new
//          running statistics (unbiased variance, like BatchNorm2d) and a per-channel
//          scale/shift, and channel_affine_kernel writes out = y * scale + shift.
//          The conv bias is left out of y because the batch mean absorbs it exactly: it only
//          enters the running mean (added in stats_finalize_kernel).
//   backward (both modes; version 2's tiled kernels for versions 1-3, the tensor-core ones of
//          version 4 for 16-bit inputs, version 6's on mma.sync)
//          dX is a transposed convolution (dgrad: an implicit GEMM gathering dY), dW an implicit
//          GEMM over the pixels (wgrad, split over chunks of pixels for parallelism, partial
//          sums added by wgrad_finish_kernel: no atomics, deterministic). In eval,
//          dgamma = invstd * (sum_k w[o,k] G[o,k] + (b - mean) sum_p dY[p,o]) with
//          G = dY^T im2col(x), the same G that gives dW = scale * G: y is never recomputed.
//          In training, the BN backward (bn_bwd_*) turns dOut into dY of the convolution first.
//
// fp32 and TF32: v3 and v4 on fp32 inputs run v2. WMMA has TF32 fragments, but they
// would round every operand to 11 bits and the level would have to declare TF32 (bound 4e-3
// instead of 1e-5) for the whole component; fp32 conv_bn stays exact at every version instead.
//
// Layouts (what the Python side, cuda_kernels/conv_bn.py, guarantees):
//   x        (N, H, W, C_in) NHWC with any element strides sx_n, sx_h, sx_w, sx_c (the Python
//            side passes the channels_last tensor permuted, so usually sx_c == 1);
//   w        the convolutions read (C_out, kH, kW, C_in) contiguous ("K-major": k = (i, j, c)
//            runs along memory): in eval that is w', which fold_bn_kernel writes from the
//            caller's weight read as it lies (WeightLayout: OIHW costs no copy); in training the
//            binding copies a weight not stored that way;
//   dy       (P, C_out) contiguous (the gradient of the NHWC output);
//   dw       written by wgrad_finish_kernel in the caller's weight layout (WeightLayout);
//   outputs, y, dx and every workspace are allocated contiguous by the binding.
// Offsets into x, y, dy, dx are int64: an activation can exceed 2**31 elements.
//
// As an exercise (`levels assignment build --levels cuda`, docs/grading.md "Level 5"): the
// solution regions marked below are BatchNorm's, the same for every version (as at Level 4):
// the eval folding, the train statistics' finish (variance, running statistics, scale and
// shift), the train backward's dY and the eval backward's dgamma, dbeta, dbias. The
// convolution's ladder stays.
#include "common.cuh"
#include "conv_bn_plan.h"
#include "mma.cuh"

#include <mma.h>

#include <type_traits>

// gemm.cu's launcher (the same library): version 4 runs 1x1 convolutions through it.
extern "C" int levels_gemm_matmul(int dtype, int version, int v4_tile,
                                  const void* a, int64_t stride_am, int64_t stride_ak,
                                  const void* b, int64_t stride_bk, int64_t stride_bn,
                                  void* c, int64_t stride_cm, int64_t stride_cn, int c_fp32,
                                  const void* bias, int64_t stride_bias,
                                  void* aux, int64_t stride_xm, int64_t stride_xn,
                                  int epilogue, int accumulate,
                                  int64_t M, int64_t N, int64_t K, cudaStream_t stream);

namespace levels_conv_bn {

// ---- candidates for common.cuh ----
template <typename T> struct is_f32 { static constexpr bool value = false; };
template <> struct is_f32<float> { static constexpr bool value = true; };

// cp.async (sm_80+): a 16-byte global -> shared copy that does not pass through registers and
// does not block the thread; src_bytes = 0 writes 16 zero bytes (the padding of a convolution).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
#else
  *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
#endif
}
// ---- end of candidates ----

// The shape of one convolution, as the launchers receive it.
struct Geom {
  int64_t N, H, W, C_in, C_out, kH, kW;
  int64_t sh, sw, ph, pw;          // stride and padding
  int64_t sx_n, sx_h, sx_w, sx_c;  // element strides of x as (N, H, W, C_in)
  int64_t H_out, W_out;
  int64_t P;  // N * H_out * W_out: output pixels, the GEMM's M
  int64_t K;  // kH * kW * C_in: the GEMM's reduction, ordered (i, j, c)
};

// =========================================================================================
// Version 1: direct convolution, one thread per output element.
// =========================================================================================

// Thread t computes out[p, o] with o = t % C_out: neighbouring threads share the pixel, so
// their reads of x are the same address (one broadcast), and their stores are contiguous.
template <typename T, typename TO>
__global__ void conv_direct_kernel(Geom g,
                                   const T* __restrict__ x,        // (N, H, W, C_in), strided
                                   const T* __restrict__ w,        // (C_out, kH, kW, C_in)
                                   const float* __restrict__ bias, // (C_out,) fp32 or nullptr
                                   TO* __restrict__ out) {         // (P, C_out)
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= g.P * g.C_out) return;
  const int64_t o = idx % g.C_out, p = idx / g.C_out;
  const int64_t n = p / (g.H_out * g.W_out), hw = p % (g.H_out * g.W_out);
  const int64_t h0 = (hw / g.W_out) * g.sh - g.ph, w0 = (hw % g.W_out) * g.sw - g.pw;
  float acc = 0.0f;
  for (int64_t i = 0; i < g.kH; ++i) {
    const int64_t hi = h0 + i;
    if (hi < 0 || hi >= g.H) continue;  // padding: zeros contribute nothing
    for (int64_t j = 0; j < g.kW; ++j) {
      const int64_t wi = w0 + j;
      if (wi < 0 || wi >= g.W) continue;
      const T* xp = x + n * g.sx_n + hi * g.sx_h + wi * g.sx_w;
      const T* wp = w + o * g.K + (i * g.kW + j) * g.C_in;
      for (int64_t c = 0; c < g.C_in; ++c) acc += to_f32(xp[c * g.sx_c]) * to_f32(wp[c]);
    }
  }
  if (bias) acc += bias[o];
  out[p * g.C_out + o] = from_f32<TO>(acc);
}

// =========================================================================================
// Version 2: a tiled GEMM main loop on CUDA cores, shared by the forward convolution and by
// the backward's dgrad and wgrad. Each is an "Op": it says how to read element (m, k) of A
// and (k, n) of B (the gather of the implicit GEMM) and where result (m, n) goes.
//   Op::Row row(m)            what a row m of A needs, decoded once per thread (not per k)
//   Op::Red red(k, k_end)     what column k of A needs, decoded once per k tile
//   float a(Row, Red)         A[m, k], 0 outside the image / past the end
//   float b(k, n, k_end)      B[k, n], 0 past the end
//   void store(m, n, split, v)
// =========================================================================================
namespace tiled {
constexpr int BM = 64, BN = 64, BK = 16, THREADS = 256;  // 4x4 outputs per thread

template <typename Op>
__global__ void __launch_bounds__(THREADS)
gemm_kernel(Op op, int64_t M, int64_t Nn, int64_t R, int64_t red_per_split) {
  // A is kept transposed (As[k][m]) so that a thread's 4 rows of A are 4 consecutive floats;
  // the +4 keeps rows 16-byte aligned while shifting banks between rows.
  __shared__ float As[BK][BM + 4];
  __shared__ float Bs[BK][BN + 4];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;  // this thread's 4x4 outputs: rows ty*4.., cols tx*4..
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * red_per_split;
  const int64_t k_end = min(R, k_begin + red_per_split);

  // Loads: thread -> A (m = tid/16 + 16r, k = tid%16): consecutive threads walk k, which is
  // the contiguous channel axis of x for the forward convolution. B (k = tid/64 + 4r, n = tid%64).
  typename Op::Row rows[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) rows[r] = op.row(m0 + tid / 16 + 16 * r, M);

  float acc[4][4] = {};
  for (int64_t k0 = k_begin; k0 < k_end; k0 += BK) {
    const typename Op::Red kr = op.red(k0 + tid % 16, k_end);
#pragma unroll
    for (int r = 0; r < 4; ++r) As[tid % 16][tid / 16 + 16 * r] = op.a(rows[r], kr);
#pragma unroll
    for (int r = 0; r < 4; ++r)
      Bs[tid / 64 + 4 * r][tid % 64] = op.b(k0 + tid / 64 + 4 * r, n0 + tid % 64, k_end);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();  // the tiles are overwritten by the next iteration
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
      if (m < M && n < Nn) op.store(m, n, blockIdx.z, acc[i][j]);
    }
}

// Forward: A[p, k] = x[n, h0 + i, w0 + j, c] (k = (i, j, c)), B[k, o] = w[o, k],
// out[p, o] = sum + bias[o].
template <typename T, typename TO>
struct ConvFwd {
  Geom g;
  const T* x;
  const T* w;
  const float* bias;  // nullable
  TO* out;            // (P, C_out)
  struct Row { int64_t base, h0, w0; bool ok; };
  struct Red { int64_t i, j, c; bool ok; };
  __device__ Row row(int64_t p, int64_t M) const {
    Row r{0, 0, 0, p < M};
    if (r.ok) {
      const int64_t n = p / (g.H_out * g.W_out), hw = p % (g.H_out * g.W_out);
      r.base = n * g.sx_n;
      r.h0 = (hw / g.W_out) * g.sh - g.ph;
      r.w0 = (hw % g.W_out) * g.sw - g.pw;
    }
    return r;
  }
  __device__ Red red(int64_t k, int64_t k_end) const {
    const int64_t ij = k / g.C_in;
    return Red{ij / g.kW, ij % g.kW, k % g.C_in, k < k_end};
  }
  __device__ float a(const Row& r, const Red& k) const {
    const int64_t hi = r.h0 + k.i, wi = r.w0 + k.j;
    if (!r.ok || !k.ok || hi < 0 || hi >= g.H || wi < 0 || wi >= g.W) return 0.0f;
    return to_f32(x[r.base + hi * g.sx_h + wi * g.sx_w + k.c * g.sx_c]);
  }
  __device__ float b(int64_t k, int64_t o, int64_t k_end) const {
    return (k < k_end && o < g.C_out) ? to_f32(w[o * g.K + k]) : 0.0f;
  }
  __device__ void store(int64_t p, int64_t o, int, float v) const {
    out[p * g.C_out + o] = from_f32<TO>(bias ? v + bias[o] : v);
  }
};

// dgrad: dx[q, c] = sum_{i, j, o} dy[p(q, i, j), o] w[o, i, j, c], q = (n, h, w) an input
// pixel, and output pixel p exists only where h + ph - i is a non-negative multiple of the
// stride (likewise for w). The GEMM: M = N*H*W, N = C_in, reduction (i, j, o).
template <typename T>
struct ConvDgrad {
  Geom g;
  const T* dy;  // (P, C_out) contiguous
  const T* w;   // (C_out, kH, kW, C_in) contiguous
  T* dx;        // (N*H*W, C_in) contiguous
  struct Row { int64_t n, h, w; bool ok; };
  struct Red { int64_t i, j, o; bool ok; };
  __device__ Row row(int64_t q, int64_t M) const {
    Row r{0, 0, 0, q < M};
    if (r.ok) {
      r.n = q / (g.H * g.W);
      const int64_t hw = q % (g.H * g.W);
      r.h = hw / g.W;
      r.w = hw % g.W;
    }
    return r;
  }
  __device__ Red red(int64_t k, int64_t k_end) const {
    const int64_t ij = k / g.C_out;
    return Red{ij / g.kW, ij % g.kW, k % g.C_out, k < k_end};
  }
  __device__ float a(const Row& r, const Red& k) const {
    const int64_t hn = r.h + g.ph - k.i, wn = r.w + g.pw - k.j;
    if (!r.ok || !k.ok || hn < 0 || wn < 0 || hn % g.sh || wn % g.sw) return 0.0f;
    const int64_t ho = hn / g.sh, wo = wn / g.sw;
    if (ho >= g.H_out || wo >= g.W_out) return 0.0f;
    return to_f32(dy[((r.n * g.H_out + ho) * g.W_out + wo) * g.C_out + k.o]);
  }
  __device__ float b(int64_t k, int64_t c, int64_t k_end) const {
    if (k >= k_end || c >= g.C_in) return 0.0f;
    const int64_t ij = k / g.C_out, o = k % g.C_out;
    return to_f32(w[o * g.K + ij * g.C_in + c]);
  }
  __device__ void store(int64_t q, int64_t c, int, float v) const {
    dx[q * g.C_in + c] = from_f32<T>(v);
  }
};

// wgrad, computed transposed: G^T[k, o] = sum_p im2col(x)[p, k] dy[p, o] with M = K (i, j, c),
// N = C_out and the reduction over the pixels p, split into blockIdx.z chunks: each chunk
// writes its own fp32 slice part[split, o, k], summed later by wgrad_finish_kernel.
template <typename T>
struct ConvWgrad {
  Geom g;
  const T* x;
  const T* dy;  // (P, C_out) contiguous
  float* part;  // (splits, C_out, K)
  struct Row { int64_t i, j, c; bool ok; };
  struct Red { int64_t base, h0, w0; bool ok; };
  __device__ Row row(int64_t k, int64_t M) const {
    const int64_t ij = k / g.C_in;
    return Row{ij / g.kW, ij % g.kW, k % g.C_in, k < M};
  }
  __device__ Red red(int64_t p, int64_t p_end) const {
    Red r{0, 0, 0, p < p_end};
    if (r.ok) {
      const int64_t n = p / (g.H_out * g.W_out), hw = p % (g.H_out * g.W_out);
      r.base = n * g.sx_n;
      r.h0 = (hw / g.W_out) * g.sh - g.ph;
      r.w0 = (hw % g.W_out) * g.sw - g.pw;
    }
    return r;
  }
  __device__ float a(const Row& k, const Red& p) const {
    const int64_t hi = p.h0 + k.i, wi = p.w0 + k.j;
    if (!k.ok || !p.ok || hi < 0 || hi >= g.H || wi < 0 || wi >= g.W) return 0.0f;
    return to_f32(x[p.base + hi * g.sx_h + wi * g.sx_w + k.c * g.sx_c]);
  }
  __device__ float b(int64_t p, int64_t o, int64_t p_end) const {
    return (p < p_end && o < g.C_out) ? to_f32(dy[p * g.C_out + o]) : 0.0f;
  }
  __device__ void store(int64_t k, int64_t o, int split, float v) const {
    part[(static_cast<int64_t>(split) * g.C_out + o) * g.K + k] = v;
  }
};
}  // namespace tiled

// =========================================================================================
// Versions 3 and 4: implicit GEMMs on the tensor cores (WMMA), cp.async 4-stage pipeline.
// Block tile 128 x 128 x 32 (k); 8 warps as 2 x 4, each warp a 64 x 32 tile = 4 x 2 WMMA
// accumulators (64 fp32 registers per thread). One main loop (main_loop) and one epilogue
// (epilogue) serve the three products; each kernel only says how its tiles are gathered
// and where a finished row of 8 outputs goes:
//   conv_kernel   forward  out[p, o]    = sum_k   im2col(x)[p, k] w[o, k]        (v3, v4)
//   dgrad_kernel  backward dx[q, c]     = sum_tap dy[p(q, tap), o] w[o, tap, c]  (v4)
//   wgrad_kernel  backward G[o, k]      = sum_p   dy[p, o] im2col(x)[p, k]       (v4)
// =========================================================================================
namespace wmma_conv {
using namespace nvcuda;
// STAGES: a build-time knob (-DLEVELS_CONV_V3_STAGES=n through LEVELS_CUDA_NVCC_FLAGS) so
// that scripts/device_level5.py's sweep can measure the pipeline depth; the default is
// what the sweep chose (reports/h100-level5.json: 4 stages 0.485 ms, 3: 0.505, 5: 0.516).
#ifndef LEVELS_CONV_V3_STAGES
#define LEVELS_CONV_V3_STAGES 4
#endif
constexpr int BM = 128, BN = 128, BK = 32, STAGES = LEVELS_CONV_V3_STAGES, THREADS = 256;
constexpr int WARPS_N = 4, WM = 64, WN = 32, FM = WM / 16, FN = WN / 16;
// An operand tile sits in shared memory one of two ways (16-bit elements):
//   k inner, [row][k], pitch LDS = BK + 8 = 40: 80-byte rows, so the 8 rows one WMMA load
//     touches start in different banks; A read as row_major, B ([n][k]) as col_major;
//   k outer, [k][row], pitch LDW = 128 + 8 = 136: 272-byte rows, again 8 rows in 8
//     different 16-byte bank groups; A ([k][m]) read as col_major, B ([k][n]) as row_major.
// Which one a kernel uses is decided by the operand's memory: a 16-byte cp.async copy needs 8
// neighbours in global memory to be 8 neighbours in shared memory, so the contiguous axis of
// the operand must be the tile's inner axis. Both pitches are multiples of 16 bytes
// (cp.async) and 16 rows of either are multiples of 32 bytes (WMMA's pointer alignment).
constexpr int LDS = BK + 8;
constexpr int LDW = BM + 8;
static_assert(BM == BN, "LDW serves both operands");
template <bool K_OUTER> __host__ __device__ constexpr int tile_elems() { return K_OUTER ? BK * LDW : BM * LDS; }
template <bool A_KO, bool B_KO> __host__ __device__ constexpr int stage_elems() {
  return tile_elems<A_KO>() + tile_elems<B_KO>();
}
template <bool A_KO, bool B_KO> __host__ __device__ constexpr int smem_bytes() {
  return STAGES * stage_elems<A_KO, B_KO>() * 2;  // 81920 (forward) .. 69632 (wgrad) at 4 stages
}
constexpr int EPI_LD = 20;  // fp32 epilogue scratch pitch (16 + 4)
static_assert(8 * 16 * EPI_LD * 4 <= smem_bytes<true, true>(), "epilogue scratch fits in the pipeline's smem");

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// The pipeline: tiles kt+1 .. kt+STAGES-1 are in flight (cp.async) while the tensor cores
// work on tile kt. load_tile(As, Bs, kt) issues the copies of tile kt into a stage (and may
// store elements itself: the scalar gathers); KT tiles in all (0 is fine: acc stays 0).
// Ends with every copy landed and a barrier, so the caller may reuse the shared memory.
template <typename T, bool A_KO, bool B_KO, typename Load>
__device__ __forceinline__ void main_loop(T* smem, Acc (&acc)[FM][FN], int KT, int warp_m,
                                          int warp_n, Load& load_tile) {
  using LayoutA = typename std::conditional<A_KO, wmma::col_major, wmma::row_major>::type;
  using LayoutB = typename std::conditional<B_KO, wmma::row_major, wmma::col_major>::type;
  constexpr int SE = stage_elems<A_KO, B_KO>(), A_ELEMS = tile_elems<A_KO>();
#pragma unroll
  for (int a = 0; a < FM; ++a)
#pragma unroll
    for (int b = 0; b < FN; ++b) wmma::fill_fragment(acc[a][b], 0.0f);
  // Prologue: tiles 0 .. STAGES-2 in flight. One commit group per tile (empty groups are fine),
  // so "wait until at most STAGES-2 groups are pending" always means "tile kt has landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_tile(smem + s * SE, smem + s * SE + A_ELEMS, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    // After this barrier tile kt is visible to all, and every warp has finished computing on
    // tile kt-1, whose stage the prefetch below overwrites.
    __syncthreads();
    const int next = kt + STAGES - 1;
    if (next < KT) {
      T* As = smem + (next % STAGES) * SE;
      load_tile(As, As + A_ELEMS, next);
    }
    cp_async_commit();

    const T* As = smem + (kt % STAGES) * SE;
    const T* Bs = As + A_ELEMS;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb[FN];
#pragma unroll
      for (int a = 0; a < FM; ++a) {
        const int m = warp_m * WM + a * 16;
        wmma::load_matrix_sync(fa[a], A_KO ? As + kk * LDW + m : As + m * LDS + kk, A_KO ? LDW : LDS);
      }
#pragma unroll
      for (int b = 0; b < FN; ++b) {
        const int n = warp_n * WN + b * 16;
        wmma::load_matrix_sync(fb[b], B_KO ? Bs + kk * LDW + n : Bs + n * LDS + kk, B_KO ? LDW : LDS);
      }
#pragma unroll
      for (int a = 0; a < FM; ++a)
#pragma unroll
        for (int b = 0; b < FN; ++b) wmma::mma_sync(acc[a][b], fa[a], fb[b], acc[a][b]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the epilogue's scratch
}

// Epilogue: a fragment's element -> (row, col) mapping is unspecified, so each 16x16
// accumulator goes through a per-warp fp32 scratch; then lane l owns row l/2, columns
// (l%2)*8 .. +7 of it and hands them to store(row, col, v) (block-tile coordinates, v: 8
// fp32 values), which writes them wherever that row of the product lives.
template <typename Store>
__device__ __forceinline__ void epilogue(Acc (&acc)[FM][FN], unsigned char* smem_raw, int warp_m,
                                         int warp_n, Store& store) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scratch = reinterpret_cast<float*>(smem_raw) + warp * 16 * EPI_LD;
  const int er = lane / 2, ec = (lane % 2) * 8;
#pragma unroll
  for (int a = 0; a < FM; ++a)
#pragma unroll
    for (int b = 0; b < FN; ++b) {
      wmma::store_matrix_sync(scratch, acc[a][b], EPI_LD, wmma::mem_row_major);
      __syncwarp();
      store(warp_m * WM + a * 16 + er, warp_n * WN + b * 16 + ec, scratch + er * EPI_LD + ec);
      __syncwarp();  // the scratch is rewritten by the next fragment
    }
}

// 8 consecutive outputs v[0..7] to dst[0..left-1] (left may be < 8 or <= 0 at the ragged
// edge), as 16-byte vector stores when `aligned` (dst is a multiple of 16 bytes) and all 8
// are in range.
template <typename TO>
__device__ __forceinline__ void store_row8(TO* dst, const float* v, int64_t left, bool aligned) {
  constexpr int PER_16B = 16 / sizeof(TO);
  if (aligned && left >= 8) {
    alignas(16) TO packed[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) packed[e] = from_f32<TO>(v[e]);
#pragma unroll
    for (int q = 0; q < 8 / PER_16B; ++q)
      reinterpret_cast<uint4*>(dst)[q] = reinterpret_cast<const uint4*>(packed)[q];
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (e < left) dst[e] = from_f32<TO>(v[e]);
  }
}

// ---- forward -------------------------------------------------------------------------
// VEC: 16-byte cp.async copies (C_in % 8 == 0, sx_c == 1, 16-byte aligned x rows and w), so a
// group of 8 consecutive k is 8 consecutive channels of one pixel and one kernel offset.
// Otherwise each element is gathered on its own (any C_in, any strides) into the same tiles.
template <typename T, typename TO, bool VEC>
__global__ void __launch_bounds__(THREADS, 2)  // 2 blocks per SM: at most 128 registers
conv_kernel(Geom g,
            const T* __restrict__ x,         // (N, H, W, C_in), strided
            const T* __restrict__ w,         // (C_out, kH, kW, C_in) contiguous
            const float* __restrict__ bias,  // (C_out,) fp32 or nullptr
            TO* __restrict__ out) {          // (P, C_out) contiguous
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const int tid = threadIdx.x, warp = tid / 32;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int64_t n_tiles = (g.C_out + BN - 1) / BN;
  // Neighbouring blocks take the output-channel tiles of the same pixels: they read the same
  // slice of x at about the same time, so it comes from L2 once.
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) / n_tiles) * BM;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) % n_tiles) * BN;

  // Each thread copies 2 rows x 8 k of A and of B per stage: rows tid/4 and tid/4 + 64, the
  // 8-element group (tid % 4) * 8 of the tile's 32 k. The row decode is done once, here.
  // Spatial coordinates and k (< K = kH*kW*C_in) fit in 32 bits; only memory offsets need 64:
  // 32-bit indices keep the register count under the 128 that 2 blocks per SM allow.
  const int kc = (tid % 4) * 8;
  const int C_in = static_cast<int>(g.C_in), kW = static_cast<int>(g.kW), K = static_cast<int>(g.K);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  int64_t x_base[2];
  int h0[2], w0[2];
  bool p_ok[2], o_ok[2];
  const T* w_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t p = m0 + tid / 4 + 64 * r;
    p_ok[r] = p < g.P;
    const int64_t pp = p_ok[r] ? p : 0;
    const int64_t n = pp / (g.H_out * g.W_out), hw = pp % (g.H_out * g.W_out);
    x_base[r] = n * g.sx_n;
    h0[r] = static_cast<int>((hw / g.W_out) * g.sh - g.ph);
    w0[r] = static_cast<int>((hw % g.W_out) * g.sw - g.pw);
    const int64_t o = o0 + tid / 4 + 64 * r;
    o_ok[r] = o < g.C_out;
    w_row[r] = w + (o_ok[r] ? o : 0) * g.K;
  }

  auto load_tile = [&](T* As, T* Bs, int kt) {
    const int k = kt * BK + kc;
    if constexpr (VEC) {
      const int ij = k / C_in, c = k % C_in, i = ij / kW, j = ij % kW;
      const bool k_ok = k < K;  // K % 8 == 0 here: a group is wholly in or out
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int hi = h0[r] + i, wi = w0[r] + j;
        const bool ok = k_ok && p_ok[r] && hi >= 0 && hi < H && wi >= 0 && wi < W;
        const T* src = ok ? x + x_base[r] + hi * g.sx_h + wi * g.sx_w + c : x;
        cp_async_16(As + (tid / 4 + 64 * r) * LDS + kc, src, ok);
        const bool okw = k_ok && o_ok[r];
        cp_async_16(Bs + (tid / 4 + 64 * r) * LDS + kc, okw ? w_row[r] + k : w, okw);
      }
    } else {
      const T zero = from_f32<T>(0.0f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int ke = k + e;
        const int ij = ke / C_in, c = ke % C_in, i = ij / kW, j = ij % kW;
        const bool k_ok = ke < K;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int hi = h0[r] + i, wi = w0[r] + j;
          const bool ok = k_ok && p_ok[r] && hi >= 0 && hi < H && wi >= 0 && wi < W;
          As[(tid / 4 + 64 * r) * LDS + kc + e] =
              ok ? x[x_base[r] + hi * g.sx_h + wi * g.sx_w + c * g.sx_c] : zero;
          Bs[(tid / 4 + 64 * r) * LDS + kc + e] = (k_ok && o_ok[r]) ? w_row[r][ke] : zero;
        }
      }
    }
  };

  Acc acc[FM][FN];
  // B[k, o] = w[o, k] sits in shared memory as Bs[o][k] (k inner): a column-major K x N matrix.
  main_loop<T, false, false>(smem, acc, (K + BK - 1) / BK, warp_m, warp_n, load_tile);

  // The bias is added here, then 8 consecutive outputs of one pixel are stored (16 bytes for
  // bf16/fp16: one vector store when C_out keeps the row aligned).
  auto store = [&](int mi, int ni, const float* s) {
    const int64_t p = m0 + mi, o = o0 + ni;
    if (p >= g.P) return;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = s[e] + ((bias && o + e < g.C_out) ? bias[o + e] : 0.0f);
    // p * C_out + o is a multiple of 16 bytes when C_out is a multiple of 16 / sizeof(TO)
    store_row8<TO>(out + p * g.C_out + o, v, g.C_out - o, g.C_out % (16 / sizeof(TO)) == 0);
  };
  epilogue(acc, smem_raw, warp_m, warp_n, store);
#endif
}

// ---- dgrad (version 4) ------------------------------------------------------------------
// dx[q, c] = sum_{i, j, o} dy[p, o] w[o, i, j, c] where q = (n, h, w) is an input pixel and
// p = (n, ho, wo) the output pixel that tap (i, j) connects it to: h = ho*sh - ph + i, so
// ho = (h + ph - i) / sh, which exists only when the division is exact (and in range).
// With stride 1 every tap counts. With stride > 1 a pixel gets contributions only from the
// taps with i = (h + ph) mod sh (mod sh), and that depends on h only through h mod sh: the
// input pixels fall into sh*sw *phases* (h mod sh, w mod sw) = (a, b), and within one phase
// every pixel has the same taps, i = i0, i0 + sh, ... (i0 = (a + ph) mod sh), likewise j.
// So the launcher runs one implicit GEMM per phase, over that phase's pixels only and that
// phase's taps only: no tap is masked, no tensor-core work is spent on products with zero
// (a 3x3 stride-2 dgrad gathers 2.25 taps per pixel on average instead of 9). Within a
// phase, h = a + sh*t and i = i0 + sh*ti give ho = t - ti + base_h with base_h = (a + ph) /
// sh (exact: a + ph - i0 is a multiple of sh): a subtraction, no division, in the gather.
// A phase without a tap (kH < sh, e.g. a 1x1 stride-2 conv for odd h) is a GEMM with an
// empty reduction: its pixels get dx = 0, written like any other result.
struct DgradPhase {
  int a, b;            // the phase: h mod sh, w mod sw
  int Ha, Wb;          // its rows and columns: h = a + sh*t (t < Ha), w = b + sw*u (u < Wb)
  int i0, j0;          // its first tap
  int nti, ntj;        // its taps: i = i0 + sh*ti (ti < nti), j = j0 + sw*tj (tj < ntj)
  int base_h, base_w;  // ho = t - ti + base_h, wo = u - tj + base_w
  int64_t M;           // N * Ha * Wb pixels: the GEMM's rows (0: no pixel in this phase)
  int Kp;              // nti * ntj * C_out: the GEMM's reduction, ordered (ti, tj, o)
};

// Phase (a, b) of g's dgrad (versions 4 and 6).
inline DgradPhase dgrad_phase(const Geom& g, int a, int b) {
  const int sh = static_cast<int>(g.sh), sw = static_cast<int>(g.sw);
  const int ph = static_cast<int>(g.ph), pw = static_cast<int>(g.pw);
  const int kH = static_cast<int>(g.kH), kW = static_cast<int>(g.kW);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  DgradPhase p{};
  p.a = a, p.b = b;
  p.Ha = a < H ? (H - a + sh - 1) / sh : 0;
  p.Wb = b < W ? (W - b + sw - 1) / sw : 0;
  p.i0 = (a + ph) % sh, p.j0 = (b + pw) % sw;
  p.nti = p.i0 < kH ? (kH - p.i0 + sh - 1) / sh : 0;
  p.ntj = p.j0 < kW ? (kW - p.j0 + sw - 1) / sw : 0;
  p.base_h = (a + ph) / sh, p.base_w = (b + pw) / sw;
  p.M = g.N * p.Ha * p.Wb;
  p.Kp = p.nti * p.ntj * static_cast<int>(g.C_out);
  return p;
}

// A = the dy gather [q][(ti, tj, o)] (k inner: 8 consecutive o of one output pixel are 16
// contiguous bytes of dy), B = the weight [(ti, tj, o)][c] (k outer: for one (o, i, j), 8
// consecutive c are 16 contiguous bytes of w's (C_out, kH, kW, C_in) layout: the "flipped,
// transposed" weight of a transposed convolution is read in place, no re-layout kernel).
// VEC_DY: C_out % 8 == 0 and dy 16-byte aligned; VEC_W: C_in % 8 == 0 and w 16-byte aligned.
template <typename T, bool VEC_DY, bool VEC_W>
__global__ void __launch_bounds__(THREADS, 2)
dgrad_kernel(Geom g, DgradPhase ph,
             const T* __restrict__ dy,  // (P, C_out) contiguous
             const T* __restrict__ w,   // (C_out, kH, kW, C_in) contiguous
             T* __restrict__ dx) {      // (N, H, W, C_in) contiguous
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int C_in = static_cast<int>(g.C_in), C_out = static_cast<int>(g.C_out);
  const int H_out = static_cast<int>(g.H_out), W_out = static_cast<int>(g.W_out);
  const int sh = static_cast<int>(g.sh), sw = static_cast<int>(g.sw), kW = static_cast<int>(g.kW);
  const int64_t n_tiles = (g.C_in + BN - 1) / BN;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) / n_tiles) * BM;
  const int c0 = static_cast<int>(blockIdx.x % n_tiles) * BN;
  const int64_t phase_pixels = static_cast<int64_t>(ph.Ha) * ph.Wb;
  const T zero = from_f32<T>(0.0f);

  // A: as the forward, rows tid/4 and tid/4 + 64, k group (tid % 4) * 8; decoded once here.
  const int kc = (tid % 4) * 8;
  int64_t dy_img[2];  // offset of the row's image in dy
  int ht[2], wt[2];   // t + base_h, u + base_w: ho = ht - ti, wo = wt - tj
  bool q_ok[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t q = m0 + tid / 4 + 64 * r;
    q_ok[r] = q < ph.M;
    const int64_t qq = q_ok[r] ? q : 0;
    const int64_t n = qq / phase_pixels;
    const int tu = static_cast<int>(qq % phase_pixels);
    dy_img[r] = n * g.H_out * g.W_out * g.C_out;
    ht[r] = tu / ph.Wb + ph.base_h;
    wt[r] = tu % ph.Wb + ph.base_w;
  }
  // B: k rows tid/16 and tid/16 + 16 of the tile, columns (tid % 16) * 8 .. + 7.
  const int kb = tid / 16, cb = c0 + (tid % 16) * 8;

  auto load_tile = [&](T* As, T* Bs, int kt) {
    // ---- A: dy gathered; zeros where the output pixel does not exist ----
    const int k = kt * BK + kc;
    if constexpr (VEC_DY) {
      const int tap = k / C_out, o = k % C_out, ti = tap / ph.ntj, tj = tap % ph.ntj;
      const bool k_ok = k < ph.Kp;  // C_out % 8 == 0: a group is wholly in or out, one tap
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int ho = ht[r] - ti, wo = wt[r] - tj;
        const bool ok = k_ok && q_ok[r] && ho >= 0 && ho < H_out && wo >= 0 && wo < W_out;
        const T* src = ok ? dy + dy_img[r] + (static_cast<int64_t>(ho) * W_out + wo) * C_out + o : dy;
        cp_async_16(As + (tid / 4 + 64 * r) * LDS + kc, src, ok);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int ke = k + e;
        const int tap = ke / C_out, o = ke % C_out, ti = tap / ph.ntj, tj = tap % ph.ntj;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int ho = ht[r] - ti, wo = wt[r] - tj;
          const bool ok = ke < ph.Kp && q_ok[r] && ho >= 0 && ho < H_out && wo >= 0 && wo < W_out;
          As[(tid / 4 + 64 * r) * LDS + kc + e] =
              ok ? dy[dy_img[r] + (static_cast<int64_t>(ho) * W_out + wo) * C_out + o] : zero;
        }
      }
    }
    // ---- B: weight rows (o, i, j), 8 consecutive input channels each ----
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int kr = kt * BK + kb + 16 * r;
      const int tap = kr / C_out, o = kr % C_out;
      const int i = ph.i0 + sh * (tap / ph.ntj), j = ph.j0 + sw * (tap % ph.ntj);
      const bool k_ok = kr < ph.Kp;
      const T* row = w + (k_ok ? static_cast<int64_t>(o) * g.K + (i * kW + j) * C_in : 0);
      T* dst = Bs + (kb + 16 * r) * LDW + (tid % 16) * 8;
      if constexpr (VEC_W) {
        const bool ok = k_ok && cb < C_in;  // C_in % 8 == 0: wholly in or out
        cp_async_16(dst, ok ? row + cb : w, ok);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = (k_ok && cb + e < C_in) ? row[cb + e] : zero;
      }
    }
  };

  Acc acc[FM][FN];
  main_loop<T, false, true>(smem, acc, (ph.Kp + BK - 1) / BK, warp_m, warp_n, load_tile);

  // Row q of this phase's GEMM is input pixel (n, a + sh*t, b + sw*u) of dx.
  const bool dx_vec = C_in % 8 == 0 && (reinterpret_cast<uintptr_t>(dx) & 15) == 0;
  auto store = [&](int mi, int ni, const float* s) {
    const int64_t q = m0 + mi;
    if (q >= ph.M) return;
    const int64_t n = q / phase_pixels;
    const int tu = static_cast<int>(q % phase_pixels);
    const int64_t h = ph.a + sh * (tu / ph.Wb), wcol = ph.b + sw * (tu % ph.Wb);
    const int c = c0 + ni;
    store_row8<T>(dx + ((n * g.H + h) * g.W + wcol) * C_in + c, s, C_in - c, dx_vec);
  };
  epilogue(acc, smem_raw, warp_m, warp_n, store);
#endif
}

// ---- wgrad (version 4) ------------------------------------------------------------------
// G[o, k] = sum_p dy[p, o] im2col(x)[p, k]: M = C_out, N = K = (i, j, c), and the reduction
// runs over the pixels p, split into blockIdx.y chunks of per_split pixels; chunk s writes its
// own fp32 partial part[s, o, k], summed by wgrad_finish_kernel (deterministic: no atomics).
// Both operands are contiguous along their *non*-reduction axis (dy along o, x along c), so
// both are staged k outer ("P-major": [p][o] and [p][k]) with 16-byte copies along that axis,
// and the tensor cores read A = [p][o] as a col_major M x K matrix and B = [p][k] as a
// row_major K x N one. The alternative, transposing in shared memory (or in a copy before the
// GEMM, as a K-major-only GEMM would need), costs a pass over each operand; reading the tile
// in the layout it landed in is free: WMMA's col_major A / row_major B loads do the
// transposition on the way into the fragments (ldmatrix .trans).
// VEC_DY: C_out % 8 == 0 and dy aligned; VEC_X: as the forward's VEC.
template <typename T, bool VEC_DY, bool VEC_X>
__global__ void __launch_bounds__(THREADS, 2)
wgrad_kernel(Geom g, int64_t per_split,
             const T* __restrict__ x,   // (N, H, W, C_in), strided
             const T* __restrict__ dy,  // (P, C_out) contiguous
             float* __restrict__ part) {  // (splits, C_out, K)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int C_in = static_cast<int>(g.C_in), C_out = static_cast<int>(g.C_out);
  const int K = static_cast<int>(g.K), kW = static_cast<int>(g.kW);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int64_t n_tiles = (g.K + BN - 1) / BN;
  const int o0 = static_cast<int>(blockIdx.x / n_tiles) * BM;
  const int k0 = static_cast<int>(blockIdx.x % n_tiles) * BN;
  const int64_t p_begin = static_cast<int64_t>(blockIdx.y) * per_split;
  const int64_t p_end = min(g.P, p_begin + per_split);
  const int hw_out = static_cast<int>(g.H_out * g.W_out);
  const T zero = from_f32<T>(0.0f);

  // Each thread copies pixel rows tid/16 and tid/16 + 16 of the tile, 8 columns from col:
  // o = o0 + col of dy, k = k0 + col of im2col(x). A thread's k never changes, so its
  // (i, j, c) is decoded once; its pixels change every tile and are decoded per tile.
  const int pr = tid / 16, col = (tid % 16) * 8;
  const int oa = o0 + col, kb = k0 + col;
  const int ijb = kb / C_in, cb = kb % C_in, ib = ijb / kW, jb = ijb % kW;

  auto load_tile = [&](T* As, T* Bs, int kt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t p = p_begin + static_cast<int64_t>(kt) * BK + pr + 16 * r;
      const bool p_ok = p < p_end;
      T* a_dst = As + (pr + 16 * r) * LDW + col;
      T* b_dst = Bs + (pr + 16 * r) * LDW + col;
      // ---- A: dy[p, oa .. oa+7] ----
      if constexpr (VEC_DY) {
        const bool ok = p_ok && oa < C_out;
        cp_async_16(a_dst, ok ? dy + p * C_out + oa : dy, ok);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) a_dst[e] = (p_ok && oa + e < C_out) ? dy[p * C_out + oa + e] : zero;
      }
      // ---- B: im2col(x)[p, kb .. kb+7]; zeros at the padding ----
      // A 32-bit division (the launcher sends P < 2**30 here): this decode runs every
      // tile, and a 64-bit one costs several times the instructions.
      const int pp = p_ok ? static_cast<int>(p) : 0;
      const int64_t n = pp / hw_out;
      const int hw = pp % hw_out;
      const int hb = (hw / static_cast<int>(g.W_out)) * static_cast<int>(g.sh) - static_cast<int>(g.ph);
      const int wb = (hw % static_cast<int>(g.W_out)) * static_cast<int>(g.sw) - static_cast<int>(g.pw);
      const T* x_img = x + n * g.sx_n;
      if constexpr (VEC_X) {
        const int hi = hb + ib, wi = wb + jb;
        const bool ok = p_ok && kb < K && hi >= 0 && hi < H && wi >= 0 && wi < W;
        cp_async_16(b_dst, ok ? x_img + hi * g.sx_h + wi * g.sx_w + cb : x, ok);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int ke = kb + e;
          const int ij = ke / C_in, c = ke % C_in, hi = hb + ij / kW, wi = wb + ij % kW;
          const bool ok = p_ok && ke < K && hi >= 0 && hi < H && wi >= 0 && wi < W;
          b_dst[e] = ok ? x_img[hi * g.sx_h + wi * g.sx_w + c * g.sx_c] : zero;
        }
      }
    }
  };

  Acc acc[FM][FN];
  const int KT = static_cast<int>((max(p_end - p_begin, int64_t{0}) + BK - 1) / BK);
  main_loop<T, true, true>(smem, acc, KT, warp_m, warp_n, load_tile);

  const bool part_vec = K % 4 == 0 && (reinterpret_cast<uintptr_t>(part) & 15) == 0;
  auto store = [&](int mi, int ni, const float* s) {
    const int o = o0 + mi, k = k0 + ni;
    if (o >= C_out) return;
    float* dst = part + (static_cast<int64_t>(blockIdx.y) * C_out + o) * K + k;
    store_row8<float>(dst, s, K - k, part_vec);
  };
  epilogue(acc, smem_raw, warp_m, warp_n, store);
#endif
}

// dgrad of a 1x1 stride-1 convolution through levels_gemm needs w^T (C_in, C_out): the
// GEMM's B operand must run along its reduction (C_out), and w runs along C_in. One small
// tiled transpose (32 x 32 tiles through shared memory: reads and writes both coalesced;
// the +1 column keeps the column reads off a single bank).
template <typename T>
__global__ void transpose_kernel(const T* __restrict__ src, int64_t rows, int64_t cols,
                                 T* __restrict__ dst) {  // dst (cols, rows) = src (rows, cols)^T
  __shared__ T tile[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int dr = threadIdx.y; dr < 32; dr += blockDim.y) {
    const int64_t r = r0 + dr, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[dr][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int dc = threadIdx.y; dc < 32; dc += blockDim.y) {
    const int64_t c = c0 + dc, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][dc];
  }
}
}  // namespace wmma_conv

// =========================================================================================
// Version 5: the forward on mma.sync m16n8k16 + ldmatrix, with tiles fitted to the problem
// (and version 6's backward pieces on the same machinery: the scattering dgrad, wgrad_kernel).
// =========================================================================================
// Versions 3 and 4 run every forward in one 128 x 128 x 32 WMMA tile. Two things cost them
// half or more of cuDNN's speed at ResNet-50's 3x3 layers (reports/h100-conv-bn5.json):
//   * the tile ignores the problem: C_out = 64 wastes half of every 128-wide tile, and at 14x14
//     and 7x7 the grid is 98 and 52 blocks on 132 SMs (a third of the GPU idle, the 7x7 one
//     with a long K = 4608 to walk alone). conv_bn_plan.h picks the tile (128x128, 128x64,
//     64x64) from P, C_out and the SM count, and cuts K into slices (split-K) when
//     even 64x64 leaves SMs idle; slices write fp32 partials that splitk_finish_kernel adds.
//   * WMMA is an API over the same tensor-core instructions whose element layout is opaque:
//     its tiles need a padded pitch (bank conflicts otherwise), every 16x16 fragment is its
//     own load, and the epilogue must go through a per-warp scratch. mma.sync m16n8k16 with
//     explicit ldmatrix.x4 (gemm.cu version 4's fragment code, mma.cuh) reads an XOR-swizzled
//     tile conflict-free without padding (64-element rows, chunk c of row r at c ^ (r % 8)),
//     gets two n8 fragments of B per load, and knows where each accumulator lives, so the
//     epilogue stages the whole tile once and stores 16 bytes per thread.
// The gather is v3's (16-byte cp.async copies of 8 channels of one tap; zeros at the padding),
// now 64 k per stage: one 3x3 tap of a 64-channel input per stage.
// Costs: 12 kernels (3 tiles x 2 dtypes x 2 output types) in the build; split-K writes and
// reads splits x P x C_out fp32 partials (9.6 MB in 3 slices at ResNet's 7x7 layer, batch 32)
// and one more launch; only the 16-byte path (C_in % 8 == 0, aligned rows) runs here, the
// scalar gathers (the stem's C_in = 3) keep version 3's kernel. $LEVELS_CONV_BN_V5_PLAN pins a
// plan (tests, sweeps); tests/test_cuda_conv_bn.py mirrors the rule, the gather and slices,
// and the swizzled fragment addressing on the CPU.
namespace mma_conv {
constexpr int BK = CB_BK;

// Where row p of a GEMM's output goes. The forward writes rows contiguously (p * C_out); version
// 6's dgrad runs this kernel on one stride phase of dx, whose row p = (n, t, u) is input pixel
// (n, a + sh*t, b + sw*u) of dx (N, H, W, C_in): a scatter with stride (sh, sw) in the image.
struct RowMap {
  int64_t phase_pixels;  // Ha * Wb: the phase's pixels per image
  int64_t H, W;          // dx's image
  int Wb, a, b, sh, sw;
};
// 32-bit divisions where the values allow (a 64-bit one is a long software routine); tu is
// below Ha * Wb < 2**30 always (the launcher's 32-bit spatial sizes).
__device__ __forceinline__ int64_t scatter_row(const RowMap& m, int64_t p) {
  int64_t n;
  uint32_t tu;
  if (p <= 0x7fffffff && m.phase_pixels <= 0x7fffffff) {
    const uint32_t pp = static_cast<uint32_t>(p), pix = static_cast<uint32_t>(m.phase_pixels);
    n = pp / pix;
    tu = pp - static_cast<uint32_t>(n) * pix;
  } else {
    n = p / m.phase_pixels;
    tu = static_cast<uint32_t>(p - n * m.phase_pixels);
  }
  const uint32_t t = tu / static_cast<uint32_t>(m.Wb), u = tu - t * static_cast<uint32_t>(m.Wb);
  return (n * m.H + m.a + m.sh * static_cast<int64_t>(t)) * m.W + m.b + m.sw * static_cast<int64_t>(u);
}

// Row r, 16-byte chunk c of a (rows x 64) tile sits at chunk c ^ (r % 8) of its row (see
// gemm.cu's swizzle): ldmatrix reads one chunk column of 8 consecutive rows, 8 distinct banks.
__device__ __forceinline__ int swz(int row, int chunk) { return row * BK + ((chunk ^ (row & 7)) << 3); }

// The cp.async pipeline of version 5's and 6's kernels, KT k-tiles: load_stage(stage, t) issues
// the copies of k-tile t into a stage (and may store elements itself: scalar gathers), in order
// t = 0, 1, ...; compute(stage) runs the tensor cores on one. STAGES-1 tiles in flight; one
// commit group per step, empty or not, so that "at most STAGES-2 groups pending" always means
// "the tile about to be used has landed". Ends with every copy landed and a barrier: the
// shared memory is the epilogue's.
template <int STAGES, typename Load, typename Compute>
__device__ __forceinline__ void pipeline(int KT, Load& load_stage, Compute& compute) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    levels_mma::cp_async_commit();
  }
  for (int t = 0; t < KT; ++t) {
    levels_mma::cp_async_wait<STAGES - 2>();
    // tile t visible to every warp, and every warp done with tile t-1, whose stage the
    // prefetch below overwrites
    __syncthreads();
    const int next = t + STAGES - 1;
    if (next < KT) load_stage(next % STAGES, next);
    levels_mma::cp_async_commit();
    compute(t % STAGES);
  }
  levels_mma::cp_async_wait<0>();
  __syncthreads();
}

// One stage of a warp's tensor-core work, BK / 16 steps of k16: load_a(af, mt, kk) fills the A
// fragment of m16 tile mt, load_b(q, nt, kk) b0, b1 of n8 tiles nt and nt + 1 (one
// ldmatrix.x4), then every m16n8 product. The kernels differ only in where their fragments sit.
template <typename T, int MT, int NT, typename LoadA, typename LoadB>
__device__ __forceinline__ void mma_stage(float (&acc)[MT][NT][4], LoadA& load_a, LoadB& load_b) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    uint32_t af[MT][4], bf[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a(af[mt], mt, kk);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t q[4];
      load_b(q, nt, kk);
      bf[nt][0] = q[0];
      bf[nt][1] = q[1];
      bf[nt + 1][0] = q[2];
      bf[nt + 1][1] = q[3];
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) levels_mma::mma_16816<T>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
  }
}

// After the pipeline: the block's BM x BN fp32 tile in the pipeline's shared memory (pitch
// BN + 8 floats), every warp's accumulators written and visible to all.
template <int BM, int BN, int STAGES, int WTM, int WTN, int MT, int NT>
__device__ __forceinline__ float* accumulators_to_smem(const float (&acc)[MT][NT][4],
                                                       unsigned char* smem_raw, int wm, int wn, int lane) {
  static_assert(BM * (BN + 8) * 4 <= STAGES * (BM + BN) * BK * 2, "the fp32 tile fits in the pipeline's smem");
  float* tile = reinterpret_cast<float*>(smem_raw);
  levels_mma::stage_acc<MT, NT>(tile, BN + 8, acc, wm * WTM, wn * WTN, lane);
  __syncthreads();
  return tile;
}

// The tile grid: blockIdx.x walks the (pixel tile, channel tile) pairs with the channel tiles
// of one pixel tile adjacent (they read the same x slice at about the same time: once from
// L2), blockIdx.y is the K slice [y * tiles_per_split, +tiles_per_split) k-tiles. Slice y of
// a split writes the fp32 partial out + y * P * C_out (no bias: the finish adds it).
// SCATTER (version 6's dgrad, one slice): row p goes to row scatter_row(rows, p) of out.
template <typename T, typename TO, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int MIN_BLOCKS,
          bool SCATTER = false>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32, MIN_BLOCKS)
conv_kernel(Geom g, int tiles_per_split,
            const T* __restrict__ x,         // (N, H, W, C_in), strides multiples of 8, sx_c = 1
            const T* __restrict__ w,         // (C_out, kH, kW, C_in) contiguous, 16-byte aligned
            const float* __restrict__ bias,  // (C_out,) fp32 or nullptr
            TO* __restrict__ out,            // (P, C_out) contiguous, or (splits, P, C_out)
            RowMap rows) {                   // SCATTER only
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int THREADS = WARPS_M * WARPS_N * 32;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
  constexpr int MT = WTM / 16, NT = WTN / 8;             // m16 x n8 accumulators per warp
  constexpr int PASS = THREADS / 8;                      // rows one pass of the block copies
  constexpr int A_ROWS = BM / PASS, B_ROWS = BN / PASS;  // rows a thread copies per stage
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile: whole m16 tiles, pairs of n8 tiles");
  static_assert(BM % PASS == 0 && BN % PASS == 0 && PASS % 8 == 0, "whole passes, swizzle period");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);  // [STAGES][BM][BK], swizzled
  T* sB = sA + STAGES * BM * BK;           // [STAGES][BN][BK], swizzled

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int C_in = static_cast<int>(g.C_in), C_out = static_cast<int>(g.C_out);
  const int K = static_cast<int>(g.K), kW = static_cast<int>(g.kW);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int n_tiles = (C_out + BN - 1) / BN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / n_tiles) * BM;
  const int o0 = static_cast<int>(blockIdx.x % n_tiles) * BN;
  const int k_tiles = (K + BK - 1) / BK;
  const int kt_begin = static_cast<int>(blockIdx.y) * tiles_per_split;
  const int KT = max(min(k_tiles - kt_begin, tiles_per_split), 0);
  TO* dst = out + static_cast<int64_t>(blockIdx.y) * g.P * C_out;

  // Thread t copies chunk t % 8 (k = 8 * (t % 8) .. +7 of the stage) of rows t / 8 + i * PASS
  // of both tiles: its chunk, hence its tap (i, j, c), is the same for all its rows, and its
  // rows' pixels are decoded once, here. A row past P gets h0 far below zero: every tap of it
  // reads as padding (zeros), no extra test in the loop.
  const int r0 = tid >> 3, ch = tid & 7;
  int64_t x_off[A_ROWS];  // n * sx_n + h0 * sx_h + w0 * sx_w
  int h0[A_ROWS], w0[A_ROWS];
#pragma unroll
  for (int r = 0; r < A_ROWS; ++r) {
    const int64_t p = m0 + r0 + r * PASS;
    const int64_t pp = p < g.P ? p : 0;
    const int64_t n = pp / (g.H_out * g.W_out), hw = pp % (g.H_out * g.W_out);
    const int hh = static_cast<int>((hw / g.W_out) * g.sh - g.ph);
    const int ww = static_cast<int>((hw % g.W_out) * g.sw - g.pw);
    x_off[r] = n * g.sx_n + static_cast<int64_t>(hh) * g.sx_h + static_cast<int64_t>(ww) * g.sx_w;
    h0[r] = p < g.P ? hh : -(1 << 30);
    w0[r] = ww;
  }
  const T* w_src = w + static_cast<int64_t>(o0 + r0) * K;  // row o0 + r0 of the weight
  const int64_t w_pass = static_cast<int64_t>(PASS) * K;

  auto load_stage = [&](int stage, int kt) {
    const int k = kt * BK + ch * 8;
    const bool k_ok = k < K;  // K % 8 == 0: a chunk is wholly in or out
    const int ij = k / C_in, c = k - ij * C_in, i = ij / kW, j = ij - i * kW;
    const int64_t tap = static_cast<int64_t>(i) * g.sx_h + static_cast<int64_t>(j) * g.sx_w + c;
    const uint32_t a_dst = levels_mma::smem_addr(sA + stage * BM * BK + swz(r0, ch));
#pragma unroll
    for (int r = 0; r < A_ROWS; ++r) {
      const int hi = h0[r] + i, wi = w0[r] + j;
      const bool ok = k_ok && hi >= 0 && hi < H && wi >= 0 && wi < W;
      // swz(r0 + r * PASS, ch) == swz(r0, ch) + r * PASS * BK: PASS is a multiple of 8
      levels_mma::cp_async_16(a_dst + r * PASS * BK * static_cast<int>(sizeof(T)),
                              ok ? x + x_off[r] + tap : x, ok ? 16 : 0);
    }
    const uint32_t b_dst = levels_mma::smem_addr(sB + stage * BN * BK + swz(r0, ch));
#pragma unroll
    for (int r = 0; r < B_ROWS; ++r) {
      const bool ok = k_ok && o0 + r0 + r * PASS < C_out;
      levels_mma::cp_async_16(b_dst + r * PASS * BK * static_cast<int>(sizeof(T)),
                              ok ? w_src + r * w_pass + k : w, ok ? 16 : 0);
    }
  };

  float acc[MT][NT][4] = {};
  auto load_slice = [&](int stage, int t) { load_stage(stage, kt_begin + t); };
  auto compute = [&](int stage) {
    const T* a_s = sA + stage * BM * BK;
    const T* b_s = sB + stage * BN * BK;
    auto load_a = [&](uint32_t (&a)[4], int mt, int kk) {
      // matrices: rows 0-7 / 8-15 (lanes 0-15) at k 0-7, then the same rows at k 8-15
      const int r = wm * WTM + mt * 16 + (lane & 15);
      levels_mma::ldmatrix_x4(a, levels_mma::smem_addr(a_s + swz(r, kk * 2 + (lane >> 4))));
    };
    auto load_b = [&](uint32_t (&q)[4], int nt, int kk) {
      // matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
      const int r = wn * WTN + nt * 8 + (lane & 7) + ((lane >> 4) << 3);
      levels_mma::ldmatrix_x4(q, levels_mma::smem_addr(b_s + swz(r, kk * 2 + ((lane >> 3) & 1))));
    };
    mma_stage<T>(acc, load_a, load_b);
  };
  pipeline<STAGES>(KT, load_slice, compute);

  // Epilogue: the accumulators go to shared memory as an fp32 BM x BN tile (rows padded by 8
  // floats), then each thread takes 8 consecutive channels of one pixel (neighbouring threads
  // the neighbouring 8: coalesced), adds the bias and stores them (16-byte stores when aligned).
  constexpr int LD = BN + 8;
  // SCATTER: each row's destination decoded once (a chain of divisions), by one thread, into
  // shared memory after the fp32 tile; the stores below read it (the barrier in
  // accumulators_to_smem makes it visible).
  int64_t* row_to = reinterpret_cast<int64_t*>(reinterpret_cast<float*>(smem_raw) + BM * LD);
  if constexpr (SCATTER) {
    static_assert(BM * LD * 4 + BM * 8 <= STAGES * (BM + BN) * BK * 2, "row offsets fit after the tile");
    for (int r = tid; r < BM; r += THREADS) row_to[r] = m0 + r < g.P ? scatter_row(rows, m0 + r) : 0;
  }
  const float* tile = accumulators_to_smem<BM, BN, STAGES, WTM, WTN>(acc, smem_raw, wm, wn, lane);
  // p * C_out + o is a multiple of 16 bytes when C_out is a multiple of 16 / sizeof(TO)
  const bool aligned = C_out % (16 / static_cast<int>(sizeof(TO))) == 0 &&
                       (reinterpret_cast<uintptr_t>(dst) & 15) == 0;
  constexpr int CHUNKS_PER_ROW = BN / 8;
  for (int q = tid; q < BM * CHUNKS_PER_ROW; q += THREADS) {
    const int row = q / CHUNKS_PER_ROW, col = (q % CHUNKS_PER_ROW) * 8;
    const int64_t p = m0 + row;
    const int o = o0 + col;
    if (p >= g.P || o >= C_out) continue;
    const float4 lo = *reinterpret_cast<const float4*>(tile + row * LD + col);
    const float4 hi = *reinterpret_cast<const float4*>(tile + row * LD + col + 4);
    float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    if (bias) {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] += o + e < C_out ? bias[o + e] : 0.0f;
    }
    const int64_t to = SCATTER ? row_to[row] : p;  // SCATTER: a multiple of C_out still
    wmma_conv::store_row8<TO>(dst + to * C_out + o, v, C_out - o, aligned);
  }
#endif
}

// Split-K's finish: out[e] = sum_s part[s, e] (+ bias), the slices added in order (the same
// sum every run: no atomics). Element-wise over P * C_out, coalesced. SCATTER: row p of the
// sum goes to row scatter_row(rows, p) of out (version 6's dgrad phases).
template <typename TO, bool SCATTER = false>
__global__ void splitk_finish_kernel(const float* __restrict__ part, int splits, int64_t P,
                                     int64_t C_out, const float* __restrict__ bias,  // nullable
                                     TO* __restrict__ out, RowMap rows) {
  const int64_t total = P * C_out, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    float s = 0.0f;
    for (int q = 0; q < splits; ++q) s += part[q * total + e];
    if (bias) s += bias[e % C_out];
    if constexpr (SCATTER) {
      const int64_t row = total <= 0x7fffffff ? static_cast<uint32_t>(e) / static_cast<uint32_t>(C_out) : e / C_out;
      out[scatter_row(rows, row) * C_out + (e - row * C_out)] = from_f32<TO>(s);
    } else {
      out[e] = from_f32<TO>(s);
    }
  }
}

// Version 6's dgrad weight for one stride phase: w'[c][ti'][tj'][o] = w[o][i][j][c] with
// i = i0 + sh (nti-1-ti'), j = j0 + sw (ntj-1-tj') (the phase's taps, flipped), so that the
// phase's transposed convolution is a forward convolution of dy with w' (conv_dgrad_v6 says
// why): its reduction (ti', tj', o) runs along w' rows, 8 consecutive o in 16 bytes, as the
// forward kernel's B operand needs. blockIdx.z is the tap (ti', tj'); each block transposes a
// 32 x 32 (o, c) tile of that tap through shared memory (both sides coalesced; the +1 column
// keeps the column reads off a single bank).
template <typename T>
__global__ void dgrad_weight_kernel(const T* __restrict__ w, int64_t C_out, int64_t C_in, int64_t K,
                                    int kW, int i0, int j0, int nti, int ntj, int sh, int sw,
                                    T* __restrict__ wt) {  // (C_in, nti, ntj, C_out)
  __shared__ T tile[32][33];
  const int tap = blockIdx.z, ti = tap / ntj, tj = tap % ntj;
  const int i = i0 + sh * (nti - 1 - ti), j = j0 + sw * (ntj - 1 - tj);
  const T* src = w + static_cast<int64_t>(i * kW + j) * C_in;  // + o * K + c
  T* dst = wt + static_cast<int64_t>(tap) * C_out;               // + c * (nti ntj C_out) + o
  const int64_t dst_ld = static_cast<int64_t>(nti) * ntj * C_out;
  const int64_t o0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int d = threadIdx.y; d < 32; d += blockDim.y) {
    const int64_t o = o0 + d, c = c0 + threadIdx.x;
    if (o < C_out && c < C_in) tile[d][threadIdx.x] = src[o * K + c];
  }
  __syncthreads();
  for (int d = threadIdx.y; d < 32; d += blockDim.y) {
    const int64_t c = c0 + d, o = o0 + threadIdx.x;
    if (o < C_out && c < C_in) dst[c * dst_ld + o] = tile[threadIdx.x][d];
  }
}

// ---- wgrad (version 6) ------------------------------------------------------------------
// G[o, k] = sum_p dy[p, o] im2col(x)[p, k] (M = C_out, N = K, the reduction over pixels), as
// version 4's wgrad_kernel, on mma.sync. Both operands run along their non-reduction axis in
// memory (dy along o, x along c), so a stage holds BK = 64 *pixels* as rows, BM (BN) columns
// each: [pixel][o] and [pixel][k], 16-byte copies along the columns. A row of 64 columns is
// swizzled as the forward's tiles (swz); a 128-column tile is two such 64-column panels
// (pswz). ldmatrix .trans turns the pixel-major 8x8 matrices into mma.sync's fragments (the
// transposition on the way into registers, as attention.cu's P.V): A (m16 x k16, "row") from
// [k][m] and B (k16 x n8, "col") from [k][n].
// Pixels change every stage and the im2col decode p -> (n, ho, wo) is a chain of divisions, so
// each thread keeps the (n, ho, wo) of its rows and steps it by 64 pixels per stage (one
// compare-and-carry per axis); its columns never change, so their taps (i, j, c) are decoded
// once. blockIdx.x: the (o tile, k tile) pair, blockIdx.y: the pixel split, which writes the
// fp32 partial part[y] (C_out, K); wgrad_finish_kernel adds the splits in order (deterministic).
// VEC_X: 16-byte copies of x (C_in % 8 == 0, aligned rows, sx_c = 1); else each element is
// gathered on its own into the same swizzled tile (the stem's C_in = 3). dy: C_out % 8 == 0 and
// 16-byte aligned (the launcher checks). P < 2**30: 32-bit pixel indices.
__device__ __forceinline__ int pswz(int row, int chunk) { return (chunk >> 3) * BK * BK + swz(row, chunk & 7); }

template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int MIN_BLOCKS, bool VEC_X>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32, MIN_BLOCKS)
wgrad_kernel(Geom g, int tiles_per_split,
             const T* __restrict__ x,     // (N, H, W, C_in), strided
             const T* __restrict__ dy,    // (P, C_out) contiguous, 16-byte aligned
             float* __restrict__ part) {  // (splits, C_out, K)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int THREADS = WARPS_M * WARPS_N * 32;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
  constexpr int MT = WTM / 16, NT = WTN / 8;             // m16 x n8 accumulators per warp
  constexpr int A_CPR = BM / 8, B_CPR = BN / 8;          // 16-byte chunks per pixel row
  constexpr int A_PASS = THREADS / A_CPR, B_PASS = THREADS / B_CPR;  // rows per pass
  constexpr int A_ROWS = BK / A_PASS, B_ROWS = BK / B_PASS;          // rows a thread copies
  static_assert(THREADS % A_CPR == 0 && THREADS % B_CPR == 0, "whole rows per pass");
  static_assert(BK % A_PASS == 0 && BK % B_PASS == 0, "whole passes per stage");
  static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BM % 64 == 0 && BN % 64 == 0, "panels, pairs of n8");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);  // [STAGES][BK pixels][BM] as BM/64 panels
  T* sB = sA + STAGES * BK * BM;           // [STAGES][BK pixels][BN] as BN/64 panels

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int C_in = static_cast<int>(g.C_in), C_out = static_cast<int>(g.C_out);
  const int K = static_cast<int>(g.K), kW = static_cast<int>(g.kW);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int H_out = static_cast<int>(g.H_out), W_out = static_cast<int>(g.W_out);
  const int sh = static_cast<int>(g.sh), sw = static_cast<int>(g.sw);
  const int ph = static_cast<int>(g.ph), pw = static_cast<int>(g.pw);
  const int P = static_cast<int>(g.P);
  const int n_tiles = (K + BN - 1) / BN;
  const int o0 = static_cast<int>(blockIdx.x / n_tiles) * BM;
  const int k0 = static_cast<int>(blockIdx.x % n_tiles) * BN;
  const int p_begin = static_cast<int>(blockIdx.y) * tiles_per_split * BK;
  const int p_end = min(P, p_begin + tiles_per_split * BK);
  const int KT = p_end > p_begin ? (p_end - p_begin + BK - 1) / BK : 0;
  const T zero = from_f32<T>(0.0f);

  // A: chunk ca of rows ra + r * A_PASS; B: chunk cb of rows rb + r * B_PASS.
  const int ca = tid % A_CPR, ra = tid / A_CPR, cb = tid % B_CPR, rb = tid / B_CPR;
  const int oa = o0 + ca * 8, kb = k0 + cb * 8;
  const bool oa_ok = oa < C_out;  // C_out % 8 == 0: a chunk is wholly in or out
  // B's columns: VEC_X one tap (i, j, c) for the chunk; else one per element (any C_in).
  constexpr int TAPS = VEC_X ? 1 : 8;
  int ti[TAPS], tj[TAPS];
  int64_t toff[TAPS];
#pragma unroll
  for (int e = 0; e < TAPS; ++e) {
    const int k = kb + e;
    const int ij = k / C_in, c = k - ij * C_in, i = ij / kW, j = ij - i * kW;
    ti[e] = k < K ? i : -(1 << 29);  // a column past K reads as padding: never in the image
    tj[e] = j;
    toff[e] = static_cast<int64_t>(i) * g.sx_h + static_cast<int64_t>(j) * g.sx_w + c * g.sx_c;
  }
  // B's rows: (n, ho, wo) of pixel p_begin + rb + r * B_PASS, stepped by BK pixels per stage.
  const int hw_out = H_out * W_out;
  const int step_w = BK % W_out, step_h = (BK / W_out) % H_out, step_n = BK / hw_out;
  int pn[B_ROWS], pho[B_ROWS], pwo[B_ROWS];
#pragma unroll
  for (int r = 0; r < B_ROWS; ++r) {
    const int p = min(p_begin + rb + r * B_PASS, P - 1);  // past P: never valid, any pixel
    pn[r] = p / hw_out;
    const int hw = p - pn[r] * hw_out;
    pho[r] = hw / W_out;
    pwo[r] = hw - pho[r] * W_out;
  }

  auto load_stage = [&](int stage, int t) {  // called for t = 0, 1, ... in order
    const int p0 = p_begin + t * BK;
    T* a_s = sA + stage * BK * BM;
    const uint32_t a_dst = levels_mma::smem_addr(a_s + pswz(ra, ca));
#pragma unroll
    for (int r = 0; r < A_ROWS; ++r) {
      const int p = p0 + ra + r * A_PASS;
      const bool ok = oa_ok && p < p_end;
      // pswz(ra + r * A_PASS, ca) == pswz(ra, ca) + r * A_PASS * BK: A_PASS is a multiple of 8
      levels_mma::cp_async_16(a_dst + r * A_PASS * BK * static_cast<int>(sizeof(T)),
                              ok ? dy + static_cast<int64_t>(p) * C_out + oa : dy, ok ? 16 : 0);
    }
    T* b_s = sB + stage * BK * BN;
#pragma unroll
    for (int r = 0; r < B_ROWS; ++r) {
      const int row = rb + r * B_PASS;
      const bool p_ok = p0 + row < p_end;
      const int hb = pho[r] * sh - ph, wb = pwo[r] * sw - pw;
      const T* x_img = x + static_cast<int64_t>(pn[r]) * g.sx_n + static_cast<int64_t>(hb) * g.sx_h +
                       static_cast<int64_t>(wb) * g.sx_w;
      if constexpr (VEC_X) {
        const int hi = hb + ti[0], wi = wb + tj[0];
        const bool ok = p_ok && hi >= 0 && hi < H && wi >= 0 && wi < W;
        levels_mma::cp_async_16(levels_mma::smem_addr(b_s + pswz(row, cb)), ok ? x_img + toff[0] : x,
                                ok ? 16 : 0);
      } else {
        T* dst = b_s + pswz(row, cb);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int hi = hb + ti[e], wi = wb + tj[e];
          const bool ok = p_ok && hi >= 0 && hi < H && wi >= 0 && wi < W;
          dst[e] = ok ? x_img[toff[e]] : zero;
        }
      }
      // the next stage's pixel: + BK = step_n images + step_h rows + step_w columns, carried
      pwo[r] += step_w;
      if (pwo[r] >= W_out) pwo[r] -= W_out, ++pho[r];
      pho[r] += step_h;
      if (pho[r] >= H_out) pho[r] -= H_out, ++pn[r];
      pn[r] += step_n;
    }
  };

  float acc[MT][NT][4] = {};
  auto compute = [&](int stage) {
    const T* a_s = sA + stage * BK * BM;
    const T* b_s = sB + stage * BK * BN;
    auto load_a = [&](uint32_t (&a)[4], int mt, int kk) {
      // matrices (transposed from [pixel][o]): (m 0-7, k 0-7), (m 8-15, k 0-7),
      // (m 0-7, k 8-15), (m 8-15, k 8-15): a0..a3
      const int m = wm * WTM + mt * 16;
      const int row = kk * 16 + ((lane >> 4) << 3) + (lane & 7);
      levels_mma::ldmatrix_x4_trans(a, levels_mma::smem_addr(a_s + pswz(row, (m >> 3) + ((lane >> 3) & 1))));
    };
    auto load_b = [&](uint32_t (&q)[4], int nt, int kk) {
      // matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
      const int n = wn * WTN + nt * 8;
      levels_mma::ldmatrix_x4_trans(q, levels_mma::smem_addr(b_s + pswz(kk * 16 + (lane & 15), (n >> 3) + (lane >> 4))));
    };
    mma_stage<T>(acc, load_a, load_b);
  };
  pipeline<STAGES>(KT, load_stage, compute);

  // Epilogue: the fp32 tile through shared memory, then 8 consecutive k of one o per thread
  // into this split's partial (16-byte stores when K keeps the rows aligned).
  constexpr int LD = BN + 8;
  const float* tile = accumulators_to_smem<BM, BN, STAGES, WTM, WTN>(acc, smem_raw, wm, wn, lane);
  float* dst = part + static_cast<int64_t>(blockIdx.y) * C_out * K;
  const bool aligned = K % 4 == 0 && (reinterpret_cast<uintptr_t>(part) & 15) == 0;
  constexpr int CHUNKS_PER_ROW = BN / 8;
  for (int q = tid; q < BM * CHUNKS_PER_ROW; q += THREADS) {
    const int row = q / CHUNKS_PER_ROW, col = (q % CHUNKS_PER_ROW) * 8;
    const int o = o0 + row, k = k0 + col;
    if (o >= C_out || k >= K) continue;
    const float* v = tile + row * LD + col;
    wmma_conv::store_row8<float>(dst + static_cast<int64_t>(o) * K + k, v, K - k, aligned);
  }
#endif
}
}  // namespace mma_conv

// =========================================================================================
// BatchNorm around the convolution.
// =========================================================================================

// The caller's weight (or its gradient) as it lies: element (o, k) of the (C_out, K) matrix,
// k = (i, j, c), at o * so + i * si + j * sj + c * sc. BatchNorm's two kernels that touch the
// weight element by element (the eval fold, which writes the K-major w' the convolutions read,
// and the wgrad's finish, which writes dW) take it through these strides, so an OIHW weight
// (nn.Conv2d's default), a channels_last one or a strided view costs no copy and its gradient
// comes back in its own layout (autograd then keeps it as it is: no copy into .grad either).
// Cost: a division and a modulo per element in two small per-channel kernels.
struct WeightLayout {
  int64_t so, si, sj, sc;  // element strides of (C_out, kH, kW, C_in)
  int64_t kW, C_in;
  __device__ int64_t at(int64_t o, int64_t k) const {
    const int64_t c = k % C_in, ij = k / C_in;
    return o * so + (ij / kW) * si + (ij % kW) * sj + c * sc;
  }
};

// Eval: block o folds channel o. w is read through its layout; w' is (C_out, kH, kW, C_in)
// contiguous in the input dtype (it feeds the same conv kernels); b', scale = gamma * invstd
// and invstd are fp32.
template <typename T>
__global__ void fold_bn_kernel(const T* __restrict__ w, WeightLayout wl,
                               const T* __restrict__ bias,  // nullable
                               const T* __restrict__ gamma, const T* __restrict__ beta,
                               const T* __restrict__ mean, const T* __restrict__ var, float eps,
                               int64_t K, T* __restrict__ w_folded, float* __restrict__ b_folded,
                               T* __restrict__ b_folded_t,  // b' in T too (version 4's GEMMs)
                               float* __restrict__ scale, float* __restrict__ invstd) {
  const int64_t o = blockIdx.x;
  // ### BEGIN SOLUTION
  const float is = 1.0f / sqrtf(to_f32(var[o]) + eps);
  const float s = to_f32(gamma[o]) * is;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    w_folded[o * K + k] = from_f32<T>(to_f32(w[wl.at(o, k)]) * s);
  if (threadIdx.x == 0) {
    const float shift = (bias ? to_f32(bias[o]) : 0.0f) - to_f32(mean[o]);
    b_folded[o] = shift * s + to_f32(beta[o]);
    scale[o] = s;
    invstd[o] = is;
  }
  // ### END SOLUTION
  if (threadIdx.x == 0) b_folded_t[o] = from_f32<T>(b_folded[o]);  // this thread's own write
}

// The per-channel reductions over the P rows of a (P, C) matrix all use one shape: block
// (32 channels) x (8 row lanes), one block per chunk of rows and 32 channels, so that a warp
// reads 32 consecutive channels of one row (coalesced), and partial results per chunk are
// merged by a second kernel (deterministic, no atomics).
constexpr int RED_C = 32, RED_R = 8;

// Sum over the 8 row lanes of a block; every thread of column threadIdx.x gets it.
__device__ __forceinline__ float column_lanes_sum(float v, float (*buf)[RED_C + 1]) {
  __syncthreads();  // buf may still be read by a previous call
  buf[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int r = 0; r < RED_R; ++r) total += buf[r][threadIdx.x];
  return total;
}

// Train: per chunk, the mean of y and the sum of squared deviations from it (M2). Two passes
// over the chunk's rows: the second reads them from L2.
__global__ void stats_partial_kernel(const float* __restrict__ y, int64_t P, int64_t C,
                                     int64_t rows_per_chunk, float* __restrict__ part_mean,
                                     float* __restrict__ part_m2) {
  __shared__ float buf[RED_R][RED_C + 1];
  const int64_t chunk = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * RED_C + threadIdx.x;
  const int64_t first = chunk * rows_per_chunk, last = min(P, first + rows_per_chunk);
  float s = 0.0f;
  if (c < C)
    for (int64_t r = first + threadIdx.y; r < last; r += RED_R) s += y[r * C + c];
  const float mean = column_lanes_sum(s, buf) / static_cast<float>(last - first);
  float m2 = 0.0f;
  if (c < C)
    for (int64_t r = first + threadIdx.y; r < last; r += RED_R) {
      const float d = y[r * C + c] - mean;
      m2 += d * d;
    }
  m2 = column_lanes_sum(m2, buf);
  if (threadIdx.y == 0 && c < C) {
    part_mean[chunk * C + c] = mean;
    part_m2[chunk * C + c] = m2;
  }
}

// (n, mean, M2) of the union of two parts, from those of the parts (Chan et al.), in double.
__device__ __forceinline__ void chan_merge(double& n_a, double& mean_a, double& m2_a, double n_b,
                                           double mean_b, double m2_b) {
  const double n = n_a + n_b;
  if (n == 0.0) return;  // two empty parts (a lane with no chunk)
  const double delta = mean_b - mean_a;
  // A part holding an Inf of y has an infinite mean, and the update would subtract it from
  // itself (Inf - Inf = NaN) where a plain sum gives Inf. Then the weighted mean instead, as
  // torch's batch statistics give it: +Inf stays +Inf, +Inf beside -Inf is NaN. (M2 turns
  // Inf or NaN either way, as torch's variance does.)
  mean_a = isfinite(delta) ? mean_a + delta * n_b / n : (n_a * mean_a + n_b * mean_b) / n;
  m2_a += m2_b + delta * delta * n_a * n_b / n;
  n_a = n;
}

// The finalize kernels' block: 32 neighbouring channels (coalesced reads of a chunk's row)
// x FIN_R lanes that split the chunks. One thread per channel walking all (up to 512)
// chunks was a chain of 512 dependent fp64 divisions: ~200 us a call on an H200, 1.6 ms of a
// CNN training step; FIN_R lanes and a tree of merges make the chain 512 / FIN_R + log2(FIN_R).
constexpr int FIN_R = 16;

// Train: the block merges its channels' chunks (Chan et al.: mean and M2 of a union from
// those of the parts, in double), lane y taking chunks y, y + FIN_R, ..., then the lanes
// merged pairwise in shared memory; lane 0 then computes
//   running_mean' = (1 - momentum) running_mean + momentum (mean + bias)
//   running_var'  = (1 - momentum) running_var  + momentum var * P / (P - 1)   (unbiased)
//   out = y * scale + shift with scale = gamma * invstd, shift = beta - mean * scale.
template <typename T>
__global__ void stats_finalize_kernel(const float* __restrict__ part_mean,
                                      const float* __restrict__ part_m2, int64_t chunks,
                                      int64_t rows_per_chunk, int64_t P, int64_t C,
                                      const T* __restrict__ bias,  // nullable
                                      const T* __restrict__ gamma, const T* __restrict__ beta,
                                      const T* __restrict__ running_mean,
                                      const T* __restrict__ running_var, float eps,
                                      float momentum, float* __restrict__ mean_out,
                                      float* __restrict__ invstd_out,
                                      T* __restrict__ new_running_mean,
                                      T* __restrict__ new_running_var, float* __restrict__ scale,
                                      float* __restrict__ shift) {
  __shared__ double lanes[3][FIN_R][RED_C + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * RED_C + threadIdx.x;
  const int y = threadIdx.y;
  double n_a = 0.0, mean_a = 0.0, m2_a = 0.0;
  if (c < C)
    for (int64_t s = y; s < chunks; s += FIN_R)
      chan_merge(n_a, mean_a, m2_a, static_cast<double>(min(rows_per_chunk, P - s * rows_per_chunk)),
                 part_mean[s * C + c], part_m2[s * C + c]);
#pragma unroll
  for (int half = FIN_R / 2; half >= 1; half /= 2) {  // lanes [half, 2 half) into [0, half)
    if (y >= half && y < 2 * half) {
      lanes[0][y - half][threadIdx.x] = n_a;
      lanes[1][y - half][threadIdx.x] = mean_a;
      lanes[2][y - half][threadIdx.x] = m2_a;
    }
    __syncthreads();
    if (y < half) chan_merge(n_a, mean_a, m2_a, lanes[0][y][threadIdx.x], lanes[1][y][threadIdx.x],
                             lanes[2][y][threadIdx.x]);
    __syncthreads();
  }
  if (y != 0 || c >= C) return;
  // ### BEGIN SOLUTION
  const double var = m2_a / static_cast<double>(P);
  const float is = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  const float mean = static_cast<float>(mean_a);
  mean_out[c] = mean;
  invstd_out[c] = is;
  const float full_mean = mean + (bias ? to_f32(bias[c]) : 0.0f);
  const float unbiased = static_cast<float>(var * static_cast<double>(P) / static_cast<double>(P - 1));
  new_running_mean[c] = from_f32<T>((1.0f - momentum) * to_f32(running_mean[c]) + momentum * full_mean);
  new_running_var[c] = from_f32<T>((1.0f - momentum) * to_f32(running_var[c]) + momentum * unbiased);
  const float sc = to_f32(gamma[c]) * is;
  scale[c] = sc;
  shift[c] = to_f32(beta[c]) - mean * sc;
  // ### END SOLUTION
}

template <typename T>
__global__ void channel_affine_kernel(const float* __restrict__ y, const float* __restrict__ scale,
                                      const float* __restrict__ shift, T* __restrict__ out,
                                      int64_t P, int64_t C) {
  const int64_t total = P * C, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t c = e % C;
    out[e] = from_f32<T>(y[e] * scale[c] + shift[c]);
  }
}

// sum_p m[p, c] per chunk of rows (dbeta-like sums of the backward).
template <typename T>
__global__ void column_sum_partial_kernel(const T* __restrict__ m, int64_t P, int64_t C,
                                          int64_t rows_per_chunk, float* __restrict__ part) {
  __shared__ float buf[RED_R][RED_C + 1];
  const int64_t chunk = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * RED_C + threadIdx.x;
  const int64_t first = chunk * rows_per_chunk, last = min(P, first + rows_per_chunk);
  float s = 0.0f;
  if (c < C)
    for (int64_t r = first + threadIdx.y; r < last; r += RED_R) s += to_f32(m[r * C + c]);
  s = column_lanes_sum(s, buf);
  if (threadIdx.y == 0 && c < C) part[chunk * C + c] = s;
}

// Train backward, per chunk: sum dOut and sum dOut * xhat, xhat = (y - mean) * invstd.
template <typename T>
__global__ void bn_bwd_partial_kernel(const T* __restrict__ dout, const float* __restrict__ y,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ invstd, int64_t P, int64_t C,
                                      int64_t rows_per_chunk, int64_t chunks,
                                      float* __restrict__ part) {  // (2, chunks, C)
  __shared__ float buf[RED_R][RED_C + 1];
  const int64_t chunk = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * RED_C + threadIdx.x;
  const int64_t first = chunk * rows_per_chunk, last = min(P, first + rows_per_chunk);
  float s_dy = 0.0f, s_dyx = 0.0f;
  if (c < C) {
    const float mu = mean[c], is = invstd[c];
    for (int64_t r = first + threadIdx.y; r < last; r += RED_R) {
      const float d = to_f32(dout[r * C + c]);
      s_dy += d;
      s_dyx += d * (y[r * C + c] - mu) * is;
    }
  }
  s_dy = column_lanes_sum(s_dy, buf);
  s_dyx = column_lanes_sum(s_dyx, buf);
  if (threadIdx.y == 0 && c < C) {
    part[chunk * C + c] = s_dy;
    part[(chunks + chunk) * C + c] = s_dyx;
  }
}

// Adds the chunks of `n_sums` stacked partials (n_sums, chunks, C) into sums (n_sums, C); the
// first sum also goes to out0 and the second to out1 in the input dtype (nullable). A
// (RED_C, RED_R) block: 32 channels, the chunks split over 8 row lanes and summed across them
// (a chain of chunks / 8 additions, not chunks).
template <typename T>
__global__ void chunks_finalize_kernel(const float* __restrict__ part, int64_t chunks, int64_t C,
                                       int n_sums, float* __restrict__ sums, T* __restrict__ out0,
                                       T* __restrict__ out1) {
  __shared__ float buf[RED_R][RED_C + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * RED_C + threadIdx.x;
  for (int q = 0; q < n_sums; ++q) {
    float s = 0.0f;
    if (c < C)
      for (int64_t k = threadIdx.y; k < chunks; k += RED_R) s += part[(q * chunks + k) * C + c];
    s = column_lanes_sum(s, buf);  // every thread of the block: it holds barriers
    if (threadIdx.y == 0 && c < C) {
      sums[q * C + c] = s;
      T* o = q == 0 ? out0 : out1;
      if (o) o[c] = from_f32<T>(s);
    }
  }
}

// Train backward: the gradient of the convolution's output,
//   dy = gamma * invstd * (dOut - mean_p(dOut) - xhat * mean_p(dOut * xhat)),
// written in T for the convolution's backward, and its per-chunk column sums taken in fp32
// *before* that rounding (part, (chunks, C)): they are the conv bias's gradient, which is exactly
// zero in training. Summed from the rounded dy it would be P roundings of 2^-8 relative each,
// a random walk that grows with P and 1/sigma(y) (the stem measured 0.04 of the gradient's
// scale in bf16); summed here it cancels to fp32 rounding. The tile walks the rows of a chunk
// like bn_bwd_partial_kernel's: 32 neighbouring channels per warp, coalesced.
template <typename T>
__global__ void bn_bwd_apply_kernel(const T* __restrict__ dout, const float* __restrict__ y,
                                    const float* __restrict__ mean, const float* __restrict__ invstd,
                                    const T* __restrict__ gamma, const float* __restrict__ sums,
                                    int64_t P, int64_t C, int64_t rows_per_chunk,
                                    T* __restrict__ dy, float* __restrict__ part) {  // (chunks, C)
  __shared__ float buf[RED_R][RED_C + 1];
  const int64_t chunk = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * RED_C + threadIdx.x;
  const int64_t first = chunk * rows_per_chunk, last = min(P, first + rows_per_chunk);
  const float inv_p = 1.0f / static_cast<float>(P);
  float s = 0.0f;
  if (c < C) {
    // ### BEGIN SOLUTION
    const float mu = mean[c], is = invstd[c], k = to_f32(gamma[c]) * is;
    const float mean_dy = sums[c] * inv_p, mean_dyx = sums[C + c] * inv_p;
    for (int64_t r = first + threadIdx.y; r < last; r += RED_R) {
      const int64_t e = r * C + c;
      const float xhat = (y[e] - mu) * is;
      const float d = k * (to_f32(dout[e]) - mean_dy - xhat * mean_dyx);
      dy[e] = from_f32<T>(d);
      s += d;
    }
    // ### END SOLUTION
  }
  s = column_lanes_sum(s, buf);
  if (threadIdx.y == 0 && c < C) part[chunk * C + c] = s;
}

// Block o adds the wgrad splits of channel o: G[o, k] = sum_s part[s, o, k]; dW and w (eval)
// through their layouts.
//   train: dW = G.
//   eval (the forward ran on w' = scale * w): dW = scale * G, and the BN/bias gradients
//     dgamma = invstd * (sum_k w[o,k] G[o,k] + (b - mean) sum_p dOut),  dbeta = sum_p dOut,
//     dbias = scale * sum_p dOut (written even without a bias: the binding then drops it).
template <typename T>
__global__ void wgrad_finish_kernel(const float* __restrict__ part, int64_t splits, int64_t C_out,
                                    int64_t K, T* __restrict__ dw, WeightLayout dwl, bool eval,
                                    const T* __restrict__ w, WeightLayout wl,
                                    const float* __restrict__ scale,
                                    const float* __restrict__ invstd, const T* __restrict__ mean,
                                    const T* __restrict__ bias, const float* __restrict__ sum_dy,
                                    T* __restrict__ dgamma, T* __restrict__ dbeta,
                                    T* __restrict__ dbias) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x;
  const float s = eval ? scale[o] : 1.0f;
  float wdot = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    float g = 0.0f;
    for (int64_t q = 0; q < splits; ++q) g += part[(q * C_out + o) * K + k];
    if (eval) wdot += to_f32(w[wl.at(o, k)]) * g;
    dw[dwl.at(o, k)] = from_f32<T>(g * s);
  }
  if (!eval) return;  // uniform over the block: no thread skips the barrier below alone
  // ### BEGIN SOLUTION
  wdot = block_sum(wdot, scratch);
  if (threadIdx.x == 0) {
    const float sdy = sum_dy[o];
    const float shift = (bias ? to_f32(bias[o]) : 0.0f) - to_f32(mean[o]);
    dgamma[o] = from_f32<T>(invstd[o] * (wdot + shift * sdy));
    dbeta[o] = from_f32<T>(sdy);
    dbias[o] = from_f32<T>(s * sdy);
  }
  // ### END SOLUTION
}

// =========================================================================================
// Launchers.
// =========================================================================================

static Geom make_geom(int64_t N, int64_t H, int64_t W, int64_t C_in, int64_t C_out, int64_t kH,
                      int64_t kW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t sx_n,
                      int64_t sx_h, int64_t sx_w, int64_t sx_c) {
  Geom g{N, H, W, C_in, C_out, kH, kW, sh, sw, ph, pw, sx_n, sx_h, sx_w, sx_c, 0, 0, 0, 0};
  g.H_out = (H + 2 * ph - kH) / sh + 1;
  g.W_out = (W + 2 * pw - kW) / sw + 1;
  g.P = N * g.H_out * g.W_out;
  g.K = kH * kW * C_in;
  return g;
}

// Rows per chunk of the per-channel reductions: at most ~512 chunks (enough blocks for the
// GPU when C is small), at least 64 rows each.
static int64_t chunk_rows(int64_t P) { return levels_cdiv(P, 512) > 64 ? levels_cdiv(P, 512) : 64; }
static int64_t chunk_count(int64_t P) { return levels_cdiv(P, chunk_rows(P)); }

// wgrad splits of the pixel axis: ~4096 pixels each (at most 64), rounded so none is empty.
static int64_t wgrad_splits(int64_t P) {
  int64_t s = levels_cdiv(P, 4096);
  s = s < 1 ? 1 : (s > 64 ? 64 : s);
  const int64_t per = levels_cdiv(P, s);
  return levels_cdiv(P, per);
}

// A per-device fact the launchers need on every call, asked of the driver once per device: the
// queries were host time every call paid for nothing. `ask` returns 0 when the driver cannot
// say (not cached then); two first calls racing write the same value, harmlessly.
template <typename Ask>
static int per_device(int (&cache)[64], Ask ask) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  const bool cacheable = dev >= 0 && dev < 64;
  if (cacheable && cache[dev] != 0) return cache[dev];
  const int value = ask(dev);
  if (cacheable) cache[dev] = value;
  return value;
}

// The current device's compute capability as 10 * major + minor (0 if the driver cannot say).
static int device_capability() {
  static int cache[64] = {};
  return per_device(cache, [](int dev) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
      return 0;
    return 10 * major + minor;
  });
}

static bool tensor_cores_available() { return device_capability() >= 80; }  // bf16 WMMA and cp.async

// The current device's SM count (version 5's tile rule asks it on every call).
static int device_sms() {
  static int cache[64] = {};
  const int sms = per_device(cache, [](int) { return levels_sm_count(); });
  return sms > 0 ? sms : 1;
}

// Whether the tensor-core kernels run: 16-bit inputs on sm_80+, at sizes their 32-bit spatial
// indices hold (offsets stay 64-bit). Elsewhere versions 3 and 4 run version 2's kernels.
template <typename T>
static bool tensor_core_path(int version, const Geom& g) {
  const int64_t lim = int64_t{1} << 30;
  const bool fits_32 = g.K < lim && g.kH * g.kW * g.C_out < lim && g.H * g.W < lim &&
                       g.H_out * g.W_out < lim && g.C_out < lim;
  return version >= 3 && !is_f32<T>::value && fits_32 && tensor_cores_available();
}

// ---- version 4's 1x1 convolutions as plain GEMMs (gemm.cu) ----
// A 1x1 convolution with stride 1 and no padding is a matrix product over the channels,
// with nothing to gather: out (P, C_out) = x (P, C_in) . w^T. gemm.cu's best kernel for the
// GPU does it (the one cuda_kernels/mlp.py picks for the MLP: version 6, TMA + wgmma, on
// sm_90; version 4, mma.sync + ldmatrix, elsewhere), at up to twice the tensor-core rate of
// WMMA. Its rule: both operands K-major (contiguous along the reduction) with rows 16 bytes
// apart a whole number of times and 16-byte aligned starts; where a layout breaks it, the
// implicit-GEMM kernels run instead.
static int gemm_version() { return device_capability() == 90 ? 6 : 4; }

template <typename T> constexpr int dtype_code() { return std::is_same<T, __half>::value ? LEVELS_F16 : LEVELS_BF16; }

static bool is_pointwise(const Geom& g) {
  return g.kH == 1 && g.kW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}

// The stride between consecutive pixels when x's (N, H, W) axes collapse into one pixel axis
// of a (P, C_in) matrix (each axis of more than one element then steps over all the axes
// inside it), else -1. Contiguous channels_last x: C_in.
static int64_t pixel_stride(const Geom& g) {
  const int64_t size[3] = {g.W, g.H, g.N}, stride[3] = {g.sx_w, g.sx_h, g.sx_n};
  int64_t ld = -1, inner = 1;
  for (int d = 0; d < 3; ++d) {
    if (size[d] == 1) continue;
    if (ld < 0) ld = stride[d];
    else if (stride[d] != ld * inner) return -1;
    inner *= size[d];
  }
  return ld < 0 ? levels_cdiv(g.C_in, 8) * 8 : ld;  // one pixel: its stride is never used
}

// K-major operand rows: contiguous along K, row stride a multiple of 8 elements, aligned start.
static bool k_major(const void* p, int64_t row_stride) {
  return row_stride > 0 && row_stride % 8 == 0 && levels_aligned16(p);
}

// ---- version 5's forward: the plan (conv_bn_plan.h) and its launch ----
// $LEVELS_CONV_BN_V5_PLAN pins the plan for tests and sweeps: "TILE" or "TILE,SPLITS" with
// TILE 0-2 (conv_bn_plan.h's CbTile: 128x128, 128x64, 64x64; -1 lets the rule choose)
// and SPLITS >= 1 K slices (0 or absent: the rule's). Read at every call (a getenv: ~100 ns),
// so a test can change it between calls. Returns false for a value it cannot parse.
static unsigned elementwise_blocks(int64_t n);  // below, with the other grid helpers

// $LEVELS_CONV_BN_V6_DGRAD_PLAN does the same for version 6's dgrad (every phase), with TILE
// 0-3 (3: CB_128x16); $LEVELS_CONV_BN_V6_WGRAD_PLAN for its wgrad (TILE 1 or 2, 0 taken as
// the rule's: cb_wgrad_plan has no 128x128; SPLITS the pixel splits, at most what the
// workspace holds).
constexpr const char* V5_PLAN_ENV = "LEVELS_CONV_BN_V5_PLAN";
constexpr const char* V6_DGRAD_PLAN_ENV = "LEVELS_CONV_BN_V6_DGRAD_PLAN";
constexpr const char* V6_WGRAD_PLAN_ENV = "LEVELS_CONV_BN_V6_WGRAD_PLAN";
static bool plan_forced(const char* env, int n_tiles, int* tile, int* splits) {
  *tile = -1, *splits = 0;
  const char* s = getenv(env);
  if (s == nullptr) return true;
  while (*s == ' ') ++s;
  if (*s == '\0') return true;
  char* end = nullptr;
  const long t = strtol(s, &end, 10);
  if (end == s || t < -1 || t >= n_tiles) return false;
  *tile = static_cast<int>(t);
  while (*end == ' ') ++end;
  if (*end == '\0') return true;
  if (*end != ',') return false;
  const char* rest = end + 1;
  const long sp = strtol(rest, &end, 10);
  while (*end == ' ') ++end;
  if (end == rest || *end != '\0' || sp < 0 || sp > 1024) return false;
  *splits = static_cast<int>(sp);
  return true;
}

static bool v5_forced(int* tile, int* splits) { return plan_forced(V5_PLAN_ENV, CB_TILES, tile, splits); }
static bool v6_dgrad_forced(int* tile, int* splits) {
  return plan_forced(V6_DGRAD_PLAN_ENV, CB_DGRAD_TILES, tile, splits);
}

static CbPlan v5_plan(int64_t P, int64_t C_out, int64_t K) {
  int tile = -1, splits = 0;
  v5_forced(&tile, &splits);  // a malformed value is refused by the launcher, not here
  return cb_plan(P, C_out, K, device_sms(), tile, splits);
}

// fp32 floats of split-K partials version 5's forward may write (0 when it does not split).
static int64_t v5_part_floats(int version, int64_t P, int64_t C_out, int64_t K) {
  if (version < 5) return 0;
  const CbPlan plan = v5_plan(P, C_out, K);
  return plan.splits > 1 ? plan.splits * P * C_out : 0;
}

template <typename T, typename TO, int TILE, bool SCATTER = false>
static int v5_launch_tile(const Geom& g, const CbPlan& plan, const T* x, const T* w,
                          const float* bias, TO* out, cudaStream_t stream,
                          mma_conv::RowMap rows = {}) {
  constexpr CbTileShape S = cb_tile_shape(TILE);
  constexpr int smem = S.stages * (S.bm + S.bn) * mma_conv::BK * static_cast<int>(sizeof(T));
  auto kernel = mma_conv::conv_kernel<T, TO, S.bm, S.bn, S.warps_m, S.warps_n, S.stages, S.blocks_per_sm, SCATTER>;
  levels_smem_opt_in_once(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid(static_cast<unsigned>(plan.blocks), static_cast<unsigned>(plan.splits));
  kernel<<<grid, S.warps_m * S.warps_n * 32, smem, stream>>>(g, plan.tiles_per_split, x, w, bias, out, rows);
  return levels_launch_status();
}

// DGRAD (version 6's dgrad): the narrow tile too, and rows scattered into dx unless the
// output is split-K's fp32 partials (contiguous; the finish scatters them). The forward's
// calls (DGRAD false) instantiate exactly version 5's kernels.
template <typename T, typename TO, typename TK, bool DGRAD = false>
static int v5_launch(const Geom& g, const CbPlan& plan, const T* x, const T* w, const float* bias,
                     TK* out, cudaStream_t stream, mma_conv::RowMap rows = {}) {
  constexpr bool SC = DGRAD && !std::is_same<TK, float>::value;
  if constexpr (DGRAD) {
    if (plan.tile == CB_128x16) return v5_launch_tile<T, TK, CB_128x16, SC>(g, plan, x, w, bias, out, stream, rows);
  }
  switch (plan.tile) {
    case CB_128x128: return v5_launch_tile<T, TK, CB_128x128, SC>(g, plan, x, w, bias, out, stream, rows);
    case CB_128x64: return v5_launch_tile<T, TK, CB_128x64, SC>(g, plan, x, w, bias, out, stream, rows);
    default: return v5_launch_tile<T, TK, CB_64x64, SC>(g, plan, x, w, bias, out, stream, rows);
  }
}

// out (P, C_out) = im2col(x) w^T (+ bias): one launch, or with split-K the slices into
// `part` (v5_part_floats of them) and the finish.
template <typename T, typename TO>
static int conv_fwd_v5(const Geom& g, const T* x, const T* w, const float* bias, TO* out,
                       float* part, cudaStream_t stream) {
  int tile = 0, splits = 0;
  if (!v5_forced(&tile, &splits)) return LEVELS_UNSUPPORTED;  // a malformed $LEVELS_CONV_BN_V5_PLAN
  const CbPlan plan = v5_plan(g.P, g.C_out, g.K);
  if (plan.blocks > 0x7fffffff || plan.splits > 65535) return LEVELS_UNSUPPORTED;
  if (plan.splits == 1) return v5_launch<T, TO, TO>(g, plan, x, w, bias, out, stream);
  if (part == nullptr) return LEVELS_UNSUPPORTED;  // the caller's workspace has no room
  const int status = v5_launch<T, TO, float>(g, plan, x, w, nullptr, part, stream);
  if (status != 0) return status;
  mma_conv::splitk_finish_kernel<TO><<<elementwise_blocks(g.P * g.C_out), 256, 0, stream>>>(
      part, plan.splits, g.P, g.C_out, bias, out, mma_conv::RowMap{});
  return levels_launch_status();
}

// The forward convolution of every version. part: version 5's split-K partials
// (v5_part_floats; nullptr when the caller has none).
template <typename T, typename TO>
static int conv_fwd(int version, const Geom& g, const T* x, const T* w, const float* bias,
                    const T* bias_t, TO* out, float* part, cudaStream_t stream) {
  if (tensor_core_path<T>(version, g)) {
    if constexpr (!is_f32<T>::value) {
      const int64_t ld = pixel_stride(g);
      // C_out >= 128: the GEMM's tiles are 128 or 256 columns wide, so a 64-channel output
      // wastes half of each (ResNet-50's 256 -> 64 1x1, eval, H100: 0.84x cuDNN through the
      // GEMM, 0.97x through the implicit kernel; reports/h100-conv-bn5.json).
      if (version >= 4 && is_pointwise(g) && g.C_out >= 128 && g.sx_c == 1 && k_major(x, ld) &&
          k_major(w, g.C_in)) {
        // out = x . w^T: B[k=c, n=o] = w[o, c] is the (N, K) K-major w itself. Eval passes the
        // folded bias in T (gemm.cu's bias dtype: one more rounding of b', ~ the rounding of
        // the output itself); train writes fp32 y with no bias.
        return levels_gemm_matmul(dtype_code<T>(), gemm_version(), 0, x, ld, 1, w, 1, g.C_in, out,
                                  g.C_out, 1, is_f32<TO>::value ? 1 : 0, bias_t, 1, nullptr, 0, 0,
                                  /*EPI_NONE*/ 0, 0, g.P, g.C_out, g.C_in, stream);
      }
      const bool vec = g.C_in % 8 == 0 && g.sx_c == 1 && g.sx_n % 8 == 0 && g.sx_h % 8 == 0 &&
                       g.sx_w % 8 == 0 && levels_aligned16(x) && levels_aligned16(w);
      if (version >= 5 && vec) return conv_fwd_v5<T, TO>(g, x, w, bias, out, part, stream);
      const int64_t blocks = levels_cdiv(g.P, wmma_conv::BM) * levels_cdiv(g.C_out, wmma_conv::BN);
      auto kernel = vec ? wmma_conv::conv_kernel<T, TO, true> : wmma_conv::conv_kernel<T, TO, false>;
      constexpr int smem = wmma_conv::smem_bytes<false, false>();
      levels_smem_opt_in_once(reinterpret_cast<const void*>(kernel), smem);
      kernel<<<static_cast<unsigned>(blocks), wmma_conv::THREADS, smem, stream>>>(g, x, w, bias, out);
      return levels_launch_status();
    }
  }
  if (version == 1) {
    const int64_t blocks = levels_cdiv(g.P * g.C_out, 256);
    conv_direct_kernel<T, TO><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(g, x, w, bias, out);
    return levels_launch_status();
  }
  // v2, and v3/v4 where they cannot run (fp32, a GPU before sm_80, sizes past 32-bit indices).
  tiled::ConvFwd<T, TO> op{g, x, w, bias, out};
  const dim3 grid(static_cast<unsigned>(levels_cdiv(g.P, tiled::BM)),
                  static_cast<unsigned>(levels_cdiv(g.C_out, tiled::BN)), 1);
  tiled::gemm_kernel<<<grid, tiled::THREADS, 0, stream>>>(op, g.P, g.C_out, g.K, g.K);
  return levels_launch_status();
}

// ---- version 6's dgrad: each stride phase as a forward convolution on version 5's kernels ----
// Within phase (a, b) (wmma_conv::DgradPhase), dx[n, a + sh t, b + sw u, c] =
// sum_{ti, tj, o} dy[n, t + base_h - ti, u + base_w - tj, o] w[o, i0 + sh ti, j0 + sw tj, c].
// With the taps flipped, ti' = nti - 1 - ti, the dy row is t - (nti - 1 - base_h) + ti': this
// is a stride-1 *forward* convolution of dy (N, H_out, W_out, C_out) by w' (C_in, nti, ntj,
// C_out) = the phase's taps of w, transposed and flipped (dgrad_weight_kernel), with padding
// nti - 1 - base_h (negative where the window starts inside dy), Ha x Wb outputs whose rows
// scatter into dx (mma_conv::RowMap). So version 5's whole machinery serves it unchanged: the
// swizzled mma.sync tiles, the 16-byte gather of 8 channels of one tap, the tile and split
// rule (conv_bn_plan.h's cb_dgrad_plan, with its narrow 128x16 tile for C_in <= 16), the
// ordered split-K finish. Costs: w' is written once per call (C_out x K elements, ~5 us at
// ResNet's 512-channel 3x3), and split phases write fp32 partials (workspace: their largest).
static Geom dgrad_phase_geom(const Geom& g, const wmma_conv::DgradPhase& p) {
  Geom q{};
  q.N = g.N, q.H = g.H_out, q.W = g.W_out, q.C_in = g.C_out, q.C_out = g.C_in;
  q.kH = p.nti, q.kW = p.ntj > 0 ? p.ntj : 1;  // a phase without taps has K = 0: never gathers
  q.sh = 1, q.sw = 1, q.ph = p.nti - 1 - p.base_h, q.pw = p.ntj - 1 - p.base_w;
  q.sx_n = g.H_out * g.W_out * g.C_out, q.sx_h = g.W_out * g.C_out, q.sx_w = g.C_out, q.sx_c = 1;
  q.H_out = p.Ha, q.W_out = p.Wb, q.P = p.M, q.K = p.Kp;
  return q;
}

static CbPlan v6_dgrad_plan(const Geom& q) {
  int tile = -1, splits = 0;
  v6_dgrad_forced(&tile, &splits);  // a malformed value is refused by the launcher, not here
  return cb_dgrad_plan(q.P, q.C_out, q.K, device_sms(), tile, splits);
}

// fp32 floats of split-K partials version 6's dgrad may write: its phases run one after
// another on the stream, so the largest one's.
static int64_t v6_dgrad_part_floats(int version, const Geom& g) {
  int64_t most = 0;
  for (int a = 0; version >= 6 && a < g.sh; ++a)
    for (int b = 0; b < g.sw; ++b) {
      const wmma_conv::DgradPhase p = wmma_conv::dgrad_phase(g, a, b);
      if (p.M == 0) continue;
      const Geom q = dgrad_phase_geom(g, p);
      const CbPlan plan = v6_dgrad_plan(q);
      if (plan.splits > 1 && plan.splits * q.P * q.C_out > most) most = plan.splits * q.P * q.C_out;
    }
  return most;
}

// dx (N, H, W, C_in) contiguous; w_t: room for C_out * K elements, 16-byte aligned (every
// phase's w', one after another: the phases' taps are the kernel's taps, each once); part:
// v6_dgrad_part_floats. C_out % 8 == 0 and dy 16-byte aligned (the caller checks).
template <typename T>
static int conv_dgrad_v6(const Geom& g, const T* dy, const T* w, T* dx, T* w_t, float* part,
                         cudaStream_t stream) {
  int tile = 0, splits = 0;
  if (!v6_dgrad_forced(&tile, &splits)) return LEVELS_UNSUPPORTED;  // a malformed knob
  int64_t taps_before = 0;
  for (int a = 0; a < g.sh; ++a)
    for (int b = 0; b < g.sw; ++b) {
      const wmma_conv::DgradPhase p = wmma_conv::dgrad_phase(g, a, b);
      if (p.M == 0) continue;  // no input pixel in this phase
      T* wp = w_t + taps_before * g.C_in * g.C_out;  // a multiple of 8 elements: C_out % 8 == 0
      taps_before += p.nti * p.ntj;
      if (p.Kp > 0) {
        const dim3 wgrid(static_cast<unsigned>(levels_cdiv(g.C_in, 32)),
                         static_cast<unsigned>(levels_cdiv(g.C_out, 32)),
                         static_cast<unsigned>(p.nti * p.ntj));
        mma_conv::dgrad_weight_kernel<T><<<wgrid, dim3(32, 8), 0, stream>>>(
            w, g.C_out, g.C_in, g.K, static_cast<int>(g.kW), p.i0, p.j0, p.nti, p.ntj,
            static_cast<int>(g.sh), static_cast<int>(g.sw), wp);
      }
      const Geom q = dgrad_phase_geom(g, p);
      const mma_conv::RowMap rows{static_cast<int64_t>(p.Ha) * p.Wb, g.H, g.W, p.Wb, a, b,
                                  static_cast<int>(g.sh), static_cast<int>(g.sw)};
      const CbPlan plan = v6_dgrad_plan(q);
      if (plan.blocks > 0x7fffffff || plan.splits > 65535) return LEVELS_UNSUPPORTED;
      int status = 0;
      if (plan.splits == 1) {
        status = v5_launch<T, T, T, true>(q, plan, dy, wp, nullptr, dx, stream, rows);
      } else {
        if (part == nullptr) return LEVELS_UNSUPPORTED;  // the caller's workspace has no room
        status = v5_launch<T, float, float, true>(q, plan, dy, wp, nullptr, part, stream, rows);
        if (status == 0) {
          mma_conv::splitk_finish_kernel<T, true><<<elementwise_blocks(q.P * q.C_out), 256, 0, stream>>>(
              part, plan.splits, q.P, q.C_out, nullptr, dx, rows);
          status = levels_launch_status();
        }
      }
      if (status != 0) return status;
    }
  return levels_launch_status();
}

// dX: version 4 on the tensor cores (a 1x1 stride-1 convolution as dX = dY . w, one GEMM;
// anything else as one implicit GEMM per stride phase, dgrad_kernel), else version 2's
// tiled kernel; version 6 runs the phases on version 5's kernels (conv_dgrad_v6), and the
// 1x1 GEMM only where C_in >= 128 (the forward's rule for its C_out: the GEMM's tiles are 128
// or 256 wide). w_t: room for C_in * C_out elements (the 1x1 path's transposed weight,
// version 6's phase weights). part: version 6's split-K partials (v6_dgrad_part_floats).
template <typename T>
static int conv_dgrad(int version, const Geom& g, const T* dy, const T* w, T* dx, T* w_t,
                      float* part, cudaStream_t stream) {
  if (version >= 4 && tensor_core_path<T>(version, g)) {
    if constexpr (!is_f32<T>::value) {
      if (is_pointwise(g) && k_major(dy, g.C_out) && g.C_in % 8 == 0 && levels_aligned16(w_t) &&
          (version < 6 || g.C_in >= 128)) {
        // B[k=o, n=c] = w[o, c] must be K-major, i.e. (C_in, C_out) in memory: w^T.
        const dim3 tgrid(static_cast<unsigned>(levels_cdiv(g.C_in, 32)),
                         static_cast<unsigned>(levels_cdiv(g.C_out, 32)));
        wmma_conv::transpose_kernel<T><<<tgrid, dim3(32, 8), 0, stream>>>(w, g.C_out, g.C_in, w_t);
        return levels_gemm_matmul(dtype_code<T>(), gemm_version(), 0, dy, g.C_out, 1, w_t, 1,
                                  g.C_out, dx, g.C_in, 1, 0, nullptr, 0, nullptr, 0, 0, 0, 0, g.P,
                                  g.C_in, g.C_out, stream);
      }
      if (version >= 6 && g.C_out % 8 == 0 && levels_aligned16(dy) && levels_aligned16(w_t))
        return conv_dgrad_v6<T>(g, dy, w, dx, w_t, part, stream);
      const bool vec_dy = g.C_out % 8 == 0 && levels_aligned16(dy);
      const bool vec_w = g.C_in % 8 == 0 && levels_aligned16(w);
      auto kernel = vec_dy ? (vec_w ? wmma_conv::dgrad_kernel<T, true, true> : wmma_conv::dgrad_kernel<T, true, false>)
                           : (vec_w ? wmma_conv::dgrad_kernel<T, false, true> : wmma_conv::dgrad_kernel<T, false, false>);
      constexpr int smem = wmma_conv::smem_bytes<false, true>();
      levels_smem_opt_in_once(reinterpret_cast<const void*>(kernel), smem);
      for (int a = 0; a < g.sh; ++a)
        for (int b = 0; b < g.sw; ++b) {
          const wmma_conv::DgradPhase p = wmma_conv::dgrad_phase(g, a, b);
          if (p.M == 0) continue;  // no input pixel in this phase
          const int64_t blocks = levels_cdiv(p.M, wmma_conv::BM) * levels_cdiv(g.C_in, wmma_conv::BN);
          kernel<<<static_cast<unsigned>(blocks), wmma_conv::THREADS, smem, stream>>>(g, p, dy, w, dx);
        }
      return levels_launch_status();
    }
  }
  tiled::ConvDgrad<T> op{g, dy, w, dx};
  const int64_t M = g.N * g.H * g.W, R = g.kH * g.kW * g.C_out;
  const dim3 grid(static_cast<unsigned>(levels_cdiv(M, tiled::BM)),
                  static_cast<unsigned>(levels_cdiv(g.C_in, tiled::BN)), 1);
  tiled::gemm_kernel<<<grid, tiled::THREADS, 0, stream>>>(op, M, g.C_in, R, R);
  return levels_launch_status();
}

// Version 4's wgrad splits the pixels so that the grid has about two blocks per SM (one full
// wave at two blocks per SM) but never fewer than TC_MIN_PIXELS per split (32 k-tiles: the
// pipeline's start and the fp32 partial's store amortized), at most TC_MAX_BLOCKS blocks
// (a bound that keeps the workspace independent of the GPU). Each split writes C_out*K fp32
// partials; at most ~512 * 128 * 128 of them in all.
constexpr int64_t TC_MIN_PIXELS = 1024, TC_MAX_BLOCKS = 512;
static int64_t tc_wgrad_tiles(int64_t C_out, int64_t K) {
  return levels_cdiv(C_out, wmma_conv::BM) * levels_cdiv(K, wmma_conv::BN);
}
static int64_t tc_wgrad_max_splits(int64_t P, int64_t C_out, int64_t K, int64_t target_blocks) {
  const int64_t s = levels_cdiv(target_blocks, tc_wgrad_tiles(C_out, K));
  const int64_t cap = P / TC_MIN_PIXELS > 1 ? P / TC_MIN_PIXELS : 1;
  return s < cap ? s : cap;
}
// Floats of wgrad partials the workspace holds: enough for either path.
static int64_t wgrad_part_floats(int64_t P, int64_t C_out, int64_t K) {
  const int64_t tc = tc_wgrad_max_splits(P, C_out, K, TC_MAX_BLOCKS), v2 = wgrad_splits(P);
  return (tc > v2 ? tc : v2) * C_out * K;
}

// ---- version 6's wgrad: mma_conv::wgrad_kernel, tile and pixel splits from cb_wgrad_plan ----
// $LEVELS_CONV_BN_V6_WGRAD_PLAN pins them ("TILE[,SPLITS]", TILE 0-2 as version 5's); the
// splits never exceed what the workspace holds (wgrad_part_floats, version 4's bound).
static CbPlan v6_wgrad_plan(const Geom& g) {
  int tile = -1, splits = 0;
  plan_forced(V6_WGRAD_PLAN_ENV, CB_TILES, &tile, &splits);  // malformed: refused by the launcher
  const int64_t most = wgrad_part_floats(g.P, g.C_out, g.K) / (g.C_out * g.K);
  return cb_wgrad_plan(g.C_out, g.K, g.P, device_sms(), most > 1 ? most : 1, tile, splits);
}

template <typename T, int TILE, bool VEC_X>
static void v6_wgrad_launch(const Geom& g, const CbPlan& plan, const T* x, const T* dy, float* part,
                            cudaStream_t stream) {
  constexpr CbTileShape S = cb_tile_shape(TILE);
  constexpr int smem = S.stages * (S.bm + S.bn) * mma_conv::BK * static_cast<int>(sizeof(T));
  auto kernel = mma_conv::wgrad_kernel<T, S.bm, S.bn, S.warps_m, S.warps_n, S.stages, S.blocks_per_sm, VEC_X>;
  levels_smem_opt_in_once(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid(static_cast<unsigned>(plan.blocks), static_cast<unsigned>(plan.splits));
  kernel<<<grid, S.warps_m * S.warps_n * 32, smem, stream>>>(g, plan.tiles_per_split, x, dy, part);
}

template <typename T, bool VEC_X>
static void v6_wgrad_tile(const Geom& g, const CbPlan& plan, const T* x, const T* dy, float* part,
                          cudaStream_t stream) {
  if (plan.tile == CB_128x64) return v6_wgrad_launch<T, CB_128x64, VEC_X>(g, plan, x, dy, part, stream);
  return v6_wgrad_launch<T, CB_64x64, VEC_X>(g, plan, x, dy, part, stream);  // cb_wgrad_plan's two
}

// G^T partials into part (splits, C_out, K); returns the number of splits, or -1 for a
// malformed $LEVELS_CONV_BN_V6_WGRAD_PLAN.
template <typename T>
static int64_t conv_wgrad(int version, const Geom& g, const T* dy, const T* x, float* part,
                          cudaStream_t stream) {
  // wgrad_kernel decodes its pixels in 32 bits (every tile: a 64-bit division costs more)
  if (version >= 4 && tensor_core_path<T>(version, g) && g.P < (int64_t{1} << 30)) {
    if constexpr (!is_f32<T>::value) {
      const bool x_vec = g.C_in % 8 == 0 && g.sx_c == 1 && g.sx_n % 8 == 0 && g.sx_h % 8 == 0 &&
                         g.sx_w % 8 == 0 && levels_aligned16(x);
      if (version >= 6 && g.C_out % 8 == 0 && levels_aligned16(dy)) {
        int tile = 0, splits = 0;
        if (!plan_forced(V6_WGRAD_PLAN_ENV, CB_TILES, &tile, &splits)) return -1;
        const CbPlan plan = v6_wgrad_plan(g);
        if (plan.blocks > 0x7fffffff || plan.splits > 65535) return -1;
        if (x_vec) v6_wgrad_tile<T, true>(g, plan, x, dy, part, stream);
        else v6_wgrad_tile<T, false>(g, plan, x, dy, part, stream);
        return plan.splits;
      }
      const int64_t sms2 = 2 * static_cast<int64_t>(levels_sm_count());
      const int64_t s = tc_wgrad_max_splits(g.P, g.C_out, g.K, sms2 < TC_MAX_BLOCKS ? sms2 : TC_MAX_BLOCKS);
      // whole k-tiles of pixels per split; recounted so that no split is empty
      const int64_t per = levels_cdiv(levels_cdiv(g.P, s), wmma_conv::BK) * wmma_conv::BK;
      const int64_t splits = levels_cdiv(g.P, per);
      const bool vec_dy = g.C_out % 8 == 0 && levels_aligned16(dy);
      const bool vec_x = x_vec;
      auto kernel = vec_dy ? (vec_x ? wmma_conv::wgrad_kernel<T, true, true> : wmma_conv::wgrad_kernel<T, true, false>)
                           : (vec_x ? wmma_conv::wgrad_kernel<T, false, true> : wmma_conv::wgrad_kernel<T, false, false>);
      constexpr int smem = wmma_conv::smem_bytes<true, true>();
      levels_smem_opt_in_once(reinterpret_cast<const void*>(kernel), smem);
      const dim3 grid(static_cast<unsigned>(tc_wgrad_tiles(g.C_out, g.K)), static_cast<unsigned>(splits));
      kernel<<<grid, wmma_conv::THREADS, smem, stream>>>(g, per, x, dy, part);
      return splits;
    }
  }
  const int64_t splits = wgrad_splits(g.P), per = levels_cdiv(g.P, splits);
  tiled::ConvWgrad<T> op{g, x, dy, part};
  const dim3 grid(static_cast<unsigned>(levels_cdiv(g.K, tiled::BM)),
                  static_cast<unsigned>(levels_cdiv(g.C_out, tiled::BN)),
                  static_cast<unsigned>(splits));
  tiled::gemm_kernel<<<grid, tiled::THREADS, 0, stream>>>(op, g.K, g.C_out, g.P, per);
  return splits;
}

static dim3 reduction_grid(int64_t P, int64_t C) {
  return dim3(static_cast<unsigned>(chunk_count(P)), static_cast<unsigned>(levels_cdiv(C, RED_C)), 1);
}
static unsigned elementwise_blocks(int64_t n) {
  const int64_t b = levels_cdiv(n, 256);
  return static_cast<unsigned>(b < 65536 ? b : 65536);  // grid-stride beyond
}

// Every workspace region starts on a 32-byte boundary (the 16-byte copies and vector stores
// of the tensor-core paths read and write some of them); sizes in floats.
static int64_t align8(int64_t floats) { return levels_cdiv(floats, 8) * 8; }
// The forward workspaces: their own regions, then (version 5) the split-K partials.
static int64_t eval_fwd_head_floats(int64_t C_out) { return 2 * align8(C_out); }  // b' fp32 and T
static int64_t train_fwd_head_floats(int64_t P, int64_t C_out) {
  return align8((2 * chunk_count(P) + 2) * C_out);  // stats partials (2, chunks, C), scale, shift
}
// A (C_out, K) 16-bit matrix in floats: the 1x1 dgrad's transposed weight.
static int64_t half_matrix_floats(int64_t C_out, int64_t K) { return align8(levels_cdiv(C_out * K, 2)); }

template <typename T>
static int eval_fwd(int version, const Geom& g, const T* x, const T* w, WeightLayout wl, const T* bias,
                    const T* gamma, const T* beta, const T* mean, const T* var, float eps, T* out,
                    T* w_folded, float* scale, float* invstd, float* work, cudaStream_t stream) {
  float* b_folded = work;                                      // (C_out,) fp32
  T* b_folded_t = reinterpret_cast<T*>(work + align8(g.C_out));  // (C_out,) T: the GEMM path's
  float* part = work + eval_fwd_head_floats(g.C_out);           // version 5's split-K partials
  fold_bn_kernel<T><<<static_cast<unsigned>(g.C_out), 256, 0, stream>>>(
      w, wl, bias, gamma, beta, mean, var, eps, g.K, w_folded, b_folded, b_folded_t, scale, invstd);
  return conv_fwd<T, T>(version, g, x, w_folded, b_folded, b_folded_t, out, part, stream);
}

template <typename T>
static int train_fwd(int version, const Geom& g, const T* x, const T* w, const T* bias,
                     const T* gamma, const T* beta, const T* running_mean, const T* running_var,
                     float eps, float momentum, T* out, float* y, float* mean, float* invstd,
                     T* new_running_mean, T* new_running_var, float* work, cudaStream_t stream) {
  const int64_t C = g.C_out, chunks = chunk_count(g.P), rows = chunk_rows(g.P);
  float* part_mean = work;             // (chunks, C)
  float* part_m2 = work + chunks * C;  // (chunks, C)
  float* scale = part_m2 + chunks * C; // (C,)
  float* shift = scale + C;            // (C,)
  float* part = work + train_fwd_head_floats(g.P, C);  // version 5's split-K partials
  const int status = conv_fwd<T, float>(version, g, x, w, nullptr, nullptr, y, part, stream);
  if (status != 0) return status;
  stats_partial_kernel<<<reduction_grid(g.P, C), dim3(RED_C, RED_R), 0, stream>>>(
      y, g.P, C, rows, part_mean, part_m2);
  stats_finalize_kernel<T><<<static_cast<unsigned>(levels_cdiv(C, RED_C)), dim3(RED_C, FIN_R), 0, stream>>>(
      part_mean, part_m2, chunks, rows, g.P, C, bias, gamma, beta, running_mean, running_var, eps,
      momentum, mean, invstd, new_running_mean, new_running_var, scale, shift);
  channel_affine_kernel<T><<<elementwise_blocks(g.P * C), 256, 0, stream>>>(y, scale, shift, out,
                                                                           g.P, C);
  return levels_launch_status();
}

// sum over rows of a (P, C) matrix into sums (C,) fp32 (and out_t in T, nullable).
template <typename T>
static void column_sum(const T* m, int64_t P, int64_t C, float* part, float* sums, T* out_t,
                       cudaStream_t stream) {
  column_sum_partial_kernel<T><<<reduction_grid(P, C), dim3(RED_C, RED_R), 0, stream>>>(
      m, P, C, chunk_rows(P), part);
  chunks_finalize_kernel<T><<<static_cast<unsigned>(levels_cdiv(C, RED_C)), dim3(RED_C, RED_R), 0, stream>>>(
      part, chunk_count(P), C, 1, sums, out_t, static_cast<T*>(nullptr));
}

// The backward's workspace, in this order (train_bwd's first two regions only in training):
//   [train] sums (2, C), bn_part (2, chunks, C);  col_part (chunks, C), sum (C,),
//   w_part (splits, C_out, K), w_t (the 1x1 dgrad's w^T or version 6's phase weights, C_out*K
//   16-bit), [train] dyc (P, C) T, [version 6] d_part (its dgrad's split-K partials).
struct BwdWork {
  float *sums, *bn_part, *col_part, *sum, *w_part;
  void *w_t, *dyc;
  float* d_part;
};
static int64_t bwd_work_floats(bool training, int version, const Geom& g, BwdWork* at = nullptr,
                               float* base = nullptr) {
  const int64_t P = g.P, C = g.C_out, K = g.K, chunks = chunk_count(P);
  const int64_t sizes[8] = {training ? align8(2 * C) : 0, training ? align8(2 * chunks * C) : 0,
                            align8(chunks * C), align8(C), align8(wgrad_part_floats(P, C, K)),
                            half_matrix_floats(C, K), training ? align8(P * C) : 0,
                            align8(v6_dgrad_part_floats(version, g))};
  float* regions[8];
  int64_t total = 0;
  for (int r = 0; r < 8; ++r) {
    regions[r] = base ? base + total : nullptr;
    total += sizes[r];
  }
  if (at)
    *at = BwdWork{regions[0], regions[1], regions[2], regions[3], regions[4], regions[5], regions[6],
                  sizes[7] > 0 ? regions[7] : nullptr};
  return total;
}

template <typename T>
static int eval_bwd(int version, const Geom& g, const T* dout, const T* x, const T* w,
                    WeightLayout wl, const T* w_folded, const T* bias, const T* running_mean,
                    const float* scale, const float* invstd, T* dx, T* dw, WeightLayout dwl,
                    T* dbias, T* dgamma, T* dbeta, float* work, cudaStream_t stream) {
  const int64_t C = g.C_out;
  BwdWork ws;
  bwd_work_floats(false, version, g, &ws, work);
  float* sum_dy = ws.sum;
  column_sum<T>(dout, g.P, C, ws.col_part, sum_dy, static_cast<T*>(nullptr), stream);
  const int64_t splits = conv_wgrad<T>(version, g, dout, x, ws.w_part, stream);
  if (splits < 0) return LEVELS_UNSUPPORTED;  // a malformed plan knob
  wgrad_finish_kernel<T><<<static_cast<unsigned>(C), 256, 0, stream>>>(
      ws.w_part, splits, C, g.K, dw, dwl, true, w, wl, scale, invstd, running_mean, bias, sum_dy,
      dgamma, dbeta, dbias);
  // dx == nullptr: x needs no gradient (a network's input images): no dgrad at all
  const int status =
      dx ? conv_dgrad<T>(version, g, dout, w_folded, dx, static_cast<T*>(ws.w_t), ws.d_part, stream) : 0;
  return status != 0 ? status : levels_launch_status();
}

template <typename T>
static int train_bwd(int version, const Geom& g, const T* dout, const T* x, const T* w,
                     const float* y, const float* mean, const float* invstd, const T* gamma,
                     T* dx, T* dw, WeightLayout dwl, T* dbias, T* dgamma, T* dbeta, float* work,
                     cudaStream_t stream) {
  const int64_t C = g.C_out, chunks = chunk_count(g.P), rows = chunk_rows(g.P);
  BwdWork ws;
  bwd_work_floats(true, version, g, &ws, work);
  T* dyc = static_cast<T*>(ws.dyc);  // (P, C) in T: the gradient of the convolution's output
  bn_bwd_partial_kernel<T><<<reduction_grid(g.P, C), dim3(RED_C, RED_R), 0, stream>>>(
      dout, y, mean, invstd, g.P, C, rows, chunks, ws.bn_part);
  chunks_finalize_kernel<T><<<static_cast<unsigned>(levels_cdiv(C, RED_C)), dim3(RED_C, RED_R), 0, stream>>>(
      ws.bn_part, chunks, C, 2, ws.sums, dbeta, dgamma);
  // dbias is mathematically 0 (the batch mean absorbs the conv bias): computed, not assumed,
  // from the fp32 dy the apply kernel sums per chunk before rounding it.
  bn_bwd_apply_kernel<T><<<reduction_grid(g.P, C), dim3(RED_C, RED_R), 0, stream>>>(
      dout, y, mean, invstd, gamma, ws.sums, g.P, C, rows, dyc, ws.col_part);
  chunks_finalize_kernel<T><<<static_cast<unsigned>(levels_cdiv(C, RED_C)), dim3(RED_C, RED_R), 0, stream>>>(
      ws.col_part, chunks, C, 1, ws.sum, dbias, static_cast<T*>(nullptr));
  const int64_t splits = conv_wgrad<T>(version, g, dyc, x, ws.w_part, stream);
  if (splits < 0) return LEVELS_UNSUPPORTED;  // a malformed plan knob
  wgrad_finish_kernel<T><<<static_cast<unsigned>(C), 256, 0, stream>>>(
      ws.w_part, splits, C, g.K, dw, dwl, false, nullptr, dwl, nullptr, nullptr, nullptr, nullptr,
      nullptr, nullptr, nullptr, nullptr);
  const int status =
      dx ? conv_dgrad<T>(version, g, dyc, w, dx, static_cast<T*>(ws.w_t), ws.d_part, stream) : 0;
  return status != 0 ? status : levels_launch_status();
}

static bool known_version(int version) { return version >= 1 && version <= 6; }

}  // namespace levels_conv_bn

// =========================================================================================
// The extern "C" interface (binding: cuda_kernels/conv_bn_binding.cpp).
// Geometry arguments, in this order everywhere: N, H, W, C_in, C_out, kH, kW, stride_h,
// stride_w, pad_h, pad_w, then x's element strides as (N, H, W, C_in): sx_n, sx_h, sx_w, sx_c.
// =========================================================================================

#define LEVELS_CONV_BN_GEOM_ARGS                                                             \
  int64_t N, int64_t H, int64_t W, int64_t C_in, int64_t C_out, int64_t kH, int64_t kW,      \
      int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t sx_n,         \
      int64_t sx_h, int64_t sx_w, int64_t sx_c
// A weight's (or dW's) element strides as (C_out, kH, kW, C_in): WeightLayout.
#define LEVELS_CONV_BN_LAYOUT(so, si, sj, sc) levels_conv_bn::WeightLayout{so, si, sj, sc, kW, C_in}
#define LEVELS_CONV_BN_GEOM                                                                  \
  levels_conv_bn::make_geom(N, H, W, C_in, C_out, kH, kW, stride_h, stride_w, pad_h, pad_w,  \
                            sx_n, sx_h, sx_w, sx_c)

// fp32 workspace (in floats) that op `which` of `version` needs for this geometry: 0 eval
// forward, 1 train forward, 2 eval backward, 3 train backward (the train backward's workspace
// also holds the (P, C_out) gradient of the convolution in the input dtype, which is at most
// P*C_out floats; version 5's forwards and version 6's dgrad add room for their split-K
// partials where their plans split, on the current device: the dgrad's phases need the whole
// geometry, hence all of it here).
extern "C" int64_t levels_conv_bn_workspace_floats(int which, int version, LEVELS_CONV_BN_GEOM_ARGS) {
  using namespace levels_conv_bn;
  const Geom g = LEVELS_CONV_BN_GEOM;
  switch (which) {
    case 0: return eval_fwd_head_floats(g.C_out) + v5_part_floats(version, g.P, g.C_out, g.K);
    case 1: return train_fwd_head_floats(g.P, g.C_out) + v5_part_floats(version, g.P, g.C_out, g.K);
    case 2: return bwd_work_floats(false, version, g);
    case 3: return bwd_work_floats(true, version, g);
    default: return -1;
  }
}

// Eval: out (P, C_out) = BN(conv(x, w) + bias) with the running statistics, folded; w read
// through its element strides sw_* as (C_out, kH, kW, C_in), any layout.
// Also returns w_folded (C_out, K) in the input dtype and fp32 scale, invstd (C_out,) for the
// backward. bias may be null. workspace: levels_conv_bn_workspace_floats(0, ...) floats.
extern "C" int levels_conv_bn_eval_fwd(int dtype, int version, const void* x, const void* w,
                                       const void* bias, const void* gamma, const void* beta,
                                       const void* running_mean, const void* running_var,
                                       double eps, LEVELS_CONV_BN_GEOM_ARGS, int64_t sw_o,
                                       int64_t sw_i, int64_t sw_j, int64_t sw_c, void* out,
                                       void* w_folded, float* scale, float* invstd,
                                       float* workspace, cudaStream_t stream) {
  using namespace levels_conv_bn;
  if (!known_version(version)) return LEVELS_BAD_VERSION;
  const Geom g = LEVELS_CONV_BN_GEOM;
  LEVELS_DISPATCH(dtype, T,
                  return eval_fwd<T>(version, g, static_cast<const T*>(x), static_cast<const T*>(w),
                                     LEVELS_CONV_BN_LAYOUT(sw_o, sw_i, sw_j, sw_c),
                                     static_cast<const T*>(bias), static_cast<const T*>(gamma),
                                     static_cast<const T*>(beta), static_cast<const T*>(running_mean),
                                     static_cast<const T*>(running_var), static_cast<float>(eps),
                                     static_cast<T*>(out), static_cast<T*>(w_folded), scale, invstd,
                                     workspace, stream));
  return LEVELS_OK;
}

// Train: out (P, C_out) = BN(conv(x, w) + bias) with batch statistics. Also returns y (P, C_out)
// fp32 (the convolution without its bias), the batch mean of y and invstd (fp32, for the
// backward), and the new running statistics (input dtype; the caller copies them into its
// buffers). workspace: levels_conv_bn_workspace_floats(1, ...) floats.
extern "C" int levels_conv_bn_train_fwd(int dtype, int version, const void* x, const void* w,
                                        const void* bias, const void* gamma, const void* beta,
                                        const void* running_mean, const void* running_var,
                                        double eps, double momentum, LEVELS_CONV_BN_GEOM_ARGS,
                                        void* out, float* y, float* mean, float* invstd,
                                        void* new_running_mean, void* new_running_var,
                                        float* workspace, cudaStream_t stream) {
  using namespace levels_conv_bn;
  if (!known_version(version)) return LEVELS_BAD_VERSION;
  const Geom g = LEVELS_CONV_BN_GEOM;
  LEVELS_DISPATCH(dtype, T,
                  return train_fwd<T>(version, g, static_cast<const T*>(x), static_cast<const T*>(w),
                                      static_cast<const T*>(bias), static_cast<const T*>(gamma),
                                      static_cast<const T*>(beta),
                                      static_cast<const T*>(running_mean),
                                      static_cast<const T*>(running_var), static_cast<float>(eps),
                                      static_cast<float>(momentum), static_cast<T*>(out), y, mean,
                                      invstd, static_cast<T*>(new_running_mean),
                                      static_cast<T*>(new_running_var), workspace, stream));
  return LEVELS_OK;
}

// Eval backward from dout (P, C_out) contiguous: dx (N, H, W, C_in) contiguous, dw (written
// through its strides sdw_*, as the forward's w through sw_*), dbias, dgamma, dbeta (C_out,),
// all in the input dtype. Versions 1-3 run the tiled
// (version 2) dgrad/wgrad, versions 4-5 the tensor-core ones (16-bit, sm_80+). dx may be null:
// x needs no gradient, and the dgrad (the transposed convolution) is skipped.
// workspace: levels_conv_bn_workspace_floats(2, ...) floats.
extern "C" int levels_conv_bn_eval_bwd(int dtype, int version, const void* dout, const void* x,
                                       const void* w, const void* w_folded, const void* bias,
                                       const void* running_mean, const float* scale,
                                       const float* invstd, LEVELS_CONV_BN_GEOM_ARGS,
                                       int64_t sw_o, int64_t sw_i, int64_t sw_j, int64_t sw_c,
                                       void* dx, void* dw, int64_t sdw_o, int64_t sdw_i,
                                       int64_t sdw_j, int64_t sdw_c, void* dbias, void* dgamma,
                                       void* dbeta, float* workspace, cudaStream_t stream) {
  using namespace levels_conv_bn;
  if (!known_version(version)) return LEVELS_BAD_VERSION;
  const Geom g = LEVELS_CONV_BN_GEOM;
  LEVELS_DISPATCH(dtype, T,
                  return eval_bwd<T>(version, g, static_cast<const T*>(dout), static_cast<const T*>(x),
                                     static_cast<const T*>(w),
                                     LEVELS_CONV_BN_LAYOUT(sw_o, sw_i, sw_j, sw_c),
                                     static_cast<const T*>(w_folded), static_cast<const T*>(bias),
                                     static_cast<const T*>(running_mean), scale, invstd,
                                     static_cast<T*>(dx), static_cast<T*>(dw),
                                     LEVELS_CONV_BN_LAYOUT(sdw_o, sdw_i, sdw_j, sdw_c),
                                     static_cast<T*>(dbias), static_cast<T*>(dgamma),
                                     static_cast<T*>(dbeta), workspace, stream));
  return LEVELS_OK;
}

// Train backward from dout (P, C_out) contiguous, y/mean/invstd of the forward, w (C_out, K)
// contiguous (the dgrad's): dx (nullable), dw (through sdw_*), dbias, dgamma, dbeta as above. workspace: levels_conv_bn_workspace_floats(3, ...) floats.
extern "C" int levels_conv_bn_train_bwd(int dtype, int version, const void* dout, const void* x,
                                        const void* w, const float* y, const float* mean,
                                        const float* invstd, const void* gamma,
                                        LEVELS_CONV_BN_GEOM_ARGS, void* dx, void* dw,
                                        int64_t sdw_o, int64_t sdw_i, int64_t sdw_j,
                                        int64_t sdw_c, void* dbias, void* dgamma, void* dbeta,
                                        float* workspace, cudaStream_t stream) {
  using namespace levels_conv_bn;
  if (!known_version(version)) return LEVELS_BAD_VERSION;
  const Geom g = LEVELS_CONV_BN_GEOM;
  LEVELS_DISPATCH(dtype, T,
                  return train_bwd<T>(version, g, static_cast<const T*>(dout), static_cast<const T*>(x),
                                      static_cast<const T*>(w), y, mean, invstd,
                                      static_cast<const T*>(gamma), static_cast<T*>(dx),
                                      static_cast<T*>(dw),
                                      LEVELS_CONV_BN_LAYOUT(sdw_o, sdw_i, sdw_j, sdw_c),
                                      static_cast<T*>(dbias),
                                      static_cast<T*>(dgamma), static_cast<T*>(dbeta), workspace,
                                      stream));
  return LEVELS_OK;
}

#undef LEVELS_CONV_BN_GEOM_ARGS
#undef LEVELS_CONV_BN_LAYOUT
#undef LEVELS_CONV_BN_GEOM
