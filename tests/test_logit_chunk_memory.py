"""scripts/logit_chunk_memory.py: XLA's memory analysis of the scoring pass per logit_chunk,
on one SmolLM2-sized layer with a small vocabulary (compiled, never run)."""

import csv

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("logit_chunk_memory")


def test_main__writes_the_files_and_chunking_lowers_the_backward_temporaries(script, tmp_path):
    # 4 x 256 slots x 2048 tokens: the f32 logits (8 MiB) outweigh the tied head (4.5 MiB),
    # whose gradient the chunked pass accumulates block by block
    argv = [f"--out={tmp_path}", "--layers=1", "--batch=4", "--length=256", "--vocab=2048"]
    assert script.main(argv + ["--chunks=0,64", "--dtypes=float32"]) == 0
    with open(tmp_path / "logit_chunk_memory.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["logit_chunk"], r["pass"]) for r in rows] == [
        ("0", "forward"),
        ("0", "forward+backward"),
        ("64", "forward"),
        ("64", "forward+backward"),
    ]
    assert list(rows[0]) == list(script.COLUMNS)
    temp = {(r["logit_chunk"], r["pass"]): int(r["temp_bytes"]) for r in rows}
    logits_bytes = 4 * 256 * 2048 * 4
    assert temp[("64", "forward+backward")] <= temp[("0", "forward+backward")] - logits_bytes
    assert temp[("0", "forward+backward")] > temp[("0", "forward")]
    table = (tmp_path / "logit_chunk_memory.md").read_text()
    assert "| float32 | forward+backward |" in table and "logit_chunk=64" in table
    command = (tmp_path / "command.txt").read_text()
    assert command.count("python scripts/logit_chunk_memory.py --out=") == 1
    assert command.strip().endswith("--chunks=0,64 --dtypes=float32")


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--chunks=0,x", "--chunks='0,x'; allowed: comma-separated integers >= 0"),
        ("--chunks=0,-8", "--chunks=[0, -8]; allowed: distinct integers >= 0"),
        ("--dtypes=float16", "--dtypes=['float16']; allowed"),
        ("--layers=0", "--layers=0; allowed: >= 1"),
        ("--length=1", "--length=1; allowed: >= 2"),
        ("--batch=two", "argument --batch: invalid int value: 'two'"),
        ("--bogus=1", "unrecognized arguments: --bogus=1"),
    ],
)
def test_main__bad_flags_exit_2_with_one_line(script, tmp_path, capsys, flag, message):
    assert script.main([f"--out={tmp_path / 'out'}", flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("logit_chunk_memory: ") and message in err
    assert not (tmp_path / "out").exists()  # nothing written
