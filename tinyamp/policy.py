"""The op policy of autocast: which ops run in lower precision and which stay in FP32.

The table is plain data (op name -> rule), printable and changeable:

* ``"lower"``: inputs are cast to the autocast dtype (float16 or bfloat16) and the op
  runs there.  Matrix products: FP16 x FP16 products are exact in FP32 (11 + 11
  significant bits fit in FP32's 24), so they are accumulated in FP32 and rounded
  once: a model of Tensor Core numerics (exact products, FP32 sums in one order; the
  hardware's adder trees order and truncate their sums differently, ``ops/matmul.py``).
* ``"lower_fp32_out"``: the same products, but the FP32 accumulator is returned
  unrounded (for a final layer whose output feeds a loss).
* ``"fp32"``: floating inputs are cast to float32, and the output is float32.  For ops
  whose float16 result overflows, underflows or loses the sum: exp (e^12 > 65504),
  log of tiny values, softmax and its log, losses, layer norm (the square of a float16
  value of 256 or more exceeds 65504), powers, and large reductions (a float16 running sum stalls at
  2048 when adding ones).
* ``"promote"``: mixed inputs are cast to the widest floating dtype among them
  (float16 + float32 -> float32); this is what elementwise ops do anyway.

Ops that are not in the table run in whatever dtype their inputs have.
"""

from __future__ import annotations

LOWER = "lower"
LOWER_FP32_OUT = "lower_fp32_out"
FP32 = "fp32"
PROMOTE = "promote"
RULES = (LOWER, LOWER_FP32_OUT, FP32, PROMOTE)

DEFAULT_POLICY: dict[str, str] = {
    # products: FP16 in, FP32 accumulate, FP16 out
    "matmul": LOWER,
    "linear": LOWER,
    # numerically sensitive: kept in FP32
    "softmax": FP32,
    "log_softmax": FP32,
    "cross_entropy": FP32,
    "layer_norm": FP32,
    "exp": FP32,
    "log": FP32,
    "pow": FP32,
    "sum": FP32,
    "mean": FP32,
    # elementwise arithmetic: widest input wins
    "add": PROMOTE,
    "sub": PROMOTE,
    "mul": PROMOTE,
    "div": PROMOTE,
    "concatenate": PROMOTE,
}

WHY: dict[str, str] = {
    "matmul": "FP16 products are exact in FP32; accumulate in FP32, round once",
    "linear": "as matmul; the bias is added to the FP32 accumulator before rounding",
    "softmax": "exp overflows FP16 for inputs above 11.09",
    "log_softmax": "probabilities at or below 2^-25 (3e-8) round to 0 in FP16: their log is -inf",
    "cross_entropy": "a loss is a large sum of small terms",
    "layer_norm": "the variance squares values: 256^2 > 65504",
    "exp": "e^x overflows FP16 for x > 11.09",
    "log": "its inputs are often tiny; FP16 rounds them to 0 at or below 2^-25 (3e-8)",
    "pow": "powers overflow and underflow quickly",
    "sum": "an FP16 running sum of ones stalls at 2048 (2048 + 1 rounds to 2048)",
    "mean": "a sum first, then a division",
    "add": "promote mixed inputs",
    "sub": "promote mixed inputs",
    "mul": "promote mixed inputs",
    "div": "promote mixed inputs",
    "concatenate": "promote mixed inputs",
}


def check_rule(op: str, rule: str) -> None:
    """Raise a clear error for a rule that is not one of RULES."""
    if rule not in RULES:
        raise ValueError(f"unknown autocast rule {rule!r} for op {op!r}; choose one of {', '.join(RULES)}")


def format_policy(policy: dict[str, str] | None = None) -> str:
    """The policy as a printable table: op, rule, and the numerical reason."""
    policy = DEFAULT_POLICY if policy is None else policy
    lines = [f"{'op':<15}{'rule':<16}why"]
    for op, rule in policy.items():
        lines.append(f"{op:<15}{rule:<16}{WHY.get(op, '')}")
    return "\n".join(lines)
