"""``tinyamp`` command line on the strict CuPy stand-in: python run_cli.py train --device cuda ..."""

from __future__ import annotations

import sys

import cupy
import strict_cupy_plugin  # noqa: F401  (switches the GPU-only kernels to their generic paths)

from tinyamp.cli import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    print(f"STRICT-CUPY VIOLATIONS: {len(cupy.VIOLATIONS)}")
    for message in dict.fromkeys(v.split("\n")[0] for v in cupy.VIOLATIONS):
        print("  " + message)
    sys.exit(code if code else (1 if cupy.VIOLATIONS else 0))
