// rms_norm_autograd.cpp — the op a Level 5 rms_norm call is, with its C++ autograd: a
// fragment that build.py appends to autograd.cpp (its own unit, no CUDA), so op<>,
// BelowAutograd, rows() and sizes_of() of namespace levels_cuda_autograd exist here.
//
//   levels_cuda::rms_norm(x, weight, eps, version) -> y
//
// As layer_norm's Function in autograd.cpp: x as its (M, N) row view (a copy only where
// the last dimension is strided or the leading ones do not flatten), weight contiguous, the
// forward's 1/rms saved for the backward of the same version.

namespace levels_cuda_autograd {

using RmsNormFwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, double, int64_t);
using RmsNormBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, int64_t, int64_t);

struct RmsNorm : public torch::autograd::Function<RmsNorm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight, double eps,
                        int64_t version) {
    static auto fwd = op<RmsNormFwd>("levels_cuda::rms_norm_fwd");
    BelowAutograd guard;
    const Tensor x2 = rows(x), w = weight.contiguous();
    auto [y, rstd] = fwd.call(x2, w, eps, version);
    ctx->save_for_backward({x2, w, rstd});
    ctx->saved_data["version"] = version;
    ctx->saved_data["shape"] = sizes_of(x);
    return at::_unsafe_view(y, x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op<RmsNormBwd>("levels_cuda::rms_norm_bwd");
    BelowAutograd guard;
    const auto saved = ctx->get_saved_variables();
    // an expanded `.sum()` gradient has stride 0 along the row: copied by rows(), once
    auto [dx, dw] = bwd.call(rows(grads[0]), saved[0], saved[1], saved[2],
                             ctx->saved_data["version"].toInt(), /*force=*/0);
    return {at::_unsafe_view(dx, ctx->saved_data["shape"].toIntVector()), dw, Tensor(), Tensor()};
  }
};

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, int64_t version) {
  return call<RmsNorm>(x, weight, eps, version);
}

}  // namespace levels_cuda_autograd

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, int version) -> Tensor");
}

// As autograd.cpp's ops: one kernel for every backend (the Function records autograd when it
// is on and runs a plain forward when it is off).
TORCH_LIBRARY_IMPL(levels_cuda, CompositeImplicitAutograd, m) {
  m.impl("rms_norm", &levels_cuda_autograd::rms_norm);
}
