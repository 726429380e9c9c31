// wgmma.cuh — the Hopper warpgroup-MMA wrappers of Level 5 (gemm.cu versions 5-6 and
// attention.cu version 6): one copy, so every wgmma kernel says it the same way. Pure CUDA,
// no torch header; every instruction here exists on sm_90a only (LEVELS_HAS_WGMMA), and a
// kernel that uses them compiles to nothing elsewhere (its launcher refuses other GPUs first).
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LEVELS_HAS_WGMMA 1
#endif

namespace levels_wgmma {

// The shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle layout,
// starting at shared address `addr` (1024-byte aligned for the first k16 slice; the next
// slices of the same rows start 32, 64, 96 bytes further, which the hardware's swizzle
// — computed from the address bits — handles).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr) {
  uint64_t desc = (uint64_t)((addr & 0x3FFFF) >> 4);  // start address, in 16-byte units
  desc |= (uint64_t)(16 >> 4) << 16;                  // leading-dimension byte offset (unused when swizzled K-major)
  desc |= (uint64_t)(1024 >> 4) << 32;                // stride byte offset: 8 rows x 128 B to the next 8 rows
  desc |= (uint64_t)1 << 62;                          // swizzle mode 1 = 128-byte
  return desc;
}

// The descriptor of an MN-major operand (B read with imm-trans-b = 1, as attention's V; or A
// with imm-trans-a = 1, as gemm.cu version 6's transposed A) in the same 128-byte
// swizzle layout: the tile is stored [k][n], n contiguous, in "atoms" of 64 n-columns
// (128 bytes) x k-rows, 16-byte chunk c of k-row r at chunk c ^ (r % 8) — byte for byte
// what the K-major writer produces for a [rows][64] tile; only the meaning of the two
// offsets changes (PTX ISA, "matrix descriptor": for MN-major swizzled layouts the
// leading-dimension byte offset is the step from one 64-element group of n to the next,
// the stride byte offset the step from one group of 8 k-rows to the next). addr: the
// k-slice's first row, 1024-byte aligned; atom_bytes: bytes from n-columns 0-63 to
// 64-127 (unused when N = 64, and for A's 64 rows).
__device__ __forceinline__ uint64_t wgmma_desc_mn(uint32_t addr, uint32_t atom_bytes) {
  uint64_t desc = (uint64_t)((addr & 0x3FFFF) >> 4);
  desc |= (uint64_t)((atom_bytes >> 4) & 0x3FFF) << 16;  // leading: next 64 columns of n
  desc |= (uint64_t)(1024 >> 4) << 32;                    // stride: next 8 rows of k (8 x 128 B)
  desc |= (uint64_t)1 << 62;                              // 128-byte swizzle
  return desc;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the "generic proxy"; wgmma reads it through the
// "async proxy": this fence orders the first before the second.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// An empty asm that "uses and redefines" an accumulator: keeps the compiler from reading
// or moving it across the asynchronous MMA's issue and wait.
__device__ __forceinline__ void keep(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// The same for a register the MMA reads (an A fragment in registers): the compiler thinks
// the asm consumed it at issue and could hand the register to something else before the
// MMA has read it; "used" again after the wait, it stays put until then.
__device__ __forceinline__ void keep(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// The accumulators as asm operands, each read and written ("+f"): d[0] .. d[N - 1] in the
// order the instructions list them (N = 32, 64, 128: the m64n64, m64n128, m64n256 shapes).
#define LEVELS_ACC8(i)                                                           \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define LEVELS_ACC32(i) LEVELS_ACC8(i), LEVELS_ACC8(i + 8), LEVELS_ACC8(i + 16), LEVELS_ACC8(i + 24)
#define LEVELS_ACC64 LEVELS_ACC32(0), LEVELS_ACC32(32)
#define LEVELS_ACC128 LEVELS_ACC64, LEVELS_ACC32(64), LEVELS_ACC32(96)

// One instruction for both 16-bit input types (TYPE: bf16 or f16): 64 accumulator registers
// in, 64 out ("+f"), the two descriptors, scale-d as a predicate (1: D = A.B + D, 0: D = A.B,
// the accumulators' old values ignored), and imm-trans-a / imm-trans-b as immediates (TA,
// TB: 1 = the operand's tile is MN-major, described by wgmma_desc_mn; 16-bit types only).
#define LEVELS_WGMMA_M64N128K16(TYPE)                                                        \
  asm volatile(                                                                           \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                        \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TYPE "." #TYPE " {"                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"                                                \
      : LEVELS_ACC64 \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))

// d[64] (+)= A(64x16, descriptor) . B(16x128, descriptor), fp32 accumulators; TA / TB = 1:
// that operand's tile is MN-major (a transposed matrix read as it lies, no copy).
template <typename T, int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d = 1) {
  static_assert((TA == 0 || TA == 1) && (TB == 0 || TB == 1), "imm-trans-a/b are 0 or 1");
#ifdef LEVELS_HAS_WGMMA
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    LEVELS_WGMMA_M64N128K16(bf16);
  } else {
    LEVELS_WGMMA_M64N128K16(f16);
  }
#endif
}

