// gemm.cu — C[M,N] (+)= A[M,K] · B[K,N] with a fused epilogue: Level 5's matrix product,
// a ladder of four versions (serves the MLP now, conv and the LSTM later).
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
//              Not here yet (the next rungs): ldmatrix.trans for N-major operands (no
//              copies in backward), an epilogue staged through shared memory for 16-byte
//              stores, and Hopper wgmma + TMA with producer/consumer warps (what cuBLAS
//              runs on an H100).
//
// Every version ends in the same epilogue, applied to the fp32 accumulator in registers
// before the single store — that is where fusion is free:
//   EPI_NONE       c = acc (+ bias[n])                   (+ old c when accumulate)
//   EPI_GELU       c = GELU(acc + bias[n])               exact GELU (erf), not the tanh one
//   EPI_GELU_SAVE  aux = acc + bias[n]; c = GELU(aux)    the pre-activation that backward needs
//   EPI_GELU_GRAD  c = acc * GELU'(aux[m, n])            dH = (dY · W2) ⊙ GELU'(H)
// Output C is the input dtype or fp32 (c_fp32: the LSTM's input projection wants fp32);
// aux is always the input dtype.
//
// Also: column_sum (bias gradients), x.sum(0) accumulated in fp32, deterministic.
//
// Strides are element strides, any value (0 for broadcast, transposed views...), except
// where version 4 says otherwise. Offsets are int64: operands may exceed 2**31 elements.

#include "common.cuh"

#include <type_traits>

namespace levels_gemm {

// levels_cdiv of common.cuh is host-only; the kernels need it too.
// ---- candidates for common.cuh ----
__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// ---- end of candidates ----

enum Epilogue { EPI_NONE = 0, EPI_GELU = 1, EPI_GELU_SAVE = 2, EPI_GELU_GRAD = 3 };

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
};

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x)
__device__ __forceinline__ float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
  return cdf + x * pdf;
}

// The epilogue of one output element (m, n), both in range.
template <typename T, typename TC>
__device__ __forceinline__ void finish(float v, int64_t m, int64_t n, const EpiArgs& ep) {
  TC* c = static_cast<TC*>(ep.c) + m * ep.stride_cm + n * ep.stride_cn;
  if (ep.accumulate) v += to_f32<TC>(*c);
  if (ep.bias) v += to_f32<T>(static_cast<const T*>(ep.bias)[n * ep.stride_bias]);
  if (ep.kind == EPI_GELU_SAVE) static_cast<T*>(ep.aux)[m * ep.stride_xm + n * ep.stride_xn] = from_f32<T>(v);
  if (ep.kind == EPI_GELU || ep.kind == EPI_GELU_SAVE) v = gelu(v);
  if (ep.kind == EPI_GELU_GRAD)
    v *= gelu_grad(to_f32<T>(static_cast<const T*>(ep.aux)[m * ep.stride_xm + n * ep.stride_xn]));
  *c = from_f32<TC>(v);
}

// Two neighbouring columns (n, n+1) of one row, as version 4's accumulator fragments hold
// them: one 4- or 8-byte access instead of two scattered ones where C (and aux) are
// contiguous along N and aligned, else element by element.
template <typename T> struct Pair;
template <> struct Pair<float> {
  using V = float2;
  static __device__ __forceinline__ V make(float a, float b) { return make_float2(a, b); }
  static __device__ __forceinline__ float lo(V v) { return v.x; }
  static __device__ __forceinline__ float hi(V v) { return v.y; }
};
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

template <typename T>
__device__ __forceinline__ bool pair_aligned(const void* p, int64_t stride) {
  return stride == 1 && reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0;
}

