"""The seam between tinyamp and a communication library: MPI on CPUs, NCCL on GPUs, one small interface.

Every rank runs the same program on its own slice of the data; they meet only in collectives,
which every rank must call in the same order with arrays of the same size:

==================================  ============================================================
``allreduce(x, op, dtype)``         every rank gets op(x_0, ..., x_{N-1}) ("sum", "max", "min"),
                                    computed in `dtype`, in an order the library chooses
``allgather(x)``                    every rank gets x_0, x_1, ..., x_{N-1}, flattened, one after the other
``alltoall(x)``                     x has N rows; row j goes to rank j; rank j's row i came from rank i
``bcast(x, root)``                  every rank gets rank `root`'s x
``barrier()``                       returns once every rank has called it
==================================  ============================================================

tinyamp uses the library's own reduction (``allreduce``) only where the order of the operands
cannot change the result: the maximum of overflow flags, sums of integers.  Gradients are summed
by ``allreduce.py`` itself, in rank order, from an ``alltoall`` and an ``allgather``, because a
floating-point sum depends on its order and every rank must get the same bits.

Never a hang: a collective that waits longer than ``timeout_s`` for the other ranks, and an
exception on any rank (``abort_on_error``), end in MPI_Abort, which stops every rank of the
job.  A rank that dies (killed, out of memory) is seen by ``mpiexec`` itself, which stops the others.

Each communicator counts the bytes this rank sends (``bytes_sent``, as the bandwidth-optimal
ring and pairwise algorithms send them: what a step costs on a network, not bytes measured on
the wire) and the seconds spent inside collectives, waiting included (``seconds``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

import numpy as np

from tinyamp import backend

OPS = ("sum", "max", "min")
SPIN_S = 2e-3  # poll without sleeping this long: a blocking MPI wait spins too, and a sleep costs ~60 us
DEFAULT_TIMEOUT_S = 300.0  # a step of the demo takes milliseconds; this only ends a job whose peer is stuck


class Communicator:
    """The interface: ``rank``, ``size``, the five collectives, ``abort``; counters of bytes and seconds."""

    rank: int = 0
    size: int = 1
    device: str = "cpu"

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds; got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.bytes_sent = 0
        self.seconds = 0.0

    @property
    def xp(self) -> Any:
        """The array module of this communicator's arrays (numpy for MPI, cupy for NCCL)."""
        return backend.array_module(self.device)

    @contextlib.contextmanager
    def _counted(self, nbytes: float) -> Iterator[float]:
        began = time.perf_counter()
        yield began + self.timeout_s
        self.seconds += time.perf_counter() - began
        self.bytes_sent += int(nbytes)

    def _timed_out(self, what: str) -> NoReturn:
        self.abort(
            f"rank {self.rank} of {self.size} waited more than {self.timeout_s:g} s for the other ranks in {what}: "
            "a rank is stuck or stopped calling the collectives in the same order; stopping every rank"
        )

    def allreduce(self, x: Any, op: str = "sum", dtype: Any = None) -> Any:
        raise NotImplementedError

    def allgather(self, x: Any) -> Any:
        raise NotImplementedError

    def alltoall(self, x: Any) -> Any:
        raise NotImplementedError

    def bcast(self, x: Any, root: int = 0) -> Any:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def abort(self, message: str, code: int = 1) -> NoReturn:
        """Print `message` and stop every rank of the job (MPI_Abort), with exit status `code`."""
        print(f"tinyamp.distributed: {message}", file=sys.stderr, flush=True)
        raise SystemExit(code)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, device={self.device!r})"


ABORT_GRACE_S = 0.5  # seconds between the last message of a failing rank and MPI_Abort


class SingleProcess(Communicator):
    """One rank alone (size 1): every collective returns its input.  For reference runs and benchmarks."""

    def allreduce(self, x: Any, op: str = "sum", dtype: Any = None) -> Any:
        _check_op(op)
        return x.astype(dtype or x.dtype, copy=True)

    def allgather(self, x: Any) -> Any:
        return x.reshape(-1).copy()

    def alltoall(self, x: Any) -> Any:
        return x.copy()

    def bcast(self, x: Any, root: int = 0) -> Any:
        return x.copy()

    def barrier(self) -> None:
        pass


