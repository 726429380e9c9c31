// rope_autograd.cpp — the op a Level 5 rope call is, with its C++ autograd: a fragment that
// build.py appends to autograd.cpp (its own unit, no CUDA), so op<> and BelowAutograd of
// namespace levels_cuda_autograd exist here.
//
//   levels_cuda::rope(x, cos, sin, interleaved, version) -> out

namespace levels_cuda_autograd {

// No layout work: the kernel reads x, dy and the tables through their strides. The backward
// is the same op with inverse=true: a rotation's inverse is its transpose, so
// dx = rotate(dy, cos, -sin). cos and sin are tables, never differentiated.
using RopeRotate = Tensor(const Tensor&, const Tensor&, const Tensor&, bool, bool, int64_t);

struct Rope : public torch::autograd::Function<Rope> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& cos,
                        const Tensor& sin, bool interleaved, int64_t version) {
    static auto rotate = op<RopeRotate>("levels_cuda::rope_rotate");
    BelowAutograd guard;
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["version"] = version;
    return rotate.call(x, cos, sin, interleaved, false, version);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto rotate = op<RopeRotate>("levels_cuda::rope_rotate");
    BelowAutograd guard;
    const auto saved = ctx->get_saved_variables();
    Tensor dx = rotate.call(grads[0], saved[0], saved[1], ctx->saved_data["interleaved"].toBool(),
                            true, ctx->saved_data["version"].toInt());
    return {dx, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool interleaved,
            int64_t version) {
  return call<Rope>(x, cos, sin, interleaved, version);
}

}  // namespace levels_cuda_autograd

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("rope(Tensor x, Tensor cos, Tensor sin, bool interleaved, int version) -> Tensor");
}

// As autograd.cpp's ops: one kernel for every backend (the Function records autograd when it
// is on and runs a plain forward when it is off).
TORCH_LIBRARY_IMPL(levels_cuda, CompositeImplicitAutograd, m) {
  m.impl("rope", &levels_cuda_autograd::rope);
}
