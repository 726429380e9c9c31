// newton_schulz.cu — Muon's Newton–Schulz orthogonalization, X <- aX + (bA + cA^2)X with
// A = X X^T, from X0 = G / (||G||_F + eps): Level 4's design (triton_kernels/newton_schulz.py)
// in CUDA, a ladder of five versions.
//
//   version 1  shared-memory tiles on the CUDA cores (gemm.cu's version 2 per tile, fp32
//              accumulation for every dtype). What it keeps from Level 4: the symmetric
//              products launch only the tiles on and below the diagonal (one block per tile,
//              T (T + 1) / 2 of them) and store each tile twice, at (i, j) and transposed at
//              (j, i); b*A + c*A·A is one launch whose epilogue reads A's tile (A·A = A·A^T);
//              a*X + B·X is one launch whose epilogue reads X's tile; the normalization is a
//              one-element scale (two deterministic launches) folded into the first step.
//              Costs: no tensor cores (16-bit inputs run at the CUDA cores' fp32 rate), and
//              the mirror store of a tile is column-wise (uncoalesced) from registers.
//   version 2  the same three products on gemm.cu's version-5 main loop (Hopper wgmma,
//              through its extern "C" levels_gemm_batched): tensor cores, 128x128 tiles fed
//              by cp.async into the 128-byte swizzled layout the wgmma descriptors read.
//              That loop takes K-major operands only (both operands' rows contiguous along
//              K), and X X^T, A·A and B·X need X along both of its dimensions: so every
//              iterate is kept twice, as X (M, N) and as X^T (N, M), in contiguous scratch
//              whose rows are rounded up to a multiple of 8 elements (16 bytes: odd sizes
//              still meet the rule). A = X X^T reads rows of X as both operands; B = c A·A +
//              b A reads rows of A twice (A = A^T); X' = B X + a X reads rows of B and rows
//              of X^T. The symmetric products run gemm.cu's symmetric schedule (tiles on and
//              below the diagonal; each off-diagonal tile mirrored), and the update writes
//              X' and X'^T from one staged tile: the transposed copy is read column-wise
//              from shared memory, so both are 16-byte stores. A "prepare" launch writes
//              X0 = s G (rounded to the dtype) into X and X^T; the last step writes straight
//              into the result, whichever of its two orientations is the contiguous one.
//              Costs: an extra M x N write per step (X^T), scratch of 4 M x N + 2 M x M per
//              matrix, Hopper only (sm_90: elsewhere LEVELS_BAD_ARCH, run version 1). fp32
//              G at version 2 runs version 1's kernels (wgmma has no fp32 path; exact fp32
//              FMAs, as gemm.cu's version 5 runs version 3 for fp32).
//              Not here yet: a persistent grid over the whole batch, X^T written only
//              where the next step needs it.
//              Measured on the H100 (bf16, five steps; reports/h100-bench-newton-schulz.json):
//              0.83x / 0.95x / 0.86x native at 1024^2, 4096^2, 4096x11008 (version 1:
//              0.02-0.06x): half the products, each at gemm.cu version 5's ~0.55-0.6x
//              cuBLAS, lands near cuBLAS doing all of them. Its X X^T alone is 1.12-1.14x
//              torch.matmul(X, X.T) (Level 4's 1.5x): the GEMM rung, not the plan, is short.
//   version 3  version 2's plan, each product on gemm.cu's version-6 GEMM instead (TMA
//              loads, a producer warpgroup and two consumer warpgroups synchronised by
//              mbarriers: levels_gemm_batched's version argument). Nothing else changes:
//              the same scratch, the same launches, the same epilogues; the version picks
//              the GEMM. Costs: version 6's (a tensor map encoded on the host per operand
//              per launch: 3 x 2 per step). Measured on the H100 (bf16, reports/h100-gemm6.json):
//              1.32x native at 4096^2, 1.14x at 4096x11008 (version 2: 0.98x, 0.91x). The
//              default on sm_90 until version 5; Level 4 (1.66x, 1.46x) is still ahead:
//              version 6 is 0.8-0.9x cuBLAS per product where Level 4's Triton GEMMs come
//              closer at these shapes.
//   version 4  version 2's plan on gemm.cu's version-7 GEMM (a persistent grid: one block per
//              SM walks (matrix, tile) pairs, the epilogue of one tile under the TMA loads of
//              the next; 128x128 tiles). Again only the version argument changes. Costs:
//              version 7's (4 ring stages at 128x128 where version 6 has 6). Measured on the
//              H100 (bf16, reports/h100-gemm7.json): 1.31x native at 4096^2, 1.16x at
//              4096x11008 (version 3 in the same run: 1.34x, 1.18x): no gain.
//   version 5  version 3 with the iterate kept once. Versions 2-4 keep X^T because version 5's
//              GEMM read K-major operands only; version 6 also reads an MN-major operand as it
//              lies (TMA boxes of 64 columns, wgmma's transpose flag). So X' = B X + a X takes
//              X itself as its B, the (K = M, N) matrix with N contiguous, and nothing writes
//              X^T: not the prepare launch, not the updates (the last step of a tall G still
//              writes its result transposed, into G's layout). Saves an M x N store per step
//              and half of the prepare launch's stores; the products are version 3's, and so
//              are the bits. Measured on the H100 (bf16, version 3 in the same run,
//              reports/level5-gemm-users-and-norms-2026-11-27/): 1.04x / 1.39x / 1.24x native at
//              1024^2, 4096^2, 4096x11008 (version 3: 1.02x, 1.37x, 1.20x); at 4096^2 the five
//              updates 1049 us against 1115, the prepare launch 58 us against 65. The default
//              on sm_90. Still below Level 4 (1.59-1.66x): each tile's epilogue runs after its
//              mainloop, and at 1024^2 36-64 tiles meet 132 SMs.
//
// Operands are read through both element strides (any view: a tall G is iterated as G^T by
// swapping its strides, no copy); scratch (A, B, the iterates) is contiguous and allocated by
// the binding. Offsets are int64.
//
// A batch (B, m, n) of same-shape matrices (an optimizer step's parameters of one shape) is
// one set of launches: every kernel's grid has a batch axis (blockIdx.y for the norms and
// the symmetric products, blockIdx.z for the update), each block finds its matrix through a
// batch stride, and each matrix has its own row of partial sums and its own scale. A 2-D G
// is a batch of one.