template <typename T, typename TC>
__device__ __forceinline__ void finish_pair(float v0, float v1, int64_t m, int64_t n, int64_t N,
                                            const EpiArgs& ep) {
  TC* c = static_cast<TC*>(ep.c) + m * ep.stride_cm + n * ep.stride_cn;
  // aux exists only for the epilogues that read or write it (it is nullptr otherwise)
  const bool has_aux = ep.kind == EPI_GELU_SAVE || ep.kind == EPI_GELU_GRAD;
  T* x = has_aux ? static_cast<T*>(ep.aux) + m * ep.stride_xm + n * ep.stride_xn : nullptr;
  const bool pair = n + 1 < N && pair_aligned<TC>(c, ep.stride_cn) && (!has_aux || pair_aligned<T>(x, ep.stride_xn));
  if (!pair) {
    if (n < N) finish<T, TC>(v0, m, n, ep);
    if (n + 1 < N) finish<T, TC>(v1, m, n + 1, ep);
    return;
  }
  if (ep.accumulate) {
    const typename Pair<TC>::V old = *reinterpret_cast<const typename Pair<TC>::V*>(c);
    v0 += Pair<TC>::lo(old);
    v1 += Pair<TC>::hi(old);
  }
  if (ep.bias) {
    const T* b = static_cast<const T*>(ep.bias);
    v0 += to_f32<T>(b[n * ep.stride_bias]);
    v1 += to_f32<T>(b[(n + 1) * ep.stride_bias]);
  }
  typename Pair<T>::V* xv = reinterpret_cast<typename Pair<T>::V*>(x);
  if (ep.kind == EPI_GELU_SAVE) *xv = Pair<T>::make(v0, v1);
  if (ep.kind == EPI_GELU || ep.kind == EPI_GELU_SAVE) {
    v0 = gelu(v0);
    v1 = gelu(v1);
  }
  if (ep.kind == EPI_GELU_GRAD) {
    const typename Pair<T>::V h = *xv;
    v0 *= gelu_grad(Pair<T>::lo(h));
    v1 *= gelu_grad(Pair<T>::hi(h));
  }
  *reinterpret_cast<typename Pair<TC>::V*>(c) = Pair<TC>::make(v0, v1);
}

// =====================================================================================
// version 1: naive, one thread per output
// =====================================================================================
template <typename T, typename TC>
__global__ void gemm_v1_kernel(const T* __restrict__ A, int64_t stride_am, int64_t stride_ak,
                               const T* __restrict__ B, int64_t stride_bk, int64_t stride_bn,
                               int64_t M, int64_t N, int64_t K, EpiArgs ep) {
  // 1-D grid of 32x8 tiles (a 2-D grid would cap M at 65535 * 8 rows).
  const int64_t tiles_n = cdiv(N, 32);
  const int64_t m = (int64_t)(blockIdx.x / tiles_n) * 8 + threadIdx.y;
  const int64_t n = (int64_t)(blockIdx.x % tiles_n) * 32 + threadIdx.x;
  if (m >= M || n >= N) return;
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k)
    acc = fmaf(to_f32<T>(A[m * stride_am + k * stride_ak]), to_f32<T>(B[k * stride_bk + n * stride_bn]), acc);
  finish<T, TC>(acc, m, n, ep);
}

// =====================================================================================
// version 2: 32x32 shared-memory tiles, one output per thread
// =====================================================================================
constexpr int V2_TILE = 32;

template <typename T, typename TC>
__global__ void gemm_v2_kernel(const T* __restrict__ A, int64_t stride_am, int64_t stride_ak,
                               const T* __restrict__ B, int64_t stride_bk, int64_t stride_bn,
                               int64_t M, int64_t N, int64_t K, EpiArgs ep) {
  // +1 column of padding: the transposed stores below (a column per warp) hit 32 banks.
  __shared__ float As[V2_TILE][V2_TILE + 1];  // [m][k]
  __shared__ float Bs[V2_TILE][V2_TILE + 1];  // [k][n]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles_n = cdiv(N, V2_TILE);
  const int64_t m0 = (int64_t)(blockIdx.x / tiles_n) * V2_TILE;
  const int64_t n0 = (int64_t)(blockIdx.x % tiles_n) * V2_TILE;
  // Coalescing: the 32 threads of a warp (same ty, tx = 0..31) must walk the operand's
  // contiguous dimension. A is (M,K): along k if stride_ak == 1, else along m. B is (K,N):
  // along n if stride_bn == 1 (B row-major), else along k (the nn.Linear weight, W^T view).
  const bool a_k_fast = stride_ak == 1;
  const bool b_n_fast = stride_bn == 1 || stride_bk != 1;
  float acc = 0.0f;
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
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < V2_TILE; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
    __syncthreads();  // the next iteration overwrites the tiles
  }
  const int64_t m = m0 + ty, n = n0 + tx;
  if (m < M && n < N) finish<T, TC>(acc, m, n, ep);
}

