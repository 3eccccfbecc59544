"""Mixed precision across processes: `mpiexec -n 2` runs of tinyamp.distributed, checked bit for bit.

Each multi-process test launches ``mpiexec -n 2 python -m tinyamp.distributed`` (MPICH from
PyPI on the CI machine) with ``--dump DIR``: every rank writes the digests of its weights,
masters, optimizer moments and scaler state after every step, and its final arrays.  The
claims, each a test:

* every rank holds the same bits after every step (ZeRO: the same weights and scale; its
  sharded masters and moments, gathered, are those of the replicated run, bit for bit);
* 2 ranks x B/2 = 1 process accumulating 2 micro-batches of B/2, bit for bit (the gradients are
  summed in the same order, in the same dtype); = 1 process x B within a float32 tolerance;
* an overflow only one rank sees: with the agreement every rank skips; without it they part;
* rank 0's per-rank table prints each rank's fingerprint of its final state and says whether they agree;
* a rank that raises, dies or hangs stops every rank within seconds; different settings are refused;
* a sharded run's checkpoint resumes bit for bit, on 2 ranks and in 1 process;
* the lost updates are counted over the whole model: ZeRO's shards, the replicated run and one
  process accumulating two micro-batches give the same counts;
* a finished run extends to a new total with --extend (refused without it), as in one process;
* Ctrl-C or SIGTERM, even if only one rank sees it, stops every rank after the same step, saves
  a checkpoint that resumes bit for bit, and exits 130 or 143; mpiexec passes Ctrl-C on;
* the NCCL communicator runs a sharded run on the strict CuPy stand-in (no host/device mix).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="tinyamp.distributed needs mpi4py: pip install -e '.[mpi]'")
if shutil.which("mpiexec") is None:
    pytest.skip("no mpiexec on PATH (pip install mpich)", allow_module_level=True)

pytestmark = pytest.mark.optim

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = ROOT / "tests" / "engine_room" / "strict_cupy"
TIMEOUT_S = 120  # every launch has this timeout (subprocess.run): a hung job fails its test, never CI
SMALL = ["--model", "mlp", "--batch-size", "64", "--quiet"]


def launch(
    ranks: int, *args: str, timeout: float = TIMEOUT_S, python_path: list[Path] | None = None,
    script: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``mpiexec -n ranks python -m tinyamp.distributed args`` with one BLAS thread (the same sums in every run)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*(python_path or []), ROOT])
    command = script or ["-m", "tinyamp.distributed"]
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, *command, *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def dumped(folder: Path, ranks: int) -> list[tuple[dict, dict[str, np.ndarray]]]:
    out = []
    for r in range(ranks):
        with np.load(folder / f"rank{r}.npz") as z:
            out.append((json.loads((folder / f"rank{r}.json").read_text()), {k: z[k] for k in z.files}))
    return out


def run_and_dump(tmp_path: Path, name: str, ranks: int, *args: str, expect: int = 0) -> list[tuple[dict, dict]]:
    folder = tmp_path / name
    result = launch(ranks, *SMALL, "--dump", str(folder), *args)
    assert result.returncode == expect, result.stdout[-3000:] + result.stderr[-3000:]
    return dumped(folder, ranks)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- in one process: the engine against the teaching code ------------------------------------------
@pytest.mark.parametrize(("precision", "optimizer"), [("mixed", "adam"), ("mixed", "sgd"), ("fp16", "sgd"),
                                                      ("fp32", "adam")])  # fmt: skip
def test_one_rank_takes_the_single_process_step_bit_for_bit(precision: str, optimizer: str) -> None:
    """N = 1: the flat, sharded machinery reduces to MasterWeights + LossScaler exactly (weights, masters, moments)."""
    from threadpoolctl import threadpool_limits

    from tinyamp.distributed import DataParallel, SingleProcess
    from tinyamp.distributed.train import DistributedSetup, RankSlice
    from tinyamp.experiments.regimes import REGIMES, build, make_scaler
    from tinyamp.experiments.tasks import DigitsMLP

    task = DigitsMLP(optimizer=optimizer, hidden=(32, 32), batch_size=16, lr=0.01)
    regime = REGIMES[precision]
    reference = build(regime, task.make_model(), task.make_optimizer)
    model = task.make_model()
    model.astype(regime.weights)
    dp = DataParallel(model, task.make_optimizer, SingleProcess(), master_weights=regime.master_weights)
    sliced = RankSlice(task, 0, 1)
    setup = DistributedSetup(regime, model, dp, make_scaler(regime.scaler), None, rank_task=sliced)
    with threadpool_limits(1):
        for batch, micro in zip(task.batches(), sliced.batches()):
            reference.step(lambda m, b=batch: task.loss(m, b))
            setup.step(lambda m, b=micro: sliced.loss(m, b))
            if setup.scaler.step_count == 6:
                break
    for (name, a), b in zip(reference.model.state_dict().items(), model.state_dict().values()):
        assert same_bits(a, b), name
    inner = reference.optimizer.optimizer if regime.master_weights else reference.optimizer
    masters = [m.data for m in reference.optimizer.master_params] if regime.master_weights else None
    gathered, state = dp.gathered()
    views = dp.layout.views
    if masters is not None:
        assert all(same_bits(m, v) for m, v in zip(masters, views(gathered)))
    for key, flat in state.items():
        assert all(same_bits(s[key], v) for s, v in zip(inner.state, views(flat))), key
    assert reference.scaler.state_dict() == setup.scaler.state_dict()


def test_an_fp16_sum_overflows_as_ranks_grow_and_predivision_trades_it_for_lost_small_values() -> None:
    """Scaled gradients of N ranks (a shared mean, +-25% per rank, |mean| from 2^-24 to 2^15): the FP16 sum
    overflows more as N grows, the FP32 sum never; pre-dividing never overflows but flushes more small values."""
    from tinyamp.distributed import reduction_error

    rng = np.random.default_rng(0)
    mean = rng.choice([-1.0, 1.0], 20_000) * 2.0 ** rng.uniform(-24, 15, 20_000)
    grads = [(mean * (1 + 0.25 * np.clip(rng.standard_normal(20_000), -3, 3))).astype(np.float16) for _ in range(16)]
    names = ("float32", "float16", "float16-predivide")
    errors = {(name, n): reduction_error(grads[:n], name) for name in names for n in (2, 4, 16)}
    assert all(errors["float32", n]["overflowed"] == 0 for n in (2, 4, 16))
    overflowed = [errors["float16", n]["overflowed"] for n in (2, 4, 16)]
    assert 0 < overflowed[0] < overflowed[1] < overflowed[2]
    assert all(errors["float16-predivide", n]["overflowed"] == 0 for n in (2, 4, 16))
    assert errors["float16-predivide", 16]["flushed_to_zero"] > errors["float16", 16]["flushed_to_zero"]
    assert errors["float32", 16]["median_relative_error"] < 2.0**-20 < errors["float16", 16]["median_relative_error"]


def test_import_tinyamp_never_imports_mpi_and_the_package_says_how_to_install_it() -> None:
    code = (
        "import sys; import tinyamp; assert 'mpi4py' not in sys.modules and 'tinyamp.distributed' not in sys.modules\n"
        "sys.modules['mpi4py'] = None\n"
        "try:\n    import tinyamp.distributed\nexcept ImportError as exc:\n    print(exc)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert 'pip install -e ".[mpi]"' in result.stdout and "pip install mpi4py mpich" in result.stdout


# ---- on two ranks ----------------------------------------------------------------------------------
def _clipped_steps(max_norm: float, steps: int = 8) -> tuple[list[float], list[float], list, list]:
    """`steps` mixed-precision steps with clipping, by MasterWeights and by a one-rank DataParallel."""
    from threadpoolctl import threadpool_limits

    from tinyamp.autocast import autocast
    from tinyamp.distributed import DataParallel, SingleProcess
    from tinyamp.distributed.train import RankSlice
    from tinyamp.experiments.regimes import REGIMES, build, make_scaler
    from tinyamp.experiments.tasks import DigitsMLP

    task = DigitsMLP(optimizer="sgd", hidden=(32, 32), batch_size=16, lr=0.05)
    reference = build(REGIMES["mixed"], task.make_model(), task.make_optimizer)
    model = task.make_model()
    model.astype("float16")
    dp, scaler = DataParallel(model, task.make_optimizer, SingleProcess()), make_scaler("pytorch")
    sliced = RankSlice(task, 0, 1)
    norms: tuple[list[float], list[float]] = ([], [])
    with threadpool_limits(1):
        for _, batch, micro in zip(range(steps), task.batches(), sliced.batches()):
            reference.optimizer.zero_grad()
            with reference.autocast():
                loss = task.loss(reference.model, batch)
            reference.scaler.scale_loss(loss).backward()
            reference.scaler.unscale_(reference.optimizer)
            norms[0].append(reference.scaler.clip_grad_norm_(reference.optimizer, max_norm))
            reference.scaler.step(reference.optimizer)
            dp.zero_grad()
            with autocast("float16"):
                loss = sliced.loss(model, micro)
            scaler.scale_loss(loss).backward()
            dp.collect()
            flags = scaler.unscale_(dp)
            norms[1].append(scaler.clip_grad_norm_(dp, max_norm))  # lands in DataParallel.clip_grad_norm_
            dp.exchange(flags)
            assert scaler.step(dp).grad_norm == norms[1][-1]  # the report gives the norm the clip measured
            dp.finish()
    return *norms, list(reference.model.state_dict().values()), list(model.state_dict().values())


def test_one_rank_clips_as_the_single_process_scaler_does_bit_for_bit() -> None:
    """N = 1: DataParallel.clip_grad_norm_ measures the same norm and clips to the same weights as MasterWeights."""
    norms, dp_norms, weights, dp_weights = _clipped_steps(max_norm=0.25)
    assert norms == dp_norms
    assert sum(n > 0.25 for n in norms) >= 4  # measured: 7 of the 8 steps clip
    assert all(same_bits(a, b) for a, b in zip(weights, dp_weights))
    *_, unclipped = _clipped_steps(max_norm=1e9)
    assert not all(same_bits(a, b) for a, b in zip(dp_weights, unclipped))  # the clipping changed the run


def test_data_parallel_clips_only_between_unscale_and_exchange() -> None:
    from tinyamp.autocast import autocast
    from tinyamp.distributed import DataParallel, SingleProcess
    from tinyamp.experiments.regimes import make_scaler
    from tinyamp.experiments.tasks import DigitsMLP

    task = DigitsMLP(optimizer="sgd", hidden=(8,), batch_size=8)
    model = task.make_model()
    model.astype("float16")
    dp, scaler = DataParallel(model, task.make_optimizer, SingleProcess()), make_scaler("pytorch")
    with autocast("float16"):
        loss = task.loss(model, next(iter(task.batches())))
    scaler.scale_loss(loss).backward()
    dp.collect()
    with pytest.raises(RuntimeError, match=r"clip between scaler.unscale_\(dp\) and dp.exchange\(flags\): before"):
        dp.clip_grad_norm_(1.0)
    dp.inject_overflow()
    flags = scaler.unscale_(dp)
    for bad in (0.0, -1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match=r"max_norm must be a number > 0; got"):
            dp.clip_grad_norm_(bad)  # type: ignore[arg-type]
    before = dp.shard.tensor.data.copy()
    # not finite: nothing is clipped, and the step skips (a NumPy float is a max_norm too, as for the scaler)
    assert scaler.clip_grad_norm_(dp, np.float32(1e-3)) == np.inf
    dp.exchange(flags)
    with pytest.raises(RuntimeError, match=r"after, DDP has already all-gathered the unclipped one"):
        dp.clip_grad_norm_(1.0)
    assert scaler.step(dp).skipped and same_bits(dp.shard.tensor.data, before)


CLIP_ON_TWO_RANKS = """
import json, sys
import numpy as np
from tinyamp.autocast import autocast
from tinyamp.distributed import DataParallel, MpiCommunicator, allreduce
from tinyamp.distributed.train import RankSlice
from tinyamp.experiments.regimes import make_scaler
from tinyamp.experiments.tasks import DigitsMLP