#include "common.cuh"

#include <algorithm>
#include <type_traits>

// gemm.cu's batched GEMM (see its definition for the contract), GEMM version 5 (our version
// 2) or 6 (our version 3).
extern "C" int levels_gemm_batched(int dtype, int version, int symmetric, int64_t batch, int64_t M, int64_t N, int64_t K,
                                   const void* a, int64_t stride_ab, int64_t stride_am, int64_t stride_ak,
                                   const void* b, int64_t stride_bb, int64_t stride_bn, int64_t stride_bk,
                                   void* c, int64_t stride_cb, int64_t stride_cm, int64_t stride_cn,
                                   void* ct, int64_t stride_tb, int64_t stride_tn, int64_t stride_tm,
                                   const void* y, int64_t stride_yb, int64_t stride_ym, int64_t stride_yn,
                                   float alpha, float beta, cudaStream_t stream);

namespace levels_newton_schulz {

constexpr int TILE = 32;      // a block computes a TILE x TILE output tile, one thread per element
constexpr int NORM_THREADS = 256;
constexpr int NORM_BLOCKS = 1024;  // fixed: the partial sums are added in the same order every run

// partials[b * gridDim.x + block] for matrix b = blockIdx.y of the batch x (batch stride sb)
template <typename T>
__global__ void sum_squares(const T* __restrict__ x, int64_t sb, int64_t sr, int64_t sc, int64_t R,
                            int64_t C, float* __restrict__ partials) {
  __shared__ float scratch[32];
  x += (int64_t)blockIdx.y * sb;
  partials += (int64_t)blockIdx.y * gridDim.x;
  float acc = 0.0f;
  const int64_t total = R * C, first = (int64_t)blockIdx.x * NORM_THREADS + threadIdx.x,
                step = (int64_t)gridDim.x * NORM_THREADS;
  // A matrix that is one block of memory (its rows or its columns contiguous: G or G^T as
  // allocated) is summed as a flat array, in 16-byte vectors where its start allows: a sum
  // of squares does not care about the order of its terms. Only another view pays a 64-bit
  // division per element to find its row and column, as every matrix did before: 46 us at
  // 4096^2 on the H100, 15 us read flat (reports/level5-gemm-users-and-norms-2026-11-27/).
  constexpr int V = 16 / (int)sizeof(T);
  const bool flat = (sc == 1 && sr == C) || (sr == 1 && sc == R);
  int64_t done = 0;  // elements [0, done) are summed by the vector loop
  if (flat && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    done = total / V * V;
    for (int64_t v = first; v < total / V; v += step) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(x) + v);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float f = to_f32<T>(e[i]);
        acc += f * f;
      }
    }
  }
  for (int64_t e = done + first; e < total; e += step) {
    const float v = to_f32<T>(flat ? x[e] : x[(e / C) * sr + (e % C) * sc]);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// scale[b] for matrix b = blockIdx.x, from its row of P partial sums
__global__ void inverse_norm(const float* __restrict__ partials, int P, float eps,
                             float* __restrict__ scale) {
  __shared__ float scratch[32];
  partials += (int64_t)blockIdx.x * P;
  scale += blockIdx.x;
  float acc = 0.0f;
  for (int p = threadIdx.x; p < P; p += NORM_THREADS) acc += partials[p];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) scale[0] = 1.0f / (sqrtf(acc) + eps);
}

