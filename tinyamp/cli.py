"""The ``tinyamp`` command.

    tinyamp info                 versions, backends, GPU
    tinyamp train [options]      train a model and print its loss and accuracy

Bad input exits with status 2 and a message that says what to type instead.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import numpy as np

MODELS = ("mlp",)


def info() -> int:
    """Print versions and which backends this machine has."""
    import tinyamp
    from tinyamp import backend

    print(f"tinyamp {tinyamp.__version__}")
    print(f"python  {platform.python_version()} ({platform.machine()})")
    print(f"numpy   {np.__version__}")
    try:
        import cupy

        print(f"cupy    {cupy.__version__}")
    except ImportError:
        print("cupy    not installed (pip install 'tinyamp[cuda12]' for an NVIDIA GPU)")
    if backend.cuda_is_available():
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        print(f"gpu     {props['name'].decode()} ({props['totalGlobalMem'] / 2**30:.0f} GiB)")
    else:
        print("gpu     none found: device='cuda' is unavailable, tinyamp runs on the CPU")
    return 0


def train(args: argparse.Namespace) -> int:
    """Train an MLP in FP32 on the spiral dataset with SGD and report loss and accuracy."""
    import tinyamp as ta
    from tinyamp import nn, optim
    from tinyamp.data import spiral

    ta.manual_seed(args.seed)
    x, y = spiral(seed=args.seed)
    model = nn.MLP([2, args.hidden, args.hidden, 3]).to(args.device)
    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    xs, ys = ta.tensor(x, device=args.device), ta.tensor(y, device=args.device)
    order = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = order.integers(0, len(y), size=args.batch_size)
        loss = ta.cross_entropy(model(xs[batch]), ys[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not args.quiet and (step % max(args.steps // 10, 1) == 0 or step == 1):
            print(f"step {step:5d}  loss {loss.item():.4f}")
    elapsed = time.perf_counter() - start
    with ta.no_grad():
        logits = model(xs)
        final = ta.cross_entropy(logits, ys).item()
        accuracy = float((logits.numpy().argmax(axis=1) == y).mean())
    print(f"final loss {final:.4f}  accuracy {100 * accuracy:.1f}%  ({1e3 * elapsed / args.steps:.2f} ms/step)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinyamp", description="Mixed-precision training you can read.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, backends and GPU")
    t = sub.add_parser("train", help="train a model (FP32 MLP on the spiral dataset)")
    t.add_argument("--model", choices=MODELS, default="mlp")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--lr", type=float, default=0.1)
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cpu", help="cpu or cuda")
    t.add_argument("--quiet", action="store_true", help="print only the final line")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return info()
    from tinyamp.backend import DeviceError, check_device

    try:
        check_device(args.device)
        if args.device != "cpu":
            from tinyamp.backend import array_module

            array_module(args.device)
    except DeviceError as exc:
        print(f"tinyamp: error: {exc}", file=sys.stderr)
        return 2
    for name in ("steps", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            print(f"tinyamp: error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    return train(args)
