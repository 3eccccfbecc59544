"""Where a training step's GPU time goes: kernel tables from PyTorch's profiler, for gpu_check.py.

PyTorch's profiler (CUPTI underneath) records every kernel the GPU runs, CuPy's and
cuBLAS's included, with its name and its time on the device.  ``profile_step`` runs a
step a few times under it; ``kernel_table`` groups what it recorded by kernel name:

* the GPU time of each kernel per step, and its share of all the step's kernel time;
* launches per step (kernels, not copies);
* device-to-host copies per step: each makes the host wait for the GPU.

``kernel_table`` is plain Python over (name, microseconds, count) records, so the tests
check it on the CPU; ``profile_step`` needs a GPU and PyTorch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KernelTable:
    """One step's GPU work, grouped by kernel name (times in seconds per step)."""

    steps: int
    busy_s: float  # all kernels' device time per step (copies not counted)
    launches: float  # kernels launched per step
    device_to_host: float  # device-to-host copies per step
    kernels: list[tuple[str, float, float]] = field(default_factory=list)  # (name, seconds, launches), slowest first

    def share(self, seconds: float) -> float:
        """A kernel's time as a fraction of all the step's kernel time."""
        return seconds / self.busy_s if self.busy_s > 0 else 0.0

    def top(self, n: int = 8) -> list[dict[str, Any]]:
        """The n slowest kernels, for the JSON and the table."""
        return [{"kernel": name, "ms_per_step": 1e3 * s, "share": self.share(s), "launches_per_step": k}
                for name, s, k in self.kernels[:n]]  # fmt: skip

    def findings(self, limit: float = 0.5) -> list[str]:
        """Every kernel that takes more than `limit` of the step's kernel time, in one sentence each."""
        return [f"{name} takes {100 * self.share(s):.1f}% of the step's GPU time ({1e3 * s:.2f} ms a step)"
                for name, s, _ in self.kernels if self.share(s) > limit]  # fmt: skip


def _is_copy(name: str) -> bool:
    return name.startswith(("Memcpy", "Memset")) or "memcpy" in name.lower() or "memset" in name.lower()


def _is_runtime_call(name: str) -> bool:
    """A CUDA runtime or driver API call (cudaLaunchKernel, cuLaunchKernel, ...) or a profiler record, not a kernel."""
    return re.match(r"cu(da)?[A-Z]", name) is not None or name.startswith("Activity Buffer")


def kernel_table(records: Iterable[tuple[str, float, int]], steps: int) -> KernelTable:
    """Group (name, device microseconds, count) records of `steps` steps into a KernelTable."""
    by_name: dict[str, list[float]] = {}
    d2h = 0
    for name, micros, count in records:
        if _is_runtime_call(name):
            continue
        if _is_copy(name):
            if "DtoH" in name or "Device -> Pageable" in name or "Device -> Pinned" in name:
                d2h += count
            continue
        entry = by_name.setdefault(name, [0.0, 0.0])
        entry[0] += micros * 1e-6 / steps
        entry[1] += count / steps
    kernels = sorted(((n, s, k) for n, (s, k) in by_name.items()), key=lambda row: -row[1])
    busy = sum(s for _, s, _ in kernels)
    return KernelTable(steps, busy, sum(k for _, _, k in kernels), d2h / steps, kernels)


def profile_step(torch: Any, step: Callable[[], None], steps: int = 3) -> KernelTable:  # pragma: no cover - GPU
    """Run `step` `steps` times under PyTorch's CUDA profiler (after one call outside it) and tabulate it."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    records = []
    for event in prof.key_averages():
        micros = getattr(event, "device_time_total", None)
        if micros is None:
            micros = getattr(event, "cuda_time_total", 0.0)
        if micros or event.count:
            records.append((event.key, float(micros), int(event.count)))
    return kernel_table(records, steps)


def short(name: str, width: int = 60) -> str:
    """A kernel's name cut to `width` characters for a table cell (templates make them long)."""
    name = name.replace("|", "/")
    return name if len(name) <= width else name[: width - 3] + "..."


def kernels(ctx: Any, sec: Any) -> None:  # pragma: no cover - needs a GPU and PyTorch
    """Kernel tables of tinyamp's mixed-precision steps: MLP, transformer, tutorial 8's MLP, the tiny MLP.

    Each step is built afresh (in FP16 with FP32 masters), run once, then profiled over a few
    steps.  Reported per workload: kernel time and launches per step, device-to-host copies per
    step (target: at most one), the slowest kernels with their share, and as a finding any kernel
    that takes more than half of the step's GPU time.
    """
    from gpu_report import ms
    from gpu_sections import Skip
    from gpu_training import mixed_step, mlp_workload, transformer_workload

    if ctx.dev.name != "cuda":
        raise Skip("kernel tables need a GPU (PyTorch's CUDA profiler)")
    try:
        import torch
    except ImportError as exc:
        raise Skip("PyTorch is not importable here: its profiler makes the kernel tables") from exc
    cfg = ctx.cfg
    workloads = {
        "mlp": lambda: mlp_workload(ctx, cfg.mlp_sizes, cfg.mlp_batch),
        "transformer": lambda: transformer_workload(ctx),
        "tutorial8": lambda: mlp_workload(ctx, cfg.tutorial8_sizes, cfg.tutorial8_batch, seed=3),
        "tiny": lambda: mlp_workload(ctx, cfg.tiny_sizes, cfg.tiny_batch, seed=2),
    }
    for name, build in workloads.items():
        step = mixed_step(build())
        table = profile_step(torch, step)
        del step
        ctx.dev.free()
        sec.record(f"{name}_busy_s", table.busy_s, f"{name}: GPU kernel time per mixed step", shown=ms(table.busy_s))
        launch_target = 73 if name == "tiny" else None
        sec.record(f"{name}_launches", table.launches, f"{name}: kernel launches per mixed step",
                   shown=f"{table.launches:.0f}", target="<= 73" if launch_target else "",
                   met=table.launches <= launch_target if launch_target else None)  # fmt: skip
        sec.record(f"{name}_device_to_host", table.device_to_host, f"{name}: device-to-host copies per step",
                   shown=f"{table.device_to_host:g}", target="<= 1", met=table.device_to_host <= 1)  # fmt: skip
        sec.record(f"{name}_top", table.top(400))  # every kernel, for the JSON
        for row in table.top(5):
            sec.record(f"{name}_k_{row['kernel'][:40]}", row["ms_per_step"], f"{name}: {short(row['kernel'])}",
                       shown=f"{row['ms_per_step']:.3f} ms, {100 * row['share']:.1f}%, "
                       f"{row['launches_per_step']:g} launches")  # fmt: skip
        findings = table.findings()
        sec.record(f"{name}_findings", findings, f"{name}: kernels above half of the step's GPU time",
                   shown="; ".join(findings) or "none", target="none", met=not findings)  # fmt: skip
        for line in findings:
            sec.say(f"FINDING ({name}): {line}")
