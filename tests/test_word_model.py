"""The word-level language model: its tokens, its batches, its model, its task, and the study that trains it.

benchmarks/underflow_lm.py trains it for minutes; here a few steps check that every piece
does what the study's text says, and that bad input gets a sentence.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinyamp as ta
from tinyamp import nn
from tinyamp.data.words import UNKNOWN, WordDataset, word_tokens
from tinyamp.experiments.regimes import REGIMES, build
from tinyamp.experiments.tasks import TASKS, WordLM

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "underflow_lm.py"


@pytest.fixture(scope="module")
def words() -> WordDataset:
    return WordDataset.from_stdlib(vocab_size=512)


def test_tokens_are_identifiers_single_characters_and_newlines() -> None:
    assert word_tokens("def f(x_1):\n    return x_1 + 2.5  # ok\n") == [
        "def", "f", "(", "x_1", ")", ":", "\n", "return", "x_1", "+", "2", ".", "5", "#", "ok", "\n",
    ]  # fmt: skip


def test_vocabulary_is_unknown_then_tokens_by_frequency(words) -> None:
    assert words.vocab_size == 512 and words.itos[0] == UNKNOWN and len(set(words.itos)) == 512
    ids = np.concatenate([words.train, words.val])
    counts = np.bincount(ids, minlength=512)[1:]
    assert np.all(np.diff(counts) <= 0), "ids 1.. must be in order of decreasing frequency"
    assert words.unknown_share == pytest.approx(np.mean(ids == 0))
    assert 0 < words.unknown_share < 0.5
    assert len(words.val) == pytest.approx(0.1 * len(ids), abs=1)


def test_a_batch_is_runs_of_consecutive_tokens_and_the_next_one(words) -> None:
    x, y = words.batch("train", context=4, batch_size=64, rng=np.random.default_rng(3))
    assert x.shape == (64, 4) and y.shape == (64,) and x.dtype == np.int64
    text = words.train
    for row, nxt in zip(x, y):
        starts = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(text, 5) == [*row, nxt], axis=1))
        assert starts.size >= 1  # the five ids occur in this order somewhere in the split


@pytest.mark.parametrize(
    ("kwargs", "words_in_error"),
    [({"vocab_size": 1}, "vocab_size must be an integer >= 2"), ({"vocab_size": 2.5}, "got 2.5")],
)
def test_bad_vocabulary_size_is_refused(kwargs, words_in_error) -> None:
    with pytest.raises(ValueError, match=words_in_error):
        WordDataset.from_stdlib(**kwargs)


def test_the_whole_vocabulary_or_at_most_it() -> None:
    every = WordDataset.from_stdlib(vocab_size=None)
    assert every.unknown_share == 0.0 and len(set(every.itos)) == every.vocab_size
    with pytest.raises(ValueError, match=rf"at most {every.vocab_size:,} ids with <unk>; pass at most that"):
        WordDataset.from_stdlib(vocab_size=every.vocab_size + 1)
    assert WordLM(vocab_size=None, batch_size=8).make_model().out.weight.shape == (every.vocab_size, 256)


def test_bad_batch_requests_are_refused(words) -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        words.batch("test", 4, 8, rng)
    with pytest.raises(ValueError, match="the val split has"):
        words.batch("val", 10**7, 8, rng)


def test_the_model_maps_contexts_to_one_logit_per_token() -> None:
    ta.manual_seed(0)
    model = nn.NeuralLanguageModel(50, context=3, dim=8, hidden=16)
    logits = model(ta.tensor(np.array([[1, 2, 3], [4, 5, 6]])))
    assert logits.shape == (2, 50)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["embedding.weight", "hidden.weight", "hidden.bias", "out.weight", "out.bias"]
    with pytest.raises(ValueError, match=r"ids of shape \(batch, 3\); got \(2, 4\)"):
        model(ta.tensor(np.zeros((2, 4), dtype=np.int64)))
    with pytest.raises(ValueError, match="vocab_size must be at least 2"):
        nn.NeuralLanguageModel(1)


def test_the_models_gradients_agree_with_finite_differences() -> None:
    ta.manual_seed(1)
    model = nn.NeuralLanguageModel(7, context=2, dim=3, hidden=5).astype("float64")
    x = ta.tensor(np.array([[1, 2], [3, 0], [6, 6]]))
    y = ta.tensor(np.array([4, 0, 2]))
    loss = ta.cross_entropy(model(x), y)
    loss.backward()
    w = model.hidden.weight
    analytic = np.asarray(w.grad).copy()
    eps = 1e-6
    numeric = np.zeros_like(analytic)
    for idx in np.ndindex(*analytic.shape):
        old = w.data[idx]
        w.data[idx] = old + eps
        up = float(ta.cross_entropy(model(x), y).item())
        w.data[idx] = old - eps
        down = float(ta.cross_entropy(model(x), y).item())
        w.data[idx] = old
        numeric[idx] = (up - down) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-9)


def test_the_task_is_tinyamp_trains_wordlm_and_every_regime_builds_it() -> None:
    assert TASKS["wordlm"] is WordLM
    task = WordLM(vocab_size=256, batch_size=64, seed=2)
    x, y = next(task.batches())
    assert x.shape == (64, 4) and y.shape == (64,)
    again = next(WordLM(vocab_size=256, batch_size=64, seed=2).batches())
    assert np.array_equal(x.numpy(), again[0].numpy())  # every regime sees the same batches
    for name in ("fp32", "fp16-master", "mixed"):
        setup = build(REGIMES[name], task.make_model(), task.make_optimizer)
        loss, report, _ = setup.step(lambda m: task.loss(m, (x, y)))
        assert np.isfinite(loss) and not report.skipped
        assert set(task.evaluate(setup.model, setup.autocast)) == {"val_loss"}


def test_without_scaling_the_non_target_logits_gradient_underflows_at_8192_tokens() -> None:
    """The study's reason, at its first step: p / N <= 2^-25 flushes, and 2^16 keeps it in range."""
    task = WordLM()
    x, y = next(task.batches())
    flushed = {}
    for name in ("fp16-master", "mixed"):
        setup = build(REGIMES[name], task.make_model(), task.make_optimizer)
        with setup.autocast():
            logits = setup.model(x)
        probs = np.asarray(ta.softmax(logits.float(), axis=-1).numpy(), dtype=np.float64)
        grad = probs / len(y)  # a non-target logit's gradient of the mean loss
        grad[np.arange(len(y)), y.numpy()] = np.nan
        scaled = (grad * setup.scaler.scale).astype(np.float16)
        flushed[name] = float(np.nanmean(np.where(np.isnan(grad), np.nan, scaled == 0)))
    assert flushed["fp16-master"] > 0.5, flushed  # more than half of 8192 x 4095 values lost
    assert flushed["mixed"] < 1e-3, flushed


