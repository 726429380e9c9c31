// newton_schulz_binding.cpp — the newton_schulz part of the one torch-facing unit (a fragment:
// build.py appends it to binding.cpp's prelude, so torch's headers are in and
// levels_cuda::{stream, dtype_code, check, in, out, shape} and LEVELS_CHECK exist).
//
// Op (validated in Python first: levels/contract.py; forward only, so the op a call is is
// this kernel op itself, with no autograd):
//   newton_schulz(G, steps, a, b, c, eps, version) -> out   G's shape and dtype, contiguous
//   G: (rows, cols) or a batch (batch, rows, cols), each matrix orthogonalized on its own

extern "C" int levels_newton_schulz_run(int dtype, int version, const void* G, int64_t sgb,
                                    int64_t sgm, int64_t sgn, void* out, int64_t sob, int64_t som,
                                    int64_t son, int64_t batch, int64_t M, int64_t N, int steps,
                                    float a, float b, float c, float eps, void* A, void* Bm,
                                    void* X0, void* X1, void* XT0, void* XT1, float* partials,
                                    float* scale, cudaStream_t stream);

namespace levels_cuda_newton_schulz {

at::Tensor newton_schulz(const at::Tensor& G, int64_t steps, double a, double b, double c,
                         double eps, int64_t version) {
  const bool batched = G.dim() == 3;
  LEVELS_CHECK((G.dim() == 2 || batched) && G.size(-2) > 0 && G.size(-1) > 0,
               "levels_cuda::newton_schulz: 'G' must be a 2-D matrix or a 3-D batch of matrices, "
               "each non-empty; got " + levels_cuda::shape(G));
  LEVELS_CHECK(steps >= 0, "levels_cuda::newton_schulz: 'steps' must be >= 0; got " +
                               std::to_string(steps));
  const c10::DeviceGuard guard(G.device());
  at::Tensor result = at::empty(G.sizes(), G.options());
  const int64_t batch = batched ? G.size(0) : 1;
  if (batch == 0) return result;  // an empty batch: nothing to launch
  // A tall G is iterated as G^T: the same memory through swapped strides (so is the result)
  const int64_t rows = G.size(-2), cols = G.size(-1);
  const bool tall = rows > cols;
  const int64_t M = tall ? cols : rows, N = tall ? rows : cols;
  const int64_t sgb = batched ? G.stride(0) : 0;
  const int64_t sgm = tall ? G.stride(-1) : G.stride(-2), sgn = tall ? G.stride(-2) : G.stride(-1);
  const int64_t som = tall ? 1 : N, son = tall ? M : 1;  // result is contiguous in G's shape
  // Scratch (levels_newton_schulz_run's contract): versions 2-5 on 16-bit G pad rows to a
  // multiple of 8 elements, and 2-4 keep X^T beside X; version 1 (and fp32 at 2-5) X alone.
  const bool wgmma = version >= 2 && version <= 5 && G.scalar_type() != at::kFloat;
  const bool keeps_t = wgmma && version <= 4;
  const int64_t ldm = wgmma ? (M + 7) / 8 * 8 : M, ldn = wgmma ? (N + 7) / 8 * 8 : N;
  const int64_t first = wgmma ? 1 : 2;  // the steps from which X0 (then X1) is used
  at::Tensor A = at::empty({batch, M, ldm}, G.options());
  at::Tensor Bm = at::empty({batch, M, ldm}, G.options());
  at::Tensor X0 = at::empty({steps >= first ? batch : 0, M, ldn}, G.options());
  at::Tensor X1 = at::empty({steps >= first + 1 ? batch : 0, M, ldn}, G.options());
  at::Tensor XT0 = at::empty({keeps_t && steps >= 1 ? batch : 0, N, ldm}, G.options());
  at::Tensor XT1 = at::empty({keeps_t && steps >= 2 ? batch : 0, N, ldm}, G.options());
  at::Tensor partials = at::empty({batch, 1024}, G.options().dtype(at::kFloat));
  at::Tensor scale = at::empty({batch}, G.options().dtype(at::kFloat));
  const int status = levels_newton_schulz_run(
      levels_cuda::dtype_code(G), static_cast<int>(version), levels_cuda::in(G), sgb, sgm, sgn,
      levels_cuda::out(result), M * N, som, son, batch, M, N, static_cast<int>(steps),
      static_cast<float>(a), static_cast<float>(b), static_cast<float>(c), static_cast<float>(eps),
      levels_cuda::out(A), levels_cuda::out(Bm), X0.numel() ? levels_cuda::out(X0) : nullptr,
      X1.numel() ? levels_cuda::out(X1) : nullptr, XT0.numel() ? levels_cuda::out(XT0) : nullptr,
      XT1.numel() ? levels_cuda::out(XT1) : nullptr,
      static_cast<float*>(levels_cuda::out(partials)), static_cast<float*>(levels_cuda::out(scale)),
      levels_cuda::stream());
  levels_cuda::check(status, "newton_schulz", version);
  return result;
}

}  // namespace levels_cuda_newton_schulz

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("newton_schulz(Tensor G, int steps, float a, float b, float c, float eps, int version) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("newton_schulz", &levels_cuda_newton_schulz::newton_schulz);
}