// The same at twice the width: d[128] (+)= A(64x16) . B(16x256), one instruction where two
// m64n128k16 would read the same A slice twice (gemm.cu's WIDE_MMA says what that bought).
// Register for register the accumulators are the two halves' side by side: d[i] for i < 64 is
// the first m64n128k16's d[i], d[64 + i] the second's.
#define LEVELS_WGMMA_M64N256K16(TYPE)                                                        \
  asm volatile(                                                                           \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                       \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." #TYPE "." #TYPE " {"                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"                                          \
      : LEVELS_ACC128 \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))

template <typename T, int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d = 1) {
  static_assert((TA == 0 || TA == 1) && (TB == 0 || TB == 1), "imm-trans-a/b are 0 or 1");
#ifdef LEVELS_HAS_WGMMA
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    LEVELS_WGMMA_M64N256K16(bf16);
  } else {
    LEVELS_WGMMA_M64N256K16(f16);
  }
#endif
}

// The register-A form: A (64x16) from four 32-bit registers a thread (PTX ISA, "register
// fragments" of wgmma .m64nNk16: warp w of the warpgroup holds rows 16w..16w+15, lane
// (g = lane / 4, t = lane % 4) holds a0,a1 = (g, 2t..2t+1), a2,a3 = (g+8, 2t..),
// a4,a5 = (g, 2t+8..), a6,a7 = (g+8, 2t+8..), two 16-bit values a register, low first —
// mma.sync m16n8k16's A fragment, one per warp), B from an MN-major descriptor
// (imm-trans-b = 1: the tile stored [k][n]); scale-d = 1, D = A.B + D.
#define LEVELS_WGMMA_RS_M64N128K16(TYPE)                                                     \
  asm volatile(                                                                           \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TYPE "." #TYPE " {"                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
      "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"                                          \
      : LEVELS_ACC64 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
#define LEVELS_WGMMA_RS_M64N64K16(TYPE)                                                      \
  asm volatile(                                                                           \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TYPE "." #TYPE " {"                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                          \
      : LEVELS_ACC32(0) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

// d[N/2] += A(64x16, registers) . B(16xN, MN-major descriptor), N = 64 or 128.
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_m64nNk16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 64 || N == 128, "the widths attention.cu uses");
#ifdef LEVELS_HAS_WGMMA
  if constexpr (N == 128) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      LEVELS_WGMMA_RS_M64N128K16(bf16);
    } else {
      LEVELS_WGMMA_RS_M64N128K16(f16);
    }
  } else {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      LEVELS_WGMMA_RS_M64N64K16(bf16);
    } else {
      LEVELS_WGMMA_RS_M64N64K16(f16);
    }
  }
#endif
}

}  // namespace levels_wgmma
