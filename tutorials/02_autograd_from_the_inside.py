# %% [markdown]
# # 2. Autograd from the inside
#
# Every later tutorial changes *what* a backward pass computes (in FP16, with a scaled loss,
# with recomputed activations) but never *how* it is organized. This tutorial opens that
# machinery on a graph small enough to check by hand.
#
# You will learn:
#
# - what a tinyamp graph is made of: `Function` nodes, their inputs, and the arrays they save;
# - the order in which the backward pass visits the nodes (a topological order), and why;
# - how gradients meet: a value used twice receives the sum of two gradients, and a broadcast
#   input receives the sum over the broadcast axis;
# - how to read one op's source, and the rule that every gradient has its tensor's dtype;
# - how `tinyamp.gradcheck` tests a backward against finite differences, and why only in
#   float64: the error of a finite difference against its step size h is a V;
# - how to derive and check the backward of a row-wise op (a mean along an axis, with `keepdims`),
#   the pattern of exercises 2.1 to 2.3.
#
# Prerequisites: Python, NumPy and the chain rule; tutorial 1 for the float16 of section 3 and the
# rounding of section 5.
#
# Time: about 1.3 s of CPU to run (3 s wall-clock on a busy shared 2-core machine), 40 minutes to read
# (a reader took 30 to 35 before section 6 was added).

# %%
import inspect
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import tinyamp as ta
from tinyamp.autograd import Edge, GradientError, topological_order
from tinyamp.function import Function
from tinyamp.ops import arithmetic, unary

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)

ta.manual_seed(0)

# %% [markdown]
# ## 1. A small graph
#
# We compute $L = \sum_i \tanh(x_i w_i + b)^2$ for three inputs $x$, three weights $w$ and one
# bias $b$ that is broadcast over the three elements. Each line below runs one forward
# operation and, because some input requires a gradient, records one node of the graph.

# %%
x = ta.tensor([0.5, -1.0, 2.0], requires_grad=True)
w = ta.tensor([0.3, 0.2, -0.1], requires_grad=True)
b = ta.tensor(0.1, requires_grad=True)
x.name, w.name, b.name = "x", "w", "b"

z = x * w  # Mul
u = z + b  # Add (b is broadcast from shape () to (3,))
y = u.tanh()  # Tanh
L = (y * y).sum()  # Mul, then Sum
print("L =", L)
print("L.creator =", L.creator)

# %% [markdown]
# A `Tensor` is an array plus two references: `.grad` (filled by backward) and `.creator`,
# the `Function` node that computed it (None for a leaf such as `x`). A node keeps its
# `inputs` (the edges of the graph back toward the leaves), `needs_input_grad`, and `saved`:
# the arrays its backward will need. An input that is a leaf is kept as the tensor itself
# (its `.grad` will be filled in); an input that was computed is kept as an `Edge`: the node
# that made it, its shape and dtype, but not its array. So saved arrays are all a graph costs
# in memory, and in mixed precision they are the activations that FP16 shrinks (by half for an
# MLP, by a third for a small transformer: tutorial 7).
#
# The backward pass visits the nodes in *topological order*: a node comes before every node
# that produced one of its inputs. Then, when a node's turn comes, all the gradient flowing
# into its output has already arrived. `tinyamp.autograd.topological_order` computes it with
# an explicit stack rather than recursion, so a chain of 100,000 ops does not exhaust
# Python's call stack.


# %%
def describe(t):
    return t.name if t.is_leaf else f"output of {t.creator.name}"


order = topological_order(L.creator)
structure = []  # kept for the drawing: backward releases each node's inputs once it is done
for i, fn in enumerate(order):
    saved = fn.saved or ()
    print(
        f"{i}. {fn.name:<5} inputs: {', '.join(describe(t) for t in fn.inputs):<34} "
        f"saved: {[f'{np.shape(a)} {np.asarray(a).dtype}' for a in saved]}"
    )
    # the drawing counts distinct arrays: y * y saves the same array twice, and holds it once
    structure.append((fn, [(t.creator, t.name, t.shape) for t in fn.inputs], len({id(a) for a in saved})))

