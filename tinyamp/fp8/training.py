"""Training in FP8: every Linear layer's three products take 8-bit inputs, emulated on NumPy.

A Linear layer computes y = x W^T + b forward, and backward dx = g W (dgrad) and
dW = g^T x (wgrad).  Under ``fp8.autocast(model)`` each of these products takes FP8 operands:

=============  =========================  =============  =========================================
recipe         x and W (forward)          g (backward)   scales
=============  =========================  =============  =========================================
``fp8``        E4M3                       E5M2           one per tensor, delayed: from the amax
                                                         history (``ScalingRecipe()``, Transformer
                                                         Engine's ``DelayedScaling`` defaults)
``fp8-current``  E4M3                     E5M2           one per tensor, from its own amax now
``mxfp8``      E4M3                       E5M2           a power of two per 32 values (OCP MX),
                                                         rounded up (``BlockCasts``)
=============  =========================  =============  =========================================

E4M3 has the precision the forward pass needs and E5M2 the range of gradients ("HYBRID").
Products of two FP8 values are exact in float32 and are summed in float32, then scaled back
(``products.fp8_matmul``; for MXFP8 each value is decoded with its block's power of two,
exactly, and the products summed in float32 the same way).  The bias is added in float32
after the product, and its gradient is the float32 sum of the rows of g, not quantized, as
Transformer Engine's fused bias gradient takes it from the unquantized g.  The rest of the
model (embeddings, layer norm, attention's own products, softmax, the loss) runs in FP32, and
the weights are FP32: they are the master weights, cast to E4M3 afresh by every forward.
The casts and products run through ``seam.py`` (``tinyamp.kernels``): the chapter's bits, in the
engine room's compiled loops where they apply.

**What is recorded.**  A forward with gradients enabled (a training step) and every backward
cast through the tensor's scaling state, which advances and records the cast (scale, amax,
values saturated, flushed to zero, not finite): each tensor is cast once per step, so its
cast i is training step i.  A forward under ``no_grad`` (evaluation) casts with the current
scales and records nothing, so scoring a model leaves its scales as they were.

**MXFP8 needs two casts of each operand.**  A block's 32 values must lie along the sum of
the product (the OCP rule, so that one block scale multiplies each partial sum): x and W
along their inputs for the forward, g along the outputs for dgrad, and x, W and g once more
along the batch or the outputs (``.input.T``, ``.weight.T``, ``.grad_output.T``), cast from
their float32 values, as Transformer Engine keeps a "columnwise" copy.  An axis that 32 does
not divide is padded with zeros, which change no block's amax and add 0 to every sum.

**Not a number.**  A value that is inf or NaN before the cast is cast to NaN, never to the
largest value (``TensorScaling.quantize``; the MXFP8 path marks its rows NaN), and counted.
The NaN reaches the layer's output, the loss and the gradients, so the loss scaler's check
skips the step as it skips an overflow (``LossScaler(mode="off")`` still checks), and the
scale of that tensor is held.  ``summary()["nonfinite"]`` lists each such cast: its tensor,
its step and how many values.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tinyamp.fp8.blocks import BlockTensor
from tinyamp.fp8.formats import E4M3, E5M2, decode, decode_e8m0
from tinyamp.fp8.scales import Fp8Scales
from tinyamp.fp8.scaling import Fp8Tensor, ScalingRecipe
from tinyamp.fp8.seam import TensorScaling, fp8_matmul
from tinyamp.fp8.seam import quantize_blocks as quantize
from tinyamp.function import Function
from tinyamp.grad_mode import is_grad_enabled
from tinyamp.nn.linear import Linear as LinearLayer
from tinyamp.nn.module import Module
from tinyamp.tensor import Tensor

RECIPES = {
    "fp8": "FP8 products (E4M3 forward, E5M2 gradients), delayed per-tensor scaling, FP32 master weights",
    "fp8-current": "FP8 products (E4M3 forward, E5M2 gradients), current per-tensor scaling, FP32 master weights",
    "mxfp8": "MXFP8 products (E4M3 forward, E5M2 gradients), a power-of-two scale per 32 values, FP32 masters",
}
MX_BLOCK = 32
PASS_OF = {"input": "forward", "weight": "forward", "grad_output": "backward"}


def fp8_training(recipe: str) -> Fp8Casts:
    """The casts of the FP8 recipe called `recipe` ("fp8", "fp8-current" or "mxfp8")."""
    if recipe == "fp8":
        return PerTensorCasts(recipe, ScalingRecipe())
    if recipe == "fp8-current":
        return PerTensorCasts(recipe, ScalingRecipe(recipe="current"))
    if recipe == "mxfp8":
        return BlockCasts(recipe)
    raise ValueError(f"unknown FP8 recipe {recipe!r}; use one of {', '.join(RECIPES)}")


class Fp8Linear(Function):
    """$y = x W^T + b$ with the three products in FP8 (the recipe's ``forward`` and ``backward``)."""

    def forward(self, x: Any, weight: Any, bias: Any = None, casts: Any = None, name: str = "") -> Any:
        self.casts, self.layer, self.x_shape, self.x_dtype = casts, name, x.shape, x.dtype
        self.bias_dtype = None if bias is None else bias.dtype
        rows = x.reshape(-1, x.shape[-1])
        y, arrays, self.meta = casts.forward(name, rows, weight, record=is_grad_enabled())
        self.save_for_backward(*arrays)  # one byte a value: the FP8 copies, not the float32 inputs
        if bias is not None:
            y = y + bias.astype(np.float32)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    def backward(self, g: Any) -> tuple[Any, ...]:
        need_x, need_w, *need_b = self.needs_input_grad
        rows = g.reshape(-1, g.shape[-1]).astype(np.float32, copy=False)
        gx, gw = self.casts.backward(self.layer, rows, self.saved, self.meta, need_x, need_w)
        gx = None if gx is None else gx.astype(self.x_dtype, copy=False).reshape(self.x_shape)
        if self.bias_dtype is None:
            return gx, gw
        gb = rows.sum(axis=0, dtype=np.float32).astype(self.bias_dtype, copy=False) if need_b[0] else None
        return gx, gw, gb


def fp8_linear(x: Tensor, layer: LinearLayer, casts: Fp8Casts, name: str) -> Tensor:
    """The Linear `layer` (called `name` in its model) applied to `x` with FP8 products."""
    if x.ndim == 0 or x.shape[-1] != layer.in_features:
        raise ValueError(f"{name}: input of shape {x.shape} does not fit Linear({layer.in_features}, "
                         f"{layer.out_features}): its last axis must be {layer.in_features}")  # fmt: skip
    params = (layer.weight,) if layer.bias is None else (layer.weight, layer.bias)
    return Fp8Linear.apply(x, *params, casts=casts, name=name)


class Fp8Casts:
    """What a recipe shares: the context that routes a model's Linear layers, the record, the summary."""

    recipe: str

    @contextlib.contextmanager
    def autocast(self, model: Module) -> Iterator[None]:
        """Within the block, every Linear layer of `model` computes its products in FP8 (weights named as
        in ``model.named_modules()``: "0", "blocks.1.mlp.0"); outside, the model is as it was."""
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LinearLayer)]
        before = [m.__dict__.get("forward") for _, m in layers]
        for name, layer in layers:
            layer.forward = functools.partial(fp8_linear, layer=layer, casts=self, name=name)
        try:
            yield
        finally:
            for (_, layer), previous in zip(layers, before):
                if previous is None:
                    del layer.forward
                else:
                    layer.forward = previous

    def records(self) -> dict[str, dict[str, Any]]:
        """Per tensor: its pass, format, values per cast, and its casts as columns (one entry a step)."""
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """Every tensor's scales, amaxes and counts per step, the non-finite casts, and totals (results.json)."""
        tensors = self.records()
        nonfinite = [{"step": step, "tensor": name, "values": n} for name, t in tensors.items()
                     for step, n in enumerate(t["series"]["nonfinite"]) if n]  # fmt: skip
        nonfinite.sort(key=lambda e: (e["step"], e["tensor"]))
        totals = {}
        for pass_ in ("forward", "backward"):
            mine = [t for t in tensors.values() if t["pass"] == pass_]
            totals[pass_] = {"values": sum(t["values"] * len(t["series"]["amax"]) for t in mine)}
            for key in ("saturated", "flushed", "nonfinite"):
                totals[pass_][key] = sum(sum(t["series"][key]) for t in mine)
        return {"recipe": self.recipe, "summary": RECIPES[self.recipe], "settings": self.settings(),
                "tensors": tensors, "nonfinite": nonfinite, "totals": totals}  # fmt: skip

    def settings(self) -> dict[str, Any]:
        raise NotImplementedError


