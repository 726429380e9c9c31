// conv_bn_binding.cpp — the conv_bn part of the binding (a fragment: build.py appends it to
// binding.cpp, whose includes and levels_cuda:: helpers it uses; it includes nothing itself).
//
// Four functional ops, two per mode; the Python side (cuda_kernels/conv_bn.py) registers their
// fake implementations and the autograd of the forward ops, and passes:
//   x     as (N, H, W, C_in), the NHWC view of a channels_last tensor (strides passed on);
//   w     as (C_out, kH, kW, C_in): the caller's weight permuted, any strides (the eval ops
//         read it as it lies, conv_bn.cu's WeightLayout); train_fwd's and train_bwd's w_k
//         the same, contiguous (their convolutions read it K-major);
//   dout  as (N, H_out, W_out, C_out) contiguous;
//   bias, gamma, beta, running stats contiguous (C_out,).
// Outputs are NHWC/K-major contiguous tensors allocated here, except dw: allocated like w (the
// caller's weight layout, so that autograd keeps it in .grad without a copy).
#include <tuple>

extern "C" {
int64_t levels_conv_bn_workspace_floats(int which, int version, int64_t N, int64_t H, int64_t W,
                                        int64_t C_in, int64_t C_out, int64_t kH, int64_t kW,
                                        int64_t stride_h, int64_t stride_w, int64_t pad_h,
                                        int64_t pad_w, int64_t sx_n, int64_t sx_h, int64_t sx_w,
                                        int64_t sx_c);
int levels_conv_bn_eval_fwd(int dtype, int version, const void* x, const void* w,
                            const void* bias, const void* gamma, const void* beta,
                            const void* running_mean, const void* running_var, double eps,
                            int64_t N, int64_t H, int64_t W, int64_t C_in, int64_t C_out,
                            int64_t kH, int64_t kW, int64_t stride_h, int64_t stride_w,
                            int64_t pad_h, int64_t pad_w, int64_t sx_n, int64_t sx_h,
                            int64_t sx_w, int64_t sx_c, int64_t sw_o, int64_t sw_i, int64_t sw_j,
                            int64_t sw_c, void* out, void* w_folded, float* scale,
                            float* invstd, float* workspace, cudaStream_t stream);
int levels_conv_bn_train_fwd(int dtype, int version, const void* x, const void* w,
                             const void* bias, const void* gamma, const void* beta,
                             const void* running_mean, const void* running_var, double eps,
                             double momentum, int64_t N, int64_t H, int64_t W, int64_t C_in,
                             int64_t C_out, int64_t kH, int64_t kW, int64_t stride_h,
                             int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t sx_n,
                             int64_t sx_h, int64_t sx_w, int64_t sx_c, void* out, float* y,
                             float* mean, float* invstd, void* new_running_mean,
                             void* new_running_var, float* workspace, cudaStream_t stream);
int levels_conv_bn_eval_bwd(int dtype, int version, const void* dout, const void* x,
                            const void* w, const void* w_folded, const void* bias,
                            const void* running_mean, const float* scale, const float* invstd,
                            int64_t N, int64_t H, int64_t W, int64_t C_in, int64_t C_out,
                            int64_t kH, int64_t kW, int64_t stride_h, int64_t stride_w,
                            int64_t pad_h, int64_t pad_w, int64_t sx_n, int64_t sx_h,
                            int64_t sx_w, int64_t sx_c, int64_t sw_o, int64_t sw_i, int64_t sw_j,
                            int64_t sw_c, void* dx, void* dw, int64_t sdw_o, int64_t sdw_i,
                            int64_t sdw_j, int64_t sdw_c, void* dbias, void* dgamma, void* dbeta,
                            float* workspace, cudaStream_t stream);
int levels_conv_bn_train_bwd(int dtype, int version, const void* dout, const void* x,
                             const void* w, const float* y, const float* mean,
                             const float* invstd, const void* gamma, int64_t N, int64_t H,
                             int64_t W, int64_t C_in, int64_t C_out, int64_t kH, int64_t kW,
                             int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                             int64_t sx_n, int64_t sx_h, int64_t sx_w, int64_t sx_c, void* dx,
                             void* dw, int64_t sdw_o, int64_t sdw_i, int64_t sdw_j, int64_t sdw_c,
                             void* dbias, void* dgamma, void* dbeta, float* workspace,
                             cudaStream_t stream);
}