names = [fn.name for fn in order]
assert names == ["Sum", "Mul", "Tanh", "Add", "Mul"], names
# the defining property: every node comes before the nodes that made its inputs
position = {fn: i for i, fn in enumerate(order)}
for fn in order:
    for t in fn.inputs:
        assert t.creator is None or position[t.creator] > position[fn]
        # leaves are the tensors themselves; computed inputs are Edges, which hold no array
        assert isinstance(t, ta.Tensor) if t.is_leaf else (isinstance(t, Edge) and not hasattr(t, "data"))

# %% [markdown]
# What each node saved tells you its derivative. The first `Mul` ($x \cdot w$) kept both of
# its inputs, because $\partial (a b)/\partial a = b$ and $\partial (a b)/\partial b = a$.
# `Tanh` kept its *output*, because $\tanh' = 1 - \tanh^2$ can be computed from it (the next op
# holds that array anyway, so this costs no extra memory). `Add` and `Sum` kept no array: their
# derivatives are 1, and they only remember shapes and dtypes. The second `Mul` computes
# $y \cdot y$: both of its inputs are the same tensor, an edge drawn twice, and the two arrays it
# saved are one array, held once (the drawing counts distinct arrays: "saves 1").

# %%
inputs_of = {fn: ins for fn, ins, _ in structure}
level = {}  # column of each node: one right of its rightmost input (leaves count as column 0)
for fn in reversed(order):
    level[fn] = 1 + max(level[c] if c is not None else 0 for c, _, _ in inputs_of[fn])
pos = {fn: (level[fn], 0.0) for fn in order}
for fn, ins, _ in structure:  # each leaf one column left of the node that reads it, off the axis
    leaves_here = [(name, shape) for c, name, shape in ins if c is None]
    for k, (name, shape) in enumerate(leaves_here):
        pos[name] = (level[fn] - 1, 0.7 if len(ins) == len(leaves_here) and k == 0 else -0.7)
        pos[name, "shape"] = shape

fig, ax = plt.subplots(figsize=(10, 3.6))
box = {"boxstyle": "round,pad=0.4", "lw": 1}
for fn, ins, n_saved in structure:
    ax.text(
        *pos[fn],
        f"{fn.name}\nsaves {n_saved}",
        ha="center",
        va="center",
        fontsize=9,
        bbox={**box, "fc": "#fde5cc", "ec": "#ff7f0e"},
    )
    for k, (creator, name, _) in enumerate(ins):
        start = pos[name] if creator is None else pos[creator]
        if creator is None:
            ax.text(
                *start,
                f"{name}\n{pos[name, 'shape']}",
                ha="center",
                va="center",
                fontsize=9,
                bbox={**box, "fc": "#dbe9f6", "ec": "#1f77b4"},
            )
        twice = creator is not None and len(ins) == 2 and ins[0][0] is ins[1][0]  # y * y: one tensor, two edges
        ax.annotate(
            "",
            xy=pos[fn],
            xytext=start,
            arrowprops={
                "arrowstyle": "->",
                "shrinkA": 22,
                "shrinkB": 22,
                "lw": 1.2,
                "connectionstyle": f"arc3,rad={0.5 * (k - 0.5) if twice else 0.0}",
            },
        )