MAX_NORM = 0.25
comm = MpiCommunicator()
task = DigitsMLP(optimizer="sgd", hidden=(32, 32), batch_size=32, lr=0.05)
for zero in (False, True):
    model = task.make_model()
    model.astype("float16")
    dp, scaler = DataParallel(model, task.make_optimizer, comm, zero=zero), make_scaler("pytorch")
    sliced, steps = RankSlice(task, comm.rank, comm.size), []
    for _, micro in zip(range(6), sliced.batches()):
        dp.zero_grad()
        with autocast("float16"):
            loss = sliced.loss(model, micro)
        scaler.scale_loss(loss).backward()
        dp.collect()
        flags = scaler.unscale_(dp)
        before = allreduce.all_gather(comm, dp._grad).astype(np.float64)  # the whole unscaled gradient
        norm = scaler.clip_grad_norm_(dp, MAX_NORM)
        after = allreduce.all_gather(comm, dp._grad).astype(np.float64)
        dp.exchange(flags)
        report = scaler.step(dp)
        dp.finish()
        steps.append({"norm": norm.hex(), "report": report.grad_norm.hex(), "exact": float(np.sqrt(np.sum(before**2))),
                      "clipped_to": float(np.sqrt(np.sum(after**2))),
                      "off": float(np.max(np.abs(after - before * min(1.0, MAX_NORM / (norm + 1e-6)))))})
    run = {"rank": comm.rank, "zero": zero, "steps": steps, "weights": dp.fingerprint()["weights"]}
    with open(f"{sys.argv[1]}/rank{comm.rank}-zero{int(zero)}.json", "w") as f:  # stdout interleaves the ranks
        json.dump(run, f)
