"""``mpiexec -n N python -m tinyamp.distributed [tinyamp train options] [--reduce-dtype D] [--zero]``.

The options of `tinyamp train`, plus the data-parallel ones; the same run as
``mpiexec -n N tinyamp train --distributed ...``.  Exit status as `tinyamp train`'s; a rank
that fails stops the job with MPI_Abort (mpiexec then exits non-zero).
"""

from __future__ import annotations

import argparse
import sys

from tinyamp.distributed.allreduce import REDUCTIONS
from tinyamp.experiments.run_settings import MODELS, PRECISIONS, SCALERS, SCHEDULES


def build_parser() -> argparse.ArgumentParser:
    """The options of `tinyamp train` that a distributed run takes, and the distributed ones."""
    p = argparse.ArgumentParser(prog="python -m tinyamp.distributed", description=__doc__.split("\n\n")[1])
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--precision", choices=PRECISIONS)
    p.add_argument("--scaler", choices=SCALERS)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="the whole batch; each rank takes batch-size / N")
    p.add_argument("--lr", type=float)
    p.add_argument("--schedule", choices=SCHEDULES)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: MPI; cuda: NCCL, one GPU per rank")
    p.add_argument("--out", metavar="DIR")
    p.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="with --out: save checkpoint.npz every N steps (default 500; 0: only at the end)")  # fmt: skip
    p.add_argument("--resume", metavar="CHECKPOINT")
    p.add_argument("--extend", action="store_true", help="with --resume and --steps: continue a run to a new total")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--reduce-dtype", choices=tuple(REDUCTIONS), default="float32",
                   help="the dtype gradients are summed in across ranks (default float32)")  # fmt: skip
    p.add_argument("--zero", action="store_true", help="ZeRO-1: shard the FP32 masters and optimizer state")
    p.add_argument("--no-agree", dest="agree", action="store_false",
                   help="let each rank decide its own overflow skip (only to see the replicas diverge)")  # fmt: skip
    p.add_argument("--micro-batches", type=int, default=1, help="backward passes per step on each rank (default 1)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="how long a rank waits for the others in a collective before the job stops (300)")  # fmt: skip
    p.add_argument("--overflow-at", action="append", metavar="STEP:RANK", help="an overflow only RANK sees at STEP")
    p.add_argument("--fault", metavar="KIND@STEP:RANK", help="raise, exit, kill or hang on purpose (faults.py)")
    p.add_argument("--dump", metavar="DIR", help="write each rank's digests and final state into DIR (tests)")
    return p


def main(argv: list[str] | None = None) -> int:
    from tinyamp.distributed.train import run_distributed

    return run_distributed(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
