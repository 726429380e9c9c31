// common.cuh — what every Level 5 kernel file shares. Pure CUDA: no torch header, ever.
//
// The contract between a `.cu` file and the one C++ binding (binding.cpp):
//   * every host launcher is `extern "C" int levels_<component>_<op>(...)`, takes raw
//     pointers, sizes and element strides as int64_t, a LevelsDtype code, a version number
//     and a cudaStream_t, and returns a LevelsStatus (0 = launched, see below);
//   * validation has already happened in Python (levels/contract.py): a launcher only
//     refuses what its kernels cannot do (a version it does not have, a dtype a version
//     does not support), by status code, and never prints or aborts.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <mutex>

enum LevelsDtype { LEVELS_F32 = 0, LEVELS_F16 = 1, LEVELS_BF16 = 2 };

// Status codes: 0 and the positive values are cudaError_t (after the launch, from
// cudaGetLastError); the negative ones are ours. binding.cpp turns them into messages.
enum LevelsStatus {
  LEVELS_OK = 0,
  LEVELS_BAD_VERSION = -1,      // no such version of this kernel
  LEVELS_BAD_DTYPE = -2,        // this version does not support this dtype
  LEVELS_UNSUPPORTED = -3,      // a size/layout this version cannot run (message in Python)
  LEVELS_BAD_ARCH = -4,         // this version needs instructions this GPU does not have
};

static inline int levels_launch_status() { return (int)cudaGetLastError(); }

static inline int64_t levels_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- host helpers of the launchers ----
static inline bool levels_aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// Threads for n work items, in whole warps, at most `cap`.
static inline int levels_threads_for(int64_t n, int cap) {
  const int64_t t = levels_cdiv(n, 32) * 32;
  return (int)(t < cap ? t : cap);
}

static inline int levels_sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 1;
  return sms > 0 ? sms : 1;
}

// What the occupancy calculator answers for `kernel` at (a, b) on the current device (blocks
// per SM at a threads, clusters at a cluster width, ...), asked once: `ask()` computes it
// (> 0), and the answer never changes in a process. The calculator is microseconds of
// driver work, more than some small calls' whole kernel time, so a launcher that sizes a
// persistent grid by it must not pay it on every call. A failed ask (<= 0) is not kept.
template <typename Ask>
static int levels_occupancy_once(const void* kernel, int64_t a, int64_t b, Ask ask) {
  struct Entry { int device; const void* kernel; int64_t a, b; int value; };
  static Entry table[256];
  static int used = 0;
  static std::mutex lock;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return ask();
  {
    std::lock_guard<std::mutex> hold(lock);
    for (int i = 0; i < used; ++i)
      if (table[i].device == device && table[i].kernel == kernel && table[i].a == a && table[i].b == b)
        return table[i].value;
  }
  const int value = ask();
  if (value > 0) {
    std::lock_guard<std::mutex> hold(lock);
    if (used < 256) table[used++] = {device, kernel, a, b, value};
  }
  return value;
}

// Opts `kernel` in to `smem` bytes of dynamic shared memory (a launch above 48 KB needs it),
// once per device, kernel and size: the attribute stays set for the process, and the call is
// microseconds of driver work that a small call's host time paid on every launch (three per
// Level 5 conv_bn forward+backward at the overhead benchmark's size). The attribute is a
// ceiling, so it only ever rises: a kernel launched with several sizes (layer_norm's version
// 6 sizes its ring by the row) keeps the largest it was opted in to. (Setting it to each
// size in turn lowered it: a later launch with a larger size, whose opt-in was remembered,
// then failed with "invalid argument".) A failed opt-in is not kept; it returns the error,
// and the launch that follows reports its own.
static inline cudaError_t levels_smem_opt_in_once(const void* kernel, int smem) {
  struct Entry { int device; const void* kernel; int smem; };
  static Entry table[256];
  static int used = 0;
  static std::mutex lock;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  std::lock_guard<std::mutex> hold(lock);
  Entry* seen = nullptr;
  for (int i = 0; i < used; ++i)
    if (table[i].device == device && table[i].kernel == kernel) seen = &table[i];
  if (seen && seen->smem >= smem) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  if (seen) seen->smem = smem;
  else if (used < 256) table[used++] = {device, kernel, smem};
  return err;
}

// Blocks of `kernel` one SM holds at once with `threads` threads and `smem` bytes of dynamic
// shared memory (>= 1; 1 where the calculator fails), asked once per device.
static inline int levels_blocks_per_sm(const void* kernel, int threads, size_t smem) {
  const int n = levels_occupancy_once(kernel, threads, (int64_t)smem, [&] {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
      (void)cudaGetLastError();  // not a launch error: do not let it surface as one
      return 0;
    }
    return per_sm;
  });
  return n > 0 ? n : 1;
}