// =====================================================================================
// version 3: 128x128 block tile, 8x8 outputs per thread in registers (exact fp32 FMAs)
// =====================================================================================
constexpr int V3_BM = 128, V3_BN = 128, V3_BK = 8, V3_TM = 8, V3_TN = 8;
constexpr int V3_THREADS = (V3_BM / V3_TM) * (V3_BN / V3_TN);  // 256

template <typename T, typename TC>
__global__ void __launch_bounds__(V3_THREADS)
gemm_v3_kernel(const T* __restrict__ A, int64_t stride_am, int64_t stride_ak,
               const T* __restrict__ B, int64_t stride_bk, int64_t stride_bn,
               int64_t M, int64_t N, int64_t K, EpiArgs ep) {
  // Both tiles k-major in shared memory, so that for one k a thread reads its 8 rows of A
  // and its 8 columns of B as contiguous float4s.
  __shared__ __align__(16) float As[V3_BK][V3_BM];
  __shared__ __align__(16) float Bs[V3_BK][V3_BN];
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
      const int64_t k = k0 + kk, n = n0 + cn;
      Bs[kk][cn] = (k < K && n < N) ? to_f32<T>(B[k * stride_bk + n * stride_bn]) : 0.0f;
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
#pragma unroll
  for (int i = 0; i < V3_TM; ++i) {
    const int64_t m = m0 + (i / 4) * 64 + ty * 4 + (i % 4);
#pragma unroll
    for (int j = 0; j < V3_TN; ++j) {
      const int64_t n = n0 + (j / 4) * 64 + tx * 4 + (j % 4);
      if (m < M && n < N) finish<T, TC>(acc[i][j], m, n, ep);
    }
  }
}

// =====================================================================================
// version 4: tensor cores — mma.sync + ldmatrix + cp.async multi-stage pipeline
// =====================================================================================
// The PTX wrappers (candidates for common.cuh once another kernel needs them).
// ---- candidates for common.cuh ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers. src_bytes < 16 reads only
// that many bytes and fills the rest with zeros: the masked edges (M, N, K tails) cost
// no branch in the main loop and never read outside the operand.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices from shared memory into the mma fragment layout: lanes 8i..8i+7
// give the row addresses of matrix i; register i of every lane receives its part of it.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A(16x16, row) · B(16x8, col) + D, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// ---- end of candidates ----

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

// Block tile BM x BN, WARPS_M x WARPS_N warps, each a (BM/WARPS_M) x (BN/WARPS_N) warp tile
// of m16n8 accumulators. A: (M, K) rows contiguous (row stride lda); B: (N, K) K-major
// (row stride ldb), i.e. B[k][n] of the contract at B + n*ldb + k.
template <typename T, typename TC, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
gemm_v4_kernel(const T* __restrict__ A, int64_t lda, const T* __restrict__ B, int64_t ldb,
               int64_t M, int64_t N, int64_t K, EpiArgs ep) {
  constexpr int THREADS = WARPS_M * WARPS_N * 32;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
  constexpr int MT = WTM / 16, NT = WTN / 8;
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile: whole m16 tiles, pairs of n8 tiles");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);  // [STAGES][BM][BK], swizzled
  T* sB = sA + STAGES * BM * V4_BK;         // [STAGES][BN][BK], swizzled

  // Grouped tile order (as Level 4's grouped_tile).
  const int64_t grid_m = cdiv(M, BM), grid_n = cdiv(N, BN);
  const int64_t pid = blockIdx.x, group = V4_GROUP_M * grid_n;
  const int64_t first_m = (pid / group) * V4_GROUP_M;
  const int64_t rows_in_group = grid_m - first_m < V4_GROUP_M ? grid_m - first_m : V4_GROUP_M;
  const int64_t m0 = (first_m + (pid % group) % rows_in_group) * BM;
  const int64_t n0 = ((pid % group) / rows_in_group) * BN;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int KT = (int)cdiv(K, V4_BK);

  float acc[MT][NT][4] = {};

  // Prologue: STAGES-1 tiles in flight. Every step commits one group, empty or not, so
  // that "wait until at most STAGES-2 groups are pending" always means "tile kt landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) {
      v4_load_tile<T, BM, THREADS>(sA + s * BM * V4_BK, A, lda, m0, M, (int64_t)s * V4_BK, K);
      v4_load_tile<T, BN, THREADS>(sB + s * BN * V4_BK, B, ldb, n0, N, (int64_t)s * V4_BK, K);
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
      v4_load_tile<T, BM, THREADS>(sA + s * BM * V4_BK, A, lda, m0, M, (int64_t)next * V4_BK, K);
      v4_load_tile<T, BN, THREADS>(sB + s * BN * V4_BK, B, ldb, n0, N, (int64_t)next * V4_BK, K);
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

  // Epilogue from the accumulator fragments: lane holds rows g and g+8 (g = lane/4),
  // columns 2*(lane%4) and +1 of each m16n8 tile, stored as pairs (finish_pair). Not done
  // yet: staging the tile through shared memory for 16-byte stores.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + wm * WTM + mt * 16 + (lane >> 2) + h * 8;
        const int64_t n = n0 + wn * WTN + nt * 8 + (lane & 3) * 2;
        if (m < M) finish_pair<T, TC>(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1], m, n, N, ep);
      }
    }
  }
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

