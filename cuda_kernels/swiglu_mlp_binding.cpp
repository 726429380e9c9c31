// swiglu_mlp_binding.cpp — fragment appended to binding.cpp's prelude after mlp_binding.cpp
// (fragments are joined in name order; this one uses its k_major and padded_rows): the
// SwiGLU MLP's two fused GEMMs of gemm.cu (levels_gemm_swiglu). The other GEMMs of its
// backward are mlp_binding.cpp's gemm_* ops, called from swiglu_mlp_autograd.cpp.

extern "C" int levels_gemm_swiglu(int dtype, int version, int grad, const void* a, int64_t stride_am,
                                  int64_t stride_ak, const void* b, const void* b2, int64_t stride_bk,
                                  int64_t stride_bn, void* c, void* c2, int64_t stride_cm, int64_t stride_cn,
                                  void* aux, void* aux2, int64_t stride_xm, int64_t stride_xn, int64_t M,
                                  int64_t N, int64_t K, cudaStream_t stream);

namespace levels_cuda_swiglu_mlp {

// The (K, N) B operands of the gate/up GEMM, as the kernel of `version` reads them: versions
// 4 and 5 (16-bit) need K-major rows (mlp_binding.cpp's k_major); every version reads w_gate
// and w_up with ONE set of strides, so two weights laid out differently (one transposed, one
// not) are both copied to the K-major layout (R*K elements each, once).
inline std::pair<at::Tensor, at::Tensor> gate_up_operands(const at::Tensor& w_gate, const at::Tensor& w_up,
                                                          bool tensor_cores) {
  at::Tensor g = tensor_cores ? levels_cuda_mlp::k_major(w_gate) : w_gate;
  at::Tensor u = tensor_cores ? levels_cuda_mlp::k_major(w_up) : w_up;
  if (g.strides() != u.strides()) {  // same shape: the same layout once both are copied
    g = g.contiguous();
    u = u.contiguous();
    if (tensor_cores) {
      g = levels_cuda_mlp::k_major(g);
      u = levels_cuda_mlp::k_major(u);
    }
  }
  return {g.t(), u.t()};  // (K, hidden) views
}

inline bool uses_tensor_cores(int64_t version, const at::Tensor& x) {
  return version >= 4 && x.scalar_type() != at::kFloat;
}

// act = silu(x · w_gateᵀ) * (x · w_upᵀ) in one GEMM; with save, also G and U (the two
// products), for backward. x (M, K), w_gate and w_up (hidden, K). Without save, g and u come
// back empty (0 elements): no (M, hidden) tensor is written that nobody reads.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gate_up(const at::Tensor& x_in, const at::Tensor& w_gate,
                                                       const at::Tensor& w_up, bool save, int64_t version) {
  if (x_in.size(0) == 0) {  // no rows (a batch of 0): empty outputs, no copy, no launch
    const auto rows = [&] { return levels_cuda_mlp::padded_rows(0, w_gate.size(0), x_in.options()); };
    if (!save) return {rows(), at::empty({0}, x_in.options()), at::empty({0}, x_in.options())};
    return {rows(), rows(), rows()};
  }
  const bool tc = uses_tensor_cores(version, x_in);
  const at::Tensor x = tc ? levels_cuda_mlp::k_major(x_in) : x_in;
  auto [b, b2] = gate_up_operands(w_gate, w_up, tc);
  const int64_t M = x.size(0), hidden = w_gate.size(0);
  // Rows padded to 8 elements: act is the A operand of the down GEMM (version 4 reads it in
  // place); g and u share its layout, as the kernel's epilogue requires of aux and aux2.
  at::Tensor act = levels_cuda_mlp::padded_rows(M, hidden, x.options());
  at::Tensor g = save ? levels_cuda_mlp::padded_rows(M, hidden, x.options()) : at::empty({0}, x.options());
  at::Tensor u = save ? levels_cuda_mlp::padded_rows(M, hidden, x.options()) : at::empty({0}, x.options());
  const int status = levels_gemm_swiglu(
      levels_cuda::dtype_code(x), static_cast<int>(version), 0, levels_cuda::in(x), x.stride(0), x.stride(1),
      levels_cuda::in(b), levels_cuda::in(b2), b.stride(0), b.stride(1), levels_cuda::out(act), nullptr,
      act.stride(0), act.stride(1), save ? levels_cuda::out(g) : nullptr, save ? levels_cuda::out(u) : nullptr,
      act.stride(0), act.stride(1), M, hidden, x.size(1), levels_cuda::stream());
  levels_cuda::check(status, "swiglu_mlp_gate_up", version);
  return {act, g, u};
}

