// newton_schulz.cu — Muon's Newton–Schulz orthogonalization, X <- aX + (bA + cA^2)X with
// A = X X^T, from X0 = G / (||G||_F + eps): Level 4's design (triton_kernels/newton_schulz.py)
// in CUDA, a ladder of one version so far.
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
//              Not here yet (the next rungs): the symmetric tile schedule on gemm.cu's
//              version 4 (mma.sync) and version 5 (wgmma) main loops, the mirror staged
//              through shared memory for 16-byte stores.
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
  const int64_t total = R * C;
  for (int64_t e = (int64_t)blockIdx.x * NORM_THREADS + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * NORM_THREADS) {
    const float v = to_f32<T>(x[(e / C) * sr + (e % C) * sc]);
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

template <typename T>
int run(const T* G, int64_t sgb, int64_t sgm, int64_t sgn, T* out, int64_t sob, int64_t som,
        int64_t son, int64_t batch, int64_t M, int64_t N, int steps, float a, float b, float c,
        float eps, T* A, T* Bm, T* X0, T* X1, float* partials, float* scale, cudaStream_t stream) {
  if (batch == 0) return LEVELS_OK;  // an empty batch: nothing to launch
  // the grids' y axes (M's tiles, the batch) and z axis (the batch) hold 65535 at most
  if (M > 65535LL * TILE || batch > 65535) return LEVELS_UNSUPPORTED;
  const int64_t P = std::min<int64_t>(NORM_BLOCKS, std::max<int64_t>(1, levels_cdiv(M * N, NORM_THREADS)));
  sum_squares<T><<<dim3((unsigned)P, (unsigned)batch), NORM_THREADS, 0, stream>>>(
      G, sgb, sgm, sgn, M, N, partials);
  inverse_norm<<<(unsigned)batch, NORM_THREADS, 0, stream>>>(partials, (int)P, eps, scale);
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

}  // namespace levels_newton_schulz

// =====================================================================================
// extern "C" launcher
// =====================================================================================

// out = newton_schulz(G) for G viewed as a batch of `batch` (M, N) matrices with M <= N
// through strides (sgb, sgm, sgn) (the binding passes a tall G transposed; a 2-D G is a batch
// of one), out viewed likewise through (sob, som, son). Scratch, all contiguous: A and Bm
// (batch, M, M), X0 and X1 (batch, M, N) (unused for steps <= 1 and <= 2), partials
// (batch * 1024 floats), scale (batch floats). batch >= 0, M, N >= 1, steps >= 0.
extern "C" int levels_newton_schulz_run(int dtype, int version, const void* G, int64_t sgb,
                                    int64_t sgm, int64_t sgn, void* out, int64_t sob, int64_t som,
                                    int64_t son, int64_t batch, int64_t M, int64_t N, int steps,
                                    float a, float b, float c, float eps, void* A, void* Bm,
                                    void* X0, void* X1, float* partials, float* scale,
                                    cudaStream_t stream) {
  using namespace levels_newton_schulz;
  if (version != 1) return LEVELS_BAD_VERSION;
  LEVELS_DISPATCH(dtype, T, {
    return run<T>(static_cast<const T*>(G), sgb, sgm, sgn, static_cast<T*>(out), sob, som, son,
                  batch, M, N, steps, a, b, c, eps, static_cast<T*>(A), static_cast<T*>(Bm),
                  static_cast<T*>(X0), static_cast<T*>(X1), partials, scale, stream);
  });
  return LEVELS_OK;  // not reached
}