"""


def test_two_ranks_clip_by_the_norm_of_the_whole_gradient_the_same_on_every_rank(tmp_path: Path) -> None:
    """Each rank holds half the gradient; both measure the whole norm, bit for bit, and clip by one factor."""
    script = tmp_path / "clip_on_two_ranks.py"
    script.write_text(CLIP_ON_TWO_RANKS)
    result = launch(2, str(tmp_path), script=[str(script)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = {(r, z): json.loads((tmp_path / f"rank{r}-zero{int(z)}.json").read_text())
            for r in (0, 1) for z in (False, True)}  # fmt: skip
    for zero in (False, True):
        a, b = runs[0, zero]["steps"], runs[1, zero]["steps"]
        assert [s["norm"] for s in a] == [s["norm"] for s in b] == [s["report"] for s in a]  # one norm, everywhere
        for s in a:
            norm = float.fromhex(s["norm"])
            # sum_of_squares adds rows of 1024 float32 squares in float32: each row within 6e-5 of itself
            assert norm == pytest.approx(s["exact"], rel=1e-4)
            assert s["clipped_to"] <= 0.25 * (1 + 1e-6) if norm > 0.25 else s["clipped_to"] == s["exact"]
            # every element scaled by the one factor: off by its float32 rounding, <= 2^-24 |element| <= 6e-8 norm
            assert s["off"] <= 1e-7 * norm
        assert sum(float.fromhex(s["norm"]) > 0.25 for s in a) >= 3  # clipping happened
    assert runs[0, False]["weights"] == runs[1, False]["weights"] == runs[0, True]["weights"]  # ZeRO = replicated
    assert [s["norm"] for s in runs[0, False]["steps"]] == [s["norm"] for s in runs[0, True]["steps"]]


def test_every_rank_holds_the_same_bits_after_every_step(tmp_path: Path) -> None:
    """Replicated: weights, masters, moments (SGD's momentum) and scaler identical on both ranks, step by step."""
    (a, fa), (b, fb) = run_and_dump(tmp_path, "ddp", 2, "--steps", "6", "--overflow-at", "2:0")
    assert len(a["fingerprints"]) == 6 and a["fingerprints"] == b["fingerprints"]
    assert a["skipped"] == b["skipped"] == [False, False, True, False, False, False]  # the overflow: both skipped
    assert all(same_bits(fa[k], fb[k]) for k in fa)


def test_zero_shards_the_masters_into_the_bits_of_the_replicated_run_and_the_memory_of_the_formula(
    tmp_path: Path,
) -> None:
    (a, fa), (b, fb) = run_and_dump(tmp_path, "zero", 2, "--steps", "6", "--zero")
    (r, fr), _ = run_and_dump(tmp_path, "ddp", 2, "--steps", "6")
    assert [x["weights"] for x in a["fingerprints"]] == [x["weights"] for x in b["fingerprints"]]
    assert [x["scaler"] for x in a["fingerprints"]] == [x["scaler"] for x in b["fingerprints"]]
    assert a["fingerprints"][-1]["masters"] != b["fingerprints"][-1]["masters"]  # each rank holds its own half
    for key in fr:  # gathered: the replicated run's masters and moments, bit for bit
        assert same_bits(fa[key], fr[key]) and same_bits(fb[key], fr[key]), key
    p = a["parameters"]  # the MLP trains with SGD + momentum: K = 4 (master) + 4 (momentum) = 8 bytes
    assert sum(a["memory"].values()) == pytest.approx((2 + 2 + 8 / 2) * p, abs=16)  # padding: < N elements
    assert sum(r["memory"].values()) == (2 + 2 + 8) * p


@pytest.mark.parametrize("reduce_dtype", ["float32", "float16"])
def test_two_ranks_are_one_process_accumulating_two_micro_batches_bit_for_bit(
    tmp_path: Path, reduce_dtype: str
) -> None:
    """Same order of the sum (g_0 + g_1, in the same dtype), same bits; also under ZeRO."""
    (two, f2), _ = run_and_dump(tmp_path, "two", 2, "--steps", "8", "--reduce-dtype", reduce_dtype, "--zero")
    ((one, f1),) = run_and_dump(tmp_path, "one", 1, "--steps", "8", "--reduce-dtype", reduce_dtype,
                                "--micro-batches", "2")  # fmt: skip
    assert two["loss"] == one["loss"] and two["scales"] == one["scales"]
    for key in f1:
        assert same_bits(f2[key], f1[key]), key


def test_two_ranks_match_one_process_with_the_whole_batch_within_a_float32_tolerance(tmp_path: Path) -> None:
    """FP32 regime: the batch's sum is cut in two (the matmul's own order differs), 10 SGD steps.

    Measured: at most 2e-8 apart for weights up to 0.13 (1.4e-7 of the largest, ~1 float32 ulp);
    the tolerance is 1e-6 of the largest weight.  Bit-identical it is not: 4% of the weights differ.
    """
    args = ["--precision", "fp32", "--steps", "10", "--schedule", "constant"]
    (two, f2), _ = run_and_dump(tmp_path, "two", 2, *args)
    ((one, f1),) = run_and_dump(tmp_path, "one", 1, *args)
    w2, w1 = f2["weights"].astype(np.float64), f1["weights"].astype(np.float64)
    assert np.max(np.abs(w2 - w1)) <= 1e-6 * np.max(np.abs(w1))
    assert np.any(w2 != w1)  # the tolerance is needed: the orders differ
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)


