// swiglu_mlp_autograd.cpp — the op a Level 5 swiglu_mlp call is, with its C++ autograd: a
// fragment that build.py appends to autograd.cpp (its own unit, no CUDA), so op<>,
// BelowAutograd, sizes_of(), matrix(), with_leading_dims_of() and gemm() of namespace
// levels_cuda_autograd exist here.
//
//   levels_cuda::swiglu_mlp(x, w_gate, w_up, w_down, version) -> out
//
// Why C++: this component's autograd was a Python torch.autograd.Function around the same
// kernel ops, and on an H200's host (`levels bench --overhead`, tiny size) a call cost
// 120 us forward and 841 us forward+backward against eager PyTorch's 74 / 668 us: the
// Function's Python frames, the node built in Python and a backward that re-entered Python
// from the autograd engine for every GEMM. Here a call is one dispatch and one C++ node.
//
// The GEMM ops take any strides and copy what their version cannot read themselves
// (swiglu_mlp_binding.cpp, mlp_binding.cpp's k_major), so nothing here copies an operand
// except x, whose (M, K) view is a copy only where the leading dimensions do not flatten.

namespace levels_cuda_autograd {

using SwigluGateUp = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&,
                                                        const Tensor&, bool, int64_t);
using SwigluGrad = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, int64_t);
using MatmulAccumulate = void(const Tensor&, const Tensor&, const Tensor&,
                              const std::optional<Tensor>&, int64_t);

struct SwigluMlp : public torch::autograd::Function<SwigluMlp> {
  // save: whether a backward will run (decided by the caller: grad mode is off in here).
  // Without it the gate/up GEMM writes act alone, not the (M, hidden) products G and U.
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w_gate,
                        const Tensor& w_up, const Tensor& w_down, int64_t version, bool save) {
    static auto gate_up = op<SwigluGateUp>("levels_cuda::swiglu_mlp_gate_up");
    BelowAutograd guard;
    const Tensor x2 = matrix(x);
    auto [act, g, u] = gate_up.call(x2, w_gate, w_up, save, version);
    const Tensor out = gemm(act, w_down.t(), version);
    if (save) {
      ctx->save_for_backward({x2, w_gate, w_up, w_down, act, g, u});
      ctx->saved_data["version"] = version;
      ctx->saved_data["shape"] = sizes_of(x);
    }
    return with_leading_dims_of(x, out);
  }

  // dW_down = dYᵀ A; (dG, dU) = the SiLU-mul derivative in the epilogue of dY W_down;
  // dX = dG W_gate + dU W_up (one GEMM, then one accumulating into its output);
  // dW_gate = dGᵀ X, dW_up = dUᵀ X: each only if its input needs it.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto grad = op<SwigluGrad>("levels_cuda::swiglu_mlp_grad");
    static auto accumulate = op<MatmulAccumulate>("levels_cuda::gemm_matmul_accumulate");
    BelowAutograd guard;
    const auto s = ctx->get_saved_variables();
    const Tensor &x2 = s[0], &w_gate = s[1], &w_up = s[2], &w_down = s[3], &act = s[4];
    const int64_t v = ctx->saved_data["version"].toInt();
    const Tensor dy = matrix(grads[0]);
    Tensor dx, dwg, dwu, dwd;
    if (ctx->needs_input_grad(3)) dwd = gemm(dy.t(), act, v);
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      auto [dg, du] = grad.call(dy, w_down, s[5], s[6], v);
      if (ctx->needs_input_grad(0)) {
        dx = gemm(dg, w_gate, v);
        accumulate.call(dx, du, w_up, std::nullopt, v);
        dx = at::_unsafe_view(dx, ctx->saved_data["shape"].toIntVector());
      }
      if (ctx->needs_input_grad(1)) dwg = gemm(dg.t(), x2, v);
      if (ctx->needs_input_grad(2)) dwu = gemm(du.t(), x2, v);
    }
    return {dx, dwg, dwu, dwd, Tensor(), Tensor()};
  }
};

Tensor swiglu_mlp(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                  int64_t version) {
  // Whether G and U are kept is decided here, as the forward runs with grad mode off: only
  // for a call that records autograd (no_grad, inference mode, nothing requiring grad: the
  // forward alone, no node, nothing saved).
  if (!records_autograd(x, w_gate, w_up, w_down))
    return forward_only<SwigluMlp>(x, w_gate, w_up, w_down, version, false);
  return SwigluMlp::apply(x, w_gate, w_up, w_down, version, true);
}

}  // namespace levels_cuda_autograd

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("swiglu_mlp(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, int version) -> Tensor");
}

// As autograd.cpp's ops: one kernel for every backend (the Function records autograd when it
// is on and runs a plain forward when it is off).
TORCH_LIBRARY_IMPL(levels_cuda, CompositeImplicitAutograd, m) {
  m.impl("swiglu_mlp", &levels_cuda_autograd::swiglu_mlp);
}