def transposed(q: Fp8Tensor) -> Fp8Tensor:
    """The transpose of an FP8 tensor: the same bytes read the other way, the same (per-tensor) scale."""
    return Fp8Tensor(q.bits.T, q.fmt, q.scale)


class PerTensorCasts(Fp8Casts):
    """Recipes "fp8" and "fp8-current": one scale per tensor, kept by ``Fp8Scales`` under one ``ScalingRecipe``."""

    def __init__(self, recipe: str, scaling: ScalingRecipe) -> None:
        self.recipe, self.scales = recipe, Fp8Scales(scaling)
        self.sizes: dict[str, int] = {}  # values per cast, by tensor

    def cast(self, name: str, x: np.ndarray, pass_: str, record: bool) -> Fp8Tensor:
        """`x` in FP8 with tensor `name`'s scale; `record`: advance and record its state, else leave it as is."""
        if record:
            self.sizes[name] = int(x.size)
            return self.scales.quantize(name, x, pass_)
        tensor = self.scales.tensors.get(name)
        if tensor is None:  # evaluated before it was ever trained: the initial state
            tensor = TensorScaling(name, self.scales.recipe.format_for(pass_), self.scales.recipe)
        probe = copy.copy(tensor)  # quantize replaces the scale and the history array: the original keeps both
        probe.history = []
        return probe.quantize(x)

    def forward(self, name: str, x: np.ndarray, w: np.ndarray, record: bool) -> tuple[np.ndarray, tuple, tuple]:
        qx = self.cast(f"{name}.input", x, "forward", record)
        qw = self.cast(f"{name}.weight", w, "forward", record)
        return fp8_matmul(qx, transposed(qw)), (qx.bits, qw.bits), (qx.scale, qw.scale)

    def backward(self, name: str, g: np.ndarray, saved: tuple, meta: tuple, need_x: bool, need_w: bool) -> tuple:
        fmt = self.scales.recipe.format_for("forward")
        qx, qw = (Fp8Tensor(bits, fmt, scale) for bits, scale in zip(saved, meta))
        qg = self.cast(f"{name}.grad_output", g, "backward", True)
        return (fp8_matmul(qg, qw) if need_x else None), (fp8_matmul(transposed(qg), qx) if need_w else None)

    def records(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, tensor in self.scales.tensors.items():
            columns = {k: [getattr(c, k) for c in tensor.history] for k in
                       ("amax", "scale", "next_scale", "event", "saturated", "flushed", "nonfinite")}  # fmt: skip
            out[name] = {"pass": self.scales.passes[name], "format": tensor.format.name, "values": self.sizes[name],
                         "series": columns, "scale": tensor.scale,
                         "amax_history": tensor.amax_history.tolist()}  # fmt: skip
        return out

    def settings(self) -> dict[str, Any]:
        return asdict(self.scales.recipe)

    def state_dict(self) -> dict[str, Any]:
        return {"scales": self.scales.state_dict(), "sizes": dict(self.sizes)}

    def capture(self) -> Any:
        """A mark of the state now, cheap to take every step (the histories only grow); ``restore`` returns to it."""
        return {n: (t.scale, t.amax_history, len(t.history)) for n, t in self.scales.tensors.items()}

    def restore(self, mark: Any) -> None:
        for name in [n for n in self.scales.tensors if n not in mark]:  # first cast after the mark
            del self.scales.tensors[name], self.scales.passes[name], self.sizes[name]
        for name, (scale, amax_history, casts) in mark.items():
            tensor = self.scales.tensors[name]  # quantize replaces amax_history, never writes into it
            tensor.scale, tensor.amax_history, tensor.history = scale, amax_history, tensor.history[:casts]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scales = Fp8Scales(self.scales.recipe)
        scales.load_state_dict(state["scales"])  # checked whole: a bad state changes nothing
        if set(state["sizes"]) != set(scales.tensors):
            raise ValueError("the saved sizes name other tensors than the saved scales")
        self.scales, self.sizes = scales, dict(state["sizes"])


@dataclass(frozen=True)
class BlockCast:
    """One MXFP8 cast of one tensor: a row of ``BlockCasts.history[name]``."""

    step: int
    amax: float  # of the whole tensor; NaN or inf when it held such values
    scale_low: float  # the smallest block scale (the multiplier before the cast, 2^-e), over blocks not all 0
    scale_high: float  # the largest; both NaN when every block was 0
    saturated: int  # values beyond the format's largest after their block's scale (0 with scales rounded up)
    flushed: int  # nonzero finite values that became 0
    nonfinite: int  # inf or NaN values: their rows of every product are NaN


class BlockCasts(Fp8Casts):
    """Recipe "mxfp8": ``blocks.quantize`` with "mxfp8_e4m3" forward and "mxfp8_e5m2" backward, scales rounded up.

    A block's power-of-two scale is rounded up, as Transformer Engine's ``MXFP8BlockScaling`` does
    (its float_to_e8m0 rounds toward +inf), not down by the OCP rule's floor, which puts a block's
    amax in [256, 512) and saturates the values of the block above 448: on the character
    transformer, 1500 steps, seeds 0, 1 and 2, the floor ended 2.7%, 2.4% and 1.1% above mixed's
    validation loss, rounding up 1.1%, 2.3% and 0.9% (benchmarks/fp8_training.py; the floor's runs
    are kept in benchmarks/results/fp8_training_mxfp8_floor_2026-12-07.txt).  TE casts gradients
    to E4M3 too; here they stay E5M2, so that the three recipes differ in their scales alone.
    Nothing carries over from step to step (each block's scale comes from its own amax), so the
    state is the record alone.
    """

    SCHEMES = {"forward": "mxfp8_e4m3", "backward": "mxfp8_e5m2"}
    ROUNDING = "up"

    def __init__(self, recipe: str = "mxfp8") -> None:
        self.recipe = recipe
        self.history: dict[str, list[BlockCast]] = {}
        self.passes: dict[str, str] = {}
        self.sizes: dict[str, int] = {}

    def cast(self, name: str, x: np.ndarray, pass_: str, record: bool) -> tuple[BlockTensor, np.ndarray]:
        """`x` (R, C) as MXFP8 blocks along C (padded with zeros to a multiple of 32), and its rows holding
        a value that is not finite (zeroed for the cast; every product of such a row is NaN)."""
        scheme = self.SCHEMES[pass_]
        fmt = E4M3 if pass_ == "forward" else E5M2
        finite = np.isfinite(x)
        bad_rows = ~finite.all(axis=1)
        pad = -x.shape[1] % MX_BLOCK
        clean = np.pad(np.where(finite, x, np.float32(0)).astype(np.float32, copy=False), ((0, 0), (0, pad)))
        q = quantize(clean, scheme, rounding=self.ROUNDING)
        if record:
            scales = decode_e8m0(q.scales)  # 2^e per block, the decoding scale
            tiles = clean.reshape(clean.shape[0], -1, MX_BLOCK)
            with np.errstate(over="ignore"):
                scaled = tiles / scales[:, :, None]  # exact: a power of two (blocks.py); the cast's input
            used = np.abs(tiles).max(axis=2) > 0
            low, high = (float(np.float32(1) / s) if used.any() else math.nan for s in
                         (scales[used].max(initial=0), scales[used].min(initial=np.inf)))  # fmt: skip
            flushed = (clean != 0) & (decode(q.codes, fmt) == 0)
            event = BlockCast(len(self.history.get(name, [])), float(np.max(np.abs(x))) if x.size else 0.0, low,
                              high, int(np.count_nonzero(np.abs(scaled) > fmt.max)), int(np.count_nonzero(flushed)),
                              int(x.size - np.count_nonzero(finite)))  # fmt: skip
            if self.passes.setdefault(name, pass_) != pass_:
                raise ValueError(f"tensor {name!r} was cast in the {self.passes[name]} pass, not the {pass_} pass")
            self.history.setdefault(name, []).append(event)
            self.sizes[name] = int(x.size)
        return q, bad_rows

    @staticmethod
    def product(a: BlockTensor, a_bad: np.ndarray, b: BlockTensor, b_bad: np.ndarray) -> np.ndarray:
        """A @ B^T for two block tensors whose blocks run along the summed axis: exact products, float32 sums."""
        out = a.dequantize() @ b.dequantize().T  # each value exact (an FP8 value times a power of two)
        out[a_bad, :] = np.nan  # a NaN input makes every sum it enters NaN, as a decoded NaN would
        out[:, b_bad] = np.nan
        return out

    def forward(self, name: str, x: np.ndarray, w: np.ndarray, record: bool) -> tuple[np.ndarray, tuple, tuple]:
        (qx, x_bad), (qw, w_bad) = (self.cast(f"{name}.{kind}", a, "forward", record)
                                    for kind, a in (("input", x), ("weight", w)))  # fmt: skip
        y = self.product(qx, x_bad, qw, w_bad)
        if not record:  # no backward follows
            return y, (), ()
        (xt, xt_bad), (wt, wt_bad) = (self.cast(f"{name}.{kind}.T", np.ascontiguousarray(a.T), "forward", True)
                                      for kind, a in (("input", x), ("weight", w)))  # fmt: skip
        return y, (xt.codes, xt.scales, wt.codes, wt.scales), (xt_bad, wt_bad, x.shape[0], w.shape[0])

    def backward(self, name: str, g: np.ndarray, saved: tuple, meta: tuple, need_x: bool, need_w: bool) -> tuple:
        xt_codes, xt_scales, wt_codes, wt_scales = saved
        xt_bad, wt_bad, rows, outputs = meta
        xt, wt = BlockTensor(xt_codes, xt_scales, "mxfp8_e4m3"), BlockTensor(wt_codes, wt_scales, "mxfp8_e4m3")
        gx = gw = None
        if need_x:  # g (M, N) @ W (N, K): blocks of g and of W^T along N
            qg, g_bad = self.cast(f"{name}.grad_output", g, "backward", True)
            gx = self.product(qg, g_bad, wt, wt_bad)
        if need_w:  # g^T (N, M) @ x (M, K): blocks of g^T and of x^T along M
            qgt, gt_bad = self.cast(f"{name}.grad_output.T", np.ascontiguousarray(g.T), "backward", True)
            gw = self.product(qgt, gt_bad, xt, xt_bad)
        return gx, gw

    def records(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, casts in self.history.items():
            columns = {k: [getattr(c, k) for c in casts] for k in
                       ("amax", "scale_low", "scale_high", "saturated", "flushed", "nonfinite")}  # fmt: skip
            fmt = "E4M3" if self.passes[name] == "forward" else "E5M2"
            out[name] = {"pass": self.passes[name], "format": fmt, "values": self.sizes[name], "series": columns}
        return out

    def settings(self) -> dict[str, Any]:
        return {"schemes": dict(self.SCHEMES), "block": MX_BLOCK, "rounding": self.ROUNDING}

    def state_dict(self) -> dict[str, Any]:
        return {"tensors": {n: {"pass": self.passes[n], "values": self.sizes[n], "history": [asdict(c) for c in casts]}
                            for n, casts in self.history.items()}}  # fmt: skip

    def capture(self) -> Any:
        return {n: len(casts) for n, casts in self.history.items()}

    def restore(self, mark: Any) -> None:
        for name in [n for n in self.history if n not in mark]:
            del self.history[name], self.passes[name], self.sizes[name]
        for name, casts in mark.items():
            self.history[name] = self.history[name][:casts]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        history, passes, sizes = {}, {}, {}
        for name, saved in state["tensors"].items():
            if saved["pass"] not in self.SCHEMES:
                raise ValueError(f"tensor {name!r} was saved with the pass {saved['pass']!r}")
            casts = [BlockCast(**c) for c in saved["history"]]
            if [c.step for c in casts] != list(range(len(casts))):
                raise ValueError(f"the casts of tensor {name!r} are not numbered 0, 1, 2, ...")
            history[name], passes[name], sizes[name] = casts, saved["pass"], saved["values"]
        self.history, self.passes, self.sizes = history, passes, sizes