top = max(level.values())
ax.text(top + 0.8, 0, "L", ha="center", va="center", fontsize=11, bbox={**box, "fc": "white", "ec": "black"})
ax.annotate("", xy=(top + 0.8, 0), xytext=pos[order[0]], arrowprops={"arrowstyle": "->", "shrinkA": 24, "shrinkB": 12})
ax.set_xlim(-0.6, top + 1.2)
ax.set_ylim(-1.5, 1.5)
ax.axis("off")
ax.set_title("The graph of L = sum(tanh(x * w + b)^2): forward left to right, backward right to left")
fig.tight_layout()
graph_path = OUT / "02_graph.png"
fig.savefig(graph_path, dpi=110)
# What the drawing claims, read off the rendered picture: every box lies inside the figure and none
# covers another; and each node's "saves N" is the number of arrays it really holds (the second Mul
# saved y for both of its inputs: one array).
fig.canvas.draw()
extents = [t.get_bbox_patch().get_window_extent() for t in ax.texts if t.get_text()]  # arrows have no text
assert all(fig.bbox.x0 <= e.x0 and e.x1 <= fig.bbox.x1 and fig.bbox.y0 <= e.y0 and e.y1 <= fig.bbox.y1 for e in extents)
assert not any(e.overlaps(f) for i, e in enumerate(extents) for f in extents[i + 1 :])
square = next(fn for fn in order if fn.name == "Mul" and all(t.creator is not None for t in fn.inputs))
assert len(square.saved) == 2 and square.saved[0] is square.saved[1]  # y, saved for each input: one array
assert sorted(t.get_text() for t in ax.texts if t.get_text().startswith("Mul")) == ["Mul\nsaves 1", "Mul\nsaves 2"]

# %% [markdown]
# ## 2. Backward, checked by hand
#
# Write $d_i = \partial L / \partial u_i$. By the chain rule, through the square and the tanh,
#
# $$d_i = 2 y_i \, (1 - y_i^2), \qquad
#   \frac{\partial L}{\partial w_i} = d_i\, x_i, \qquad
#   \frac{\partial L}{\partial x_i} = d_i\, w_i, \qquad
#   \frac{\partial L}{\partial b} = \sum_i d_i .$$
#
# The last one is the rule for broadcasting: $b$ was copied to three places in the forward
# pass, so it receives the sum of the three gradients. The $2 y_i$ is the other rule: $y$ fed
# both inputs of the last `Mul`, whose backward hands $g \cdot y$ to each; the two arrive at
# the same node and are added. We ask tinyamp to keep the gradients of the intermediate
# tensors $y$ and $u$ too (`retain_grad`), and compare everything with the formulas, computed
# in float64 from the same inputs.

# %%
y.retain_grad()
u.retain_grad()
L.backward()

x64, w64, b64 = x.numpy().astype(np.float64), w.numpy().astype(np.float64), float(b.item())
y64 = np.tanh(x64 * w64 + b64)
d = 2 * y64 * (1 - y64**2)
expected = {"y": 2 * y64, "u": d, "w": d * x64, "x": d * w64, "b": d.sum()}
computed = {"y": y.grad, "u": u.grad, "w": w.grad, "x": x.grad, "b": b.grad}
for key in expected:
    print(f"dL/d{key}: tinyamp {np.round(computed[key], 6)}   by hand {np.round(expected[key], 6)}")
    assert np.allclose(computed[key], expected[key], rtol=1e-5, atol=1e-7), key
    assert computed[key].dtype == np.float32  # the dtype of the tensor, not of the hand computation

# %% [markdown]
# After the walk, each node that saved arrays for its backward (here Mul and Tanh) has freed
# them, so the memory of the activations is returned as the backward pass moves toward the
# leaves; nodes that saved nothing (Add, Sum) have nothing to free. A second backward
# through the same graph is therefore an error, not a silent reuse of freed data.
# `retain_graph=True` on the first call keeps everything, at the price of the memory.

# %%
assert all(fn.saved is None for fn in order if fn.name in ("Mul", "Tanh"))
assert all(not fn.saved for fn in order if fn.name in ("Add", "Sum"))  # they never held an array
try:
    L.backward()
    raise AssertionError("a second backward should have failed")
except GradientError as exc:
    print("second backward:", exc)

# %% [markdown]
# ## 3. One op, read from the source
#
# Each op is one `Function` subclass in `tinyamp/ops/` with a `forward` and a `backward` on
# plain arrays (NumPy here, CuPy on a GPU). Here is the whole of `Mul`:

# %%
mul_source = inspect.getsource(arithmetic.Mul)
print(mul_source)
assert "return a * b" in mul_source and "g * b" in mul_source and "g * a" in mul_source  # the math, as written

