"""The eight-bits chapter keeps its shape: at most 400 lines, each mechanism on one screen, no engine
room and no ml_dtypes behind it, ``import tinyamp`` as light as before, and ``tinyamp info`` shows it."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from tinyamp.cli import main
from tinyamp.fp8 import BLOCKS, CHAPTER, blocks, formats, products, scaling

pytestmark = pytest.mark.fp8

ROOT = Path(__file__).resolve().parents[1]
MECHANISMS = {
    "decoding (the table of values)": formats.Minifloat.values,
    "rounding with saturation": formats.encode,
    "the scale rule": scaling.next_scale,
    "a cast and its state": scaling.TensorScaling.quantize,
    "the FP8 product": products.fp8_matmul,
    "the limited accumulator": products.limited_accumulation,
}
BLOCK_MECHANISMS = {
    "the shared exponent": blocks.shared_exponents,
    "a block-scaled cast": blocks.quantize,
    "dequantizing blocks": blocks.BlockTensor.dequantize,
}


def test_the_chapter_is_at_most_400_lines(capsys: pytest.CaptureFixture[str]) -> None:
    counts = {module: len((ROOT / module).read_text().splitlines()) for module in CHAPTER}
    with capsys.disabled():
        print(f"\neight bits: {sum(counts.values())} lines", *(f"  {n:4d}  {m}" for m, n in counts.items()), sep="\n")
    assert sum(counts.values()) <= 400


def test_the_readme_table_of_the_chapter_gives_each_modules_true_line_count() -> None:
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        parts = [p.strip() for p in line.strip("|").split("|")]
        if len(parts) == 4 and parts[1].strip("`") in CHAPTER:
            rows[parts[1].strip("`")] = int(parts[3])
    actual = {module: len((ROOT / module).read_text().splitlines()) for module in CHAPTER}
    assert rows == actual


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_each_mechanism_fits_on_one_screen_in_the_chapter(mechanism: str) -> None:
    fn = inspect.unwrap(getattr(MECHANISMS[mechanism], "func", MECHANISMS[mechanism]))  # cached_property -> func
    source, _ = inspect.getsourcelines(fn)
    assert Path(inspect.getsourcefile(fn)).resolve().relative_to(ROOT).as_posix() in CHAPTER
    assert len(source) <= 60, f"{mechanism} takes {len(source)} lines"


def test_block_scaling_sits_beside_the_chapter_in_at_most_150_lines() -> None:
    # The chapter had 17 of its 400 lines left; blocks.py reads after it, on a budget of its own.
    assert BLOCKS not in CHAPTER and len((ROOT / BLOCKS).read_text().splitlines()) <= 150


@pytest.mark.parametrize("mechanism", BLOCK_MECHANISMS)
def test_each_block_mechanism_fits_on_one_screen(mechanism: str) -> None:
    source, _ = inspect.getsourcelines(BLOCK_MECHANISMS[mechanism])
    assert len(source) <= 60, f"{mechanism} takes {len(source)} lines"


def test_the_chapter_imports_neither_the_engine_room_nor_ml_dtypes() -> None:
    for module in (*CHAPTER, BLOCKS):
        text = (ROOT / module).read_text()
        for name in ("tinyamp.engine.fast", "tinyamp.engine.cuda", "import ml_dtypes", "tinyamp.kernels"):
            assert name not in text, f"{module} mentions {name}"


def test_import_tinyamp_and_its_fp8_chapter_leave_ml_dtypes_unloaded() -> None:
    code = "import sys, tinyamp, tinyamp.fp8; print('ml_dtypes' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_info_prints_the_fp8_limits_beside_fp16s(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    table = out.split("FP8 and FP4 beside FP16", 1)[1].split("\n\n", 1)[0]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert rows["float16"][4] == "65504" and rows["E4M3"][4] == "448" and rows["E5M2"][4] == "57344"
    assert rows["E2M1"][4] == "6" and "0xFF" in table and "s.1111.111" in table