// (dG, dU) = the SiLU-mul derivative applied to dA = dY · W_down in the epilogue of that GEMM.
// dy (M, N), w_down (N, hidden), g and u (M, hidden) from gate_up (any strides, one layout).
std::tuple<at::Tensor, at::Tensor> grad(const at::Tensor& dy_in, const at::Tensor& w_down, const at::Tensor& g_in,
                                        const at::Tensor& u_in, int64_t version) {
  if (dy_in.size(0) == 0) {  // no rows (a batch of 0): empty dG and dU, no copy, no launch
    const int64_t hidden = w_down.size(1);
    return {levels_cuda_mlp::padded_rows(0, hidden, dy_in.options()),
            levels_cuda_mlp::padded_rows(0, hidden, dy_in.options())};
  }
  const bool tc = uses_tensor_cores(version, dy_in);
  const at::Tensor dy = tc ? levels_cuda_mlp::k_major(dy_in) : dy_in;
  // B = W_down as the (N, hidden) matrix of dY · W_down; K-major for versions 4 and 5 means
  // contiguous along N, i.e. W_downᵀ's rows: one copy of the weight (a transposing copy of
  // hidden x N elements: 0.45 ms at Llama 3 8B, 7% of the whole forward+backward on an
  // H100: reports/level5-gemm-users-and-norms-2026-11-27/). Version 6 reads an nn.Linear
  // weight as it lies (hidden contiguous: MN-major tiles, as mlp_binding.cpp's matmul_into).
  const bool b_as_lies = version == 6 && tc && dy_in.size(1) > 0 && levels_cuda_mlp::is_k_major(w_down);
  const at::Tensor b = tc && !b_as_lies ? levels_cuda_mlp::k_major(w_down.t()).t() : w_down;
  at::Tensor g = g_in, u = u_in;
  if (g.strides() != u.strides()) {  // the epilogue reads both with one set of strides
    g = g.contiguous();
    u = u.contiguous();
  }
  const int64_t M = dy.size(0), hidden = w_down.size(1);
  at::Tensor dg = levels_cuda_mlp::padded_rows(M, hidden, dy.options());
  at::Tensor du = levels_cuda_mlp::padded_rows(M, hidden, dy.options());
  const int status = levels_gemm_swiglu(
      levels_cuda::dtype_code(dy), static_cast<int>(version), 1, levels_cuda::in(dy), dy.stride(0), dy.stride(1),
      levels_cuda::in(b), nullptr, b.stride(0), b.stride(1), levels_cuda::out(dg), levels_cuda::out(du),
      dg.stride(0), dg.stride(1), const_cast<void*>(levels_cuda::in(g)), const_cast<void*>(levels_cuda::in(u)),
      g.stride(0), g.stride(1), M, hidden, dy.size(1), levels_cuda::stream());
  levels_cuda::check(status, "swiglu_mlp_grad", version);
  return {dg, du};
}

}  // namespace levels_cuda_swiglu_mlp

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("swiglu_mlp_gate_up(Tensor x, Tensor w_gate, Tensor w_up, bool save, int version) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("swiglu_mlp_grad(Tensor dy, Tensor w_down, Tensor g, Tensor u, int version) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("swiglu_mlp_gate_up", &levels_cuda_swiglu_mlp::gate_up);
  m.impl("swiglu_mlp_grad", &levels_cuda_swiglu_mlp::grad);
}