// out = alpha * s^2 * X X^T (+ beta * Y), X (M, K), Y and out (M, M); s = scale[b] if scale;
// matrix b = blockIdx.y of the batch (batch strides sxb, syb, sob).
template <typename T>
__global__ void __launch_bounds__(TILE * TILE)
sym_v1(const T* __restrict__ X, int64_t sxb, int64_t sxm, int64_t sxk, const T* __restrict__ Y,
       int64_t syb, int64_t sym, int64_t syn, T* __restrict__ out, int64_t sob, int64_t som,
       int64_t son, const float* __restrict__ scale, int64_t M, int64_t K, float alpha, float beta) {
  const int64_t batch = blockIdx.y;
  X += batch * sxb;
  if (Y != nullptr) Y += batch * syb;
  out += batch * sob;
  if (scale != nullptr) scale += batch;
  // Tile (i, j), j <= i, number i (i + 1) / 2 + j: i is the triangular root of the block's
  // index, from a double square root corrected by one either way.
  const int64_t p = blockIdx.x;
  int64_t i = (int64_t)((sqrt(8.0 * (double)p + 1.0) - 1.0) * 0.5);
  while ((i + 1) * (i + 2) / 2 <= p) ++i;
  while (i * (i + 1) / 2 > p) --i;
  const int64_t j = p - i * (i + 1) / 2;
  __shared__ float xi[TILE][TILE + 1], xj[TILE][TILE + 1];  // +1: no bank conflicts on xj[tx][k]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = i * TILE + ty, col = j * TILE + tx;
  float acc = 0.0f;
  // ### BEGIN SOLUTION
  for (int64_t k0 = 0; k0 < K; k0 += TILE) {
    const int64_t k = k0 + tx, ri = i * TILE + ty, rj = j * TILE + ty;
    xi[ty][tx] = (ri < M && k < K) ? to_f32<T>(X[ri * sxm + k * sxk]) : 0.0f;
    xj[ty][tx] = (rj < M && k < K) ? to_f32<T>(X[rj * sxm + k * sxk]) : 0.0f;
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < TILE; ++kk) acc += xi[ty][kk] * xj[tx][kk];
    __syncthreads();
  }
  if (row >= M || col >= M) return;
  if (scale != nullptr) acc *= scale[0] * scale[0];
  acc *= alpha;
  if (Y != nullptr) acc += beta * to_f32<T>(Y[row * sym + col * syn]);
  const T v = from_f32<T>(acc);
  out[row * som + col * son] = v;
  if (i != j) out[col * som + row * son] = v;  // the mirror image, at (j, i)
  // ### END SOLUTION
}

