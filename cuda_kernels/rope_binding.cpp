// rope_binding.cpp — the rope part of the one torch-facing unit (a fragment: build.py appends
// it to binding.cpp's prelude, so torch's headers are already in and levels_cuda::{stream,
// dtype_code, check, in, out} exist).
//
// Op (validated in Python first: levels/contract.py; autograd.cpp's `rope` calls it):
//   rope_rotate(x, cos, sin, interleaved, inverse, version) -> y
// x (B, H, N, D) and the (N, D/2) tables with any strides (the kernel reads through them);
// y contiguous. inverse=True rotates by -theta: the backward.

extern "C" int levels_rope_rotate(int dtype, int version, const void* x, const void* cos,
                                  const void* sin, void* y, int64_t B, int64_t H, int64_t N,
                                  int64_t half, const int64_t* stride_x,
                                  const int64_t* stride_cos, const int64_t* stride_sin,
                                  float sign, int interleaved, cudaStream_t stream);

namespace levels_cuda_rope {

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                  bool interleaved, bool inverse, int64_t version) {
  const std::string op = "levels_cuda::rope_rotate: ";
  LEVELS_CHECK(x.dim() == 4 && x.size(3) % 2 == 0,
               op + "'x' must be 4-D (B, H, N, D) with D even; got " + levels_cuda::shape(x));
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), half = x.size(3) / 2;
  for (const at::Tensor* t : {&cos, &sin}) {
    LEVELS_CHECK(t->dim() == 2 && t->size(0) == N && t->size(1) == half &&
                     t->scalar_type() == x.scalar_type(),
                 op + "the tables must be (N, D/2) = (" + std::to_string(N) + ", " +
                     std::to_string(half) + ") of x's dtype; got " + levels_cuda::shape(*t));
  }
  // The kernels index x and the tables from their first element through their strides, and
  // never backwards: negative strides (no torch view has them) are refused.
  for (const at::Tensor* t : {&x, &cos, &sin}) {
    for (int64_t d = 0; d < t->dim(); ++d) LEVELS_CHECK(t->stride(d) >= 0, op + "negative stride");
  }
  const c10::DeviceGuard guard(x.device());  // launch on x's GPU, with that GPU's stream
  at::Tensor y = at::empty({B, H, N, 2 * half}, x.options());
  if (y.numel() == 0) return y;
  const int64_t sx[4] = {x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
  const int64_t sc[2] = {cos.stride(0), cos.stride(1)};
  const int64_t ss[2] = {sin.stride(0), sin.stride(1)};
  const int status = levels_rope_rotate(
      levels_cuda::dtype_code(x), static_cast<int>(version), levels_cuda::in(x),
      levels_cuda::in(cos), levels_cuda::in(sin), levels_cuda::out(y), B, H, N, half, sx, sc, ss,
      inverse ? -1.0f : 1.0f, interleaved ? 1 : 0, levels_cuda::stream());
  levels_cuda::check(status, "rope_rotate", version);
  return y;
}

}  // namespace levels_cuda_rope

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("rope_rotate(Tensor x, Tensor cos, Tensor sin, bool interleaved, bool inverse, "
        "int version) -> Tensor");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) { m.impl("rope_rotate", &levels_cuda_rope::rotate); }