# %% [markdown]
# `forward` saves $a$ and $b$ and returns $a b$. `backward` receives $g = \partial L/\partial c$
# and returns one gradient per input: $g b$ for $a$ and $g a$ for $b$ (or `None` when an input
# needs none, which saves the multiplication). Both go through `unbroadcast(grad, shape, dtype)`,
# which does two things:
#
# - it sums the gradient over every axis along which the input was broadcast, the rule we
#   checked for $b$ above (in float32, even for float16 inputs, then rounds once);
# - it casts the gradient to the input's dtype. A float16 tensor multiplied by a float32 one
#   gives a float32 product, but the float16 input receives a float16 gradient.
#
# The second rule is what makes mixed precision manageable: the dtype of every gradient is
# known in advance (it is the dtype of its tensor), and the autograd engine checks it after
# every backward, naming the op that broke it.
#
# The arithmetic is the array library's own: `a * b` is NumPy's (or CuPy's) product. The few
# array operations that need more than that, a float16 add fast enough on a CPU or a Tensor
# Core product on a GPU, are functions of `tinyamp/kernels.py`, whose bodies are the plain
# reference code; faster implementations of the same bits register behind them (the "engine
# room", `tinyamp/engine/fast/` and `tinyamp/engine/cuda/`). `Tanh` shows the other pattern, a derivative
# written with the saved output:

# %%
print(inspect.getsource(unary.Tanh))

h16 = ta.tensor([1.0, 2.0, 3.0], dtype="float16", requires_grad=True)
v32 = ta.tensor([0.5, 0.25, 0.125], requires_grad=True)
prod = h16 * v32
prod.sum().backward()
print(
    f"float16 * float32 -> {prod.dtype}; grad of the float16 input: {h16.grad} ({h16.grad.dtype}); "
    f"of the float32 input: {v32.grad.dtype}"
)
assert prod.dtype == np.float32 and h16.grad.dtype == np.float16 and v32.grad.dtype == np.float32
assert np.array_equal(h16.grad, v32.numpy().astype(np.float16))

# %% [markdown]
# ## 4. Checking a backward with finite differences
#
# A hand derivation checks one graph; `tinyamp.gradcheck` checks any function. For each input
# element it perturbs the value by $\pm h$ and compares the *central difference*
#
# $$\frac{\partial s}{\partial x_i} \approx \frac{s(x + h e_i) - s(x - h e_i)}{2h}$$
#
# with the analytic gradient from backward. (A function with a tensor output is reduced to a
# scalar $s$ by a fixed random weighting of its outputs, so every output's gradient is tested
# at once.) It needs float64 inputs; we will see why in a moment.


# %%
def f(x, w, b):
    return (x * w + b).tanh() ** 2


rng = np.random.default_rng(0)
inputs = [ta.tensor(rng.standard_normal(s), dtype="float64", requires_grad=True) for s in ((4, 3), (3,), ())]
assert ta.gradcheck(f, inputs)
print("gradcheck passed for tanh(x * w + b)^2 with x (4, 3), w (3,), b ()")

# %% [markdown]
# A check that always passes proves nothing, so here is a broken op: a square whose backward
# forgot the factor 2. We write it as a `Function` subclass, exactly like tinyamp's own ops,
# and gradcheck names the input, the element and both values.


# %%
class BrokenSquare(Function):
    """$y = x^2$ with a wrong derivative, $x$ instead of $2x$."""

    def forward(self, x):
        self.save_for_backward(x)
        return x * x

    def backward(self, g):
        (x,) = self.saved
        return (g * x,)  # should be 2 * g * x


try:
    ta.gradcheck(lambda t: BrokenSquare.apply(t), [ta.tensor([0.5, -1.5], dtype="float64", requires_grad=True)])
    raise AssertionError("gradcheck should have caught the wrong derivative")
except GradientError as exc:
    print("caught:", exc)

try:
    ta.gradcheck(f, [ta.tensor(t.numpy(), dtype="float32", requires_grad=True) for t in inputs])
    raise AssertionError("gradcheck should refuse float32 inputs")
