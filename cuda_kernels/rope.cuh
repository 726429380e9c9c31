// rope.cuh — the rotation at the heart of rotary position embeddings, for any kernel.
//
// A pair of features (x1, x2) is a point in the plane; RoPE turns it by its position's angle
// theta: (x1 cos - x2 sin, x2 cos + x1 sin). rope.cu applies it to whole tensors; a fused
// attention kernel can include this header and apply it to its q and k tiles right after
// loading them, in registers (RoPE fused into attention never writes rotated q and k back).
// The backward of a rotation is the rotation by -theta: call it with -sin.
#pragma once

__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float& y1,
                                            float& y2) {
  y1 = y2 = __int_as_float(0x7fc00000);  // NaN until the lines between the markers are written
  // ### BEGIN SOLUTION
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
  // ### END SOLUTION
}