def test_cli_refuses_a_batch_larger_than_the_training_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tinyamp", "train", "--model", "wordlm", "--batch-size", "10000000", "--quiet"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "training runs of 4 tokens; pass at most that" in done.stderr


def test_the_study_runs_and_checks_its_two_claims(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("underflow_lm", SCRIPT)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    fake = {
        0: {"fp32": {"metrics": {"val_loss": 4.0}}, "fp16-master": {"metrics": {"val_loss": 4.05}},
            "mixed": {"metrics": {"val_loss": 4.002}}},
        1: {"fp32": {"metrics": {"val_loss": 4.1}}, "fp16-master": {"metrics": {"val_loss": 4.09}},
            "mixed": {"metrics": {"val_loss": 4.1}}},
    }  # fmt: skip
    held = study.claims(fake)
    assert list(held.values()) == [False, True]  # seed 1's fp16-master ended below FP32
    fake[1]["mixed"]["metrics"]["val_loss"] = 4.2
    assert list(study.claims(fake).values()) == [False, False]


def test_the_study_writes_its_rows_and_its_figure(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("underflow_lm", SCRIPT)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    rows, figure = tmp_path / "rows.json", tmp_path / "loss.png"
    args = ["--quick", "--seeds", "3", "--vocab-size", "64", "--batch-size", "64", "--json", str(rows)]
    assert study.main([*args, "--figure", str(figure)]) == 0
    doc = json.loads(rows.read_text())
    assert doc["steps"] == 2 and doc["task"]["vocab_size"] == 64 and "seed" not in doc["task"]
    assert list(doc["seeds"]["3"]) == ["fp32", "fp16-master", "mixed"]
    assert len(doc["seeds"]["3"]["mixed"]["series"]["loss"]) == 2
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad in (["--batch-size", "0"], ["--vocab-size", "most"], ["--vocab-size", "0"]):
        with pytest.raises(SystemExit):
            study.main(bad)