@pytest.mark.parametrize("zero", [False, True], ids=["replicated", "zero"])
def test_an_overflow_one_rank_sees_skips_every_rank_with_agreement_and_splits_them_without(
    tmp_path: Path, zero: bool
) -> None:
    flags = ["--steps", "5", "--overflow-at", "2:1"] + (["--zero"] if zero else [])
    (a, _), (b, _) = run_and_dump(tmp_path, "agree", 2, *flags)
    assert a["skipped"] == b["skipped"] == [False, False, True, False, False]
    assert a["scales"] == b["scales"] and [x["weights"] for x in a["fingerprints"]] == [
        x["weights"] for x in b["fingerprints"]
    ]
    (a, _), (b, _) = run_and_dump(tmp_path, "split", 2, *flags, "--no-agree", expect=0 if zero else 3)
    assert a["skipped"][2] is False and b["skipped"][2] is True  # rank 1 alone saw its shard's inf
    assert a["scales"][2:] != b["scales"][2:]  # the scale histories part for good
    if zero:  # all-gathered, the weights stay equal: the divergence is in the scales the gradients carry
        assert [x["weights"] for x in a["fingerprints"]] == [x["weights"] for x in b["fingerprints"]]
    else:  # rank 0 stepped with rank 1's inf: its weights are no longer finite, rank 1's are
        assert a["fingerprints"][2]["weights"] != b["fingerprints"][2]["weights"]
        assert a["finite"] is False and b["finite"] is True