class MpiCommunicator(Communicator):
    """MPI through mpi4py, on NumPy arrays.  Non-blocking collectives, polled, so that a wait can time out."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        from mpi4py import MPI  # initializes MPI (once per process)

        super().__init__(timeout_s)
        self._MPI = MPI
        self.world = MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()

    def _wait(self, request: Any, deadline: float, what: str) -> None:
        spin_until, pause = time.perf_counter() + SPIN_S, 1e-5
        while not request.Test():  # Test also drives MPI's progress
            now = time.perf_counter()
            if now > deadline:
                self._timed_out(what)
            if now > spin_until:  # a long wait: yield the core to the ranks still computing
                time.sleep(pause)
                pause = min(2 * pause, 1e-3)

    def allreduce(self, x: Any, op: str = "sum", dtype: Any = None) -> Any:
        _check_op(op)
        send = np.ascontiguousarray(x, dtype=dtype or x.dtype)
        out = np.empty_like(send)
        mpi_op = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}[op]
        ring = 2 * (self.size - 1) / self.size * send.nbytes  # a ring all-reduce: reduce-scatter, then all-gather
        with self._counted(ring) as deadline:
            self._wait(self.world.Iallreduce(send, out, op=mpi_op), deadline, f"allreduce({op})")
        return out

    def allgather(self, x: Any) -> Any:
        send = np.ascontiguousarray(x).reshape(-1)
        out = np.empty(self.size * send.size, send.dtype)
        with self._counted((self.size - 1) * send.nbytes) as deadline:
            self._wait(self.world.Iallgather(_raw(send), _raw(out)), deadline, "allgather")
        return out

    def alltoall(self, x: Any) -> Any:
        send = np.ascontiguousarray(x)
        _check_rows(send, self.size)
        out = np.empty_like(send)
        with self._counted((self.size - 1) * send[0].nbytes) as deadline:
            self._wait(self.world.Ialltoall(_raw(send), _raw(out)), deadline, "alltoall")
        return out

    def bcast(self, x: Any, root: int = 0) -> Any:
        buf = np.array(x, copy=True)
        with self._counted(buf.nbytes if self.rank == root else 0) as deadline:
            self._wait(self.world.Ibcast(_raw(buf), root=root), deadline, "bcast")
        return buf

    def barrier(self) -> None:
        with self._counted(0) as deadline:
            self._wait(self.world.Ibarrier(), deadline, "barrier")

    def abort(self, message: str, code: int = 1) -> NoReturn:
        print(f"tinyamp.distributed: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # mpiexec forwards each rank's output through a pipe; MPI_Abort kills the ranks at once, and
        # on a busy machine the last lines could still be in that pipe (seen in CI): give them time.
        time.sleep(ABORT_GRACE_S)
        self.world.Abort(code)  # every rank of the job stops; mpiexec exits with a non-zero status
        raise SystemExit(code)  # not reached


class NcclCommunicator(Communicator):
    """NCCL through ``cupyx.distributed``, on CuPy arrays; MPI starts the ranks and stops them on an error.

    Built and tested on the CPU with a stand-in for CuPy (tests/test_distributed.py); it has not
    yet run on a GPU.  NCCL's calls return at once and run on the GPU's stream, so a wait is
    polled on a CUDA event, with the same timeout as MPI's.  NCCL's set-up (``init_process_group``)
    runs in a thread that the timeout bounds too.  The end of a grouped call (the all-to-all's
    ``ncclGroupEnd``) can block inside the call itself, where nothing here can time it out.
    """

    device = "cuda"

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import cupy
        from cupyx.distributed import init_process_group
        from mpi4py import MPI

        super().__init__(timeout_s)
        self.world = MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        device = self.rank % max(1, cupy.cuda.runtime.getDeviceCount())  # one GPU per rank
        cupy.cuda.Device(device).use()
        self._cupy = cupy
        try:  # MPI passes NCCL's unique id
            self._nccl = self._started(lambda: init_process_group(self.size, self.rank, use_mpi=True), device)
        except RuntimeError as exc:  # cupyx raises "NCCL is not available" when libnccl cannot be loaded
            raise backend.DeviceError(
                f"--device cuda sends the gradients with NCCL, and CuPy cannot use it ({exc}): "
                "pip install 'tinyamp[cuda12,nccl12,mpi]' (or [cuda13,nccl13,mpi])"
            ) from exc

    def _started(self, init: Any, device: int) -> Any:
        """``init()`` (NCCL's set-up), bounded by the time-out: it blocks inside NCCL until every rank has
        joined, so it runs in a thread, and a rank that waits longer than ``timeout_s`` stops the job."""
        done: dict[str, Any] = {}

        def run() -> None:
            try:
                self._cupy.cuda.Device(device).use()  # the current device belongs to each thread
                done["value"] = init()
            except BaseException as exc:  # handed to the caller below
                done["error"] = exc

        thread = threading.Thread(target=run, name="nccl-set-up", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            self.abort(
                f"rank {self.rank} of {self.size} waited more than {self.timeout_s:g} s for NCCL to start "
                "(init_process_group): a rank did not join; stopping every rank"
            )
        if "error" in done:
            raise done["error"]
        return done["value"]

    def _wait(self, deadline: float, what: str) -> None:
        event_type = getattr(self._cupy.cuda, "Event", None)
        if event_type is None:  # the CPU stand-in runs every call to completion
            return
        event = event_type()
        event.record()
        while not event.done:
            if time.perf_counter() > deadline:
                self._timed_out(what)
            time.sleep(1e-4)

    def allreduce(self, x: Any, op: str = "sum", dtype: Any = None) -> Any:
        _check_op(op)
        send = self._cupy.ascontiguousarray(x, dtype=dtype or x.dtype)
        out = self._cupy.empty_like(send)
        with self._counted(2 * (self.size - 1) / self.size * send.nbytes) as deadline:
            self._nccl.all_reduce(send, out, op)
            self._wait(deadline, f"allreduce({op})")
        return out

    def allgather(self, x: Any) -> Any:
        send = self._cupy.ascontiguousarray(x).reshape(-1)
        out = self._cupy.empty(self.size * send.size, send.dtype)
        with self._counted((self.size - 1) * send.nbytes) as deadline:
            self._nccl.all_gather(_raw(send), _raw(out), send.nbytes)
            self._wait(deadline, "allgather")
        return out

    def alltoall(self, x: Any) -> Any:
        send = self._cupy.ascontiguousarray(x)
        _check_rows(send, self.size)
        out = self._cupy.empty_like(send)
        with self._counted((self.size - 1) * send[0].nbytes) as deadline:
            self._nccl.all_to_all(_raw(send).reshape(self.size, -1), _raw(out).reshape(self.size, -1))
            self._wait(deadline, "alltoall")
        return out

    def bcast(self, x: Any, root: int = 0) -> Any:
        buf = self._cupy.array(x, copy=True)
        with self._counted(buf.nbytes if self.rank == root else 0) as deadline:
            self._nccl.broadcast(_raw(buf), root)
            self._wait(deadline, "bcast")
        return buf

    def barrier(self) -> None:
        with self._counted(0):
            self._nccl.barrier()

    def abort(self, message: str, code: int = 1) -> NoReturn:
        print(f"tinyamp.distributed: {message}", file=sys.stderr, flush=True)
        time.sleep(ABORT_GRACE_S)  # as MpiCommunicator.abort: let mpiexec forward the message first
        self.world.Abort(code)
        raise SystemExit(code)  # not reached


def _raw(a: Any) -> Any:
    """The bytes of a contiguous array: moving bits needs no dtype, so float16 and bfloat16 travel too."""
    return a.reshape(-1).view(np.uint8)


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}; got {op!r}")


def _check_rows(x: Any, size: int) -> None:
    if x.ndim < 1 or x.shape[0] != size:
        raise ValueError(f"alltoall sends row j to rank j: it needs {size} rows, one per rank; got shape {x.shape}")


def make_communicator(device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> Communicator:
    """MPI for device "cpu", NCCL for "cuda"; the ranks and their number come from ``mpiexec -n N``."""
    if backend.check_device(device) == "cuda":
        backend.array_module("cuda")  # CuPy and a GPU, or a DeviceError that says what is missing
        return NcclCommunicator(timeout_s)
    return MpiCommunicator(timeout_s)


def exchange_text(comm: Communicator, text: str) -> list[str]:
    """Every rank's `text`, in rank order, on every rank (two allgathers: the lengths, then the padded bytes)."""
    xp = comm.xp
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    lengths = backend.to_device(comm.allgather(xp.asarray([data.size], dtype=np.int64)), "cpu")
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: data.size] = data
    gathered = backend.to_device(comm.allgather(xp.asarray(padded)), "cpu").reshape(comm.size, -1)
    return [bytes(row[:n]).decode("utf-8") for row, n in zip(gathered, lengths)]


def exchange_json(comm: Communicator, value: Any) -> list[Any]:
    """Every rank's JSON-able `value`, in rank order, on every rank."""
    return [json.loads(t) for t in exchange_text(comm, json.dumps(value, sort_keys=True))]


@contextlib.contextmanager
def abort_on_error(comm: Communicator) -> Iterator[None]:
    """Turn an exception on this rank into MPI_Abort of the whole job, with the rank and the error named.

    Without it, the other ranks would wait forever in their next collective for a rank that
    has left (MPI does not notice an exception, only a process that exits).
    """
    try:
        yield
    except SystemExit as exc:
        if exc.code not in (None, 0):
            comm.abort(f"rank {comm.rank} of {comm.size} exited with status {exc.code}; stopping every rank", 1)
        raise
    except BaseException as exc:  # KeyboardInterrupt included: the others must not wait for this rank
        details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        sys.stderr.write(details)  # the message follows in abort(); both before MPI_Abort kills the job
        comm.abort(f"rank {comm.rank} of {comm.size} raised {type(exc).__name__}: {exc}; stopping every rank", 1)
