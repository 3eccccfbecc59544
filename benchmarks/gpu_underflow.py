"""gpu_check section "underflow": benchmarks/underflow_lm.py at a GPU's scale, fp32 / fp16-master / mixed.

On a CPU the study runs at 4,096 tokens of vocabulary and 8,192 predicted tokens a batch (30
minutes); a GPU takes the whole corpus vocabulary (every token: 6,243 ids with Python 3.11) and
16,384 tokens a batch, 200 steps on three seeds.  The section records each seed's validation
loss gaps to FP32 and whether the study's two claims held: fp16-master ends above FP32 and
further from it than mixed, and mixed ends within 0.01 nats of FP32.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from gpu_report import Section
from gpu_sections import Context, run_python

FULL = ["--vocab-size", "all", "--batch-size", "16384", "--steps", "200", "--seeds", "0", "1", "2"]
DRY_RUN = ["--vocab-size", "256", "--batch-size", "256", "--quick", "--seeds", "0"]
TIMEOUT_S = 200.0


def underflow(ctx: Context, sec: Section) -> None:
    """The study in a subprocess on the device under test; its JSON read back into the section's metrics."""
    sizes = DRY_RUN if ctx.cfg.mode == "dry run" else FULL
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "underflow_lm.json"
        args = ["benchmarks/underflow_lm.py", "--device", ctx.dev.name, *sizes, "--json", str(out)]
        sec.say("python " + " ".join(args[:-2]))
        code, text, seconds, timed_out = run_python(ctx, args, TIMEOUT_S)
        print("\n".join("    | " + line for line in text.strip().splitlines()[-16:]), flush=True)
        if timed_out or not out.exists():
            raise RuntimeError(f"underflow_lm.py {'timed out' if timed_out else f'exited with {code}'} "
                               f"after {seconds:.0f} s, without its JSON")  # fmt: skip
        doc = json.loads(out.read_text())
    for seed, regimes in doc["seeds"].items():
        fp32 = regimes["fp32"]["metrics"]["val_loss"]
        gaps = {name: regimes[name]["metrics"]["val_loss"] - fp32 for name in ("fp16-master", "mixed")}
        sec.record(f"seed{seed}_gaps", gaps, f"seed {seed}: val loss - fp32's",
                   f"fp16-master {gaps['fp16-master']:+.4f}, mixed {gaps['mixed']:+.4f}")  # fmt: skip
    for i, (claim, held) in enumerate(doc["claims"].items()):
        sec.record(f"claim{i}", held, claim, "yes" if held else "no", target="yes", met=held)
    sec.record("seconds", seconds, "the study's wall time", f"{seconds:.0f} s")