// out = s * (a X + B X), B (M, M), X and out (M, N); K = 0: out = s * a * X (steps = 0);
// matrix b = blockIdx.z of the batch (batch strides sbb, sxb, sob).
template <typename T>
__global__ void __launch_bounds__(TILE * TILE)
update_v1(const T* __restrict__ B, int64_t sbb, int64_t sbm, int64_t sbk, const T* __restrict__ X,
          int64_t sxb, int64_t sxm, int64_t sxn, T* __restrict__ out, int64_t sob, int64_t som,
          int64_t son, const float* __restrict__ scale, int64_t M, int64_t N, int64_t K, float a) {
  const int64_t batch = blockIdx.z;
  B += batch * sbb;
  X += batch * sxb;
  out += batch * sob;
  if (scale != nullptr) scale += batch;
  __shared__ float sb[TILE][TILE + 1], sx[TILE][TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = (int64_t)blockIdx.y * TILE + ty, col = (int64_t)blockIdx.x * TILE + tx;
  float acc = 0.0f;
  // ### BEGIN SOLUTION
  for (int64_t k0 = 0; k0 < K; k0 += TILE) {
    const int64_t kb = k0 + tx, kx = k0 + ty;
    sb[ty][tx] = (row < M && kb < K) ? to_f32<T>(B[row * sbm + kb * sbk]) : 0.0f;
    sx[ty][tx] = (kx < K && col < N) ? to_f32<T>(X[kx * sxm + col * sxn]) : 0.0f;
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < TILE; ++kk) acc += sb[ty][kk] * sx[kk][tx];
    __syncthreads();
  }
  if (row >= M || col >= N) return;
  acc += a * to_f32<T>(X[row * sxm + col * sxn]);
  if (scale != nullptr) acc *= scale[0];
  out[row * som + col * son] = from_f32<T>(acc);
  // ### END SOLUTION
}

template <typename T>
void sym(const T* X, int64_t sxb, int64_t sxm, int64_t sxk, const T* Y, T* out,
         const float* scale, int64_t batch, int64_t M, int64_t K, float alpha, float beta,
         cudaStream_t stream) {
  const int64_t tiles = levels_cdiv(M, TILE);
  const dim3 grid((unsigned)(tiles * (tiles + 1) / 2), (unsigned)batch);
  sym_v1<T><<<grid, dim3(TILE, TILE), 0, stream>>>(
      X, sxb, sxm, sxk, Y, M * M, M, 1, out, M * M, M, 1, scale, M, K, alpha,
      beta);  // Y, out: contiguous (batch, M, M)
}

template <typename T>
void update(const T* B, int64_t sbb, const T* X, int64_t sxb, int64_t sxm, int64_t sxn, T* out,
            int64_t sob, int64_t som, int64_t son, const float* scale, int64_t batch, int64_t M,
            int64_t N, int64_t K, float a, cudaStream_t stream) {
  const dim3 grid((unsigned)levels_cdiv(N, TILE), (unsigned)levels_cdiv(M, TILE), (unsigned)batch);
  update_v1<T><<<grid, dim3(TILE, TILE), 0, stream>>>(B, sbb, M, 1, X, sxb, sxm, sxn, out, sob,
                                                      som, son, scale, M, N, K, a);
}

// scale[b] = 1 / (||G_b|| + eps) for every matrix of the batch: two deterministic launches.
template <typename T>
void normalize(const T* G, int64_t sgb, int64_t sgm, int64_t sgn, int64_t batch, int64_t M, int64_t N,
               float eps, float* partials, float* scale, cudaStream_t stream) {
  const int64_t P = std::min<int64_t>(NORM_BLOCKS, std::max<int64_t>(1, levels_cdiv(M * N, NORM_THREADS)));
  sum_squares<T><<<dim3((unsigned)P, (unsigned)batch), NORM_THREADS, 0, stream>>>(
      G, sgb, sgm, sgn, M, N, partials);
  inverse_norm<<<(unsigned)batch, NORM_THREADS, 0, stream>>>(partials, (int)P, eps, scale);
}

