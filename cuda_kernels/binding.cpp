// binding.cpp — the translation unit of Level 5 that binds the kernels to torch (the other
// one that includes torch's headers is autograd.cpp, the ops users call, with no CUDA in it).
//
// Parsing torch's headers is almost all of a cold build (59 s with torch/extension.h in a
// .cu, 32 s with a pure .cu and a separate binding, measured on the H100), so:
//   * the kernels (`<component>.cu`) never include torch: they export extern "C" launchers
//     on raw pointers, sizes, strides and a stream (see common.cuh);
//   * this file includes only what it uses (the op registry, TensorBase-level tensors,
//     at::empty, the current stream), not <torch/extension.h>, and registers the ops with
//     TORCH_LIBRARY instead of building a pybind11 module;
//   * each component adds its part as `<component>_binding.cpp`, a fragment that the loader
//     (build.py) appends to this prelude, so that they all stay in this one unit.
//
// The binding only unpacks: validation was done in Python by levels/contract.py before any
// op is called. It allocates outputs, takes the current stream, passes the dtype code, and
// turns a launcher's status into a torch error that says what failed.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace levels_cuda {

// The stream torch is using now: kernels run in order with the surrounding torch ops.
inline cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Errors are raised with a message built as one std::string, never through TORCH_CHECK's
// several-argument form, which formats with an std::ostringstream: on the H100 image that
// stream, instantiated inside this library, crashed the process (a segfault in
// basic_ostream::_M_insert<long>) instead of raising. One string goes straight to c10.
[[noreturn]] inline void fail(const std::string& message) { TORCH_CHECK(false, message); }

#define LEVELS_CHECK(cond, message) \
  do {                              \
    if (!(cond)) ::levels_cuda::fail(message); \
  } while (0)

// "[2, 3, 4]": a shape for a message, without an ostream.
inline std::string shape(const at::TensorBase& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

// LevelsDtype of common.cuh.
inline int dtype_code(const at::TensorBase& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    default:
      fail(std::string("Level 5 (CUDA) kernels take float32, float16 or bfloat16; got ") +
           c10::toString(t.scalar_type()));
  }
}

// A launcher's LevelsStatus (common.cuh) as a torch error naming the op and the version.
inline void check(int status, const char* op, int64_t version) {
  if (status == 0) return;
  std::string why;
  switch (status) {
    case -1: why = "this version does not exist"; break;
    case -2: why = "this version does not support this dtype"; break;
    case -3: why = "this version does not support these sizes or layouts"; break;
    case -4: why = "this version needs instructions this GPU does not have (wgmma: sm_90); pick a lower version"; break;
    default: why = std::string("CUDA error: ") + cudaGetErrorString(static_cast<cudaError_t>(status));
  }
  fail(std::string("levels_cuda::") + op + " (version " + std::to_string(version) + "): " + why);
}

// For kernels that index an (M, N) operand by a row stride and its columns by +1 (layer_norm,
// rms_norm): anything else is refused rather than read outside the view (the Python side never
// sends it; opcheck or a direct call might).
inline void check_rows(const at::TensorBase& t, const char* component, const char* name,
                       int64_t M, int64_t N) {
  const std::string what = std::string("levels_cuda::") + component + ": '" + name + "'";
  LEVELS_CHECK(t.dim() == 2 && t.size(0) == M && t.size(1) == N,
               what + " must be (" + std::to_string(M) + ", " + std::to_string(N) + "); got " +
                   shape(t));
  LEVELS_CHECK(N == 1 || t.stride(1) == 1,
               what + " must have adjacent columns (stride 1 in its last dimension)");
  LEVELS_CHECK(M == 1 || t.stride(0) >= 0, what + " has a negative row stride");
}

// A contiguous (n,) vector of `dtype` (a weight, a per-row statistic).
inline void check_vector(const at::TensorBase& t, const char* component, const char* name,
                         int64_t n, at::ScalarType dtype) {
  LEVELS_CHECK(t.dim() == 1 && t.size(0) == n && t.is_contiguous() && t.scalar_type() == dtype,
               std::string("levels_cuda::") + component + ": '" + name +
                   "' must be a contiguous (" + std::to_string(n) + ",) " +
                   c10::toString(dtype) + " tensor; got " +
                   c10::toString(t.scalar_type()) + " " + shape(t));
}

// Raw pointers for the launchers. const_data_ptr/mutable_data_ptr exist from torch 2.1 on.
inline const void* in(const at::TensorBase& t) { return t.const_data_ptr(); }
inline void* out(const at::TensorBase& t) { return t.mutable_data_ptr(); }

}  // namespace levels_cuda

// ---- the component fragments follow (appended by build.py) ----