def table_rows(stdout: str) -> dict[int, str]:
    """The per-rank table rank 0 prints: rank -> the fingerprint in its last column."""
    rows = [line.split() for line in stdout.splitlines() if line[:4].strip().isdigit() and "KiB" in line]
    return {int(r[0]): r[-1] for r in rows}


def test_the_per_rank_table_shows_each_ranks_fingerprint_and_says_whether_they_agree(tmp_path: Path) -> None:
    """The fingerprint printed is the final state's (the digests --dump records), and a run whose ranks parted
    (an overflow on rank 1 alone, no agreement, ZeRO: the weights stay equal, the scales do not) is told so."""
    from tinyamp.distributed.train import shared_fingerprint

    together = launch(2, *SMALL, "--steps", "4", "--dump", str(tmp_path / "agree"))
    assert together.returncode == 0, together.stdout[-3000:] + together.stderr[-3000:]
    printed = table_rows(together.stdout)
    (a, _), (b, _) = dumped(tmp_path / "agree", 2)
    final = [{**row, "fingerprint": d["fingerprints"][-1]} for row, d in zip(a["rows"], (a, b))]  # after the last step
    assert printed == {0: shared_fingerprint(final[0]), 1: shared_fingerprint(final[1])} and printed[0] == printed[1]
    assert "fingerprint: SHA-256 of the weights, masters, optimizer moments and scaler state;" in together.stdout
    assert "the same on every rank (2 of them): they hold one model, bit for bit" in together.stdout

    parted = launch(2, *SMALL, "--steps", "5", "--zero", "--overflow-at", "2:1", "--no-agree")
    assert parted.returncode == 0, parted.stdout[-3000:] + parted.stderr[-3000:]
    printed = table_rows(parted.stdout)
    assert sorted(printed) == [0, 1] and printed[0] != printed[1]
    assert "SHA-256 of the weights and scaler state (ZeRO: each rank holds its own shard" in parted.stdout
    assert "the ranks DISAGREE with rank 0 (rank 1: scaler state): they no longer train one model" in parted.stdout


@pytest.mark.parametrize(("fault", "says"), [
    ("raise@2:1", "rank 1 of 2 raised RuntimeError"),
    ("kill@2:1", "BAD TERMINATION"),
    ("hang@2:1", "rank 0 of 2 waited more than 3 s"),
])  # fmt: skip
def test_a_rank_that_raises_dies_or_hangs_stops_every_rank_within_seconds(fault: str, says: str) -> None:
    began = time.perf_counter()
    result = launch(2, *SMALL, "--steps", "50", "--fault", fault, "--timeout", "3", timeout=60)
    elapsed = time.perf_counter() - began
    assert result.returncode != 0
    assert says in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
    assert elapsed < 30, f"the job took {elapsed:.0f} s to stop"


