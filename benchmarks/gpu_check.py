"""GPU verification of tinyamp: throughput and memory measured on one GPU, then the commands and GPU tests.

    PYTHONPATH=. OUT=$OUT python3 benchmarks/gpu_check.py     # on one GPU; ends by --time-limit (420 s)
    python benchmarks/gpu_check.py --quick                     # smaller sizes, a fast look
    python benchmarks/gpu_check.py --dry-run                   # the same code on NumPy, tiny sizes, seconds

Sections, in order (each independent: a failing one prints its traceback, is marked
FAILED in the table, and the run goes on):

1. env          GPU, driver, CUDA runtime, versions, tinyamp.cuda_is_available(), and a smoke
                test (cuBLAS loads, a float16 GemmEx product and a device-side scaler step run)
2. matmul       tinyamp FP16 vs cuBLAS FP16 vs FP32 (no TF32) vs TF32 at n^3, results checked
3. mlp          MLP training step, FP32 vs mixed precision: time and peak memory
4. transformer  CharTransformer training step, FP32 vs mixed precision
5. tutorial8    tutorial 8's MLP (1024-4096-4096-10, batch 1024), FP32 vs mixed precision
6. overhead     a tiny MLP step: host wall time per FP32 and per mixed step
7. kernels      kernel tables of the mixed steps of 3-6 from PyTorch's profiler (which sees
                CuPy's kernels): GPU time, launches and device-to-host copies per step, the
                slowest kernels, and any kernel above half of a step reported as a finding
8. torch-amp    PyTorch AMP on the MLP of section 3 (PyTorch's sections come after tinyamp's,
                so its allocator does not disturb CuPy's measurements)
9. torch-transformer  PyTorch on section 4's shape (a twin built of the same layers), FP32 and AMP
10. torch-tiny  PyTorch AMP's host time per step on the tiny MLP of section 6
11. cli         tinyamp train and tinyamp demo with --device on the device, end to end
12. tests       pytest -k cuda tests, in a subprocess with a timeout
13. underflow   benchmarks/underflow_lm.py on the device: does loss scaling alone repair a word-level
                model's underflow at the corpus's whole vocabulary and 16,384 tokens a batch? (last: the
                longest, and a study rather than a check)

Then one Markdown table and a JSON file of every number: $OUT/gpu_check.json when OUT
is set, else benchmarks/results/gpu_check.json.  Exit status: 0 when every section
passed or was skipped, 1 when one failed (or the time limit was reached), 2 when no
CUDA GPU is usable (without --dry-run).  Targets that are missed are reported, not failed.
"""

from __future__ import annotations

import os

_TF32_ENV = os.environ.pop("CUPY_TF32", None)  # before CuPy is imported: FP32 products must be real FP32