template <typename T, typename TC>
int launch_v1(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream) {
  const int64_t blocks = cdiv(M, 8) * cdiv(N, 32);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  gemm_v1_kernel<T, TC><<<(unsigned)blocks, dim3(32, 8), 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep);
  return levels_launch_status();
}

template <typename T, typename TC>
int launch_v2(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream) {
  const int64_t blocks = cdiv(M, V2_TILE) * cdiv(N, V2_TILE);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  gemm_v2_kernel<T, TC><<<(unsigned)blocks, dim3(V2_TILE, V2_TILE), 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep);
  return levels_launch_status();
}

template <typename T, typename TC>
int launch_v3(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream) {
  const int64_t blocks = cdiv(M, V3_BM) * cdiv(N, V3_BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  gemm_v3_kernel<T, TC><<<(unsigned)blocks, V3_THREADS, 0, stream>>>(A, sam, sak, B, sbk, sbn, M, N, K, ep);
  return levels_launch_status();
}

template <typename T, typename TC, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
int launch_v4_config(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N, int64_t K,
                     const EpiArgs& ep, cudaStream_t stream) {
  constexpr int smem = STAGES * (BM + BN) * V4_BK * (int)sizeof(T);
  auto kernel = gemm_v4_kernel<T, TC, BM, BN, WARPS_M, WARPS_N, STAGES>;
  // Above 48 KB of dynamic shared memory a kernel must opt in (once per kernel).
  static bool opted_in = false;
  if (!opted_in) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return (int)err;
    opted_in = true;
  }
  const int64_t blocks = cdiv(M, BM) * cdiv(N, BN);
  if (blocks > 0x7fffffff) return LEVELS_UNSUPPORTED;
  kernel<<<(unsigned)blocks, WARPS_M * WARPS_N * 32, smem, stream>>>(A, lda, B, ldb, M, N, K, ep);
  return levels_launch_status();
}

template <typename T, typename TC>
int launch_v4(const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
              int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream) {
  if constexpr (std::is_same<T, float>::value) {
    return launch_v3<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream);  // exact fp32
  } else {
    // cp.async moves 16-byte chunks along K: rows must be contiguous along K (for B: the
    // (N,K) K-major matrix, stride_bk == 1) and start on 16-byte boundaries.
    const bool rows_ok = sak == 1 && sbk == 1 && sam % 8 == 0 && sbn % 8 == 0;
    const bool base_ok = reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(B) % 16 == 0;
    if (!rows_ok || !base_ok) return LEVELS_UNSUPPORTED;
    // Tile shape (LEVELS_GEMM_V4_TILE=n pins one, for the bench's sweep; 0 or unset: auto):
    //   1: 128x256, 8 warps of 64x64, 3 stages (144 KB, one block per SM)  [measured]
    //   2: the same with 4 stages (192 KB): more loads in flight per SM   [not measured yet]
    //   3: 128x128, 8 warps of 64x32, 3 stages (96 KB, two blocks per SM) [measured]
    // A 64x64 warp tile does twice the tensor-core work per byte read from shared memory of
    // a 64x32 one. Auto: the big tile only when its tiles fill every SM at least once.
    // Every shape here is 4 more kernels to compile (2 dtypes x 2 output dtypes): the sweep
    // stays short on purpose (build time).
    int tile = 0;
    if (const char* env = getenv("LEVELS_GEMM_V4_TILE")) tile = atoi(env);
    if (tile == 0) tile = cdiv(M, 128) * cdiv(N, 256) >= num_sms() ? 1 : 3;
    switch (tile) {
      case 1: return launch_v4_config<T, TC, 128, 256, 2, 4, 3>(A, sam, B, sbn, M, N, K, ep, stream);
      case 2: return launch_v4_config<T, TC, 128, 256, 2, 4, 4>(A, sam, B, sbn, M, N, K, ep, stream);
      case 3: return launch_v4_config<T, TC, 128, 128, 2, 4, 3>(A, sam, B, sbn, M, N, K, ep, stream);
      default: return LEVELS_UNSUPPORTED;
    }
  }
}

