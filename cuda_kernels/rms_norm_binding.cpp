// rms_norm_binding.cpp — the rms_norm part of the one torch-facing unit (a fragment: build.py
// appends it to binding.cpp's prelude, so torch's headers are in and levels_cuda::{stream,
// dtype_code, check, check_rows, check_vector, in, out, shape} and LEVELS_CHECK exist).
//
// Ops (validated in Python first: levels/contract.py; rms_norm_autograd.cpp hands over x as
// an (M, N) view with adjacent columns and weight contiguous):
//   rms_norm_fwd(x, weight, eps, version) -> (y, rstd)
//   rms_norm_bwd(dy, x, weight, rstd, version, force=0) -> (dx, dweight)
//     force: 0, or (version 4) the rows an iteration to pin, 1, 2 or 4 (scripts, tests)

extern "C" int levels_rms_norm_fwd(int dtype, int version, const void* x, const void* weight,
                                   void* y, float* rstd, int64_t M, int64_t N, int64_t stride_x,
                                   float eps, cudaStream_t stream);
extern "C" int64_t levels_rms_norm_bwd_partials(int dtype, int version, int force, int64_t M,
                                                int64_t N);
extern "C" int levels_rms_norm_bwd(int dtype, int version, int force, const void* dy,
                                   const void* x, const void* weight, const float* rstd, void* dx,
                                   void* dweight, float* partials, int64_t partial_rows,
                                   int64_t M, int64_t N, int64_t stride_dy, int64_t stride_x,
                                   cudaStream_t stream);

namespace levels_cuda_rms_norm {

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& x, const at::Tensor& weight, double eps,
                                       int64_t version) {
  LEVELS_CHECK(x.dim() == 2, "levels_cuda::rms_norm_fwd: 'x' must be 2-D (M, N); got " +
                                 levels_cuda::shape(x));
  const int64_t M = x.size(0), N = x.size(1);
  levels_cuda::check_rows(x, "rms_norm", "x", M, N);
  levels_cuda::check_vector(weight, "rms_norm", "weight", N, x.scalar_type());
  const c10::DeviceGuard guard(x.device());  // launch on x's GPU, with that GPU's stream
  at::Tensor y = at::empty({M, N}, x.options());
  at::Tensor rstd = at::empty({M}, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return {y, rstd};
  const int status = levels_rms_norm_fwd(
      levels_cuda::dtype_code(x), static_cast<int>(version), levels_cuda::in(x),
      levels_cuda::in(weight), levels_cuda::out(y), static_cast<float*>(levels_cuda::out(rstd)),
      M, N, x.stride(0), static_cast<float>(eps), levels_cuda::stream());
  levels_cuda::check(status, "rms_norm_fwd", version);
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> bwd(const at::Tensor& dy, const at::Tensor& x,
                                       const at::Tensor& weight, const at::Tensor& rstd,
                                       int64_t version, int64_t force) {
  LEVELS_CHECK(x.dim() == 2, "levels_cuda::rms_norm_bwd: 'x' must be 2-D (M, N); got " +
                                 levels_cuda::shape(x));
  const int64_t M = x.size(0), N = x.size(1);
  levels_cuda::check_rows(x, "rms_norm", "x", M, N);
  levels_cuda::check_rows(dy, "rms_norm", "dy", M, N);
  LEVELS_CHECK(dy.scalar_type() == x.scalar_type(),
               std::string("levels_cuda::rms_norm_bwd: 'dy' must be ") +
                   c10::toString(x.scalar_type()) + "; got " + c10::toString(dy.scalar_type()));
  levels_cuda::check_vector(weight, "rms_norm", "weight", N, x.scalar_type());
  levels_cuda::check_vector(rstd, "rms_norm", "rstd", M, at::kFloat);
  const c10::DeviceGuard guard(x.device());
  at::Tensor dx = at::empty({M, N}, x.options());
  at::Tensor dweight = at::empty({N}, weight.options());
  if (M == 0 || N == 0) {  // no rows: dweight is a sum of nothing; no launch
    dweight.zero_();
    return {dx, dweight};
  }
  const int dtype = levels_cuda::dtype_code(x);
  const int64_t P = levels_rms_norm_bwd_partials(dtype, static_cast<int>(version),
                                                 static_cast<int>(force), M, N);
  if (P < 0) levels_cuda::check(static_cast<int>(P), "rms_norm_bwd", version);
  // dweight is a sum over rows: P partial rows (fp32), then a kernel adds them up. Scratch
  // from torch's caching allocator, ordered with the stream.
  at::Tensor partials = at::empty({P * N}, x.options().dtype(at::kFloat));
  const int status = levels_rms_norm_bwd(
      dtype, static_cast<int>(version), static_cast<int>(force), levels_cuda::in(dy), levels_cuda::in(x),
      levels_cuda::in(weight), static_cast<const float*>(levels_cuda::in(rstd)),
      levels_cuda::out(dx), levels_cuda::out(dweight),
      P > 0 ? static_cast<float*>(levels_cuda::out(partials)) : nullptr, P, M, N, dy.stride(0),
      x.stride(0), levels_cuda::stream());
  levels_cuda::check(status, "rms_norm_bwd", version);
  return {dx, dweight};
}

}  // namespace levels_cuda_rms_norm

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("rms_norm_fwd(Tensor x, Tensor weight, float eps, int version) -> (Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor rstd, int version, "
        "int force=0) "
        "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("rms_norm_fwd", &levels_cuda_rms_norm::fwd);
  m.impl("rms_norm_bwd", &levels_cuda_rms_norm::bwd);
}
