"""scripts/bench_workers.py: N training processes at once against one alone."""

import csv

import pytest

from tests.scripts import TINY_TRAIN_FLAGS, load_script


def _result(times, metrics, cpu=1.0):
    return {"times": times, "metrics": metrics, "utime": cpu, "stime": 0.0, "wall": sum(times)}


def test_summarize__throughput_is_n_times_the_alone_step_over_the_shared_step():
    bench = load_script("bench_workers")
    m = [{"loss": 0.5}]
    alone = [_result([2.0, 2.2, 1.8], m * 3), _result([2.0, 1.9, 2.1], m * 3)]
    together = [[_result([3.0, 3.2, 3.0], m * 3), _result([3.0, 2.8, 3.0], m * 3)]]
    rows = bench.summarize(alone, together, 2)
    assert [r["setting"] for r in rows] == ["alone", "2 at once"]
    assert [r["median_step_s"] for r in rows] == [2.0, 3.0]
    assert [r["steps_per_s"] for r in rows] == [0.5, round(2 / 3.0, 3)]
    assert rows[0]["throughput_vs_alone"] == 1.0
    assert rows[1]["throughput_vs_alone"] == round(round(2 / 3.0, 3) / 0.5, 3)  # 1.334
    assert [r["cpu_s_per_step"] for r in rows] == [round(2.0 / 6, 2), round(2.0 / 6, 2)]
    assert all(r["same_metrics"] for r in rows)
    together[0][1]["metrics"] = [{"loss": 0.4}] * 3
    assert not bench.summarize(alone, together, 2)[1]["same_metrics"]


def test_overlapping__keeps_the_steps_run_while_every_process_was_timing():
    bench = load_script("bench_workers")
    m = [{"loss": float(i)} for i in range(4)]
    a = {**_result([1.0] * 4, m), "t0": 0.0}  # steps over 0-1, 1-2, 2-3, 3-4
    b = {**_result([1.0] * 3, m[:3]), "t0": 1.5}  # 1.5-2.5, 2.5-3.5, 3.5-4.5
    # Both timing over [1.5, 4]: a's steps 2 and 3, b's steps 0 and 1.
    cut_a, cut_b = bench.overlapping([a, b])
    assert (cut_a["kept"], cut_b["kept"]) == ([2, 3], [0, 1])
    assert cut_a["metrics"] == m[2:] and cut_b["times"] == [1.0, 1.0]
    # Compared step by step with the alone run's metrics.
    assert bench._same(cut_a, m) and bench._same(cut_b, m)
    assert not bench._same({**cut_a, "metrics": m[:2]}, m)
    # c's one step (0-10) spans all of b's timing (1.5-4.5): b keeps every step, c, with no
    # step wholly inside, its first.
    c = {**_result([10.0], m[:1]), "t0": 0.0}
    assert [r["kept"] for r in bench.overlapping([c, b])] == [[0], [0, 1, 2]]


def test_bench_workers__identical_processes_agree_and_the_table_is_written(tmp_path, capsys):
    bench = load_script("bench_workers")
    flags = [f for f in TINY_TRAIN_FLAGS if not f.startswith("--config.log")]
    rows = bench.main([*flags, "--steps=1", "--rounds=1", "--workers=2", f"--out={tmp_path}"])
    written = list(csv.DictReader(open(tmp_path / "bench_workers.csv")))
    assert [r["setting"] for r in written] == ["alone", "2 at once"] == [r["setting"] for r in rows]
    assert all(r["same_metrics"] == "True" for r in written)
    assert all(float(r["median_step_s"]) > 0 for r in written)
    assert [int(r["processes"]) for r in written] == [1, 2]
    assert written[0]["throughput_vs_alone"] == "1.0"
    assert (
        "bench_workers.py --config=configs/frozen_lake.py" in (tmp_path / "command.txt").read_text()
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers=1"], "allowed: >= 2"),
        (["--steps=0"], "allowed: >= 1 each"),
        (["--seed=3"], "allowed: the flags above and --config.KEY=VALUE"),
    ],
)
def test_bench_workers__bad_arguments_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        load_script("bench_workers").main(argv)
    assert message in capsys.readouterr().err
