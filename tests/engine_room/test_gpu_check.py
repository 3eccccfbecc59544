"""benchmarks/gpu_check.py: its dry run (the same section code on NumPy) and its refusal without a GPU.

The GPU run itself needs a GPU; the dry run exercises the rest (timers, peak memory, ratios,
the table, the JSON) in a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tinyamp

pytestmark = pytest.mark.engine_room

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = ("env", "matmul", "mlp", "transformer", "tutorial8", "overhead", "kernels", "torch-amp",
            "torch-transformer", "torch-tiny", "cli", "tests", "underflow")  # fmt: skip
# the timings (seconds) each measuring section must report; the torch-* ones only where PyTorch is installed
TIMINGS = {
    "matmul": ("tinyamp_fp16_s", "cublas_fp16_s", "fp32_s", "tf32_s"),
    "mlp": ("fp32_step_s", "mixed_step_s"),
    "transformer": ("fp32_step_s", "mixed_step_s"),
    "tutorial8": ("fp32_step_s", "mixed_step_s"),
    "overhead": ("host_wall_s", "event_s", "mixed_wall_s", "mixed_host_s"),
    "torch-amp": ("torch_amp_step_s",),
    "torch-transformer": ("fp32_step_s", "amp_step_s"),
    "torch-tiny": ("amp_host_s",),
    "cli": ("train_seconds", "demo_seconds"),
}


def run_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # one BLAS thread: the dry run spawns `tinyamp demo`, and OpenBLAS threads spinning against
    # another process on a loaded machine made it 100x slower (killed by its section timeout)
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_dry_run_prints_every_section_and_writes_positive_timings(tmp_path: Path) -> None:
    result = run_script(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "DRY RUN" in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0] == "| section | metric | value | target | met? |"
    for name in SECTIONS:
        assert any(line.startswith(f"| {name} |") for line in table), f"no table row for section {name}"
    assert "No number in this table was estimated" in out

    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["meta"]["dry_run"] is True and doc["meta"]["complete"] is True and doc["meta"]["failed"] == []
    sections = doc["sections"]
    assert list(sections) == list(SECTIONS)
    assert sections["tests"]["status"] == "skipped"  # no pytest subprocess in a dry run
    assert sections["kernels"]["status"] == "skipped"  # the kernel tables need a GPU
    torch_missing = sections["torch-amp"]["status"] == "skipped"
    for name, section in sections.items():
        assert isinstance(section["seconds"], float) and section["seconds"] > 0
        if name.startswith("torch-") and torch_missing:
            continue
        if name in TIMINGS:
            assert section["status"] == "ok", section["error"]
            for key in TIMINGS[name]:
                value = section["metrics"][key]
                assert isinstance(value, float) and value > 0, (name, key, value)
    assert sections["matmul"]["metrics"]["tinyamp_error"] < 1e-2
    assert sections["mlp"]["metrics"]["fp32_peak_bytes"] > 0 and sections["mlp"]["metrics"]["mixed_peak_bytes"] > 0
    profile = sections["overhead"]["metrics"]["mixed_host_profile"]  # where the tiny step's host time goes
    assert profile and all(row["ms_per_step"] >= 0 and row["calls_per_step"] > 0 for row in profile)


@pytest.mark.skipif(tinyamp.cuda_is_available(), reason="a GPU is usable here: the script would run for real")
def test_without_a_gpu_it_says_so_and_exits_with_status_2(tmp_path: Path) -> None:
    result = run_script(tmp_path, "--skip-tests")
    assert result.returncode == 2
    assert "no CUDA GPU is usable" in result.stderr and "--dry-run" in result.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_kernel_tables_count_kernels_copies_and_findings_not_runtime_calls() -> None:
    """gpu_profile.kernel_table on records as PyTorch's profiler gives them (no GPU needed)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_profile import kernel_table

    records = [
        ("tinyamp_scaled_sum_of_squares", 6000.0, 6), ("cupy_add__float16_float16_float16", 1500.0, 9),
        ("Memcpy DtoH (Device -> Pageable)", 30.0, 3), ("Memset (Device)", 3.0, 3),
        ("cuLaunchKernel", 0.0, 12), ("cudaStreamIsCapturing", 0.0, 4), ("Activity Buffer Request", 0.0, 1),
    ]  # fmt: skip
    table = kernel_table(records, steps=3)
    assert table.launches == 5  # 15 kernels in 3 steps: the runtime API calls are not kernels
    assert table.device_to_host == 1
    assert abs(table.busy_s - 2.5e-3) < 1e-12
    assert [name for name, _, _ in table.kernels] == [
        "tinyamp_scaled_sum_of_squares",
        "cupy_add__float16_float16_float16",
    ]
    assert table.findings() == ["tinyamp_scaled_sum_of_squares takes 80.0% of the step's GPU time (2.00 ms a step)"]
    assert table.top(1)[0]["share"] == 0.8