def test_ranks_started_with_different_settings_are_refused_at_start_up() -> None:
    first = ["-n", "1", sys.executable, "-m", "tinyamp.distributed", *SMALL, "--steps", "2"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    cmd = ["mpiexec", *first, "--lr", "0.1", ":", *first, "--lr", "0.05"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 2
    assert "different settings (--lr: rank 0 0.1, rank 1 0.05)" in result.stderr


def test_device_cuda_without_a_usable_gpu_stops_every_rank_with_one_sentence() -> None:
    import tinyamp

    if tinyamp.cuda_is_available():
        pytest.skip("this machine has a usable GPU")
    result = launch(2, *SMALL, "--steps", "2", "--device", "cuda")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "tinyamp: error: device='cuda'" in result.stderr and "Traceback" not in result.stderr


def test_a_sharded_checkpoint_resumes_bit_for_bit_on_two_ranks_and_in_one_process(tmp_path: Path) -> None:
    """Saved at step 3 by a ZeRO run that then crashed; resumed on 2 ranks, and in 1 process x 2 micro-batches."""
    args = ["--steps", "6", "--zero", "--reduce-dtype", "float16"]
    (straight, fs), _ = run_and_dump(tmp_path, "straight", 2, *args)
    out = tmp_path / "run"
    crashed = launch(2, *SMALL, *args, "--out", str(out), "--checkpoint-every", "3", "--fault", "raise@3:1")
    assert crashed.returncode != 0 and (out / "checkpoint.npz").exists(), crashed.stderr[-2000:]
    resume = ["--resume", str(out / "checkpoint.npz"), "--zero", "--reduce-dtype", "float16"]
    (again, fa), _ = run_and_dump(tmp_path, "again", 2, *resume)
    ((alone, f1),) = run_and_dump(tmp_path, "alone", 1, *resume, "--micro-batches", "2")
    for key in fs:
        assert same_bits(fa[key], fs[key]) and same_bits(f1[key], fs[key]), key
    assert again["scales"] == alone["scales"] == straight["scales"]  # the scaler's history travels in the file
    assert again["loss"] == straight["loss"]  # the resumed run reports the whole run: its history travels


def test_a_killed_rank_leaves_the_default_periodic_checkpoint_which_one_process_refuses_and_two_ranks_resume(
    tmp_path: Path,
) -> None:
    """--out without --checkpoint-every saved only at the end: a rank killed at step 510 of 600 lost the whole run.
    Now rank 0 saves every 500 steps, as one process does.  `tinyamp train --resume` of that 2-rank ZeRO file
    ended with status 0 on other bits (its gradients are not sums of two halves): it is refused, naming the world
    size and the command, and that command resumes it."""
    from tinyamp.experiments.run_settings import DEFAULT_CHECKPOINT_EVERY

    out = tmp_path / "run"
    killed = launch(2, *SMALL, "--zero", "--steps", str(DEFAULT_CHECKPOINT_EVERY + 100), "--out", str(out),
                    "--fault", f"kill@{DEFAULT_CHECKPOINT_EVERY + 10}:1")  # fmt: skip
    assert killed.returncode != 0, killed.stdout[-2000:]
    manifest = json.loads((out / "tinyamp-run.json").read_text())
    assert (manifest["step"], manifest["finished"]) == (DEFAULT_CHECKPOINT_EVERY, False)
    checkpoint = out / "checkpoint.npz"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    alone = subprocess.run([sys.executable, "-m", "tinyamp", "train", "--resume", str(checkpoint), "--quiet"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert (alone.returncode, alone.stdout) == (2, ""), alone.stdout[-2000:] + alone.stderr[-2000:]
    command = f"mpiexec -n 2 python -m tinyamp.distributed --resume {checkpoint} --out DIR --zero"
    assert alone.stderr == (
        f"tinyamp: error: --resume {checkpoint} was saved by a data-parallel run on 2 ranks with ZeRO: one process "
        f"sums each batch's gradient in another order and would not continue it bit for bit; resume it with  "
        f"{command}  (or in one process, without mpiexec and with --micro-batches 2)\n"
    )
    again = launch(2, "--resume", str(checkpoint), "--out", str(tmp_path / "again"), "--zero", "--quiet")
    assert again.returncode == 0, again.stderr[-2000:]
    done = json.loads((tmp_path / "again" / "results.json").read_text())
    assert done["config"]["resumed_from"] == DEFAULT_CHECKPOINT_EVERY


@pytest.mark.parametrize("precision", ["mixed", "fp16"])
def test_lost_updates_are_counted_over_the_whole_model_whatever_the_sharding(tmp_path: Path, precision: str) -> None:
    """The measured (changed, lost) counts of 2 ranks (ZeRO, replicated) and of 1 process x 2 micro-batches agree."""
    layouts = {"replicated": (2, []), "one process": (1, ["--micro-batches", "2"])}
    if precision == "mixed":
        layouts["zero"] = (2, ["--zero"])  # ZeRO shards FP32 masters: the "fp16" regime has none
    measured = {}
    for name, (ranks, extra) in layouts.items():
        out = tmp_path / name.replace(" ", "_")
        result = launch(ranks, *SMALL, "--precision", precision, "--steps", "40", "--out", str(out), *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        row = json.loads((out / "results.json").read_text())["tasks"]["mlp"]["regimes"][precision]
        measured[name] = (row["measured"]["changed"], row["measured"]["lost"], row["lost_update_fraction"])
    first = measured["replicated"]
    assert sum(first[1]) > 0 and 0 < first[2] < 1, first  # updates were lost, and not all of them
    assert all(m == first for m in measured.values()), measured


def test_a_finished_run_extends_to_a_new_total_only_with_extend_and_a_constant_rate_continues_exactly(
    tmp_path: Path,
) -> None:
    """6 straight steps at a constant rate = 3 steps, then --resume --steps 6 --extend, bit for bit."""
    args = ["--schedule", "constant", "--zero"]
    (straight, fs), _ = run_and_dump(tmp_path, "straight", 2, *args, "--steps", "6")
    first = launch(2, *SMALL, *args, "--steps", "3", "--out", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-2000:]
    resume = ["--resume", str(tmp_path / "first" / "checkpoint.npz"), "--zero", "--steps", "6"]
    refused = launch(2, *SMALL, *resume)
    assert refused.returncode == 2
    assert "finished (3 of 3 steps); add --extend to continue it to 6 steps" in refused.stderr
    alone = launch(2, *SMALL, "--steps", "6", "--extend")
    assert alone.returncode == 2 and "--extend continues a saved run to more steps; it needs --resume" in alone.stderr
    folder = tmp_path / "again"
    extended = launch(2, *SMALL, *resume, "--extend", "--dump", str(folder))
    assert extended.returncode == 0, extended.stderr[-2000:]
    assert "the steps from 3 on are those a straight 6-step run takes" in extended.stdout
    (again, fa), _ = dumped(folder, 2)
    for key in fs:
        assert same_bits(fa[key], fs[key]), key
    assert again["loss"] == straight["loss"]  # the resumed run reports the whole run: its history travels


@pytest.mark.parametrize(("fault", "status", "extra"), [("sigint", 130, []), ("sigterm", 143, ["--zero"])])
def test_a_signal_only_one_rank_sees_stops_every_rank_after_that_step_and_the_checkpoint_resumes_bit_for_bit(
    tmp_path: Path, fault: str, status: int, extra: list[str]
) -> None:
    """Rank 1 alone gets the signal in step 2; both stop after it, at 3 of 6; a resume ends as a straight run."""
    args = ["--steps", "6", *extra]
    (straight, fs), _ = run_and_dump(tmp_path, "straight", 2, *args)
    out = tmp_path / "run"
    stopped = launch(2, *SMALL, *args, "--out", str(out), "--fault", f"{fault}@2:1")
    assert stopped.returncode == status, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    name = fault.upper()
    assert f"stopped by {name} at step 3 of 6 on every rank; wrote {out / 'checkpoint.npz'}" in stopped.stderr
    assert json.loads((out / "tinyamp-run.json").read_text())["step"] == 3
    (again, fa), _ = run_and_dump(tmp_path, "again", 2, "--resume", str(out / "checkpoint.npz"), *extra)
    for key in fs:
        assert same_bits(fa[key], fs[key]), key
    assert again["loss"] == straight["loss"]  # the resumed run reports the whole run: its history travels


def test_a_signal_without_out_stops_every_rank_and_says_nothing_was_written() -> None:
    result = launch(2, *SMALL, "--steps", "6", "--fault", "sigint@1:0")
    assert result.returncode == 130, result.stderr[-2000:]
    assert "stopped by SIGINT at step 2 of 6 on every rank; nothing was written" in result.stderr


def test_ctrl_c_to_mpiexec_reaches_every_rank_which_stop_together_and_save(tmp_path: Path) -> None:
    """The real path: SIGINT to mpiexec, which passes it on to the ranks, at whatever step they reached."""
    out = tmp_path / "run"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "tinyamp.distributed", *SMALL, "--steps", "100000",
           "--out", str(out), "--checkpoint-every", "1"]  # fmt: skip
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (out / "tinyamp-run.json").exists():  # the first checkpoint: the ranks are training
            assert job.poll() is None and time.monotonic() < deadline, "the job ended or never started training"
            time.sleep(0.05)
        job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=TIMEOUT_S)
    finally:
        job.kill()
    assert job.returncode == 130, stderr[-2000:]
    manifest = json.loads((out / "tinyamp-run.json").read_text())
    assert manifest["finished"] is False and 1 <= manifest["step"] < 100_000
    assert f"stopped by SIGINT at step {manifest['step']} of 100000 on every rank" in stderr


RUN_ON_STAND_IN = """
import sys, types
import numpy as np
import cupy  # the strict stand-in, first on PYTHONPATH
import strict_cupy_plugin  # noqa: F401  (the GPU-only kernels switched to their generic code)
from mpi4py import MPI

world = MPI.COMM_WORLD
OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


def host(a):
    if not isinstance(a, cupy.ndarray):
        raise TypeError(f"NCCL takes device arrays; got {type(a).__name__}")
    return cupy.asnumpy(a)


class Backend:  # cupyx.distributed.NCCLBackend's calls, carried by MPI
    def all_reduce(self, i, o, op="sum"):
        h = host(i); r = np.empty_like(h); host(o); world.Allreduce(h, r, op=OPS[op]); o[...] = cupy.asarray(r)
    def all_gather(self, i, o, count):
        h = host(i); r = np.empty(world.size * count, h.dtype); host(o); world.Allgather(h, r); o[...] = cupy.asarray(r)
    def all_to_all(self, i, o):
        h = host(i); r = np.empty_like(h); host(o); world.Alltoall(h, r); o[...] = cupy.asarray(r)
    def broadcast(self, a, root=0):
        h = host(a); world.Bcast(h, root=root); a[...] = cupy.asarray(h)
    def barrier(self):
        world.Barrier()


distributed = types.ModuleType("cupyx.distributed")
distributed.init_process_group = lambda n, rank, **kw: Backend()
sys.modules["cupyx.distributed"] = distributed
cupy.cuda.runtime.getDeviceCount = lambda: 1
cupy.cuda.Device.use = lambda self: None
from tinyamp.distributed.__main__ import main

code = main(sys.argv[1:])
print(f"STRICT-CUPY VIOLATIONS: {len(cupy.VIOLATIONS)}")
sys.exit(code or (1 if cupy.VIOLATIONS else 0))
"""


@pytest.mark.engine_room  # the stand-in swaps the engine room's GPU kernels (TINYAMP_ENGINE_ROOM=off has none)
def test_the_nccl_communicator_runs_a_sharded_run_on_the_strict_stand_in(tmp_path: Path) -> None:
    """NCCL's interface, carried by MPI on CuPy stand-in arrays: no host array reaches it, the same bits as MPI's."""
    script = tmp_path / "run_on_stand_in.py"
    script.write_text(RUN_ON_STAND_IN)
    args = ["--steps", "4", "--zero", "--reduce-dtype", "float16", "--overflow-at", "1:1"]
    gpu = launch(2, *SMALL, *args, "--device", "cuda", "--dump", str(tmp_path / "gpu"), script=[str(script)],
                 python_path=[STAND_IN])  # fmt: skip
    out = gpu.stdout + gpu.stderr
    assert gpu.returncode == 0, out[-4000:]
    assert out.count("STRICT-CUPY VIOLATIONS: 0") == 2, out[-4000:]
    (g, fg), _ = dumped(tmp_path / "gpu", 2)
    (c, fc), _ = run_and_dump(tmp_path, "cpu", 2, *args)
    assert g["skipped"] == c["skipped"] == [False, True, False, False]
    for key in fc:
        assert same_bits(fg[key], fc[key]), key


def test_the_agreement_line_of_one_rank_does_not_speak_of_ranks_that_are_not_there() -> None:
    from tinyamp.distributed.train import SHARED_STATE, agreement_in_words

    fingerprint = dict.fromkeys(SHARED_STATE[False], "ab12cd34")
    row = {"rank": 0, "sharded": False, "fingerprint": fingerprint}
    assert agreement_in_words([row])[1] == "  one rank: there is no other rank to agree with"
    two = agreement_in_words([row, {**row, "rank": 1}])[1]
    assert two == "  the same on every rank (2 of them): they hold one model, bit for bit"
    other = {**row, "rank": 1, "fingerprint": {**fingerprint, "scaler": "00000000"}}
    assert "DISAGREE with rank 0 (rank 1: scaler state)" in agreement_in_words([row, other])[1]
