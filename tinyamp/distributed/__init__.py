"""Mixed precision across processes: data-parallel training on MPI (CPUs) or NCCL (GPUs).

Read in this order (tutorial 9 runs each idea on two processes):

* ``communicator.py``: the seam: five collectives on MPI (mpi4py) or NCCL (cupyx.distributed),
  with a timeout and an abort so that a job never hangs;
* ``flat.py``: all parameters as one flat vector cut into N shards;
* ``allreduce.py``: the gradient sum, its dtype (FP32, FP16, FP16 pre-divided) and its order;
* ``agreement.py``: one overflow decision for ranks that each check their own shard;
* ``zero.py``: ZeRO stage 1, the FP32 masters and moments sharded;
* ``data_parallel.py``: one replica, as an optimizer a LossScaler drives;
* ``checkpoint.py``: a sharded run's state gathered into one single-process checkpoint;
* ``train.py``: `tinyamp train --distributed`; ``faults.py``: failures injected on purpose;
* ``launch.py``: finding the ``mpiexec`` that goes with this Python's mpi4py (tutorial 9).

``import tinyamp`` never imports this package; it needs mpi4py and an MPI library.
"""

try:
    import mpi4py  # noqa: F401  (MPI itself starts only when a communicator is made)
except ImportError as exc:  # pragma: no cover - the tests skip without mpi4py
    raise ImportError(
        'tinyamp.distributed needs mpi4py and an MPI library: pip install -e ".[mpi]" (or pip install mpi4py mpich), '
        "then launch with mpiexec -n 2 ..."
    ) from exc

from tinyamp.distributed.agreement import RemoteOverflow, agree_on_overflow
from tinyamp.distributed.allreduce import REDUCTIONS, Reduction, reduction_error, sum_in_rank_order
from tinyamp.distributed.communicator import (
    Communicator,
    MpiCommunicator,
    NcclCommunicator,
    SingleProcess,
    abort_on_error,
    exchange_json,
    make_communicator,
)
from tinyamp.distributed.data_parallel import DataParallel
from tinyamp.distributed.flat import FlatLayout
from tinyamp.distributed.zero import MasterShard, zero_bytes_per_parameter

__all__ = [
    "Communicator", "MpiCommunicator", "NcclCommunicator", "SingleProcess", "make_communicator", "abort_on_error",
    "exchange_json", "REDUCTIONS", "Reduction", "sum_in_rank_order", "reduction_error", "agree_on_overflow",
    "RemoteOverflow", "FlatLayout", "MasterShard", "zero_bytes_per_parameter", "DataParallel",
]  # fmt: skip
