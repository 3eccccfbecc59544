"""Grades no submission can forge: the verdict is decided in a process that never runs student code, from plain data
checked against its own reference.  Each attack is made for real, by a workspace graded by the real command in a
subprocess; each fails its exercise with one sentence, while the stubs beside it report "not started"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyamp.exercises import remote
from tinyamp.exercises.catalog import PACKAGE
from tinyamp.exercises.workspace import write_workspace

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]

# module -> code appended to its stub: at import it patches the grading it could reach before, and it redefines
# one exercise with a wrong answer that the patch would have let pass (the other exercises there stay stubs)
ATTACKS = {
    "formats": '''
import tinyamp.amp.formats as _formats
import tinyamp.exercises.grading as _grading
import tinyamp.testing.rounding as _rounding

_grading.FAILED = _grading.NOT_STARTED = "passed"  # every verdict of this process would read "passed"
_rounding._compare = lambda *args, **kwargs: None  # check_rounding would compare nothing
_formats.ulp = lambda x, fmt="float16": 1.0  # the reference ulp would agree with the answer below


def round_to_float16(x):
    return x


def float16_ulp(x):
    if not math.isfinite(x) or abs(x) >= 65520:
        raise ValueError("not finite in float16")
    return 1.0


def fp16_matmul(a, b):
    return np.zeros((a.shape[0], b.shape[1]), a.dtype)
''',
    "data_parallel": '''
np.isnan = lambda x: np.ones(np.shape(x), bool)  # "every element is NaN": no difference would count


def mean_gradient(grads, reduction):
    return np.zeros(grads[0].shape, np.float32)
''',
    "eight_bits": '''
class Liar(np.ndarray):
    """An array that says it equals anything."""

    def __eq__(self, other):
        return np.ones(np.broadcast(self, other).shape, bool)

    def __ne__(self, other):
        return np.zeros(np.broadcast(self, other).shape, bool)


def round_to_e4m3(x):
    return np.zeros(x.shape, np.uint8).view(Liar)
''',
    "master_weights": '''
class Answer:
    """Pickled, it would come back whole; it is truthy and equal to anything."""

    def __bool__(self):
        return True

    def __eq__(self, other):
        return True


def update_is_lost(weight, update):
    return Answer()
''',
    "backward": '''
def softmax_backward(y, g, axis):
    return np.zeros(30 * 2**20, np.uint8)  # 30 MiB: more than a reply may hold
''',
    "loss_scaling": '''
def scaling_is_exact(g, k):
    return [True] * 8_000_000  # not an array: the student's process writes it whole, and the grader refuses it
''',
    "checkpointing": '''
import tinyamp.exercises.remote as _remote

_remote.Server.send = lambda self, reply: self.connection.send_bytes(b"\\x80\\x04 not JSON")
''',
}
# exercise -> what its row must say (it fails, with this sentence)
FAILS = {
    "1.1": "it must return a float16 array of shape",
    "1.2": "yours gives 1; the ulp is",
    "1.3": "your [0, 0] is 0",
    "9.1": "your mean[0] is 0, expected",
    "10.1": "your round_to_e4m3 returned an ndarray subclass, myamp.eight_bits.Liar (return a numpy.ndarray itself",
    "4.1": "your update_is_lost returned an object of type myamp.master_weights.Answer: the grader reads only plain",
    "2.1": f"your softmax_backward returned 31,457,280 bytes of arrays (shape (31457280,), uint8), more than the "
           f"{remote.ARRAY_LIMIT // 2**20} MiB the grader reads from your code",
    "5.3": f"sent the grader a reply of more than {remote.REPLY_LIMIT // 2**20} MiB (a result that large?)",
    "7.1": "sent the grader a reply that is not JSON",
}  # fmt: skip
# The files that change a module they imported are refused by the command before any grading (``reach.patching``):
# these rows say so.  The verdicts above are then tested past that check, as if it had been fooled (below).
REFUSED = {  # regular expressions
    "1.1": r"myamp/formats\.py line \d+: changes tinyamp\.exercises\.grading\.FAILED, which it imported: the grader "
           r"cannot tell what such code changes, so it grades none of it",
    "9.1": r"myamp/data_parallel\.py line \d+: changes numpy\.isnan, which it imported",
    "7.1": r"myamp/checkpointing\.py line \d+: changes tinyamp\.exercises\.remote\.Server\.send, which it imported",
}  # fmt: skip
REFUSED["1.2"] = REFUSED["1.3"] = REFUSED["1.1"]
NOT_STARTED = ("2.2", "2.3", "4.2", "5.1", "5.2", "5.4", "6.1", "10.2", "10.3")


def row(out: str, number: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"{number} "))


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The table `tinyamp exercises check` prints for a workspace of stubs with every attack planted."""
    workspace = tmp_path_factory.mktemp("attacks") / "ws"
    write_workspace(workspace)
    for module, code in ATTACKS.items():
        path = workspace / PACKAGE / f"{module}.py"
        path.write_text(path.read_text() + code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tinyamp", "exercises", "check", str(workspace), "--timeout", "60"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)  # fmt: skip
    assert done.returncode == 1 and not done.stderr, done.stdout + done.stderr
    assert f"{len(FAILS)} failed, {len(NOT_STARTED)} not started" in done.stdout, done.stdout
    return done.stdout


@pytest.mark.parametrize("number", list(FAILS))
def test_each_attack_fails_its_exercise_with_one_sentence(graded: str, number: str) -> None:
    line = row(graded, number)
    assert " failed " in line and re.search(REFUSED.get(number, re.escape(FAILS[number])), line), line
    assert line.count(". ") <= 1 and "Traceback" not in line, line  # one sentence, not a dump


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A workspace of stubs with every attack planted, and the stubs' own sources: what the grader's source
    checks would read if an attack had got past them."""
    from tinyamp.exercises.reach import workspace_sources

    workspace = tmp_path_factory.mktemp("past") / "ws"
    write_workspace(workspace)
    clean = workspace_sources(workspace)
    for module, code in ATTACKS.items():
        path = workspace / PACKAGE / f"{module}.py"
        path.write_text(path.read_text() + code)
    return workspace, clean


@pytest.mark.parametrize("number", list(REFUSED))
def test_past_the_source_checks_the_grader_process_still_decides(attacked: tuple[Path, dict[str, str]],
                                                                 number: str) -> None:  # fmt: skip
    """The second line of defence: the student's process patched tinyamp, NumPy or its own server, the grader
    (this process) read the untouched stubs; the verdict still comes from plain data checked here."""
    from exercise_helpers import FAILED, grade_remote

    from tinyamp.exercises.catalog import find
    from tinyamp.exercises.remote import ChildLost

    workspace, clean = attacked
    try:
        result = grade_remote(find(number), workspace, sources=clean)
        status, message = result.status, result.message
    except ChildLost as lost:  # the command's grader sends this sentence as the verdict (isolation._grader)
        status, message = FAILED, lost.sentence
    assert status == FAILED and FAILS[number] in message, message


@pytest.mark.parametrize("number", NOT_STARTED)
def test_the_stubs_beside_the_attacks_are_not_started(graded: str, number: str) -> None:
    assert " not started " in row(graded, number)


# ---- plain data, both ways ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [
    None, True, 3, -0.0, float("nan"), "x", [1, [2.5]], (1, "a"), {"k": (1, None), 2: [3]},
    np.float16(2.0**-24), np.bool_(True), np.int64(-5), np.arange(6, dtype=np.float16).reshape(2, 3),
    np.array([1.0, np.nan], np.float32), np.zeros((0, 3), np.uint8),
])  # fmt: skip
def test_plain_data_comes_back_as_it_went_exact_type_and_dtype(value: object) -> None:
    back = remote.decode(remote.encode(value))
    assert type(back) is type(value)
    if isinstance(value, (np.ndarray, np.generic)):
        assert back.dtype == value.dtype and back.shape == np.shape(value)
        assert np.asarray(back).tobytes() == np.asarray(value).tobytes()
    elif value == value:  # noqa: PLR0124  (NaN is not equal to itself)
        assert back == value


def test_what_is_not_plain_data_is_refused_in_the_students_process_and_here() -> None:
    for value in (np.array([object()]), np.zeros(3).view(np.matrix), object(), {1, 2}, type("Str", (str,), {})()):
        with pytest.raises(remote._Refused):
            remote.encode(value)
    for forged in ({"$": "array", "npy": "not base64!"}, {"$": "pickle", "items": []}, {"no": "tag"},
                   {"$": "dict", "items": [[[1], 2]]}, {"$": "array", "npy": _npy_of_objects()}):  # fmt: skip
        with pytest.raises(remote.Malformed):
            remote.decode(forged)


def _npy_of_objects() -> str:
    """An .npy file holding a pickled object array, as a forged reply would send it."""
    import base64
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.array([object()]), allow_pickle=True)
    return base64.b64encode(buffer.getvalue()).decode()


# ---- the same in one process pair, without the command: objects, methods, and what ends a grading ------------
SCALER = '''
import math
import sys


class DynamicLossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 min_scale=None, max_scale=None):
        self._scale, self.growth_factor, self.backoff_factor = init_scale, growth_factor, backoff_factor
        self.growth_interval, self.min_scale, self.max_scale, self.growth_tracker = growth_interval, min_scale, \\
            max_scale, 0

    @property
    def scale(self):
        return SCALE(self._scale)

    def update(self, found_inf):
        EXIT()
        return self

    def state_dict(self):
        return {"scale": self._scale, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, d):
        self._scale, self.growth_tracker = d["scale"], d["growth_tracker"]
'''


@pytest.mark.parametrize("scale, exit_, reason", [
    ("float", "lambda: None", r"clean steps? your scale is [^,]+, the pytorch rule says"),
    ("lambda s: object()", "lambda: None", r"^your DynamicLossScaler\.scale returned an object of type object: the "
                                           r"grader reads only plain data"),
    ("float", "lambda: sys.exit(3)", r"^called sys\.exit\(3\) at myamp/loss_scaling\.py:\d+: a graded function must "
                                     r"return, not end the program$"),
])  # fmt: skip
def test_an_object_of_the_students_class_is_driven_by_its_handle(tmp_path: Path, scale: str, exit_: str,
                                                                  reason: str) -> None:  # fmt: skip
    """A scaler that never grows (its update returns self, a handle the grader may be given back); one whose
    scale is an object; one whose update calls sys.exit: each verdict as the command would give it."""
    import re

    from exercise_helpers import FAILED, grade_remote

    from tinyamp.exercises.catalog import find

    write_workspace(tmp_path / "ws")
    (tmp_path / "ws" / PACKAGE / "loss_scaling.py").write_text(f"SCALE = {scale}\n" + SCALER.replace(
        "import sys\n", f"import sys\n\nEXIT = {exit_}\n"))  # fmt: skip
    result = grade_remote(find("5.1"), tmp_path / "ws")
    assert result.status == FAILED and re.search(reason, result.message), result.message