except GradientError as exc:
    print("refused:", exc)

# %% [markdown]
# ## 5. Why float64: the V of finite-difference error
#
# A central difference has two errors that pull in opposite directions.
#
# - **Truncation.** The Taylor series gives $\frac{s(x+h) - s(x-h)}{2h} = s'(x) + \frac{h^2}{6}
#   s'''(x) + \dots$: the error shrinks like $h^2$.
# - **Rounding.** Each value of $s$ carries a relative error of about $\varepsilon$, machine
#   epsilon, and the difference divides it by $2h$: an error of about $\varepsilon |s| / h$,
#   which *grows* as $h$ shrinks. Worse, $x + h$ itself is rounded, so the step actually taken
#   is not $h$; once $h$ is below half an ulp of $x$, $x + h = x$ and the difference is 0.
#
# The total is smallest near $h \approx \varepsilon^{1/3}$, with an error near
# $\varepsilon^{2/3}$. In float64 ($\varepsilon = 2^{-52}$) that is $h \approx 10^{-5}$ and an
# error near $10^{-11}$, so gradcheck's default $h = 10^{-6}$ and tolerance ($10^{-6}$ plus
# $10^{-5}$ times the finite difference: `atol + rtol * |numerical|`) leave a wide margin. In
# float32 ($\varepsilon = 2^{-23}$) the best possible error is $10^{-6}$ to $10^{-5}$, and at
# $h = 10^{-6}$ it is already about $10^{-2}$: no tolerance could tell a wrong derivative from
# rounding noise. We measure the curve for $s = \tanh$ at $x = 0.5$.

# %%
hs = 10.0 ** np.linspace(-12, 0, 97)
exact_derivative = 1 - np.tanh(0.5) ** 2
errors = {}
for dtype in (np.float64, np.float32):
    x0 = dtype(0.5)
    errs = []
    for h in hs:
        step = dtype(h)
        estimate = (np.tanh(x0 + step) - np.tanh(x0 - step)) / (dtype(2) * step)
        errs.append(abs(float(estimate) - exact_derivative))
    errors[dtype.__name__] = np.maximum(np.array(errs), 1e-17)  # an exact hit would be log(0)

best = {name: (hs[np.argmin(e)], e.min()) for name, e in errors.items()}
at_gradcheck_h = {name: e[np.argmin(abs(hs - 1e-6))] for name, e in errors.items()}
for name, (h_best, e_best) in best.items():
    print(f"{name}: best h = {h_best:.1e} with error {e_best:.1e}; at h = 1e-6 the error is {at_gradcheck_h[name]:.1e}")

assert best["float64"][1] < 1e-9 and 1e-8 < best["float64"][0] < 1e-3
assert best["float32"][1] > 100 * best["float64"][1]  # float32 cannot get close
assert best["float32"][0] > 10 * best["float64"][0]  # and needs a much larger step
assert at_gradcheck_h["float32"] > 1e-2 and 9.5 < np.log10(at_gradcheck_h["float32"] / at_gradcheck_h["float64"]) < 10.5
assert errors["float32"][0] > 0.5  # h far below the ulp of 0.5: x + h == x, the estimate is 0

fig, ax = plt.subplots(figsize=(9.5, 4.2), layout="constrained")
for name, color in (("float64", "#1f77b4"), ("float32", "#d62728")):
    ax.loglog(hs, errors[name], color=color, lw=1.5, label=name)
    eps = np.finfo(name).eps
    ax.loglog(hs, hs**2 / 6 + eps / (2 * hs), color=color, ls=":", lw=1, label=f"{name} model: h^2/6 + eps/(2h)")
