"""Wrong solutions a careful student plausibly writes, one rule broken in each, and the grade each gets.

Each mutant is the reference solution with one edit: a rule of the stub's docstring broken,
a parameter ignored, float64 or float16 where float32 is stated, a loop that stops early, or
the conversion (or tinyamp's own implementation) the exercise forbids reached through
``getattr``, ``importlib``, ``__import__``, a helper or an alias.  Each is written into a
workspace and graded as ``tinyamp exercises check`` grades it (the default, deterministic
examples): it must fail, with a reason that names the rule it broke.

Deterministic, but not fixed: hypothesis also draws constants from the modules loaded so far, so
the counterexample a grader meets first changes with the tests run before it, the code and the
hypothesis version.  So each reason's pattern holds for every counterexample of its mistake (both
faults of a mutant with two, either sign, every value beyond a threshold), checked by grading every
mutant with random draws under many seeds.

Covered: every exercise (1.1 to 10.3).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from exercise_helpers import FAILED, grade_remote

from tinyamp.exercises.catalog import PACKAGE, find
from tinyamp.exercises.workspace import write_workspace

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]
IMPORTLIB = "import importlib\n"

# (exercise, what is wrong, the text of the reference solution replaced, its replacement, the reason's pattern)
MUTANTS: list[tuple[str, str, str, str, str]] = [
    # ---- 1.1 round_to_float16 ----------------------------------------------------------------------------------------
    (
        "ex1_1",
        "the sign dropped",
        "return (bits | sign)",
        "return (bits | 0 * sign)",
        r"for x = -.* yours gives (?!-).*; float16 rounds it to -",
    ),
    (
        "ex1_1",
        "NaN becomes inf",
        "bits = np.where(np.isnan(x), 0x7E00, bits)",
        "pass",
        r"for x = nan .* a NaN, yours gives 0; float16 rounds it to nan",
    ),
    (
        "ex1_1",
        "overflow from 65504 up",
        "magnitude >= 65520",
        "magnitude > 65504",
        r"beyond the largest float16 value 65504 \(the overflow threshold is halfway",
    ),
    (
        "ex1_1",
        "subnormals flushed to 0",
        "normal, subnormal)",
        "normal, 0)",
        r"yours gives 0; float16 rounds it to \S+e-0[5-8]",
    ),
    (
        "ex1_1",
        "the addition in float64",
        "rounded = (magnitude + big) - big",
        "rounded = ((magnitude.astype(np.float64) + big) - big).astype(np.float32)",
        r"just above halfway between the float16 neighbours .* \(to nearest, ties to even\)",
    ),
    (
        "ex1_1",
        "B one power of two too small",
        "np.maximum(e - 1, -14) + 13",
        "np.maximum(e - 1, -14) + 12",
        r"halfway between the float16 neighbours .* \(to nearest, ties to even\)",
    ),
    (
        "ex1_1",
        "the subnormal B ignored",
        "np.maximum(e - 1, -14) + 13",
        "(e - 1) + 13",
        r"halfway between the float16 neighbours \S+e-0[5-8] and",
    ),
    (
        "ex1_1",
        "float16 through getattr",
        "magnitude = np.abs(x)",
        "return x.astype(getattr(np, 'float16'))",
        r"converts to float16 with NumPy \(line \d+: astype\(float16\)\)",
    ),
    (
        "ex1_1",
        "float16 through a computed name",
        "magnitude = np.abs(x)",
        "return x.astype(getattr(np, 'float' + str(16)))",
        r"reaches a name the grader cannot follow \(line \d+: getattr with a computed",
    ),
    (
        "ex1_1",
        "float16 through a dtype in a variable",
        "magnitude = np.abs(x)",
        "d = 'float' + '16'\n    return x.astype(d)",
        r"converts to a dtype the grader cannot read \(line \d+: astype\(<a dtype",
    ),
    (
        "ex1_1",
        "float16 positional in np.asarray",
        "magnitude = np.abs(x)",
        "return np.asarray(x, np.float16)",
        r"converts to float16 with NumPy \(line \d+: asarray\(\.\.\., float16\)\)",
    ),
    (
        "ex1_1",
        "float16 through a helper",
        "magnitude = np.abs(x)",
        "return _to16(x)\n\n\ndef _to16(v):\n    return v.astype(np.float16)\n\n\n"
        "def _unused(x):\n    magnitude = np.abs(x)",
        r"converts to float16 with NumPy \(line \d+: astype\(float16\)\)",
    ),
    (
        "ex1_1",
        "float16 through a module alias",
        "magnitude = np.abs(x)",
        "return x.astype(HALF)\n\n\nHALF = np.float16\n\n\ndef _unused(x):\n    magnitude = np.abs(x)",
        r"converts to a dtype the grader cannot read|converts to float16 with NumPy",
    ),
    (
        "ex1_1",
        "tinyamp's rounding through importlib",
        "magnitude = np.abs(x)",
        "return __import__('importlib').import_module('tinyamp.rounding').round_to_float16(x)",
        r"uses tinyamp\.rounding, tinyamp's own version of what Exercise 1\.1",
    ),
    (
        "ex1_1",
        "tinyamp's rounding through __import__",
        "magnitude = np.abs(x)",
        "return __import__('tinyamp.rounding', fromlist=['r']).round_to_float16(x)",
        r"uses tinyamp\.rounding, tinyamp's own version of what Exercise 1\.1",
    ),
    # ---- 1.2 float16_ulp ---------------------------------------------------------------------------------------------
    (
        "ex1_2",
        "x not rounded to float16 first",
        "v = abs(float(np.float16(x)))",
        "v = abs(float(x))",
        r"\(round x to float16 once, directly\)",
    ),
    (
        "ex1_2",
        "inf returned instead of ValueError",
        'raise ValueError(f"{x!r} is not finite in float16: it has no ulp")',
        "return math.inf",
        r"yours returns inf: x is not finite in float16, raise ValueError",
    ),
    (
        "ex1_2",
        "the subnormal ulp only at 0",
        "if v < 2.0**-14:",
        "if v == 0:",
        r"a subnormal value, yours gives 2\^-\d+; the ulp is 2\^-24",
    ),
    (
        "ex1_2",
        "the exponent off by one",
        "return 2.0 ** (k - 10)",
        "return 2.0 ** (k - 11)",
        r"a normal value, yours gives .*; the ulp is .*: the gap from .* to the next larger float16",
    ),
    (
        "ex1_2",
        "rounded through float32 first",
        "v = abs(float(np.float16(x)))",
        "v = abs(float(np.float16(np.float32(x))))",
        r"for x = -?(2047\.4999|65519\.9999).* once, directly",
    ),
    (
        "ex1_2",
        "tinyamp's ulp through importlib",
        'with np.errstate(over="ignore"):\n        v = abs',
        "return __import__('importlib').import_module('tinyamp.amp.formats').ulp(x, 'float16')\n    with "
        'np.errstate(over="ignore"):\n        v = abs',
        r"uses tinyamp\.amp\.formats, tinyamp's own version of what Exercise 1\.2",
    ),
    (
        "ex1_2",
        "tinyamp's ulp through getattr",
        'with np.errstate(over="ignore"):\n        v = abs',
        "import tinyamp.amp\n    return getattr(tinyamp.amp, 'formats').ulp(x, 'float16')\n    with "
        'np.errstate(over="ignore"):\n        v = abs',
        r"uses tinyamp\.amp\.formats, tinyamp's own version of what Exercise 1\.2",
    ),
    # ---- 1.3 fp16_matmul ---------------------------------------------------------------------------------------------
    (
        "ex1_3",
        "sums in float64",
        "return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)",
        "return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)",
        r"float32 rounds it to 1 \+ 2\^-11, halfway .*\(the sums must be float32: a float64 sum keeps",
    ),
    (
        "ex1_3",
        "sums in float16",
        "return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)",
        "out = np.zeros((a.shape[0], b.shape[1]), np.float16)\n    for k in range(a.shape[1]):\n        out = out + "
        "a[:, k:k + 1] * b[k:k + 1, :]\n    return out",
        r"your \[\d, \d\] is .*; the exact sum of products is .*sum in float32, round at the end",
    ),
    (
        "ex1_3",
        "a loop that stops one product early",
        "return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)",
        "out = np.zeros((a.shape[0], b.shape[1]), np.float32)\n    for k in range(a.shape[1] - 1):\n        out += "
        "np.outer(a[:, k], b[k]).astype(np.float32)\n    return out.astype(np.float16)",
        r"your \[0, 0\] is 0; the exact sum of products is 1",
    ),
    (
        "ex1_3",
        "tinyamp's product through importlib",
        "return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)",
        "return __import__('importlib').import_module('tinyamp.kernels').matmul(a, b)",
        r"uses tinyamp\.kernels, tinyamp's own version of what Exercise 1\.3",
    ),
    # ---- 2.1 to 2.3: backwards ---------------------------------------------------------------------------------------
    (
        "ex2_1",
        "axis ignored",
        "return y * (g - (g * y).sum(axis=axis, keepdims=True))",
        "return y * (g - (g * y).sum(axis=-1, keepdims=True))",
        r"and axis = -?\d: .*your \w+_backward gives .*, finite differences give",
    ),
    (
        "ex2_1",
        "the sum without g",
        "return y * (g - (g * y).sum(axis=axis, keepdims=True))",
        "return y * (g - y.sum(axis=axis, keepdims=True))",
        r"your \w+_backward gives .*, finite differences give",
    ),
    (
        "ex2_2",
        "axis ignored",
        "return g - np.exp(y) * g.sum(axis=axis, keepdims=True)",
        "return g - np.exp(y) * g.sum(axis=-1, keepdims=True)",
        r"and axis = -?\d: .*your \w+_backward gives .*, finite differences give",
    ),
    (
        "ex2_2",
        "y used as probabilities",
        "return g - np.exp(y) * g.sum(axis=axis, keepdims=True)",
        "return g - y * g.sum(axis=axis, keepdims=True)",
        r"your \w+_backward gives .*, finite differences give",
    ),
    (
        "ex2_2",
        "nothing returned",
        "return g - np.exp(y) * g.sum(axis=axis, keepdims=True)",
        "g - np.exp(y) * g.sum(axis=axis, keepdims=True)",
        r"raised TypeError: your log_softmax_backward returned NoneType: return dL/dx, a float64 array of shape",
    ),
    (
        "ex2_3",
        "rstd ignored",
        "return rstd * (g - g.mean(",
        "return 1.0 * (g - g.mean(",
        r"your \w+_backward gives .*, finite differences give",
    ),
    (
        "ex2_3",
        "the variance's share dropped",
        "- xhat * (g * xhat).mean(axis=-1, keepdims=True))",
        ")",
        r"your \w+_backward gives .*, finite differences give",
    ),
    (
        "ex2_3",
        "the means over every axis",
        "g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True)",
        "g.mean() - xhat * (g * xhat).mean()",
        r"\(shape \(\d+(, \d+)+\), float64\).*your \w+_backward gives .*, finite differences give",
    ),
    # ---- 4.1 update_is_lost ------------------------------------------------------------------------------------------
    (
        "ex4_1",
        "a zero update counted as lost",
        "if update == 0:\n        return False\n    moved",
        "moved",
        r"and update = -?0 yours says True, expected False",
    ),
    (
        "ex4_1",
        "the exact sum, not the float32 one",
        "float(np.float32(weight) + np.float32(update)) - weight",
        "(weight + update) - weight",
        # the exact sum and the float32 one round to different sides either way: lost called kept, or kept lost
        r"yours says (False, expected True|True, expected False): the float32 sum .* rounds to",
    ),
    (
        "ex4_1",
        "direction ignored",
        "toward_zero = weight != 0 and (moved < 0) == (weight > 0)",
        "toward_zero = False",
        r"yours says True, expected False: .*half the gap from the weight to its neighbour (below|above)",
    ),
    (
        "ex4_1",
        "ties always lost",
        "return (w / ulp) % 2 == 0",
        "return True",
        r"yours says True, expected False: .*the sum is exactly halfway: a tie",
    ),
    (
        "ex4_1",
        "no subnormal gap",
        "ulp = 2.0**-24 if w < 2.0**-14 else 2.0 ** (math.frexp(w)[1] - 11)",
        "ulp = 2.0 ** (math.frexp(w)[1] - 11)",
        r"for weight = -?(0|2\^-\d+|\S+e-0[5-8]) and update = .* yours says",  # every weight below 2^-14, 0 too
    ),
    (
        "ex4_1",
        "float16 through getattr",
        "if update == 0:\n        return False\n",
        "if update == 0:\n        return False\n    f16 = getattr(np, 'float16')\n    return "
        "float(f16(np.float32(weight) + np.float32(update))) == weight\n",
        r"converts to float16 with NumPy \(line \d+: getattr\(\.\.\., float16\)\)",
    ),
    (
        "ex4_1",
        "tinyamp's rule through importlib",
        "if update == 0:\n        return False\n",
        "return __import__('importlib').import_module('tinyamp.amp.lost_updates').update_is_lost(weight, update)\n",
        r"uses tinyamp\.amp\.lost_updates, tinyamp's own version",
    ),
    # ---- 4.2 master_step ---------------------------------------------------------------------------------------------
    (
        "ex4_2",
        "lr ignored",
        "master - np.float32(lr) * grad16",
        "master - np.float32(0.01) * grad16",
        r"and lr = .*: your new master\[0\] is .*, expected .*: master - float32\(lr\) \* widened grad16",
    ),
    (
        "ex4_2",
        "the step in float64",
        "new_master = master - np.float32(lr) * grad16.astype(np.float32)",
        "new_master = (master.astype(np.float64) - lr * grad16.astype(np.float64)).astype(np.float32)",
        r"your new master\[0\] is .*, expected .*: master - float32\(lr\) \* widened grad16, computed in fl",
    ),
    (
        "ex4_2",
        "unchanged elements counted as lost",
        "lost = (new_master != master) & (update != 0) & stays",
        "lost = stays",
        r"you count 1 lost updates, expected 0: the elements whose master changed",
    ),
    (
        "ex4_2",
        "the float16 weight from w16, not the master",
        "return new_master.astype(np.float16), new_master",
        "return (w16.astype(np.float32) + update).astype(np.float16), new_master",
        r"your new w16\[0\] is .*, expected .*: the new master rounded once",
    ),
    (
        "ex4_2",
        "tinyamp's optimizer through importlib",
        "new_master = master - np.float32(lr)",
        "opt = __import__('importlib').import_module('tinyamp.optim')\n    new_master = master - np.float32(lr)",
        r"uses tinyamp\.optim, tinyamp's own version of what Exercise 4\.2",
    ),
    # ---- 5.1 DynamicLossScaler ---------------------------------------------------------------------------------------
    (
        "ex5_1",
        "growth_factor ignored",
        "self.scale * self.growth_factor",
        "self.scale * 2.0",
        r"clean steps? your scale is .*, the (pytorch|jmp) rule says .*growth_factor=(?!2,)",
    ),
    (
        "ex5_1",
        "backoff_factor ignored",
        "self.scale * self.backoff_factor",
        "self.scale * 0.5",
        r"overflows? your scale is .*, the (pytorch|jmp) rule says .*backoff_factor=(?!0\.5,)",
    ),
    (
        "ex5_1",
        "growth_interval ignored",
        "if self.growth_tracker < self.growth_interval:",
        "if self.growth_tracker < 2000:",
        r"after growth_interval=1 clean steps in a row the scale must grow",
    ),
    (
        "ex5_1",
        "max_scale ignored",
        "self.scale = grown if self.max_scale is None else min(grown, self.max_scale)",
        "self.scale = grown",
        r"your scale is 4096, the rule says 3000 .*: a grown scale above max_scale is lowered",
    ),
    (
        "ex5_1",
        "min_scale ignored",
        "if self.min_scale is not None:",
        "if False:",
        # the rule's scale is the floor, whichever floor was drawn (jmp's own 1, or a power of two)
        r"overflows? your scale is \S+, the jmp rule says (\S+) \(settings: .*min_scale=\1,",
    ),
    (
        "ex5_1",
        "init_scale ignored",
        "self.scale = float(np.float32(init_scale))",
        "self.scale = 2.0**16",
        r"before any step your scale is 65536, the (pytorch|jmp) rule says .*init_scale=(?!65536,)",
    ),
    (
        "ex5_1",
        "growth one step early",
        "if self.growth_tracker < self.growth_interval:",
        "if self.growth_tracker < self.growth_interval - 1:",
        r"the scale grows only after exactly growth_interval=2 clean steps in a row",
    ),
    (
        "ex5_1",
        "the grown scale not rounded to float32",
        "grown = float(np.float32(self.scale * self.growth_factor))",
        "grown = self.scale * self.growth_factor",
        # a factor that is not a power of two shows it at a growth that float32 rounds; a power of two (2, 4, or 8 or
        # 16 drawn as any factor) at float32's ceiling, where the unrounded scale grows to 2^128 to 2^131 (which
        # of the two the grader meets first depends on hypothesis's draws)
        r"clean steps? your scale is \S+, the pytorch rule says \S+: the pytorch rule keeps its scale in float32, so "
        r"each new scale is rounded to float32 \(\S+ \* \S+ rounds to \S+\) \(settings: .*growth_factor=(?!2,|4,)"
        r"|clean steps your scale is 2\^1(2[89]|3[01]), the pytorch rule says \S+: the scale must never grow to inf .*"
        r"the scale is a float32 value, and float32's largest is just below 2\^128",
    ),
    (
        "ex5_1",
        "load_state_dict ignores the tracker",
        'self.scale, self.growth_tracker = float(state_dict["scale"]), int(state_dict["growth_tracker"])',
        'self.scale = float(state_dict["scale"])',
        r"a scaler restored from your state_dict\(\) .* a state_dict round trip",
    ),
    (
        "ex5_1",
        "tinyamp's scaler through importlib",
        "self.scale = float(np.float32(init_scale))",
        "self.ref = __import__('importlib').import_module('tinyamp.amp').LossScaler\n        self.scale = "
        "float(np.float32(init_scale))",
        r"uses tinyamp\.amp, tinyamp's own version of what Exercise 5\.1",
    ),
    # ---- 5.2 skip_or_step --------------------------------------------------------------------------------------------
    (
        "ex5_2",
        "unscaled in float64",
        "(p.grad.astype(np.float32) * inverse)",
        "(p.grad.astype(np.float64) / scale)",
        r"with scale (?!1 )\S+ .*unscale every gradient \(multiply by 1/scale in float32",
    ),
    (
        "ex5_2",
        "a loop that stops one parameter early",
        "for p in optimizer.params:",
        "for p in optimizer.params[:-1]:",
        # with one parameter the loop checks nothing: a clean step is not taken, or an inf is not seen (which of
        # the two the grader's examples meet first depends on hypothesis's draws, hence both)
        r"after your step the (weight|optimizer's \S+ of|gradient of) w\d.*: unscale every gradient \(multiply by "
        r"1/scale in float32, round once to its dtype\)(, then call optimizer.step\(\) \(skip_or_step| in place)"
        r"|an inf in the scaled gradient of w0, .*your step returned skipped=False, but an unscaled gradient is not "
        r"finite",
    ),
    (
        "ex5_2",
        "skipped reported the wrong way round",
        "return not finite",
        "return finite",
        r"your step returned skipped=True, but every gradient is finite",
    ),
    (
        "ex5_2",
        "finite checked on the first gradient only",
        "finite = finite and bool(np.isfinite(p.grad).all())",
        "finite = bool(np.isfinite(optimizer.params[0].grad).all())",
        r"(an inf|a NaN) in the scaled gradient of w[1-9].* skipped=False, but an",
    ),
    # ---- 5.3 scaling_is_exact ----------------------------------------------------------------------------------------
    (
        "ex5_3",
        "k ignored",
        "scaled = g.astype(np.float64) * 2.0**k",
        "scaled = g.astype(np.float64)",
        r"and k = -?\d+ \(S = 2\^-?\d+\).* yours says (not )?exact, but g \* S = ",
    ),
    (
        "ex5_3",
        "65504 itself not allowed",
        "np.abs(scaled) <= 65504.0",
        "np.abs(scaled) < 65504.0",
        r"yours says not exact, but g \* S = -?65504 is a float16 value",  # g = 65504, or 2047 with k = 5, ...
    ),
    (
        "ex5_3",
        "the subnormal grid ignored",
        " & (np.mod(scaled, 2.0**-24) == 0)",
        "",
        r"yours says exact, but g \* S = \S+ is not a float16 value: it rounds to",
    ),
    # ---- 6.1 autocast_dtypes -----------------------------------------------------------------------------------------
    (
        "ex6_1",
        "lower ignored",
        'return [lower if d == "float32" else d',
        'return ["float16" if d == "float32" else d',
        r"under autocast\('bfloat16'.* yours gives \['float16'\]; autocast gives \['bfloat16'\]",
    ),
    (
        "ex6_1",
        "overrides ignored",
        "rule = {**DEFAULT_POLICY, **(overrides or {})}.get(op)",
        "rule = DEFAULT_POLICY.get(op)",
        r"policy=\{.*\}\) yours gives .*; autocast gives",
    ),
    (
        "ex6_1",
        "bfloat16 kept by the fp32 rule",
        'return ["float32" if FLOAT_BYTES.get(d) == 2 else d',
        'return ["float32" if d == "float16" else d',
        r"\(rule 'fp32'\) with inputs bfloat16 .* yours gives \['bfloat16'\]",
    ),
    (
        "ex6_1",
        "promote always to float32",
        "widest = max(floats, key=FLOAT_BYTES.__getitem__)",
        'widest = "float32"',
        r"\(rule 'promote'\) .* yours gives \['float32'\]; autocast gives \['float16'\]",
    ),
    (
        "ex6_1",
        "float64 lowered too",
        'return [lower if d == "float32" else d',
        'return [lower if d in ("float32", "float64") else d',
        r"with inputs float64 .* yours gives \['float16'\]; autocast gives \['float64'\]",
    ),
    (
        "ex6_1",
        "tinyamp's autocast through importlib",
        "rule = {**DEFAULT_POLICY",
        "ac = __import__('importlib').import_module('tinyamp.autocast')\n    rule = {**DEFAULT_POLICY",
        r"uses tinyamp\.autocast, tinyamp's own version of what Exercise 6\.1",
    ),
    # ---- 7.1 checkpoint_segment --------------------------------------------------------------------------------------
    (
        "ex7_1",
        "gradients from elsewhere not set aside",
        "        for p in self.params:\n            p.grad = None\n",
        "",
        r"two forward and backward passes \(the gradients add up in \.grad\): the",
    ),
    (
        "ex7_1",
        "the graph kept: no memory saved",
        "        with no_grad():\n            return segment(Tensor(x)).data",
        "        self.kept = segment(Tensor(x))\n        return self.kept.data",
        r"your forward leaves .* MiB held until backward, the plain segment",
    ),
    (
        "ex7_1",
        "tinyamp's checkpoint through importlib",
        "params = list(params)\n",
        "params = list(params)\n    return __import__('importlib').import_module('tinyamp.recompute').checkpoint(segm"
        "ent, x)\n",
        r"uses tinyamp\.recompute, tinyamp's own version of what Exercise 7\.1",
    ),
    # ---- 9.1 mean_gradient -------------------------------------------------------------------------------------------
    (
        "ex9_1",
        "the float32 reduction summed in float64",
        "total = grads[0].astype(np.float32)",
        "return (sum(g.astype(np.float64) for g in grads) / n).astype(np.float32)",
        r"reduction 'float32': your mean\[\d+\] is .*: widen each gradient to float32, sum",
    ),
    (
        "ex9_1",
        "a loop that stops one rank early",
        "for p in parts[1:]:",
        "for p in parts[1:-1]:",
        r"your mean\[\d+\] is \S+, expected \S+: sum in rank order in float16",
    ),
    (
        "ex9_1",
        "N ignored in the predivision",
        "/ np.float32(n)).astype(np.float16) for g in grads]",
        "/ np.float32(2)).astype(np.float16) for g in grads]",
        r"'float16-predivide': your mean\[\d+\] is \S+, expected \S+: divide each gradient by N",
    ),
    (
        "ex9_1",
        "tinyamp's all-reduce through importlib",
        "n = len(grads)\n",
        "n = len(grads)\n    d = __import__('importlib').import_module('tinyamp.distributed')\n",
        r"uses tinyamp\.distributed, tinyamp's own version of what Exercise 9\.1",
    ),
    # ---- 10.1 round_to_e4m3 ------------------------------------------------------------------------------------------
    (
        "ex10_1",
        "ties away from zero",
        "value = np.rint(magnitude / gap) * gap",
        "value = np.floor(magnitude / gap + 0.5) * gap",
        r"yours gives 0x\w\w = .*; the saturating cast gives 0x\w\w = .*a tie (goes to the one whose last mantissa bit "
        r"is 0|between 0 and 2\^-9, and goes to the even one, 0)",
    ),
    (
        "ex10_1",
        "truncated, not rounded",
        "value = np.rint(magnitude / gap) * gap",
        "value = np.trunc(magnitude / gap) * gap",
        r"yours gives 0x\w\w = .*; the saturating cast gives 0x\w\w = .*(halfway between|rounds to the nearer)",
    ),
    (
        "ex10_1",
        "no saturation: NaN beyond 464, as ml_dtypes' cast",
        "np.minimum(np.abs(np.where(nan, np.float32(0), x).astype(np.float64)), 448.0)",
        "np.abs(np.where(nan, np.float32(0), x).astype(np.float64))",
        # beyond 464 it gives NaN (0x7f), far beyond or at inf whatever its unclamped exponent makes; either sign
        r"yours gives 0x\w\w = .*; the saturating cast gives 0x[7f]e = [01] 1111 110 \(-?448\): \S+ is beyond E4M3's "
        r"largest value 448: the recipes' cast saturates it",
    ),
    (
        "ex10_1",
        "NaN written as 0",
        "return np.where(nan, np.uint8(0x7F) | sign, code).astype(np.uint8)",
        "return code",
        r"= nan yours gives 0x00 .*: x is NaN, and E4M3's only NaN is s\.1111\.111",
    ),
    (
        "ex10_1",
        "subnormals flushed",
        "gap = np.exp2(np.maximum(k, -6) - 3)",
        "gap = np.exp2(k - 3)",
        # either sign, any subnormal (or 2^-6 itself, where the largest round up): the clause says where x is
        r"yours gives 0x\w\w = [01] [01]{4} [01]{3} .*the saturating cast gives 0x[08]\w = [01] 000[01] [01]{3} .*: "
        r"below 2\^-6 E4M3's values are the subnormals, the multiples of 2\^-9",
    ),
    (
        "ex10_1",
        "the sign dropped",
        "code = code.astype(np.uint8) | sign",
        "code = code.astype(np.uint8)",
        r"x\.flat\[0\] = -0 yours gives 0x00 .*: the sign bit \(bit 7\) is x's own, -0\.0 included",
    ),
    (
        "ex10_1",
        "ml_dtypes' cast after a clip",
        "    x = np.asarray(x, dtype=np.float32)\n    sign",
        "    import ml_dtypes\n    return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)\n"
        "    sign",
        r"uses ml_dtypes(\.float8_e4m3fn)?, a library's version of what Exercise 10\.1 asks you to build",
    ),
    (
        "ex10_1",
        "an FP8 dtype by its name",
        "    x = np.asarray(x, dtype=np.float32)\n    sign",
        "    return np.clip(x, -448, 448).astype('float8_e4m3fn').view(np.uint8)\n    sign",
        r"names an FP8 type \(line \d+: float8_e4m3fn\): Exercise 10\.1 asks you to round by hand",
    ),
    (
        "ex10_1",
        "tinyamp's cast through __import__",
        "    x = np.asarray(x, dtype=np.float32)\n    sign",
        "    return __import__('tinyamp.fp8.formats', fromlist=['e']).encode(x, 'E4M3')\n    sign",
        r"uses tinyamp\.fp8\.formats, tinyamp's own version of what Exercise 10\.1",
    ),
    # ---- 10.2 DelayedScaling -----------------------------------------------------------------------------------------
    (
        "ex10_2",
        "an amax of 0 divides",
        "        if r == 0:\n            return\n",
        "",
        r"after the amaxes 0 your scale is 3\.40\d*e\+38, tinyamp's rule says 1: the reduced amax .* is 0, nothing "
        r"measured: the previous scale is kept",
    ),
    (
        "ex10_2",
        "a NaN amax written into the history",
        "        if not math.isfinite(amax):\n            return\n",
        "        if math.isinf(amax):\n            return\n",
        r"after the amaxes 2, nan your scale is 3\.40\d*e\+38, tinyamp's rule says 224: a step whose amax is NaN or "
        r"inf keeps the previous scale and leaves the history as it was",
    ),
    (
        "ex10_2",
        "an inf amax written into the history",
        "        if not math.isfinite(amax):\n            return\n",
        "        if math.isnan(amax):\n            return\n",
        r"after the amaxes 2, inf your amax_history is \[2, inf\] .*the rule's is \[0, 2\] .*a NaN or inf amax is "
        r"not written",  # its scale 448 / inf = 0 is held, as a quotient that underflows is: the history shows it
    ),
    (
        "ex10_2",
        "the overflow left at inf",
        "self.scale = float(scale) if np.isfinite(scale) else float(np.finfo(np.float32).max)",
        "self.scale = float(scale)",
        r"after the amaxes 2\^-149 your scale is inf, .* overflows float32 .*: the scale becomes float32's largest "
        r"value 3\.40\d*e\+38, not inf",
    ),
    (
        "ex10_2",
        "margin ignored",
        "np.float32(self.fp8_max * 2.0**-self.margin)",
        "np.float32(self.fp8_max)",
        r"margin=1, .* your scale is 224, tinyamp's rule says 112: scale = float32\(448 \* 2\^-1\) / 2",
    ),
    (
        "ex10_2",
        "most_recent ignored",
        'r = self.amax_history.max() if self.amax_compute_algo == "max" else self.amax_history[-1]',
        "r = self.amax_history.max()",
        r"after the amaxes 2, 200, 3 your scale is 1\.12\d*, tinyamp's rule says 74\.66\d*: .*where 3 is the newest",
    ),
    (
        "ex10_2",
        "an amax of 0 not written (TE's bulk kernel)",
        "        self.amax_history = np.append(",
        "        if amax == 0:\n            return\n        self.amax_history = np.append(",
        r"after the amaxes 0, 2, 0 your amax_history is \[0, 0, 2\] .*the rule's is \[0, 2, 0\] .*a 0 included",
    ),
    # ---- 10.3 mx_block_scales ----------------------------------------------------------------------------------------
    (
        "ex10_3",
        "the exponent rounded up",
        "e = np.where(amax > 0, k - emax_elem, -127)",
        "e = np.where(amax > 0, np.ceil(np.log2(np.where(amax > 0, amax, 1))).astype(int) - emax_elem, -127)",
        r"yours gives the byte \d+ \(2\^-?\d+\), the OCP rule gives \d+ .*: e = floor\(log2 amax\) - emax_elem = "
        r".*yours is that exponent rounded up \(Transformer Engine's choice\)",
    ),
    (
        "ex10_3",
        "log2 in float32",
        "k = np.frexp(amax)[1] - 1",
        "k = np.floor(np.log2(amax.astype(np.float32))).astype(int)",
        r"log2 in float32 rounds \S+ up to exactly -?\d+: take the exponent exactly \(np\.frexp\)",  # 2^-2 too
    ),
    (
        "ex10_3",
        "no clamp to E8M0's range",
        "return (np.clip(e, -127, 127) + 127).astype(np.uint8)",
        "return (e + 127).astype(np.uint8)",
        r"the OCP rule gives 0 \(2\^-127\): e = .* below E8M0's smallest exponent: clamp e to -127",
    ),
    (
        "ex10_3",
        "emax_elem as log2 448",
        "e = np.where(amax > 0, k - emax_elem, -127)",
        "e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1)) - np.log2({'E4M3': 448.0, 'E5M2': "
        "57344.0}[fmt])).astype(int), -127)",
        r"yours is one lower: emax_elem is the exponent of the largest value's binade, (8|15) = floor\(log2 ",
    ),
    (
        "ex10_3",
        "E4M3's emax_elem for E5M2",
        'emax_elem = {"E4M3": 8, "E5M2": 15}[fmt]',
        "emax_elem = 8",
        r"fmt = 'E5M2'.*E5M2's emax_elem is 15 \(its largest value is 57344 = 1\.75 \* 2\^15\), not E4M3's 8",
    ),
    (
        "ex10_3",
        "a block of zeros given an exponent",
        "e = np.where(amax > 0, k - emax_elem, -127)",
        "e = k - emax_elem",
        r"has amax 0; yours gives the byte \d+ .*: a block of zeros has no amax; it gets e = -127, the byte 0",
    ),
]


def mutant_source(exercise_id: str, old: str, new: str) -> str:
    """The reference solution's module with `old` replaced by `new` (once: the edit must be unambiguous)."""
    source = (ROOT / f"tests/exercise_solutions/{find(exercise_id).module}.py").read_text()
    assert source.count(old) == 1, f"{exercise_id}: {old!r} occurs {source.count(old)} times in the solution"
    return source.replace(old, new)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("mutants") / "ws"
    write_workspace(directory)
    return directory


@pytest.mark.parametrize("exercise_id, wrong, old, new, reason", MUTANTS, ids=[f"{m[0]}: {m[1]}" for m in MUTANTS])
def test_each_plausible_wrong_solution_fails_with_the_rule_it_broke(
    stubs: Path, exercise_id: str, wrong: str, old: str, new: str, reason: str
) -> None:
    fails_with_its_reason(stubs, exercise_id, wrong, old, new, reason)


def fails_with_its_reason(stubs: Path, exercise_id: str, wrong: str, old: str, new: str, reason: str) -> None:
    exercise = find(exercise_id)
    (stubs / PACKAGE / f"{exercise.module}.py").write_text(mutant_source(exercise_id, old, new))
    result = grade_remote(exercise, stubs)  # as the command grades: the student's code in a process of its own
    assert result.status == FAILED, f"{wrong}: graded {result.status}"
    assert re.search(reason, result.message), result.message
