"""scripts/bench_malloc.py: the allocator settings run the same steps and give the same numbers."""

import csv

import pytest

from tests.scripts import TINY_TRAIN_FLAGS, load_script


def test_bench_malloc__settings_agree_on_every_metric_and_the_table_is_written(tmp_path, capsys):
    bench = load_script("bench_malloc")
    flags = [f for f in TINY_TRAIN_FLAGS if not f.startswith("--config.log")]
    bench.main([*flags, "--steps=1", "--rounds=1", "--settings=default,keep", f"--out={tmp_path}"])
    rows = list(csv.DictReader(open(tmp_path / "bench_malloc.csv")))
    assert [r["setting"] for r in rows] == ["default", "keep"]
    assert all(r["same_metrics"] == "True" for r in rows)
    assert all(int(r["minor_faults_per_step"]) > 0 and float(r["median_step_s"]) > 0 for r in rows)
    assert rows[0]["vs_default"] == "1.0"
    assert (
        "bench_malloc.py --config=configs/frozen_lake.py" in (tmp_path / "command.txt").read_text()
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--settings=keep"], "allowed: default plus any of"),
        (["--settings=default,fast"], "allowed: default plus any of"),
        (["--steps=0"], "allowed: >= 1 each"),
        (["--seed=3"], "allowed: the flags above and --config.KEY=VALUE"),
    ],
)
def test_bench_malloc__bad_arguments_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        load_script("bench_malloc").main(argv)
    assert message in capsys.readouterr().err
