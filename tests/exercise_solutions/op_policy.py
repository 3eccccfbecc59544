"""Exercise 6.1: the decision autocast makes for each op (tutorials/06_the_op_policy.py)."""

from __future__ import annotations

from tinyamp.policy import DEFAULT_POLICY  # hint: the table: op -> rule; data you may read

FLOAT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}  # the floating dtypes and their sizes


def autocast_dtypes(
    op: str, input_dtypes: list[str], lower: str = "float16", overrides: dict[str, str] | None = None
) -> list[str]:
    """Exercise 6.1: the dtype each input of `op` has once autocast has cast it.

    Task: inside ``autocast(lower, policy=overrides)``, the op `op` receives inputs of the
    dtypes `input_dtypes` (names: "float16", "bfloat16", "float32", "float64", "int64",
    "bool"); return the dtype names it computes with, in order.  `overrides` replaces rows of
    ``tinyamp.policy.DEFAULT_POLICY`` (op -> rule); an op that is in no row is left alone.
    The grader compares your answer with what tinyamp's autocast does.

    Math, one rule per row (tinyamp/policy.py says why each op has its rule):

    * "lower" and "lower_fp32_out": float32 inputs become `lower` (float16 or bfloat16);
    * "fp32": 16-bit floating inputs become float32;
    * "promote": floating inputs narrower than the widest floating input become that one;
    * in every rule, integer and bool inputs stay, and float64 is never lowered: a float64
      computation asked for its precision on purpose.

    Read: tutorials/06_the_op_policy.py, sections 1 (The table) and 7 (Overriding one entry).

    Time: about 15 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 6.1
    rule = {**DEFAULT_POLICY, **(overrides or {})}.get(op)
    if rule in ("lower", "lower_fp32_out"):
        return [lower if d == "float32" else d for d in input_dtypes]
    if rule == "fp32":
        return ["float32" if FLOAT_BYTES.get(d) == 2 else d for d in input_dtypes]
    floats = [d for d in input_dtypes if d in FLOAT_BYTES]
    if rule == "promote" and floats:
        widest = max(floats, key=FLOAT_BYTES.__getitem__)  # the first of the widest, as autocast picks it
        return [widest if FLOAT_BYTES.get(d, 99) < FLOAT_BYTES[widest] else d for d in input_dtypes]
    return list(input_dtypes)
    # <<< exercise 6.1
