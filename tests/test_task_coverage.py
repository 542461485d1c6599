"""scripts/task_coverage.py: distinct tasks in an evaluation's draws, by hand and on countdown."""

import csv

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def tc():
    return load_script("task_coverage")


def test_coverage__by_hand(tc):
    # Evaluation draws a, a, b; fresh draws a x3, b, c x2, d x2 (4 distinct).
    row = tc.coverage([b"a", b"a", b"b"], [b"a", b"a", b"a", b"b", b"c", b"c", b"d", b"d"])
    assert row == {
        "eval_draws": 3,
        "distinct_in_eval": 2,
        "mass_covered": 4 / 8,  # a x3 and b of the 8 fresh draws
        "distinct_in_fresh": 4,
        "top_task_share": 3 / 8,
    }
    with pytest.raises(ValueError, match="at least one evaluation draw"):
        tc.coverage([], [b"a"])


def test_task_coverage__countdown_evaluation_repeats_tasks_of_a_small_split(tc, tmp_path, capsys):
    rows = tc.main(["--envs=countdown", "--num_tasks=64", "--fresh=512", f"--out={tmp_path}"])
    (row,) = rows
    # Countdown's test split holds 160 tasks (3 numbers of 1-9, targets 10-30, a fifth held
    # out): 512 fresh draws repeat tasks, 64 evaluation draws hold at most 64.
    assert row["distinct_in_fresh"] <= 160 < 512
    assert row["distinct_in_eval"] <= 64
    assert 0 < row["mass_covered"] <= 1 and row["top_task_share"] >= 1 / 160
    written = list(csv.DictReader(open(tmp_path / "table.csv")))
    assert written[0]["env"] == "countdown" and int(written[0]["eval_draws"]) == 64
    assert "task_coverage.py --envs=countdown" in (tmp_path / "command.txt").read_text()
    # The same keys give the same identities: a second run agrees exactly.
    assert tc.main(["--envs=countdown", "--num_tasks=64", "--fresh=512"]) == rows


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--envs=chess"], "allowed: a comma list of"),
        (["--num_tasks=0"], "allowed: >= 1 each"),
        (["--fresh_seed=1234"], "allowed: a seed other than --eval_seed"),
    ],
)
def test_task_coverage__bad_arguments_are_refused_in_one_line(tc, argv, message, capsys):
    with pytest.raises(SystemExit):
        tc.main(argv)
    assert message in capsys.readouterr().err
