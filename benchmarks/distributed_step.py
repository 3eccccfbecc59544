"""Data-parallel mixed precision on MPI: a step's time and its communication share, and memory per rank.

    python benchmarks/distributed_step.py            (needs mpiexec: pip install -e ".[mpi]")

Each configuration is a real ``mpiexec -n N python -m tinyamp.distributed`` run (one BLAS
thread per rank), read back from its ``--dump`` files:

* time: the median step (the loop's measurement steps excluded) of the digits MLP 64-256-256-10,
  batch 128 in all (128/N per rank), mixed precision, on N = 1 and 2 processes; the
  communication share is the time inside collectives, waiting for the other rank included;
* memory: the bytes of model states each rank holds (FP16 weights and gradients, FP32 masters and
  Adam's moments: the char transformer, Adam) for N = 1, 2, 4, replicated and ZeRO-1, against
  the ZeRO paper's 2 + 2 + 12/N bytes per parameter.  N = 4 on a 2-core machine is oversubscribed
  (MPICH's mpiexec needs no flag for it): fine for bytes, not for time.  A static loss scale (2^10) keeps
  the two steps from being skipped, which would count as a diverged run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tinyamp.distributed.zero import zero_bytes_per_parameter  # noqa: E402


def run(ranks: int, *flags: str) -> list[dict]:
    """One launch; each rank's dumped JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "tinyamp.distributed", "--quiet", "--dump", tmp,
               *flags]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(ranks)]


def main() -> None:
    print("## Time of a step (digits MLP, mixed precision, batch 128 in all; machine shared: noisy)\n")
    print("| N | mode | reduce | ms/step (rank 0) | time in collectives | KiB sent per step per rank |")
    print("|---|---|---|---|---|---|")
    for ranks in (1, 2):
        for mode in ([], ["--zero"]):
            for reduce in ("float32", "float16"):
                rows = run(ranks, "--model", "mlp", "--batch-size", "128", "--steps", "120", "--schedule",
                           "constant", "--reduce-dtype", reduce, *mode)[0]["rows"]  # fmt: skip
                r = rows[0]
                print(
                    f"| {ranks} | {'ZeRO-1' if mode else 'replicated'} | {reduce} | {r['ms_per_step']:.2f} | "
                    f"{100 * r['communication_share']:.0f}% | {r['sent_per_step'] / 1024:.1f} |"
                )
    print("\n## Model states held per rank (char transformer, Adam: K = 12 bytes of FP32 state per parameter)\n")
    print("| N | mode | bytes/parameter, measured (rank 0) | 2 + 2 + 12/N | KiB held |")
    print("|---|---|---|---|---|")
    for ranks in (1, 2, 4):
        for zero in (False, True):
            d = run(ranks, "--model", "transformer", "--batch-size", "8", "--steps", "2", "--scaler", "static",
                    *(["--zero"] if zero else []))[0]  # fmt: skip
            held = sum(d["memory"].values())
            formula = zero_bytes_per_parameter(ranks, 12, zero)
            print(
                f"| {ranks} | {'ZeRO-1' if zero else 'replicated'} | {held / d['parameters']:.3f} | "
                f"{formula:.3f} | {held / 1024:.0f} |"
            )


if __name__ == "__main__":
    main()