def _nvrtc_has_pch() -> bool:
    """CuPy built for CUDA 13 (NVRTC >= 12.8): precompiled headers are available."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("cupy-cuda13x")
    except PackageNotFoundError:
        return False
    return True


if _nvrtc_has_pch():  # a fresh machine compiles ~170 kernels; PCH makes each compile several times faster
    os.environ.setdefault("CUPY_NVRTC_USE_PCH", "1")  # inherited by the test and cli subprocesses

import argparse  # noqa: E402
import datetime  # noqa: E402
import faulthandler  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the working tree's tinyamp, installed or not

import numpy as np  # noqa: E402
from gpu_cli import cli  # noqa: E402
from gpu_device import make_device  # noqa: E402
from gpu_peers import torch_tiny, torch_transformer  # noqa: E402
from gpu_profile import kernels  # noqa: E402
from gpu_report import Section, markdown_table, write_json  # noqa: E402
from gpu_sections import Config, Context, Skip, environment, gpu_tests, matmul  # noqa: E402
from gpu_training import mlp, overhead, torch_amp, transformer, tutorial8  # noqa: E402
from gpu_underflow import underflow  # noqa: E402

import tinyamp as ta  # noqa: E402
from tinyamp.backend import DeviceError, array_module  # noqa: E402

TRANSFORMER = {"vocab": 128, "block": 256, "dim": 1024, "heads": 16, "layers": 6, "batch": 64}
CONFIGS = {
    "full": Config("full", 8192, (8192, 8192, 8192, 8192, 1024), 8192, TRANSFORMER),
    "quick": Config("quick", 4096, (4096, 4096, 4096, 1024), 4096,
                    dict(TRANSFORMER, dim=512, layers=4, block=128, batch=32), reps=5, step_budget_s=6.0),
    "dry run": Config("dry run", 64, (32, 32, 32, 10), 16,
                      {"vocab": 32, "block": 16, "dim": 32, "heads": 4, "layers": 2, "batch": 4},
                      tutorial8_sizes=(32, 64, 64, 10), tutorial8_batch=16,
                      warmup=1, reps=3, matmul_inner=1, step_budget_s=2.0, run_tests=False),
}  # fmt: skip


SECTIONS: list[tuple[str, Callable[[Context, Section], None], float]] = [
    ("env", environment, 60),
    ("matmul", matmul, 90),
    ("mlp", mlp, 120),
    ("transformer", transformer, 120),
    ("tutorial8", tutorial8, 60),
    ("overhead", overhead, 60),
    ("kernels", kernels, 120),
    ("torch-amp", torch_amp, 90),
    ("torch-transformer", torch_transformer, 90),
    ("torch-tiny", torch_tiny, 30),
    ("cli", cli, 150),
    ("tests", gpu_tests, 200),
    ("underflow", underflow, 210),
]  # name, function, time limit in seconds (the whole run has its own limit too): tinyamp's numbers
# first (the kernel tables import PyTorch but allocate nothing through it), then PyTorch's peers (their
# allocator after CuPy's measurements), then the end-to-end commands and the test suite, and last the
# underflow study (the longest): the watchdog may cut the last ones


class SectionTimeout(Exception):
    """A section ran past its own time limit."""


def _alarm(signum: int, frame: object) -> None:
    raise SectionTimeout("the section ran past its time limit")


class Run:
    """The sections run so far, the final report, and a watchdog that ends the run at its time limit."""

    def __init__(self, ctx: Context, out: Path, time_limit_s: float) -> None:
        self.ctx, self.out, self.time_limit_s = ctx, out, time_limit_s
        self.started = time.perf_counter()
        self.started_utc = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.current: Section | None = None
        self._lock = threading.Lock()
        self._reported = False

    def section(self, name: str, fn: Callable[[Context, Section], None], limit_s: float) -> None:
        """Run one section, catching whatever it raises: its traceback is printed and it is marked FAILED."""
        sec = Section(name)
        self.ctx.sections.append(sec)
        self.current = sec
        print(f"\n== {name} ==", flush=True)
        t0 = time.perf_counter()
        use_alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")
        if use_alarm:
            signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(int(limit_s))
        try:
            fn(self.ctx, sec)
            sec.status = "ok"
        except Skip as why:
            sec.status, sec.error = "skipped", str(why)
            print(f"  skipped: {why}", flush=True)
        except Exception:
            sec.status, sec.error = "FAILED", traceback.format_exc()
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            if use_alarm:
                signal.alarm(0)
            sec.seconds = time.perf_counter() - t0
            try:
                self.ctx.dev.free()
            except Exception:  # a broken device must not hide the report
                traceback.print_exc()
        print(f"  -> {sec.status} in {sec.seconds:.1f} s", flush=True)
        self.save()

    def meta(self, complete: bool) -> dict[str, object]:
        """The run's settings and environment, for the JSON file."""
        failed = [s.name for s in self.ctx.sections if s.status == "FAILED"]
        return {
            "mode": self.ctx.cfg.mode, "dry_run": self.ctx.dev.name == "cpu", "device": self.ctx.dev.name,
            "argv": sys.argv[1:], "started_utc": self.started_utc, "seconds": time.perf_counter() - self.started,
            "complete": complete, "failed": failed, "python": platform.python_version(), "numpy": np.__version__,
            "tinyamp": ta.__version__, "config": vars(self.ctx.cfg),
            "cupy_tf32_env_removed": _TF32_ENV, "nvidia_tf32_override": os.environ.get("NVIDIA_TF32_OVERRIDE"),
        }  # fmt: skip

    def save(self) -> None:
        """Write the JSON with what is measured so far (after every section: a crash loses no section)."""
        write_json(self.out, self.meta(complete=False), self.ctx.sections)

    def report(self) -> int:
        """Print the table, write the JSON, return the exit status (once, whoever calls first)."""
        with self._lock:
            if self._reported:
                return 1
            self._reported = True
        sections, dry = self.ctx.sections, self.ctx.dev.name == "cpu"
        print("\n" + ("DRY RUN (NumPy on the CPU, tiny sizes; nothing here is a GPU number)\n" if dry else ""))
        print(markdown_table(sections, dry_run=dry))
        # True by construction: every row is recorded by a section from what it measured (or read) in this run.
        print("\nNo number in this table was estimated: every value was measured in this run.")
        meta = self.meta(complete=True)
        write_json(self.out, meta, sections)
        failed = meta["failed"]
        print(f"wrote {self.out}")
        print(f"{len(sections)} sections, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
              f"{meta['seconds']:.0f} s in all")  # fmt: skip
        sys.stdout.flush()
        return 1 if failed else 0

    def on_time_limit(self) -> None:
        """The watchdog: mark the running section FAILED, kill child processes, report, and exit now."""
        sec = self.current
        if sec is not None:
            sec.status = "FAILED"
            sec.error = f"the whole run reached its time limit of {self.time_limit_s:.0f} s in this section"
        for pid in list(self.ctx.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        print(f"\n!! time limit of {self.time_limit_s:.0f} s reached during {sec.name if sec else '?'}", flush=True)
        self.report()
        os._exit(1)


def no_gpu_message() -> str | None:
    """Why CUDA is unusable here, or None when a GPU is usable."""
    try:
        array_module("cuda")
    except DeviceError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="run every section on NumPy at tiny sizes")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument("--skip-tests", action="store_true", help="do not run pytest -k cuda")
    parser.add_argument("--size", type=int, default=None, help="matmul size n (n x n @ n x n); default 8192")
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help="comma-separated sections to run after env (e.g. transformer,kernels)")  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=420.0, help="seconds before the watchdog ends the run")
    args = parser.parse_args(argv)
    names = [name for name, _, _ in SECTIONS]
    only = None if args.only is None else {"env", *(n.strip() for n in args.only.split(",") if n.strip())}
    if only is not None and not only <= set(names):
        unknown = ", ".join(sorted(only - set(names)))
        parser.error(f"--only: no section called {unknown}; the sections are {', '.join(names)}")

    if not args.dry_run:
        why = no_gpu_message()
        if why is not None:
            print(f"gpu_check: no CUDA GPU is usable here, so nothing can be measured.\n  {why}\n"
                  "Run it on a machine with an NVIDIA GPU and CuPy, or use --dry-run to exercise it on the CPU.",
                  file=sys.stderr)  # fmt: skip
            return 2
    cfg = CONFIGS["dry run" if args.dry_run else "quick" if args.quick else "full"]
    cfg = replace(cfg, matmul_n=args.size or cfg.matmul_n, run_tests=cfg.run_tests and not args.skip_tests)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).resolve().parent / "results"
    out = out_dir / "gpu_check.json"
    np.seterr(over="ignore", invalid="ignore")  # the first mixed step overflows on purpose (the scaler skips it)

    faulthandler.enable()  # a crash in native code (CUDA, a library) still prints where it happened
    ctx = Context(cfg, make_device(args.dry_run))
    run = Run(ctx, out, args.time_limit)
    if args.dry_run:
        print("DRY RUN: every section on NumPy (device 'cpu') at tiny sizes, no pytest; no GPU number is produced.")
    else:
        print(f"tinyamp GPU check ({cfg.mode}); time limit {args.time_limit:.0f} s")
    watchdog = threading.Timer(args.time_limit, run.on_time_limit)
    watchdog.daemon = True
    watchdog.start()
    faulthandler.dump_traceback_later(args.time_limit + 15, exit=True)  # the backstop if the watchdog cannot run
    try:
        for name, fn, limit_s in SECTIONS:
            if only is None or name in only:
                run.section(name, fn, limit_s)
    finally:
        watchdog.cancel()
        faulthandler.cancel_dump_traceback_later()
    return run.report()


if __name__ == "__main__":
    sys.exit(main())