template <typename T>
int run(const T* G, int64_t sgb, int64_t sgm, int64_t sgn, T* out, int64_t sob, int64_t som,
        int64_t son, int64_t batch, int64_t M, int64_t N, int steps, float a, float b, float c,
        float eps, T* A, T* Bm, T* X0, T* X1, float* partials, float* scale, cudaStream_t stream) {
  if (batch == 0) return LEVELS_OK;  // an empty batch: nothing to launch
  // the grids' y axes (M's tiles, the batch) and z axis (the batch) hold 65535 at most
  if (M > 65535LL * TILE || batch > 65535) return LEVELS_UNSUPPORTED;
  normalize<T>(G, sgb, sgm, sgn, batch, M, N, eps, partials, scale, stream);
  if (steps == 0) {
    update<T>(G, sgb, G, sgb, sgm, sgn, out, sob, som, son, scale, batch, M, N, 0, 1.0f, stream);
    return levels_launch_status();
  }
  const T* x = G;
  int64_t sxb = sgb, sxm = sgm, sxn = sgn;
  for (int step = 0; step < steps; ++step) {
    const float* s = step == 0 ? scale : nullptr;
    sym<T>(x, sxb, sxm, sxn, nullptr, A, s, batch, M, N, 1.0f, 0.0f, stream);  // A = X X^T
    sym<T>(A, M * M, M, 1, A, Bm, nullptr, batch, M, M, c, b, stream);        // B = b A + c A A
    const bool last = step == steps - 1;
    T* target = last ? out : (step % 2 == 0 ? X0 : X1);
    update<T>(Bm, M * M, x, sxb, sxm, sxn, target, last ? sob : M * N, last ? som : N,
              last ? son : 1, s, batch, M, N, M, a, stream);
    x = target;
    sxb = M * N;
    sxm = N;
    sxn = 1;
  }
  return levels_launch_status();
}

// ---- version 2 ----

// Rows of version 2's scratch: a multiple of 8 elements, so every row starts 16-byte aligned.
inline int64_t padded(int64_t n) { return levels_cdiv(n, 8) * 8; }

template <typename T> constexpr int dtype_code() { return std::is_same<T, __half>::value ? LEVELS_F16 : LEVELS_BF16; }

// X0 = s G into X (M, ldx) and, unless XT is nullptr (version 5), X^T (N, ldt), matrix
// blockIdx.z: one 32x32 tile of G per block, read along whichever of G's dimensions is
// contiguous, turned around in shared memory so that both writes are along rows too.
constexpr int PREP_ROWS = 8;  // prepare_v2's block: TILE x PREP_ROWS threads

template <typename T>
__global__ void __launch_bounds__(TILE * PREP_ROWS)
prepare_v2(const T* __restrict__ G, int64_t sgb, int64_t sgm, int64_t sgn, const float* __restrict__ scale,
           T* __restrict__ X, int64_t ldx, T* __restrict__ XT, int64_t ldt, int64_t M, int64_t N) {
  __shared__ float t[TILE][TILE + 1];
  const int64_t b = blockIdx.z;
  G += b * sgb;
  X += b * M * ldx;
  if (XT != nullptr) XT += b * N * ldt;  // version 5 keeps no X^T
  const float s = scale[b];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t m0 = (int64_t)blockIdx.y * TILE, n0 = (int64_t)blockIdx.x * TILE;
  const bool m_fast = sgm == 1 && sgn != 1;  // a tall G's transpose: consecutive threads along m
  // PREP_ROWS rows of threads, each thread TILE / PREP_ROWS elements of the tile, its loads
  // all in flight at once. With one element a thread (a 32 x 32 block) the launch took
  // 113 us at 4096^2 on the H100 for 96 MB moved; this way 68 us.
#pragma unroll
  for (int r = ty; r < TILE; r += PREP_ROWS) {
    const int mi = m_fast ? tx : r, ni = m_fast ? r : tx;
    if (m0 + mi < M && n0 + ni < N) t[mi][ni] = s * to_f32<T>(G[(m0 + mi) * sgm + (n0 + ni) * sgn]);
  }
  __syncthreads();
#pragma unroll
  for (int r = ty; r < TILE; r += PREP_ROWS) {
    if (m0 + r < M && n0 + tx < N) X[(m0 + r) * ldx + n0 + tx] = from_f32<T>(t[r][tx]);
    if (XT != nullptr && n0 + r < N && m0 + tx < M) XT[(n0 + r) * ldt + m0 + tx] = from_f32<T>(t[tx][r]);
  }
}

