// layer_norm_binding.cpp — the layer_norm part of the one torch-facing unit (a fragment:
// build.py appends it to binding.cpp's prelude, so torch's headers are already in and
// levels_cuda::{stream, dtype_code, check, in, out} exist).
//
// Ops (validated in Python first: levels/contract.py, then cuda_kernels/layer_norm.py, which
// hands over x as an (M, N) view with adjacent columns and weight/bias contiguous):
//   layer_norm_fwd(x, weight, bias, eps, version, path=0) -> (y, mean, rstd)
//   layer_norm_bwd(dy, x, weight, mean, rstd, version, path=0) -> (dx, dweight, dbias)
// version: 1-6, or 0 for the measured rule (version 6 or 4 by x's width,
// layer_norm_plan.h ln_default_version), resolved here; version 6 picks its kernel from x's
// width and address.
// path: 0 lets the version's rule choose its kernel; version 4 takes 1-7 to force one
// (layer_norm_plan.h), version 6 takes 1 (its copy-engine kernel at any width), for the
// tests and the sweep (scripts/sweep_layer_norm.py); other versions take 0 only.

extern "C" int levels_layer_norm_default_version(int dtype, const void* x, int64_t M, int64_t N,
                                                 int64_t stride_x);
extern "C" int levels_layer_norm_fwd(int dtype, int version, int force, const void* x,
                                     const void* weight, const void* bias, void* y, float* mean,
                                     float* rstd, int64_t M, int64_t N, int64_t stride_x,
                                     float eps, cudaStream_t stream);
extern "C" int64_t levels_layer_norm_bwd_partials(int dtype, int version, int force, int64_t M,
                                                  int64_t N);
extern "C" int levels_layer_norm_bwd(int dtype, int version, int force, const void* dy,
                                     const void* x, const void* weight, const float* mean,
                                     const float* rstd, void* dx, void* dweight, void* dbias,
                                     float* partials, int64_t partial_rows, int64_t M, int64_t N,
                                     int64_t stride_dy, int64_t stride_x, cudaStream_t stream);

namespace levels_cuda_layer_norm {

// version 0: the rule's choice for this x (the forward and the backward see the same x).
static int64_t resolved(int64_t version, const at::Tensor& x) {
  if (version != 0) return version;
  return levels_layer_norm_default_version(levels_cuda::dtype_code(x), x.data_ptr(), x.size(0),
                                           x.size(1), x.stride(0));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd(const at::Tensor& x, const at::Tensor& weight,
                                                   const at::Tensor& bias, double eps,
                                                   int64_t version, int64_t path) {
  LEVELS_CHECK(x.dim() == 2, "levels_cuda::layer_norm_fwd: 'x' must be 2-D (M, N); got " +
                                 levels_cuda::shape(x));
  const int64_t M = x.size(0), N = x.size(1);
  levels_cuda::check_rows(x, "layer_norm", "x", M, N);
  levels_cuda::check_vector(weight, "layer_norm", "weight", N, x.scalar_type());
  levels_cuda::check_vector(bias, "layer_norm", "bias", N, x.scalar_type());
  const c10::DeviceGuard guard(x.device());  // launch on x's GPU, with that GPU's stream
  at::Tensor y = at::empty({M, N}, x.options());
  at::Tensor mean = at::empty({M}, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({M}, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return {y, mean, rstd};
  version = resolved(version, x);
  const int status = levels_layer_norm_fwd(
      levels_cuda::dtype_code(x), static_cast<int>(version), static_cast<int>(path),
      levels_cuda::in(x),
      levels_cuda::in(weight), levels_cuda::in(bias), levels_cuda::out(y),
      static_cast<float*>(levels_cuda::out(mean)), static_cast<float*>(levels_cuda::out(rstd)), M,
      N, x.stride(0), static_cast<float>(eps), levels_cuda::stream());
  levels_cuda::check(status, "layer_norm_fwd", version);
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dy, const at::Tensor& x,
                                                   const at::Tensor& weight,
                                                   const at::Tensor& mean,
                                                   const at::Tensor& rstd, int64_t version,
                                                   int64_t path) {
  LEVELS_CHECK(x.dim() == 2, "levels_cuda::layer_norm_bwd: 'x' must be 2-D (M, N); got " +
                                 levels_cuda::shape(x));
  const int64_t M = x.size(0), N = x.size(1);
  levels_cuda::check_rows(x, "layer_norm", "x", M, N);
  levels_cuda::check_rows(dy, "layer_norm", "dy", M, N);
  LEVELS_CHECK(dy.scalar_type() == x.scalar_type(),
               std::string("levels_cuda::layer_norm_bwd: 'dy' must be ") +
                   c10::toString(x.scalar_type()) + "; got " + c10::toString(dy.scalar_type()));
  levels_cuda::check_vector(weight, "layer_norm", "weight", N, x.scalar_type());
  levels_cuda::check_vector(mean, "layer_norm", "mean", M, at::kFloat);
  levels_cuda::check_vector(rstd, "layer_norm", "rstd", M, at::kFloat);
  const c10::DeviceGuard guard(x.device());
  at::Tensor dx = at::empty({M, N}, x.options());
  at::Tensor dweight = at::empty({N}, weight.options());
  at::Tensor dbias = at::empty({N}, weight.options());
  if (M == 0 || N == 0) {  // no rows: dweight and dbias are sums of nothing; no launch
    dweight.zero_();
    dbias.zero_();
    return {dx, dweight, dbias};
  }
  const int dtype = levels_cuda::dtype_code(x);
  version = resolved(version, x);
  const int64_t P = levels_layer_norm_bwd_partials(dtype, static_cast<int>(version),
                                                   static_cast<int>(path), M, N);
  if (P < 0) levels_cuda::check(static_cast<int>(P), "layer_norm_bwd", version);
  // dweight/dbias are sums over rows: the kernels write P partial rows of each (fp32),
  // a second kernel adds them up. Scratch from torch's caching allocator, freed on return
  // (the allocator keeps it ordered with the stream).
  at::Tensor partials = at::empty({2 * P * N}, x.options().dtype(at::kFloat));
  const int status = levels_layer_norm_bwd(
      dtype, static_cast<int>(version), static_cast<int>(path), levels_cuda::in(dy), levels_cuda::in(x),
      levels_cuda::in(weight), static_cast<const float*>(levels_cuda::in(mean)),
      static_cast<const float*>(levels_cuda::in(rstd)), levels_cuda::out(dx),
      levels_cuda::out(dweight), levels_cuda::out(dbias),
      P > 0 ? static_cast<float*>(levels_cuda::out(partials)) : nullptr, P, M, N, dy.stride(0),
      x.stride(0), levels_cuda::stream());
  levels_cuda::check(status, "layer_norm_bwd", version);
  return {dx, dweight, dbias};
}

}  // namespace levels_cuda_layer_norm

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("layer_norm_fwd(Tensor x, Tensor weight, Tensor bias, float eps, int version, "
        "int path=0) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd, "
        "int version, int path=0) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("layer_norm_fwd", &levels_cuda_layer_norm::fwd);
  m.impl("layer_norm_bwd", &levels_cuda_layer_norm::bwd);
}
