"""How long `tinyamp demo` takes, and what its settings cost: run it as a user would.

    python benchmarks/demo_time.py            # the demo twice (casts compiled, casts as NumPy passes)
    python benchmarks/demo_time.py --quick    # 300 MLP steps, no transformer: a smoke test

The README's install (`pip install -e .`) has no numba, so the casts run as NumPy passes
(``TINYAMP_CAST_KERNELS=numpy`` chooses them even where numba is installed).  It also
times one mixed-precision MLP step and one transformer step with BLAS on 1 thread (what
the command uses) and on 2, interleaved, as medians.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def demo_seconds(extra_env: dict[str, str], quick: bool) -> float:
    """Wall time of one `python -m tinyamp demo --quiet` in a fresh process."""
    args = ["--steps", "300", "--transformer-steps", "0"] if quick else []
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tinyamp", "demo", "--quiet", *args], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, **extra_env})  # fmt: skip
    return time.perf_counter() - began


def step_medians(rounds: int = 5) -> dict[str, float]:
    """Median ms of a training step, BLAS on 1 and on 2 threads, interleaved round by round."""
    from threadpoolctl import threadpool_limits

    from tinyamp.experiments.regimes import REGIMES, build
    from tinyamp.experiments.tasks import CharTransformer, DigitsMLP

    times: dict[str, list[float]] = {}
    for task in (DigitsMLP(), CharTransformer()):
        setup = build(REGIMES["mixed"], task.make_model(), task.make_optimizer)
        batches = task.batches()
        for _ in range(rounds):
            for threads in (1, 2):
                with threadpool_limits(limits=threads, user_api="blas"):
                    for _ in range(20):
                        batch = next(batches)
                        t0 = time.perf_counter()
                        setup.step(lambda m, b=batch, t=task: t.loss(m, b))
                        times.setdefault(f"{task.name} mixed step, BLAS {threads} thread", []).append(
                            time.perf_counter() - t0
                        )
    return {k: 1e3 * float(np.median(v)) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    print(f"{os.cpu_count()} cores; numbers are wall-clock seconds of one run each")
    for label, env in (("casts as NumPy passes (the README's install)", {"TINYAMP_CAST_KERNELS": "numpy"}),
                       ("casts compiled (numba)", {})):  # fmt: skip
        print(f"tinyamp demo{' (quick)' if quick else ''}, {label}: {demo_seconds(env, quick):.0f} s")
    for name, ms in step_medians().items():
        print(f"{name}: {ms:.2f} ms (median)")


if __name__ == "__main__":
    main()
