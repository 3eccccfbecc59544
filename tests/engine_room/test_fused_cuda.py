"""The fused GPU kernels give the reference's bits: master-weight updates, unscaling, a whole scaler step.

The GPU tests skip without CUDA; the host-side logic around the kernels (which path runs,
the skip flag the update kernels read, the counters rolled back, the one read per step)
runs on the CPU with NumPy stand-ins for the kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tinyamp as ta
from tinyamp import kernels, nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.backend import to_device
from tinyamp.engine.cuda import gemm, master_update, scaler_step, unscale

pytestmark = pytest.mark.engine_room

needs_cuda = pytest.mark.skipif(not ta.cuda_is_available(), reason="needs CuPy and a CUDA GPU")

OPTIMIZERS = {
    "sgd": lambda p: optim.SGD(p, lr=0.05),
    "sgd-momentum-wd": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd-nesterov": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam-l2": lambda p: optim.Adam(p, lr=1e-3, weight_decay=1e-2),
    "adamw": lambda p: optim.AdamW(p, lr=1e-3),
}


def train(device: str, make_optimizer: Any, steps: int = 4) -> tuple[list[np.ndarray], list[np.ndarray], list]:
    """A few mixed-precision steps of a small MLP; returns the model weights, the masters and the reports."""
    ta.manual_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 5, size=16)
    model = nn.MLP([12, 32, 5]).half().to(device)
    opt = MasterWeights(make_optimizer(model.named_parameters()), track_lost_updates=False)
    scaler = LossScaler(init_scale=2.0**10)
    xt, yt = ta.tensor(x, device=device), ta.tensor(y, device=device)
    reports = []
    for _ in range(steps):
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(model(xt), yt)
        scaler.scale_loss(loss).backward()
        reports.append(scaler.step(opt))
    host = [to_device(p.data, "cpu") for p in opt.model_params]
    masters = [to_device(p.data, "cpu") for p in opt.master_params]
    return host, masters, reports


@needs_cuda
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_master_updates_give_the_cpu_bits(name: str) -> None:
    cpu_model, cpu_masters, _ = train("cpu", OPTIMIZERS[name])
    gpu_model, gpu_masters, _ = train("cuda", OPTIMIZERS[name])
    # Integer-free data: the products are summed in another order on the GPU, so gradients differ
    # in the last bits; compare the update kernels on identical inputs below, and the runs loosely here.
    for a, b in zip(cpu_masters, gpu_masters):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    for a, b in zip(cpu_model, gpu_model):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=2e-3, atol=1e-3)


def updated(name: str, w0: np.ndarray, grads: list[np.ndarray], device: str) -> list[np.ndarray]:
    """Steps of optimizer `name` on master `w0`, each rounded into a float16 copy, on `device`: the
    master, the copy and every moment array, on the host.  On the GPU each step is one fused kernel."""
    master = ta.tensor(w0, device=device, requires_grad=True)
    opt = OPTIMIZERS[name]([("w", master)])
    copy = ta.tensor(w0.astype(np.float16), device=device).data
    for g in grads:
        g = ta.tensor(g, device=device).data
        if device == "cpu":  # the reference: the optimizer's update, then one rounding
            master.grad = g
            opt.step()
            kernels.cast(master.data, np.float16, out=copy)
        else:
            opt.step_count += 1
            master_update.fused_update(opt, master.data, g, opt.state[0], copy, None, None)
    moments = [v for v in opt.state[0].values() if hasattr(v, "shape")]
    return [to_device(a, "cpu") for a in (master.data, copy, *moments)]


@needs_cuda
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_one_fused_update_is_bit_identical_to_numpy(name: str) -> None:
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((64, 33)).astype(np.float32)
    grads = [rng.standard_normal((64, 33)).astype(np.float32) * 1e-2 for _ in range(3)]
    for a, b in zip(updated(name, w0, grads, "cpu"), updated(name, w0, grads, "cuda")):
        assert a.tobytes() == b.tobytes()


@needs_cuda
@pytest.mark.parametrize("name", ["adamw", "sgd-momentum-wd"])
def test_fused_updates_keep_float32_subnormals_as_numpy_does(name: str) -> None:
    """CuPy compiles kernels with -ftz=true; the kernels' PTX arithmetic must still keep
    float32 subnormals: Adam's g*g for |g| ~ 1e-20 is ~1e-40, below float32's smallest normal."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal(4096).astype(np.float32) * np.float32(1e-36)
    grads = [rng.standard_normal(4096).astype(np.float32) * np.float32(1e-20) for _ in range(2)]
    assert np.any(np.abs(grads[0] * grads[0]) < np.finfo(np.float32).tiny)  # the case under test
    for a, b in zip(updated(name, w0, grads, "cpu"), updated(name, w0, grads, "cuda")):
        assert a.tobytes() == b.tobytes()


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fused_unscale_gives_the_cpu_bits_and_flags_the_nonfinite(dtype: Any) -> None:
    rng = np.random.default_rng(2)
    g = (rng.standard_normal(1000) * 300).astype(dtype)
    g[17] = np.inf
    flags, values = {}, {}
    for device in ("cpu", "cuda"):
        a, b = ta.tensor(g, device=device, requires_grad=True), ta.tensor(g[:10], device=device, requires_grad=True)
        a.grad, b.grad = ta.tensor(g, device=device).data, ta.tensor(g[:10], device=device).data
        opt = optim.SGD([("a", a), ("b", b)], lr=0.1)
        scaler = LossScaler(init_scale=2.0**8)
        scaler.scale_loss(ta.tensor(1.0, device=device))
        flags[device] = scaler.unscale_(opt)
        values[device] = (to_device(a.grad, "cpu"), to_device(b.grad, "cpu"))
    assert flags["cpu"] == flags["cuda"] == {"a": True, "b": False}
    for x, y in zip(values["cpu"], values["cuda"]):
        assert x.tobytes() == y.tobytes()