// Version 2 on 16-bit G: the products on gemm.cu's wgmma loop (levels_gemm_batched). Scratch
// (all contiguous, rows padded: ldm = padded(M), ldn = padded(N)): A, Bm (batch, M, ldm);
// X0, XT0 (batch, M, ldn) and (batch, N, ldm) for steps >= 1; X1, XT1 the same for steps >= 2.
// gemm_version: 5 (Newton–Schulz version 2), 6 (version 3) or 7 (version 4), the GEMM every
// product runs on.
// keep_t = false (version 5): XT0 and XT1 are not given; X' = B X + a X reads X itself as the
// MN-major B operand (version 6's batched GEMM reads a (K, N) matrix with N contiguous as it
// lies), so no X^T is written, neither by the prepare launch nor by the updates.
template <typename T>
int run_v2(int gemm_version, const T* G, int64_t sgb, int64_t sgm, int64_t sgn, T* out, int64_t sob, int64_t som,
           int64_t son, int64_t batch, int64_t M, int64_t N, int steps, float a, float b, float c,
           float eps, T* A, T* Bm, T* X0, T* X1, T* XT0, T* XT1, float* partials, float* scale,
           cudaStream_t stream, bool keep_t = true) {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 9) return LEVELS_BAD_ARCH;  // before any launch: nothing half done
  if (batch == 0) return LEVELS_OK;
  if (M > 65535LL * TILE || N > 65535LL * TILE || batch > 65535) return LEVELS_UNSUPPORTED;
  normalize<T>(G, sgb, sgm, sgn, batch, M, N, eps, partials, scale, stream);
  if (steps == 0) {  // s G: version 1's update with an empty K
    update<T>(G, sgb, G, sgb, sgm, sgn, out, sob, som, son, scale, batch, M, N, 0, 1.0f, stream);
    return levels_launch_status();
  }
  const int64_t ldm = padded(M), ldn = padded(N);
  const dim3 grid((unsigned)levels_cdiv(N, TILE), (unsigned)levels_cdiv(M, TILE), (unsigned)batch);
  prepare_v2<T><<<grid, dim3(TILE, PREP_ROWS), 0, stream>>>(G, sgb, sgm, sgn, scale, X0, ldn, XT0, ldm, M, N);
  int status = levels_launch_status();
  T* X[2] = {X0, X1};
  T* XT[2] = {XT0, XT1};
  const int dt = dtype_code<T>();
  for (int step = 0, cur = 0; step < steps && status == LEVELS_OK; ++step, cur ^= 1) {
    const bool last = step == steps - 1;
    // The result of the last step is contiguous in G's shape: for a wide G that is X' (c),
    // for a tall one X'^T (ct); any other strides go through c element by element.
    T* c_out = !last ? X[cur ^ 1] : (son == 1 || som != 1 ? out : nullptr);
    T* ct_out = !last ? (keep_t ? XT[cur ^ 1] : nullptr) : (c_out == nullptr ? out : nullptr);
    const int64_t scb = last ? sob : M * ldn, scm = last ? som : ldn, scn = last ? son : 1;
    const int64_t stb = last ? sob : N * ldm, stn = last ? son : ldm, stm = last ? som : 1;
    // ### BEGIN SOLUTION
    // A = X X^T: rows of X as both operands, K = N, symmetric
    status = levels_gemm_batched(dt, gemm_version, 1, batch, M, M, N, X[cur], M * ldn, ldn, 1, X[cur], M * ldn, ldn, 1,
                                 A, M * ldm, ldm, 1, nullptr, 0, 0, 0, nullptr, 0, 0, 0, 1.0f, 0.0f, stream);
    // B = c A·A + b A: rows of A as both operands (A·A = A·A^T), K = M, symmetric
    if (status == LEVELS_OK)
      status = levels_gemm_batched(dt, gemm_version, 1, batch, M, M, M, A, M * ldm, ldm, 1, A, M * ldm, ldm, 1, Bm, M * ldm,
                                   ldm, 1, nullptr, 0, 0, 0, A, M * ldm, ldm, 1, c, b, stream);
    // X' = B X + a X: rows of B and rows of X^T (the (N, K = M) K-major operand); X' and X'^T.
    // Version 5: X itself as B (stride_bn = 1, stride_bk = ldn: MN-major); X' alone.
    if (status == LEVELS_OK && keep_t)
      status = levels_gemm_batched(dt, gemm_version, 0, batch, M, N, M, Bm, M * ldm, ldm, 1, XT[cur], N * ldm, ldm, 1, c_out,
                                   scb, scm, scn, ct_out, stb, stn, stm, X[cur], M * ldn, ldn, 1, 1.0f, a, stream);
    else if (status == LEVELS_OK)
      status = levels_gemm_batched(dt, gemm_version, 0, batch, M, N, M, Bm, M * ldm, ldm, 1, X[cur], M * ldn, 1, ldn, c_out,
                                   scb, scm, scn, ct_out, stb, stn, stm, X[cur], M * ldn, ldn, 1, 1.0f, a, stream);
    // ### END SOLUTION
  }
  return status;
}

}  // namespace levels_newton_schulz