ax.axvline(1e-6, color="grey", ls="--", lw=0.8, label="gradcheck's default h")
ax.set_ylim(1e-13, 2)
ax.set_xlabel("step h")
ax.set_ylabel("|central difference - exact derivative|")
ax.set_title("Finite-difference error of tanh'(0.5)")
ax.grid(True, which="major", alpha=0.3)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: every curve stays visible
v_path = OUT / "02_finite_difference_error.png"
fig.savefig(v_path, dpi=110)
# The legend covers no point of any curve (read off the rendered picture).
fig.canvas.draw()
legend_box = ax.get_legend().get_window_extent()
for line in ax.get_lines():
    points = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
    assert legend_box.count_contains(points) == 0, line.get_label()
# The claims of the next paragraph, on the measured curves: each stays under its dotted model at
# every h; on the right, where truncation dominates, float64's error divided by h^2/6 is
# |tanh'''(0.5)|, about 0.57 (the third derivative by hand: tanh''' = -2 (1 - t^2)(1 - 3 t^2)); and
# float32's best error is about six decades above float64's.
for name in errors:
    assert np.all(errors[name] <= hs**2 / 6 + np.finfo(name).eps / (2 * hs)), name
t = np.tanh(0.5)
third_derivative = -2 * (1 - t**2) * (1 - 3 * t**2)
truncation_side = (hs >= 1e-3) & (hs <= 1e-2)
measured_third = errors["float64"][truncation_side] / (hs[truncation_side] ** 2 / 6)
print(f"float64 error / (h^2/6) for h in [1e-3, 1e-2]: {measured_third.min():.4f} to {measured_third.max():.4f}; "
      f"|tanh'''(0.5)| = {abs(third_derivative):.4f}")  # fmt: skip
assert np.allclose(measured_third, abs(third_derivative), rtol=1e-3) and abs(abs(third_derivative) - 0.57) < 0.005
assert 5.5 < np.log10(best["float32"][1] / best["float64"][1]) < 6.5

# %% [markdown]
# The measured curves stay under the dotted model, $h^2/6$ on the right (here
# $|s'''(0.5)| \approx 0.57$, below the model's 1) and $\varepsilon/(2h)$ on the left (an upper
# estimate: rounding errors partly cancel). Float32's V bottoms out about six decades above
# float64's, and on its far left the estimate is exactly 0 because $x + h$ rounded back to $x$.
# The same arithmetic is behind the rest of this course: rounding error divided by a small
# number becomes a large error, and a difference of nearly equal numbers keeps only the bits in
# which they differ.
#
# ## 6. A row-wise op: a reduction along an axis, with `keepdims`
#
# Softmax, log_softmax and layer norm (exercises 2.1 to 2.3) work on each row of their input:
# every output of a row depends on every input of that row, through a sum or a mean along the
# last axis. The smallest such op subtracts each row's mean (the first step of layer norm):
# $y_{ri} = x_{ri} - \bar{x}_r$ with $\bar{x}_r = \frac{1}{D} \sum_j x_{rj}$ over the $D$ values of
# row $r$. Element by element, $\partial y_{ri} / \partial x_{rj} = \delta_{ij} - 1/D$, so for any
# $g = \partial L / \partial y$ the chain rule sums over the row:
#
# $$\frac{\partial L}{\partial x_{rj}} = \sum_i g_{ri} \left(\delta_{ij} - \frac{1}{D}\right)
#   = g_{rj} - \frac{1}{D} \sum_i g_{ri}:$$
#
# each gradient minus its row's mean. In NumPy that is one reduction along the last axis, kept as
# a column of shape (rows, 1) by `keepdims=True`, so that it broadcasts back along each row. We
# check it as gradcheck would, written out: a float64 central difference for every element of
# $x$, of $L = \sum r \cdot y$ with fixed random weights $r$ (so $g = r$), which is also how the
# graders of exercises 2.1 to 2.3 check yours. $L$ is linear in $x$, so the central difference has
# no truncation error; what is left is rounding, about $\varepsilon |L| / h \approx 10^{-10}$.

# %%
def centered(v):
    """Each row minus its mean: the forward."""
    return v - v.mean(axis=-1, keepdims=True)


def centered_backward(g):
    """dL/dx of centered(x), from g = dL/dy: each gradient minus its row's mean."""
    return g - g.mean(axis=-1, keepdims=True)


