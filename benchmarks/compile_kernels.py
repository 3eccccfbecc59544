"""Compile tinyamp's CUDA kernel code with NVRTC, without a GPU: does it still build?

    pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
    python benchmarks/compile_kernels.py            # prints "compiled: ..." or the compiler log

CuPy compiles an ElementwiseKernel at its first call, on the GPU.  This script wraps each
kernel body of tinyamp/engine/cuda/master_update.py and tinyamp/engine/cuda/unscale.py in a plain
CUDA loop, with the parameter names and types the ElementwiseKernel declares and CuPy's
own headers (its float16 class), and compiles the lot to PTX for sm_90 with NVRTC.  It
catches typos, unknown intrinsics and type errors on a machine with no GPU; it cannot
catch a wrong result (the GPU tests do that).
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyamp.engine.cuda import (
    master_update,  # noqa: E402
    unscale,  # noqa: E402
)
from tinyamp.engine.cuda.exact_float32 import PREAMBLE  # noqa: E402


def kernel(name: str, params: list[str], body: str) -> str:
    """`body` in a grid-stride loop over i, with the declared parameters."""
    return (
        f'extern "C" __global__ void {name}({", ".join(params)}, int n) {{\n'
        "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {\n"
        f"{body}\n  }}\n}}\n"
    )


def source() -> str:
    """Every kernel body of tinyamp, each bound to element i of its arrays as CuPy binds it."""
    scalars = "float beta1, float beta2, float one_minus_beta1, float one_minus_beta2, float bias_correction2_sqrt"
    parts = ["#include <cupy/carray.cuh>\n#include <cupy/float16.cuh>\n", PREAMBLE]
    parts.append(kernel(
        "sgd", ["const float* g_", "float lr", "float wd", "const int* skip", "float* w_", "float16* w16_"],
        "const float g = g_[i]; float &w = w_[i]; float16 &w16 = w16_[i];\n" + master_update._SGD,
    ))  # fmt: skip
    parts.append(kernel(
        "sgd_momentum",
        ["const float* g_", "float lr", "float mu", "float wd", "bool nesterov", "bool first", "const int* skip",
         "float* w_", "float* buf_", "float16* w16_"],
        "const float g = g_[i]; float &w = w_[i]; float &buf = buf_[i]; float16 &w16 = w16_[i];\n"
        + master_update._SGD_MOMENTUM,
    ))  # fmt: skip
    parts.append(kernel(
        "adam",
        ["const float* g_", scalars, "float eps", "float step_size", "float wd", "float decay", "bool decoupled",
         "const int* skip", "float* w_", "float* m_", "float* v_", "float16* w16_"],
        "const float g = g_[i]; float &w = w_[i]; float &m = m_[i]; float &v = v_[i]; float16 &w16 = w16_[i];\n"
        + master_update._ADAM,
    ))  # fmt: skip
    for t in ("float16", "float"):
        body = f"{t} &g = g_[i];\n" + unscale._MULTIPLY.replace("(T)", f"({t})")
        parts.append(kernel(f"multiply_{t}", ["float factor", f"{t}* g_"], body))
    # the variants that read a float16 gradient and 1/scale (the first line of each body)
    parts.append(kernel(
        "sgd_from_float16",
        ["const float16* g16_", "float inverse", "float lr", "float wd", "const int* skip", "float* w_",
         "float16* w16_"],
        "const float16 g16 = g16_[i]; float &w = w_[i]; float16 &w16 = w16_[i];\n"
        + master_update._FROM_FLOAT16 + master_update._SGD,
    ))  # fmt: skip
    parts.append(kernel(
        "scaled_squares", ["const float16* x_", "float inverse", "double* out"],
        "const float16 x = x_[i];\nout[i] = " + unscale._SCALED_SQUARE + ";",
    ))  # fmt: skip
    return "".join(parts)


def main() -> int:
    try:
        import cupy
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:
        print(f"compile_kernels: needs CuPy and NVRTC ({exc})", file=sys.stderr)
        return 2
    includes = [os.path.join(os.path.dirname(cupy.__file__), "_core", "include")]
    for site in sys.path:  # CUDA headers (cuda_fp16.h) from the nvidia-* wheels, if that is where they are
        includes += glob.glob(os.path.join(site, "nvidia", "cu*", "include"))
    program = nvrtc.createProgram(source(), "tinyamp_kernels.cu", [], [])
    options = ["-std=c++17", "--gpu-architecture=compute_90"] + [f"-I{path}" for path in includes]
    try:
        nvrtc.compileProgram(program, options)
    except Exception as exc:  # the log says where
        print(f"compile_kernels: FAILED ({exc})\n{nvrtc.getProgramLog(program)}", file=sys.stderr)
        return 1
    print(f"compiled: {len(nvrtc.getPTX(program))} bytes of PTX for sm_90 (every kernel body of tinyamp)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