// ---- 16-byte vectors: VEC elements that travel as one ld.global.v4 / st.global.v4 ----
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T> __host__ __device__ constexpr int vec_width() { return 16 / (int)sizeof(T); }

// ---- element conversions: every kernel computes in fp32 and stores in the input dtype ----
template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- reductions ----
// A warp adds its 32 values with register shuffles: no shared memory, no barrier.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// A block adds one value per thread: warps reduce in registers, then warp 0 reduces the
// per-warp partials from shared memory. `scratch` holds >= 32 floats; every thread gets
// the total. Call it from all threads of the block (it has barriers).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = (threadIdx.x < n_warps) ? scratch[threadIdx.x] : 0.0f;
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
}

// ---- the fused, persistent norm backwards (rms_norm.cu's v3 and v4; layer_norm.cu's v5 keeps
// its own loads inline, each row's mean and rstd beside its row: measured faster there) ----
// A thread owns the 16-byte vectors t, t + G, ... of every row (G threads a row, E elements a
// thread). Its vectors of a parameter row (the weight), zero past the row so that padding
// lanes add nothing and store nothing, stay in registers across all the block's rows ...
template <typename T, int E>
__device__ __forceinline__ void load_columns(const T* __restrict__ p, int64_t n_vec, int t, int G,
                                             Vec<T, vec_width<T>()> (&out)[E / vec_width<T>()]) {
  constexpr int VEC = vec_width<T>();
  using V = Vec<T, VEC>;
  V zero;
#pragma unroll
  for (int j = 0; j < VEC; ++j) zero.v[j] = from_f32<T>(0.0f);
  const V* pv = reinterpret_cast<const V*>(p);
#pragma unroll
  for (int c = 0; c < E / VEC; ++c) {
    const int64_t k = (int64_t)c * G + t;
    out[c] = k < n_vec ? pv[k] : zero;
  }
}

// ... as do its E partial sums of a parameter's gradient, written once at the end as the
// block's row of a (P, N) fp32 buffer (a second kernel adds the P rows: deterministic).
template <typename T, int E>
__device__ __forceinline__ void store_partials(float* __restrict__ row, const float (&sums)[E],
                                               int64_t n_vec, int t, int G) {
  constexpr int VEC = vec_width<T>();
#pragma unroll
  for (int c = 0; c < E / VEC; ++c) {
    const int64_t k = (int64_t)c * G + t;
    if (k < n_vec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) row[k * VEC + j] = sums[c * VEC + j];
    }
  }
}

// R rows of x and dy from row0 into registers, every load issued before any use; a row at or
// past `last` loads nothing (zeros; its caller gives it rstd 0). x and dy rows are stride_x /
// stride_dy elements apart, each a whole number of aligned vectors (the launcher's check).
template <typename T, int E, int R>
__device__ __forceinline__ void load_rows(const T* __restrict__ x, const T* __restrict__ dy,
                                          int64_t stride_x, int64_t stride_dy, int64_t row0,
                                          int64_t last, int64_t n_vec, int t, int G,
                                          Vec<T, vec_width<T>()> (&xk)[R][E / vec_width<T>()],
                                          Vec<T, vec_width<T>()> (&gk)[R][E / vec_width<T>()]) {
  constexpr int VEC = vec_width<T>();
  using V = Vec<T, VEC>;
  V zero;
#pragma unroll
  for (int j = 0; j < VEC; ++j) zero.v[j] = from_f32<T>(0.0f);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const bool live = row0 + r < last;
    const int64_t row = live ? row0 + r : row0;
    const V* xr = reinterpret_cast<const V*>(x + row * stride_x);
    const V* dyr = reinterpret_cast<const V*>(dy + row * stride_dy);
#pragma unroll
    for (int c = 0; c < E / VEC; ++c) {
      const int64_t k = (int64_t)c * G + t;
      xk[r][c] = live && k < n_vec ? xr[k] : zero;
      gk[r][c] = live && k < n_vec ? dyr[k] : zero;
    }
  }
}

// ---- dtype dispatch in a launcher: LEVELS_DISPATCH(dtype, T, launch<T>(...)) ----
#define LEVELS_DISPATCH(code, T, ...)                         \
  switch (code) {                                             \
    case LEVELS_F32: { using T = float; __VA_ARGS__; break; } \
    case LEVELS_F16: { using T = __half; __VA_ARGS__; break; } \
    case LEVELS_BF16: { using T = __nv_bfloat16; __VA_ARGS__; break; } \
    default: return LEVELS_BAD_DTYPE;                         \
  }
