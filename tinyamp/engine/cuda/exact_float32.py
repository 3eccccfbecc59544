"""float32 arithmetic in tinyamp's CUDA kernels: IEEE rounding, subnormals kept.

The fused GPU kernels must give the bits NumPy gives, so each multiply, add, divide and
square root has to be one IEEE operation rounded to nearest.  Two things stand in the way:

* a compiler may fuse ``a * b + c`` into one FMA, rounded once instead of twice;
* CuPy compiles every kernel with ``-ftz=true``, and appends it last so a kernel's own
  options cannot undo it: float32 subnormals (below 2^-126, about 1.2e-38) then become 0
  in every float32 instruction, where NumPy keeps them (Adam's second moment of a tiny
  gradient, for example).

Writing each operation as one PTX instruction settles both: ``mul.rn.f32`` is a multiply
rounded to nearest with subnormals kept (the ``.ftz`` variant is a different instruction),
and the compiler does not fuse or reorder inline assembly.  Kernels pass ``PREAMBLE`` to
``cupy.ElementwiseKernel`` / ``ReductionKernel`` and call ``f32_mul(a, b)`` and friends;
``f32_to_f64`` widens to double keeping subnormals (a plain ``(double)`` cast is flushed too).
"""

from __future__ import annotations

PREAMBLE = r"""
__device__ __forceinline__ float f32_add(float a, float b) { float r; asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float f32_sub(float a, float b) { float r; asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float f32_mul(float a, float b) { float r; asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float f32_div(float a, float b) { float r; asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float f32_sqrt(float a) { float r; asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a)); return r; }
__device__ __forceinline__ double f32_to_f64(float a) { double r; asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a)); return r; }
"""  # noqa: E501
