"""gpu_check section "cli": ``tinyamp train``, ``tinyamp demo`` and tutorial 8, end to end on the device.

Each command runs in a subprocess, as a user would type it, with ``--device`` set to the
device under test and small step counts; the section checks the exit status and that
``results.json`` was written with a finite loss for every regime.  Tutorial 8 takes its
GPU branch wherever a GPU is visible.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from gpu_report import Section
from gpu_sections import Context, run_python

COMMANDS = {
    "train": ["train", "--precision", "mixed", "--steps", "30", "--quiet"],
    "demo": ["demo", "--steps", "30", "--transformer-steps", "5", "--quiet"],
}
TIMEOUT_S = 100.0


def _final_losses(results: dict) -> dict[str, float]:
    """Every number called *loss* in the regimes' summaries of a results.json, by regime."""
    found: dict[str, float] = {}

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("series", "per_step", "histograms"):
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool) and "loss" in key:
                    found[f"{path}/{key}"] = float(value)
                else:
                    walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{path}[{i}]")

    walk(results, "")
    return found


def cli(ctx: Context, sec: Section) -> None:
    """``tinyamp train`` and ``tinyamp demo`` with ``--device`` on the device under test."""
    device = ctx.dev.name
    for name, args in COMMANDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            full = [*args, "--device", device, "--out", tmp]
            sec.say("tinyamp " + " ".join(full[:-1]) + " DIR")
            code, out, seconds, _ = run_python(ctx, ["-m", "tinyamp", *full], TIMEOUT_S)
            tail = out.strip().splitlines()[-15:]
            print("\n".join("    | " + line for line in tail), flush=True)
            results_path = Path(tmp) / "results.json"
            if code != 0 or not results_path.exists():
                raise RuntimeError(
                    f"tinyamp {name} --device {device} exited with {code}; output ends:\n" + "\n".join(tail)
                )
            losses = _final_losses(json.loads(results_path.read_text()))
        if not losses or not all(math.isfinite(v) for v in losses.values()):
            raise RuntimeError(f"tinyamp {name} --device {device}: results.json has no finite losses: {losses}")
        sec.record(f"{name}_seconds", seconds, f"tinyamp {name} --device {device}",
                   f"ok in {seconds:.1f} s, {len(losses)} finite losses in results.json")  # fmt: skip
        sec.record(f"{name}_losses", losses)
    # Tutorial 8 measures Tensor Core speed and step memory live where a GPU is visible
    # (and shows CPU figures otherwise): run it as a reader would, and check that it finishes.
    with tempfile.TemporaryDirectory() as tmp:
        script = "tutorials/08_tensor_cores_and_speed.py"
        sec.say(f"python {script}")
        code, out, seconds, _ = run_python(ctx, [script], TIMEOUT_S, {"TINYAMP_TUTORIAL_OUT": tmp, "MPLBACKEND": "Agg"})
        tail = out.strip().splitlines()[-15:]
        print("\n".join("    | " + line for line in tail), flush=True)
        if code != 0:
            raise RuntimeError(f"{script} exited with {code}; output ends:\n" + "\n".join(tail))
    sec.record("tutorial8_seconds", seconds, "tutorial 08 (Tensor Cores and speed)", f"ok in {seconds:.1f} s")