template <typename T, typename TC>
int launch(int version, const void* a, int64_t sam, int64_t sak, const void* b, int64_t sbk, int64_t sbn,
           int64_t M, int64_t N, int64_t K, const EpiArgs& ep, cudaStream_t stream) {
  const T* A = static_cast<const T*>(a);
  const T* B = static_cast<const T*>(b);
  switch (version) {
    case 1: return launch_v1<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream);
    case 2: return launch_v2<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream);
    case 3: return launch_v3<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream);
    case 4: return launch_v4<T, TC>(A, sam, sak, B, sbk, sbn, M, N, K, ep, stream);
    default: return LEVELS_BAD_VERSION;
  }
}

}  // namespace levels_gemm

// C[M,N] (+)= A[M,K] · B[K,N], then the epilogue (see the top of the file).
// Element strides for every matrix; bias (N,) with its own stride; aux (M, N) is read or
// written only by the GELU_SAVE / GELU_GRAD epilogues. c_fp32: C is float32 (else the input
// dtype). accumulate: C += instead of C =. Version 4 needs stride_ak == stride_bk == 1, row
// strides (stride_am, stride_bn) multiples of 8 and 16-byte aligned A, B (cuda_kernels/mlp.py
// makes them so), else LEVELS_UNSUPPORTED. M, N or K may be 0.
extern "C" int levels_gemm_matmul(int dtype, int version,
                                  const void* a, int64_t stride_am, int64_t stride_ak,
                                  const void* b, int64_t stride_bk, int64_t stride_bn,
                                  void* c, int64_t stride_cm, int64_t stride_cn, int c_fp32,
                                  const void* bias, int64_t stride_bias,
                                  void* aux, int64_t stride_xm, int64_t stride_xn,
                                  int epilogue, int accumulate,
                                  int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  using namespace levels_gemm;
  if (version < 1 || version > 4) return LEVELS_BAD_VERSION;
  if (epilogue < EPI_NONE || epilogue > EPI_GELU_GRAD) return LEVELS_UNSUPPORTED;
  if ((epilogue == EPI_GELU_SAVE || epilogue == EPI_GELU_GRAD) && aux == nullptr) return LEVELS_UNSUPPORTED;
  if (M <= 0 || N <= 0) return LEVELS_OK;  // nothing to write
  const EpiArgs ep{c, stride_cm, stride_cn, bias, stride_bias, aux, stride_xm, stride_xn, epilogue, accumulate};
  LEVELS_DISPATCH(dtype, T,
                  return c_fp32 ? launch<T, float>(version, a, stride_am, stride_ak, b, stride_bk, stride_bn, M, N, K, ep, stream)
                                : launch<T, T>(version, a, stride_am, stride_ak, b, stride_bk, stride_bn, M, N, K, ep, stream));
  return LEVELS_OK;  // not reached
}

// out[n] = sum over m of x[m, n], fp32 accumulation; out is (N,) contiguous, float32 when
// out_fp32 else the input dtype. One kernel serves every version (1-4) of the GEMM.
extern "C" int levels_gemm_column_sum(int dtype, int version, const void* x, int64_t stride_xm,
                                      int64_t stride_xn, void* out, int out_fp32, int64_t M, int64_t N,
                                      cudaStream_t stream) {
  using namespace levels_gemm;
  if (version < 1 || version > 4) return LEVELS_BAD_VERSION;
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
