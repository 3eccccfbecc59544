"""Loss scaling alone repairs underflow: a word-level language model in fp32, fp16-master and mixed.

    python benchmarks/underflow_lm.py                 # seeds 0 1 2, 150 steps: about 32 minutes on 2 CPU cores
    python benchmarks/underflow_lm.py --seeds 0 --steps 300 --json benchmarks/results/underflow_lm.json
    python benchmarks/underflow_lm.py --quick         # 2 steps a run: checks that it runs
    python benchmarks/underflow_lm.py --device cuda --vocab-size all --batch-size 16384 --steps 200
                                                      # every token of the corpus, on a GPU (gpu_check's section)

The model is ``tinyamp train --model wordlm`` (``experiments.tasks.WordLM``): Bengio et al.'s
(2003) next-token model over the 4,096 most frequent tokens of the Python-source corpus,
8,192 predicted tokens a batch, Adam.  ``fp16-master`` (FP16 weights and activations, FP32
master weights, no loss scaling) and ``mixed`` (the same with the dynamic loss scale) differ
in one mechanism, so whatever separates them is loss scaling's doing.

Why underflow matters here and not on the digits: the gradient of the mean loss reaches a
non-target logit as $p / N$, and FP16 flushes it to 0 when $p / N \\le 2^{-25}$, that is
$p \\le N \\cdot 2^{-25} = 2.4 \\times 10^{-4}$ at $N = 8192$.  A softmax over 4,096 tokens puts
most of its tokens below that (1/4096 = 2.4e-4 is the uniform share), so without scaling
nothing pushes their logits down: only the target's logit, and the few likely tokens', get a
gradient.  With 10 classes (the digits) a probability is rarely that small.

Printed per seed: the validation loss of each regime, its gap to FP32's, the training loss
(mean of the last 10 steps) and underflow@end (of the nonzero FP32 gradient values, the share
0 in FP16 at the regime's scale).  The last lines check two claims on every seed:
``fp16-master`` ends above FP32's validation loss and further from it than ``mixed``, and
``mixed`` ends within 0.01 nats of FP32's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from tinyamp.engine.fast.allocator import keep_freed_memory  # noqa: E402
from tinyamp.experiments.blas_threads import one_blas_thread  # noqa: E402
from tinyamp.experiments.runner import run_regime  # noqa: E402
from tinyamp.experiments.tasks import WordLM  # noqa: E402

REGIMES = ("fp32", "fp16-master", "mixed")
MIXED_TOLERANCE = 0.01  # nats of validation loss: "mixed matches FP32"


def run_seed(seed: int, steps: int, **task: Any) -> dict[str, dict[str, Any]]:
    """Each regime's results.json entry (without the per-step series) plus its final training loss."""
    task = WordLM(seed=seed, **task)
    out = {}
    for regime in REGIMES:
        with np.errstate(all="ignore"):
            result, _ = run_regime(task, regime, steps, measure_every=max(1, steps // 6))
        entry = result.to_json()
        entry["train_loss_last10"] = float(np.mean(result.series["loss"][-10:]))
        for key in ("measured", "histogram"):  # the per-step series stays: the figure draws its losses
            entry.pop(key)
        out[regime] = entry
    return out


def format_seed(seed: int, regimes: dict[str, dict[str, Any]]) -> str:
    fp32 = regimes["fp32"]["metrics"]["val_loss"]
    lines = [f"seed {seed}:  {'regime':<12} {'val loss':>9} {'- fp32':>8} {'train loss':>10} "
             f"{'skipped':>7} {'underflow@end':>13}"]  # fmt: skip
    for name, r in regimes.items():
        val = r["metrics"]["val_loss"]
        under = "-" if r["underflow_fraction"] is None else f"{100 * r['underflow_fraction']:.1f}%"
        lines.append(f"         {name:<12} {val:9.4f} {val - fp32:+8.4f} {r['train_loss_last10']:10.4f} "
                     f"{r['skipped_steps']:7d} {under:>13}")  # fmt: skip
    return "\n".join(lines)


def claims(by_seed: dict[int, dict[str, dict[str, Any]]]) -> dict[str, bool]:
    """fp16-master ends above FP32 and further from it than mixed; mixed within MIXED_TOLERANCE of FP32."""
    gaps = {
        seed: {name: r[name]["metrics"]["val_loss"] - r["fp32"]["metrics"]["val_loss"] for name in REGIMES}
        for seed, r in by_seed.items()
    }
    return {
        "fp16-master ends above FP32, and further from it than mixed, on every seed": all(
            g["fp16-master"] > 0 and g["fp16-master"] > abs(g["mixed"]) for g in gaps.values()
        ),
        f"mixed ends within {MIXED_TOLERANCE} nats of FP32 on every seed": all(
            abs(g["mixed"]) <= MIXED_TOLERANCE for g in gaps.values()
        ),
    }


def draw(regimes: dict[str, dict[str, Any]], seed: int, sizes: dict[str, Any], path: Path) -> None:
    """The training loss of the three regimes (experiments.figures' loss curves), each labelled with its
    validation loss's gap to FP32's and its underflow@end."""
    from tinyamp.experiments.figures import draw_loss_curves

    fp32 = regimes["fp32"]["metrics"]["val_loss"]
    title = (f"word-level model: {sizes['vocab_size']:,} tokens of vocabulary, {sizes['batch_size']:,} a batch, "
             f"seed {seed}")  # fmt: skip
    fig = draw_loss_curves({"regimes": regimes}, title)
    ax = fig.axes[0]
    for line in ax.get_lines():
        name, _, rest = line.get_label().partition(" ")  # the figure may have added "(on top of ...)"
        r = regimes.get(name)
        if r is not None and r["underflow_fraction"] is not None:
            gap, lost = r["metrics"]["val_loss"] - fp32, 100 * r["underflow_fraction"]
            shown = f"{gap:+.3f}" if abs(gap) >= 5e-4 else "\u00b10.000"  # not "-0.000"
            label = f"{name}: val loss {shown} vs fp32's, {lost:.0f}% of gradient values 0 in FP16"
            line.set_label(label + (f"\n{rest}" if rest else ""))
    ax.legend(fontsize="x-small", loc="upper right")
    fig.savefig(path)


def vocabulary(text: str) -> int | None:
    """``--vocab-size``: a whole number, or "all" (None: every distinct token)."""
    if text == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'all'; got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="default 0 1 2")
    parser.add_argument("--steps", type=int, default=150, help="steps a run (default 150)")
    parser.add_argument("--vocab-size", type=vocabulary, default=4096,
                        help="tokens of the vocabulary (default 4096), or 'all': every token of the corpus")
    parser.add_argument("--batch-size", type=int, default=8192, help="predicted tokens a batch (default 8192)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="2 steps a run: checks that it runs")
    parser.add_argument("--json", type=Path, help="also write the rows there")
    parser.add_argument("--figure", type=Path, help="also draw the first seed's training losses there (PNG)")
    args = parser.parse_args(argv)
    if any(s < 0 for s in args.seeds):
        parser.error(f"--seeds must be whole numbers of 0 or more; got {args.seeds}")
    for flag, value, least in (("--steps", args.steps, 1), ("--vocab-size", args.vocab_size, 2),
                               ("--batch-size", args.batch_size, 1)):  # fmt: skip
        if value is not None and value < least:  # --vocab-size all is None
            parser.error(f"{flag} must be at least {least}; got {value}")
    sizes = {"vocab_size": args.vocab_size, "batch_size": args.batch_size, "device": args.device}
    keep_freed_memory()
    steps = 2 if args.quick else args.steps
    began = time.perf_counter()
    by_seed = {}
    with one_blas_thread():
        for seed in args.seeds:
            by_seed[seed] = run_seed(seed, steps, **sizes)
            print(format_seed(seed, by_seed[seed]), flush=True)
    held = claims(by_seed)
    for claim, ok in held.items():
        print(f"{claim}: {'yes' if ok else 'NO'}")
    seconds = time.perf_counter() - began
    print(f"{steps} steps a run; took {seconds:.0f} s")
    if args.json is not None:
        task = {k: v for k, v in vars(WordLM(**sizes)).items() if k not in ("dataset", "seed")}
        document = {"steps": steps, "task": task, "claims": held,
                    "seconds": seconds, "seeds": {str(s): r for s, r in by_seed.items()}}  # fmt: skip
        args.json.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if args.figure is not None:
        draw(by_seed[args.seeds[0]], args.seeds[0], sizes, args.figure)
    return 0 if args.quick or all(held.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