def central_differences(loss, v, h=1e-6):
    """The gradient of the scalar loss(v) at v, one float64 central difference per element."""
    grad = np.empty_like(v)
    for i in np.ndindex(v.shape):
        up, down = v.copy(), v.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (loss(up) - loss(down)) / (2 * h)
    return grad


rows = np.random.default_rng(1)
x_rows, r_rows = rows.standard_normal((2, 4, 3))
numerical = central_differences(lambda v: np.sum(r_rows * centered(v)), x_rows)
by_hand = centered_backward(r_rows)
print(f"row-wise centering, (4, 3): largest |by hand - central difference| = {np.abs(by_hand - numerical).max():.1e}")
assert np.abs(by_hand - numerical).max() < 1e-8

# %% [markdown]
# tinyamp's graph of the same op shows where the column comes from. `mean(axis=-1,
# keepdims=True)` makes a node whose output has shape (4, 1); `Sub` broadcasts it over each row.
# In backward, `Sub` hands the mean $-g$, and `unbroadcast` sums it over the broadcast axis back
# to (4, 1) (the rule of section 2, for $b$): $-\sum_i g_{ri}$ per row. `Mean`'s backward divides
# that by $D$ and spreads it over the row again, where it meets the direct gradient $g$ from `Sub`:
# the formula above, assembled by the walk.

# %%
xt = ta.tensor(x_rows, dtype="float64", requires_grad=True)
row_mean = xt.mean(axis=-1, keepdims=True)
row_mean.retain_grad()
(ta.tensor(r_rows) * (xt - row_mean)).sum().backward()
print(f"the row means: shape {row_mean.shape}, their gradient: shape {row_mean.grad.shape}")
assert row_mean.shape == row_mean.grad.shape == (4, 1)
assert np.allclose(row_mean.grad, -r_rows.sum(axis=-1, keepdims=True), rtol=1e-12, atol=1e-15)
assert np.abs(xt.grad - numerical).max() < 1e-8  # the walk's gradient, against the same differences

# %% [markdown]
# Leave out `keepdims` and the row means are a vector of shape (rows,), which NumPy broadcasts
# along the *last* axis, as if it were one row. Against a (4, 3) gradient that is an error, but
# against a square one it runs and subtracts from each element the mean of another row. The
# finite differences catch it, on a square shape: test a row-wise backward on shapes whose
# axes differ, and on a square one (the graders draw both).


# %%
def forgot_keepdims(g):
    return g - g.mean(axis=-1)  # shape (rows,): broadcast as a row, not as a column


x_square, r_square = rows.standard_normal((2, 3, 3))
numerical_square = central_differences(lambda v: np.sum(r_square * centered(v)), x_square)
wrong = np.abs(forgot_keepdims(r_square) - numerical_square).max()
right = np.abs(centered_backward(r_square) - numerical_square).max()
print(f"(3, 3) without keepdims: off by up to {wrong:.2f}; with it: {right:.1e}")
assert right < 1e-8 and wrong > 0.1
try:
    forgot_keepdims(r_rows)
    raise AssertionError("a (4,) vector should not broadcast against (4, 3)")
except ValueError as exc:
    print("(4, 3) without keepdims:", exc)

# %% [markdown]
# ## Summary
#
# - A graph is a set of `Function` nodes; each keeps its edges (leaf tensors, or `Edge`s to
#   the nodes that computed its other inputs) and the arrays its backward needs.
#   `tensor.creator` and `topological_order` let you walk it.
# - Backward visits nodes in topological order, sums the gradients that meet at a node, sums
#   over broadcast axes, and frees saved arrays as it goes.
# - Every gradient has the dtype and shape of its tensor; a float16 input gets a float16
#   gradient even from a float32 product.
# - Finite differences check a backward only in float64: in float32 the rounding error
#   divided by $h$ swamps the derivative.
# - A row-wise op's backward sums its derivative along the row: a reduction with `keepdims=True`,
#   broadcast back; checked against float64 central differences, on a square shape too.