def test_on_the_cpu_the_scaler_steps_on_the_host() -> None:
    """NumPy arrays: the GPU strategy does not apply, and LossScaler.step runs its own host-side code."""
    model = nn.MLP([3, 2]).half()
    masters = MasterWeights(optim.SGD(model.parameters(), lr=0.1), track_lost_updates=False)
    model(ta.tensor(np.ones((1, 3), np.float16))).sum().backward()
    assert scaler_step.scaled_step(masters, 1.0) is NotImplemented
    assert kernels._faster("scaled_step", masters, 1.0) is NotImplemented


@needs_cuda
@pytest.mark.parametrize("name", ["sgd-momentum-wd", "adamw"])
def test_an_overflow_skipped_on_the_gpu_changes_nothing_and_rolls_back_the_counters(name: str) -> None:
    ta.manual_seed(0)
    model = nn.MLP([12, 16, 5]).half().to("cuda")
    opt = MasterWeights(OPTIMIZERS[name](model.named_parameters()), track_lost_updates=False)
    scaler = LossScaler(init_scale=2.0**10)
    x = ta.tensor(np.random.default_rng(0).standard_normal((8, 12)), dtype="float32", device="cuda")
    y = ta.tensor(np.arange(8) % 5, device="cuda")

    def one_step(poison: bool) -> Any:
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(model(x), y)
        scaler.scale_loss(loss).backward()
        if poison:
            model.parameters()[0].grad[0, 0] = np.inf
        assert scaler_step._applies(opt)  # the GPU-decided path, from the float16 gradients, is under test
        return scaler.step(opt)

    one_step(False)  # creates the optimizer state
    weights = [to_device(p.data, "cpu").copy() for p in opt.model_params + opt.master_params]
    state = [{k: to_device(v, "cpu").copy() if hasattr(v, "shape") else v for k, v in s.items()}
             for s in opt.optimizer.state]  # fmt: skip
    count = opt.optimizer.step_count
    report = one_step(True)
    assert report.skipped and report.nonfinite_params
    assert opt.optimizer.step_count == count
    for before, p in zip(weights, opt.model_params + opt.master_params):
        assert before.tobytes() == to_device(p.data, "cpu").tobytes()
    for before, after in zip(state, opt.optimizer.state):
        assert before.keys() == after.keys()
        for k, v in before.items():
            got = after[k]
            assert (v.tobytes() == to_device(got, "cpu").tobytes()) if hasattr(v, "shape") else v == got
    assert not one_step(False).skipped and opt.optimizer.step_count == count + 1


# ---- the GPU's host-side logic, run on the CPU with NumPy stand-ins for the kernels -------------------------
# The kernels themselves need a GPU; everything around them (which path is taken, the skip flag
# read by the update "kernels", the counters rolled back after a skipped step, the one read of
# flags and sums) is plain Python, and runs here with kernels written in NumPy float32 arithmetic.
def _f32(x: float) -> np.float32:
    return np.float32(x)


def fake_sgd(g, lr, wd, skip, w, w16):  # noqa: ANN001, ANN202
    if skip == 0:
        d = g if wd == 0 else w * wd + g
        w -= lr * d
        w16[...] = w.astype(np.float16)


def fake_sgd_momentum(g, lr, mu, wd, nesterov, first, skip, w, buf, w16):  # noqa: ANN001, ANN202
    if skip == 0:
        d = g if wd == 0 else w * wd + g
        buf[...] = d if first else buf * mu + d
        d = d + mu * buf if nesterov else buf
        w -= lr * d
        w16[...] = w.astype(np.float16)