namespace levels_cuda_conv_bn {

// The geometry of one call, in the launchers' argument order.
struct Shape {
  int64_t N, H, W, C_in, C_out, kH, kW, sh, sw, ph, pw, H_out, W_out, P, K;
};

inline Shape shape_of(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride,
                      at::IntArrayRef padding) {
  TORCH_CHECK(x.dim() == 4 && w.dim() == 4 && stride.size() == 2 && padding.size() == 2,
              "levels_cuda::conv_bn_*: x (N, H, W, C_in), w (C_out, kH, kW, C_in), "
              "stride and padding pairs expected");
  Shape s{};
  s.N = x.size(0); s.H = x.size(1); s.W = x.size(2); s.C_in = x.size(3);
  s.C_out = w.size(0); s.kH = w.size(1); s.kW = w.size(2);
  s.sh = stride[0]; s.sw = stride[1]; s.ph = padding[0]; s.pw = padding[1];
  s.H_out = (s.H + 2 * s.ph - s.kH) / s.sh + 1;
  s.W_out = (s.W + 2 * s.pw - s.kW) / s.sw + 1;
  s.P = s.N * s.H_out * s.W_out;
  s.K = s.kH * s.kW * s.C_in;
  return s;
}


inline const void* maybe(const std::optional<at::Tensor>& t) {
  return t.has_value() ? levels_cuda::in(*t) : nullptr;
}

#define LEVELS_CONV_BN_SHAPE(s, x)                                                        \
  s.N, s.H, s.W, s.C_in, s.C_out, s.kH, s.kW, s.sh, s.sw, s.ph, s.pw, x.stride(0),        \
      x.stride(1), x.stride(2), x.stride(3)
// A (C_out, kH, kW, C_in) weight's (or dw's) element strides, WeightLayout's order.
#define LEVELS_CONV_BN_STRIDES(t) t.stride(0), t.stride(1), t.stride(2), t.stride(3)

// The fp32 workspace of op `which` (conv_bn.cu's levels_conv_bn_workspace_floats: the version
// and the whole geometry decide it; version 6's dgrad phases need all of it).
inline at::Tensor workspace(int which, int64_t version, const Shape& s, const at::Tensor& x) {
  const int64_t n = levels_conv_bn_workspace_floats(which, static_cast<int>(version),
                                                    LEVELS_CONV_BN_SHAPE(s, x));
  return at::empty({n}, x.options().dtype(at::kFloat));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> eval_fwd(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
    const at::Tensor& gamma, const at::Tensor& beta, const at::Tensor& running_mean,
    const at::Tensor& running_var, at::IntArrayRef stride, at::IntArrayRef padding, double eps,
    int64_t version) {
  const Shape s = shape_of(x, w, stride, padding);
  at::Tensor out = at::empty({s.N, s.H_out, s.W_out, s.C_out}, x.options());
  at::Tensor w_folded = at::empty({s.C_out, s.kH, s.kW, s.C_in}, w.options());
  at::Tensor scale = at::empty({s.C_out}, x.options().dtype(at::kFloat));
  at::Tensor invstd = at::empty({s.C_out}, x.options().dtype(at::kFloat));
  at::Tensor work = workspace(0, version, s, x);
  const int status = levels_conv_bn_eval_fwd(
      levels_cuda::dtype_code(x), static_cast<int>(version), levels_cuda::in(x),
      levels_cuda::in(w), maybe(bias), levels_cuda::in(gamma), levels_cuda::in(beta),
      levels_cuda::in(running_mean), levels_cuda::in(running_var), eps,
      LEVELS_CONV_BN_SHAPE(s, x), LEVELS_CONV_BN_STRIDES(w), levels_cuda::out(out),
      levels_cuda::out(w_folded),
      scale.mutable_data_ptr<float>(), invstd.mutable_data_ptr<float>(),
      work.mutable_data_ptr<float>(), levels_cuda::stream());
  levels_cuda::check(status, "conv_bn_eval_fwd", version);
  return {out, w_folded, scale, invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> train_fwd(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
    const at::Tensor& gamma, const at::Tensor& beta, const at::Tensor& running_mean,
    const at::Tensor& running_var, at::IntArrayRef stride, at::IntArrayRef padding, double eps,
    double momentum, int64_t version) {
  const Shape s = shape_of(x, w, stride, padding);
  TORCH_CHECK(w.is_contiguous(), "levels_cuda::conv_bn_train_fwd: w must be contiguous (K-major)");
  at::Tensor out = at::empty({s.N, s.H_out, s.W_out, s.C_out}, x.options());
  at::Tensor y = at::empty({s.N, s.H_out, s.W_out, s.C_out}, x.options().dtype(at::kFloat));
  at::Tensor mean = at::empty({s.C_out}, x.options().dtype(at::kFloat));
  at::Tensor invstd = at::empty({s.C_out}, x.options().dtype(at::kFloat));
  at::Tensor new_mean = at::empty({s.C_out}, running_mean.options());
  at::Tensor new_var = at::empty({s.C_out}, running_var.options());
  at::Tensor work = workspace(1, version, s, x);
  const int status = levels_conv_bn_train_fwd(
      levels_cuda::dtype_code(x), static_cast<int>(version), levels_cuda::in(x),
      levels_cuda::in(w), maybe(bias), levels_cuda::in(gamma), levels_cuda::in(beta),
      levels_cuda::in(running_mean), levels_cuda::in(running_var), eps, momentum,
      LEVELS_CONV_BN_SHAPE(s, x), levels_cuda::out(out), y.mutable_data_ptr<float>(),
      mean.mutable_data_ptr<float>(), invstd.mutable_data_ptr<float>(),
      levels_cuda::out(new_mean), levels_cuda::out(new_var), work.mutable_data_ptr<float>(),
      levels_cuda::stream());
  levels_cuda::check(status, "conv_bn_train_fwd", version);
  return {out, y, mean, invstd, new_mean, new_var};
}

// dx of the backward ops: (N, H, W, C_in), or, when x needs no gradient (a network's input
// images: the stem's dgrad is the most expensive one, C_in = 3 wide), an empty (0,) tensor
// and no dgrad launched (the launchers take a null dx).
static at::Tensor input_grad(bool need_dx, const Shape& s, const at::Tensor& x) {
  return need_dx ? at::empty({s.N, s.H, s.W, s.C_in}, x.options()) : at::empty({0}, x.options());
}
static void* dx_ptr(const at::Tensor& dx) { return dx.numel() > 0 ? levels_cuda::out(dx) : nullptr; }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> eval_bwd(
    const at::Tensor& dout, const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_folded,
    const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
    const at::Tensor& scale, const at::Tensor& invstd, at::IntArrayRef stride,
    at::IntArrayRef padding, int64_t version, bool need_dx) {
  const Shape s = shape_of(x, w, stride, padding);
  at::Tensor dx = input_grad(need_dx, s, x);
  // w's strides where w is dense, else dense ones in w's dimension order (empty_like)
  at::Tensor dw = at::empty_like(w);
  at::Tensor dbias = at::empty({s.C_out}, x.options());
  at::Tensor dgamma = at::empty({s.C_out}, x.options());
  at::Tensor dbeta = at::empty({s.C_out}, x.options());
  at::Tensor work = workspace(2, version, s, x);
  const int status = levels_conv_bn_eval_bwd(
      levels_cuda::dtype_code(x), static_cast<int>(version), levels_cuda::in(dout),
      levels_cuda::in(x), levels_cuda::in(w), levels_cuda::in(w_folded), maybe(bias),
      levels_cuda::in(running_mean), scale.const_data_ptr<float>(),
      invstd.const_data_ptr<float>(), LEVELS_CONV_BN_SHAPE(s, x), LEVELS_CONV_BN_STRIDES(w),
      dx_ptr(dx), levels_cuda::out(dw), LEVELS_CONV_BN_STRIDES(dw), levels_cuda::out(dbias),
      levels_cuda::out(dgamma),
      levels_cuda::out(dbeta), work.mutable_data_ptr<float>(), levels_cuda::stream());
  levels_cuda::check(status, "conv_bn_eval_bwd", version);
  return {dx, dw, dbias, dgamma, dbeta};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> train_bwd(
    const at::Tensor& dout, const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_k,
    const at::Tensor& y, const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& gamma,
    at::IntArrayRef stride, at::IntArrayRef padding, int64_t version, bool need_dx) {
  const Shape s = shape_of(x, w, stride, padding);
  TORCH_CHECK(w_k.is_contiguous() && w_k.sizes() == w.sizes(),
              "levels_cuda::conv_bn_train_bwd: w_k must be w contiguous");
  at::Tensor dx = input_grad(need_dx, s, x);
  at::Tensor dw = at::empty_like(w);  // as in eval_bwd
  at::Tensor dbias = at::empty({s.C_out}, x.options());
  at::Tensor dgamma = at::empty({s.C_out}, x.options());
  at::Tensor dbeta = at::empty({s.C_out}, x.options());
  at::Tensor work = workspace(3, version, s, x);
  const int status = levels_conv_bn_train_bwd(
      levels_cuda::dtype_code(x), static_cast<int>(version), levels_cuda::in(dout),
      levels_cuda::in(x), levels_cuda::in(w_k), y.const_data_ptr<float>(),
      mean.const_data_ptr<float>(), invstd.const_data_ptr<float>(), levels_cuda::in(gamma),
      LEVELS_CONV_BN_SHAPE(s, x), dx_ptr(dx), levels_cuda::out(dw), LEVELS_CONV_BN_STRIDES(dw),
      levels_cuda::out(dbias), levels_cuda::out(dgamma), levels_cuda::out(dbeta),
      work.mutable_data_ptr<float>(), levels_cuda::stream());
  levels_cuda::check(status, "conv_bn_train_bwd", version);
  return {dx, dw, dbias, dgamma, dbeta};
}

#undef LEVELS_CONV_BN_SHAPE
#undef LEVELS_CONV_BN_STRIDES

}  // namespace levels_cuda_conv_bn

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("conv_bn_eval_fwd(Tensor x, Tensor w, Tensor? bias, Tensor gamma, Tensor beta, "
        "Tensor running_mean, Tensor running_var, int[2] stride, int[2] padding, float eps, "
        "int version) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("conv_bn_train_fwd(Tensor x, Tensor w, Tensor? bias, Tensor gamma, Tensor beta, "
        "Tensor running_mean, Tensor running_var, int[2] stride, int[2] padding, float eps, "
        "float momentum, int version) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("conv_bn_eval_bwd(Tensor dout, Tensor x, Tensor w, Tensor w_folded, Tensor? bias, "
        "Tensor running_mean, Tensor scale, Tensor invstd, int[2] stride, int[2] padding, "
        "int version, bool need_dx=True) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("conv_bn_train_bwd(Tensor dout, Tensor x, Tensor w, Tensor w_k, Tensor y, Tensor mean, "
        "Tensor invstd, Tensor gamma, int[2] stride, int[2] padding, int version, "
        "bool need_dx=True) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("conv_bn_eval_fwd", &levels_cuda_conv_bn::eval_fwd);
  m.impl("conv_bn_train_fwd", &levels_cuda_conv_bn::train_fwd);
  m.impl("conv_bn_eval_bwd", &levels_cuda_conv_bn::eval_bwd);
  m.impl("conv_bn_train_bwd", &levels_cuda_conv_bn::train_bwd);
}
