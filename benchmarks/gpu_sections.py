"""gpu_check.py's configuration and context, and its first sections: environment, GPU tests, matmul.

Each section takes the run's Context and the Section it fills in.  The same code runs on
the GPU and, for ``--dry-run``, on NumPy at tiny sizes: only gpu_device.py knows which
device it is talking to.  The training sections are in gpu_training.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gpu_device import Device, measure, relative_error, tf32_matmul
from gpu_report import Section, mib, ms

import tinyamp as ta

ROOT = Path(__file__).resolve().parents[1]


class Skip(Exception):
    """Raised by a section that does not apply here; the message says why."""


@dataclass(frozen=True)
class Config:
    """Sizes and repetitions of one run (full, quick or dry run)."""

    mode: str
    matmul_n: int
    mlp_sizes: tuple[int, ...]
    mlp_batch: int
    transformer: dict[str, int]  # vocab, block, dim, heads, layers, batch
    tutorial8_sizes: tuple[int, ...] = (1024, 4096, 4096, 10)
    tutorial8_batch: int = 1024
    tiny_sizes: tuple[int, ...] = (64, 64, 10)
    tiny_batch: int = 32
    warmup: int = 3
    reps: int = 10
    matmul_inner: int = 5
    step_budget_s: float = 12.0
    tests_timeout_s: float = 150.0
    run_tests: bool = True


@dataclass
class Context:
    """What the sections share: the configuration, the device, the sections run so far, child processes."""

    cfg: Config
    dev: Device
    sections: list[Section] = field(default_factory=list)
    children: list[int] = field(default_factory=list)

    def done(self, name: str) -> Section | None:
        """The section called `name` if it ran and succeeded."""
        return next((s for s in self.sections if s.name == name and s.status == "ok"), None)


# ---- 1. environment --------------------------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def environment(ctx: Context, sec: Section) -> None:
    """GPU, driver, CUDA runtime and library versions (torch's from its metadata: it is not imported here)."""
    dev = ctx.dev
    sec.record("python", platform.python_version())
    sec.record("numpy", np.__version__)
    sec.record("torch", _version("torch"))
    sec.record("tinyamp.cuda_is_available", ta.cuda_is_available())
    if dev.name == "cuda":
        cupy = dev.xp
        runtime = cupy.cuda.runtime
        device = cupy.cuda.Device()
        props = runtime.getDeviceProperties(device.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        sec.record("gpu", name)
        sec.record("compute_capability", device.compute_capability)
        sec.record("gpu_memory_bytes", device.mem_info[1])
        sec.record("driver", _cuda_version(runtime.driverGetVersion()))
        sec.record("runtime", _cuda_version(runtime.runtimeGetVersion()))
        sec.record("cupy", cupy.__version__)
        gpu = f"{name} (sm_{device.compute_capability}, {mib(device.mem_info[1])})"
        cuda = f"driver {sec.metrics['driver']}, runtime {sec.metrics['runtime']}"
    else:
        sec.record("cpu", platform.processor() or platform.machine())
        gpu, cuda = "none: dry run on the CPU (NumPy)", "not used (dry run)"
        sec.record("cupy", "not used (dry run)")
    sec.record("gpu_row", gpu, "GPU")
    sec.record("cuda_row", cuda, "CUDA")
    versions = f"python {sec.metrics['python']}, numpy {np.__version__}, cupy {sec.metrics['cupy']}, "
    sec.record("versions_row", versions + f"torch {sec.metrics['torch']}", "versions")
    available = sec.metrics["tinyamp.cuda_is_available"]
    if dev.name == "cuda":
        sec.record("available_row", available, "tinyamp.cuda_is_available()", target="True", met=available)
    else:
        sec.record("available_row", available, "tinyamp.cuda_is_available()")
    t0 = time.perf_counter()
    smoke_test(dev.name)
    sec.record("smoke_row", f"ok in {time.perf_counter() - t0:.1f} s", "smoke test (GemmEx product, one mixed step)")


def smoke_test(device: str) -> None:
    """Fail early, with a clear message, where the whole run would fail later.

    ``cupy.is_available()`` says True even when cuBLAS cannot be loaded or the float16
    headers are missing for NVRTC; this loads cuBLAS, checks one float16 product (exact on
    small integers), and runs one mixed-precision step (tinyamp/engine/cuda/scaler_step.py: the scaled
    sums of squares and the fused master updates).
    """
    from tinyamp import backend, nn, optim
    from tinyamp.amp import LossScaler, MasterWeights, autocast

    if device == "cuda":
        backend.cublas()  # a DeviceError naming the fix if libcublas cannot be loaded
    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    b = np.arange(20, dtype=np.float16).reshape(4, 5) - 9
    product = ta.matmul(ta.tensor(a, device=device), ta.tensor(b, device=device)).numpy()
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    if product.dtype != np.float16 or not np.array_equal(product, expected):
        raise RuntimeError(f"float16 matmul on {device}: got {product.tolist()}, expected {expected.tolist()}")
    ta.manual_seed(0)
    model = nn.MLP([8, 16, 4]).to(device).half()
    # untracked masters: the whole step on the device (the scaled sums of squares and the fused updates)
    sgd = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt, scaler = MasterWeights(sgd, track_lost_updates=False), LossScaler(init_scale=2.0**10)
    x = ta.tensor(np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8), device=device)
    y = ta.tensor(np.array([0, 1, 2, 3]), device=device)
    with autocast():
        loss = ta.cross_entropy(model(x), y)
    scaler.scale_loss(loss).backward()
    report = scaler.step(opt)
    weights = np.concatenate([p.numpy().ravel() for p in model.parameters()])
    if report.skipped or not np.isfinite(weights).all():
        raise RuntimeError(f"one mixed-precision step on {device}: skipped={report.skipped}, {report}")


# ---- 2. tinyamp's test-suite on the GPU --------------------------------------------------------------------
def _junit_counts(path: Path) -> dict[str, int] | None:
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def run_python(ctx: Context, args: list[str], timeout_s: float, extra_env: dict[str, str] | None = None
               ) -> tuple[int, str, float, bool]:  # fmt: skip
    """``python ARGS`` from the repository root, in its own process group (killed whole on timeout).

    Returns (return code, output, seconds, timed out); the watchdog can kill it meanwhile
    through ``ctx.children``.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.update(extra_env or {})
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    ctx.children.append(proc.pid)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
        out, _ = proc.communicate()
    except BaseException:  # the section's alarm, or Ctrl-C: never leave a child loading the GPU
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        ctx.children.remove(proc.pid)
    return proc.returncode, out, time.perf_counter() - t0, timed_out


def gpu_tests(ctx: Context, sec: Section) -> None:
    """``pytest -k cuda tests`` in a subprocess with a timeout: the GPU parametrizations of the suite.

    pyproject's addopts already pass -q; a second -q would hide the summary line, so none
    is added.  Counts come from the JUnit XML report (robust), the log tail from stdout.
    """
    if not ctx.cfg.run_tests:
        raise Skip("not run (dry run or --skip-tests)")
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        args = ["-m", "pytest", "-p", "no:cacheprovider", "-k", "cuda", "--tb=short", "-rfE", f"--junitxml={xml}",
                "tests"]  # fmt: skip
        sec.say(" ".join(["python"] + args[:-2] + ["tests"]) + f"  (timeout {ctx.cfg.tests_timeout_s:.0f} s)")
        t0 = time.perf_counter()
        code, out, _, timed_out = run_python(ctx, args, ctx.cfg.tests_timeout_s)
        counts = _junit_counts(xml)
    tail = out.splitlines()[-60:]
    print("\n".join("    | " + line for line in tail), flush=True)
    sec.record("returncode", code)
    sec.record("seconds", time.perf_counter() - t0)
    sec.record("timed_out", timed_out)
    sec.record("output_tail", tail)
    if timed_out:
        raise TimeoutError(f"pytest did not finish within {ctx.cfg.tests_timeout_s:.0f} s (killed)")
    if counts is None:
        raise RuntimeError(f"pytest wrote no JUnit report (return code {code}, timed out: {timed_out})")
    sec.record("counts", counts)
    bad = counts["failures"] + counts["errors"]
    shown = f"{counts['passed']} passed, {bad} failed or errors, {counts['skipped']} skipped"
    ok = bad == 0 and counts["passed"] > 0
    sec.record("summary", shown, "pytest -k cuda", target="0 failed, > 0 passed", met=ok)
    if not ok:
        raise RuntimeError(f"GPU tests: {shown} (pytest return code {code})")


# ---- 3. matmul throughput ------------------------------------------------------------------------------------
def matmul(ctx: Context, sec: Section) -> None:
    """tinyamp FP16 against cuBLAS FP16, FP32 (no TF32) and TF32 at n^3; results checked against each other."""
    dev, cfg, xp, n = ctx.dev, ctx.cfg, ctx.dev.xp, ctx.cfg.matmul_n
    rng = np.random.default_rng(0)
    a32, b32 = (dev.put(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(2))  # full 24-bit values
    a16, b16 = a32.astype(xp.float16), b32.astype(xp.float16)
    ta_a, ta_b = ta.tensor(a16, device=dev.name), ta.tensor(b16, device=dev.name)
    out32 = xp.empty((n, n), dtype=xp.float32)
    cuda, ref = dev.name == "cuda", ("CuPy" if dev.name == "cuda" else "NumPy")
    sec.record("n", n, "size", shown=f"{n} x {n} @ {n} x {n}")
    sec.record("cupy_tf32_env", os.environ.get("CUPY_TF32"))

    c_ta = ta.matmul(ta_a, ta_b).data
    if c_ta.dtype != np.float16:
        raise TypeError(f"ta.matmul of two float16 tensors returned {c_ta.dtype}, expected float16")
    c64 = a16.astype(xp.float64) @ b16.astype(xp.float64)  # exact inputs of the FP16 products
    errors = {"tinyamp_vs_fp16": relative_error(c_ta, a16 @ b16), "tinyamp_vs_fp64": relative_error(c_ta, c64)}
    c64 = a32.astype(xp.float64) @ b32.astype(xp.float64)  # FP32 inputs have 24 bits: TF32 rounds them to 11
    errors["fp32_vs_fp64"] = relative_error(a32 @ b32, c64)
    errors["tf32_vs_fp64"] = relative_error(tf32_matmul(dev, a32, b32, out32), c64)
    del c_ta, c64
    sec.record("relative_errors", errors)
    worst = max(errors["tinyamp_vs_fp16"], errors["tinyamp_vs_fp64"])
    sec.record("tinyamp_error", worst, f"tinyamp FP16 result vs {ref} FP16 and FP64 (rel. Frobenius)",
               shown=f"{worst:.2e}", target="< 1e-2", met=worst < 1e-2)  # fmt: skip
    fp32_ok = errors["fp32_vs_fp64"] < 2e-5
    sec.record("fp32_error", errors["fp32_vs_fp64"], f"FP32 ({ref} @) result vs FP64 (TF32 would miss this)",
               shown=f"{errors['fp32_vs_fp64']:.2e}", target="< 2e-5", met=fp32_ok)  # fmt: skip
    sec.record("tf32_error", errors["tf32_vs_fp64"], "TF32 result vs FP64", shown=f"{errors['tf32_vs_fp64']:.2e}",
               target="< 1e-2", met=errors["tf32_vs_fp64"] < 1e-2)  # fmt: skip

    contenders: dict[str, tuple[str, Callable[[], Any]]] = {
        "tinyamp_fp16": ("tinyamp FP16 (ta.matmul)", lambda: ta.matmul(ta_a, ta_b)),
        "cublas_fp16": ("cuBLAS FP16, FP32 accumulate (CuPy @)" if cuda else "NumPy float16 @ (dry run)",
                        lambda: a16 @ b16),
        "fp32": ("FP32, no TF32 (CuPy @)" if cuda else "NumPy float32 @ (dry run)", lambda: a32 @ b32),
        "tf32": ("TF32 (cuBLAS GemmEx, FAST_TF32)" if cuda else "float32 @ standing in for TF32 (dry run)",
                 lambda: tf32_matmul(dev, a32, b32, out32)),
    }  # fmt: skip
    flops = 2.0 * n**3
    for key, (label, fn) in contenders.items():
        t = measure(dev.clock, fn, cfg.warmup, cfg.reps, cfg.matmul_inner, budget_s=8.0)
        sec.record(f"{key}_s", t.median_s)
        sec.record(f"{key}_tflops", flops / t.median_s / 1e12, label,
                   shown=f"{ms(t.median_s)}, {flops / t.median_s / 1e12:.3g} TFLOP/s")  # fmt: skip
        sec.record(f"{key}_samples", t.samples)
    ratio = sec.metrics["cublas_fp16_s"] / sec.metrics["tinyamp_fp16_s"]
    sec.record("tinyamp_over_cublas_throughput", ratio, f"tinyamp / {ref} FP16 @ throughput", shown=f"{ratio:.3f}",
               target=">= 0.90", met=ratio >= 0.90)  # fmt: skip
    if worst >= 1e-2:
        raise AssertionError(f"tinyamp's FP16 product is wrong: relative error {worst:.3g} (limit 1e-2)")
    if errors["tf32_vs_fp64"] >= 1e-2:
        raise AssertionError(f"the TF32 GemmEx result is wrong: relative error {errors['tf32_vs_fp64']:.3g}")