def fake_adam(g, beta1, beta2, omb1, omb2, bc2, eps, step_size, wd, decay, decoupled, skip, w, m, v, w16):  # noqa: ANN001, ANN202
    if skip == 0:
        grad = g
        if decoupled and wd != 0:
            w *= decay
        elif wd != 0:
            grad = w * wd + g
        m[...] = m * beta1 + grad * omb1
        v[...] = v * beta2 + grad * grad * omb2
        w -= m / (np.sqrt(v) / bc2 + eps) * step_size
        w16[...] = w.astype(np.float16)


def fake_multiply(factor, g):  # noqa: ANN001, ANN202
    g[...] = g.astype(np.float32) * factor


def fake_squares(g):  # noqa: ANN001, ANN202
    wide = g.astype(np.float64).ravel()
    return np.array(np.dot(wide, wide))


def fake_scaled_squares(g, inverse):  # noqa: ANN001, ANN202
    with np.errstate(over="ignore", invalid="ignore"):
        return fake_squares(g.astype(np.float32) * inverse)


@pytest.fixture
def kernels_on_numpy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Send float32 masters with float16 copies, and float16/float32 gradients, down the GPU code paths."""
    launched: list[str] = []

    def logged(name: str, fn: Any) -> Any:
        def run(*args: Any) -> Any:
            launched.append(name)
            return fn(*args)

        return run

    def from_float16(fn: Any) -> Any:  # the kernel variant that reads (float16 g, 1/scale)
        def run(g16: np.ndarray, inverse: np.float32, *rest: Any) -> None:
            fn(g16.astype(np.float32) * inverse, *rest)

        return run

    fakes = {"sgd": fake_sgd, "sgd_momentum": fake_sgd_momentum, "adam": fake_adam}
    update_kernels = {(name, False): logged(name, fn) for name, fn in fakes.items()}
    update_kernels.update(
        {(name, True): logged(name + " from float16", from_float16(fn)) for name, fn in fakes.items()}
    )
    numpy_is_the_gpu = lambda *arrays: all(isinstance(x, np.ndarray) for x in arrays)  # noqa: E731
    for module in (master_update, unscale):
        monkeypatch.setattr(module, "on_gpu", numpy_is_the_gpu)
    monkeypatch.setattr(master_update, "_kernels", lambda: update_kernels)

    def with_out(fn: Any) -> Any:  # a ReductionKernel writes into `out` when given one
        def run(*args: Any, out: Any = None) -> Any:
            total = fn(*args)
            if out is None:
                return total
            out[...] = total
            return out

        return run

    three = (logged("multiply", fake_multiply), with_out(fake_squares),
             with_out(logged("scaled squares", fake_scaled_squares)))  # fmt: skip
    monkeypatch.setattr(unscale, "_kernels", lambda: three)
    monkeypatch.setattr(unscale, "_any_not_finite", lambda: lambda s: np.int32(not np.isfinite(s).all()))
    return launched


def short_run(name: str, poison_step: int | None, clip: float | None = None) -> tuple[list[bytes], list, list]:
    """Four mixed-precision steps of a small MLP (one poisoned with an inf; unscaled and clipped to `clip`
    before each step if given); weights, reports, final state."""
    ta.manual_seed(0)
    rng = np.random.default_rng(0)
    model = nn.MLP([12, 16, 5]).half()
    opt = MasterWeights(OPTIMIZERS[name](model.named_parameters()), track_lost_updates=False)
    scaler = LossScaler(init_scale=2.0**10)
    x, y = ta.tensor(rng.standard_normal((8, 12)).astype(np.float32)), ta.tensor(np.arange(8) % 5)
    reports = []
    for step in range(4):
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(model(x), y)
        scaler.scale_loss(loss).backward()
        if step == poison_step:
            model.parameters()[0].grad[0, 0] = np.inf
        if clip is not None:
            scaler.unscale_(opt)
            scaler.clip_grad_norm_(opt, clip)
        reports.append(scaler.step(opt))
    weights = [p.data.tobytes() for p in opt.model_params + opt.master_params]
    state = [(opt.optimizer.step_count, sorted(s)) for s in opt.optimizer.state]
    return weights, [(r.skipped, r.scale_after, r.nonfinite_params) for r in reports], state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("poison_step", [None, 0, 2])
def test_the_gpu_path_decides_skips_on_the_device_and_matches_the_cpu_path(
    kernels_on_numpy: list[str], monkeypatch: pytest.MonkeyPatch, name: str, poison_step: int | None
) -> None:
    gpu_style = short_run(name, poison_step)
    kernel = "adam" if "adam" in name else ("sgd_momentum" if "momentum" in name or "nesterov" in name else "sgd")
    # no float32 gradient: the float16 ones are read twice (4 steps x 4 gradients), written never
    assert kernels_on_numpy.count("scaled squares") == 4 * 4 and "multiply" not in kernels_on_numpy
    assert kernel + " from float16" in kernels_on_numpy
    monkeypatch.undo()  # the reference: host-side skip, NumPy updates, rounding after
    cpu_style = short_run(name, poison_step)
    assert gpu_style == cpu_style
    if poison_step is not None:
        assert gpu_style[1][poison_step][0]  # the poisoned step was skipped


@pytest.mark.parametrize("poison_step", [None, 1])
def test_after_unscale_and_clipping_the_step_reads_the_gathered_gradients_on_the_host(
    kernels_on_numpy: list[str], monkeypatch: pytest.MonkeyPatch, poison_step: int | None
) -> None:
    """unscale_ has gathered the float32 gradients and clipping wrote to them: the fused step must not apply."""
    gpu_style = short_run("adamw", poison_step, clip=0.05)
    assert "scaled squares" not in kernels_on_numpy and "adam from float16" not in kernels_on_numpy
    assert kernels_on_numpy.count("multiply") >= 4  # unscale_ on the GPU kernels, and clipping
    monkeypatch.undo()
    assert gpu_style == short_run("adamw", poison_step, clip=0.05)


def test_a_mixed_precision_run_of_the_demo_goes_through_every_gpu_path(
    kernels_on_numpy: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's mixed regime with the cuBLAS products and the fused kernels swapped in: it trains."""
    from test_cublas_plan import fake_call

    from tinyamp.experiments.runner import run_regime
    from tinyamp.experiments.tasks import DigitsMLP

    products: list[Any] = []

    def call(p: Any, a: Any, b: Any, c: Any, beta: float) -> None:
        products.append(p)
        fake_call(p, a, b, c, beta)

    monkeypatch.setattr(gemm, "on_gpu", lambda *arrays: all(isinstance(x, np.ndarray) for x in arrays))
    monkeypatch.setattr(gemm, "_call", call)
    result, setup = run_regime(DigitsMLP(hidden=(32,)), "mixed", steps=40, measure_every=20)
    assert products and "sgd_momentum from float16" in kernels_on_numpy and "scaled squares" in kernels_on_numpy
    assert np.isfinite(result.metrics["train_loss"]) and result.metrics["accuracy"] > 0.5