// =====================================================================================
// extern "C" launcher
// =====================================================================================

// out = newton_schulz(G) for G viewed as a batch of `batch` (M, N) matrices with M <= N
// through strides (sgb, sgm, sgn) (the binding passes a tall G transposed; a 2-D G is a batch
// of one), out viewed likewise through (sob, som, son). batch >= 0, M, N >= 1, steps >= 0.
// Scratch, all contiguous, allocated by the caller:
//   version 1 and fp32 at versions 2-5: A and Bm (batch, M, M), X0 and X1 (batch, M, N) (unused
//     for steps <= 1 and <= 2); XT0, XT1 unused;
//   versions 2-5 (fp16, bf16; sm_90): rows padded to a multiple of 8 (ldm = M, ldn = N rounded
//     up): A and Bm (batch, M, ldm), X0 and X1 (batch, M, ldn), XT0 and XT1 (batch, N, ldm)
//     (X0, XT0 unused for steps 0; X1, XT1 for steps <= 1; XT0 and XT1 unused at version 5);
//   partials (batch * 1024 floats), scale (batch floats).
extern "C" int levels_newton_schulz_run(int dtype, int version, const void* G, int64_t sgb,
                                    int64_t sgm, int64_t sgn, void* out, int64_t sob, int64_t som,
                                    int64_t son, int64_t batch, int64_t M, int64_t N, int steps,
                                    float a, float b, float c, float eps, void* A, void* Bm,
                                    void* X0, void* X1, void* XT0, void* XT1, float* partials,
                                    float* scale, cudaStream_t stream) {
  using namespace levels_newton_schulz;
  if (version < 1 || version > 5) return LEVELS_BAD_VERSION;
  LEVELS_DISPATCH(dtype, T, {
    if constexpr (!std::is_same<T, float>::value) {
      if (version >= 2)  // the GEMM version each runs on: 2 -> 5, 3 -> 6, 4 -> 7, 5 -> 6
        return run_v2<T>(version == 5 ? 6 : version + 3, static_cast<const T*>(G), sgb, sgm, sgn,
                         static_cast<T*>(out), sob, som, son, batch, M, N, steps, a, b, c, eps,
                         static_cast<T*>(A), static_cast<T*>(Bm), static_cast<T*>(X0), static_cast<T*>(X1),
                         static_cast<T*>(XT0), static_cast<T*>(XT1), partials, scale, stream, version != 5);
    }
    // version 1, and fp32 at versions 2-5 (exact fp32 on the CUDA cores: wgmma has no fp32)
    return run<T>(static_cast<const T*>(G), sgb, sgm, sgn, static_cast<T*>(out), sob, som, son,
                  batch, M, N, steps, a, b, c, eps, static_cast<T*>(A), static_cast<T*>(Bm),
                  static_cast<T*>(X0), static_cast<T*>(X1), partials, scale, stream);
  });
  return LEVELS_OK;  // not reached
}