# ---- full reductions in many blocks --------------------------------------------------------------------------
class _RowReduction:
    """A NumPy stand-in for a CuPy ReductionKernel of squares: reduces everything, or along `axis`, in float64."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], int | None]] = []

    def __call__(self, x: np.ndarray, axis: int | None = None) -> np.ndarray:
        self.calls.append((x.shape, axis))
        wide = x.astype(np.float64)
        return np.sum(wide * wide, axis=axis)


@pytest.mark.parametrize("size", [1, 1000, 1 << 16, (1 << 16) + 1, 20 * unscale.ROW, 20 * unscale.ROW + 7])
def test_in_rows_splits_a_large_array_into_rows_and_keeps_every_value(size: int) -> None:
    """The splitting alone (on the CPU): every value is summed once, and only large arrays are split."""
    g = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    reduction = _RowReduction()
    total = unscale._in_rows(reduction, g)
    exact = np.sum(g.astype(np.float64) ** 2)
    assert abs(total - exact) <= size * 2.0**-52 * exact
    if size <= 1 << 16:
        assert reduction.calls == [((size,), None)]  # one launch, as before
    else:
        rows = size // unscale.ROW
        assert reduction.calls[0] == ((rows, unscale.ROW), 1)  # one block per row
        assert len(reduction.calls) == (1 if size % unscale.ROW == 0 else 2)  # the partial row, when there is one


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("size", [1000, (1 << 16) + 1, 20 * unscale.ROW + 7, (1 << 22) + 5])
def test_sums_of_squares_in_many_blocks_agree_with_float64_within_the_stated_bound(dtype: Any, size: int) -> None:
    """unscale.py's bound: float64 sums of exact squares, in another order, within n * 2^-53 of the total."""
    cupy = ta.backend.array_module("cuda")
    rng = np.random.default_rng(size)
    g = (rng.standard_normal(size) * 300).astype(dtype)
    inverse = np.float32(2.0**-7)
    wide = g.astype(np.float64)
    unscaled = (g.astype(np.float32) * inverse).astype(np.float64)  # each product rounded to float32, as the kernel
    exact = {"plain": np.sum(wide * wide), "scaled": np.sum(unscaled * unscaled)}
    d = cupy.asarray(g)
    got = {"plain": float(unscale.sum_of_squares(d)), "scaled": float(unscale.scaled_sum_of_squares(d, inverse))}
    for key in exact:
        assert abs(got[key] - exact[key]) <= size * 2.0**-53 * exact[key], (key, got[key], exact[key])
    d[size // 2] = np.inf
    assert not np.isfinite(float(unscale.sum_of_squares(d)))  # the overflow check still sees one inf
