"""scripts/compare_rows.py: the paired difference of two studies' rows, checked by hand."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from rl4agents import results
from tests.scripts import load_script


@pytest.fixture(scope="module")
def compare_rows():
    return load_script("compare_rows")


def _write(folder, base_greedy, base_sampled, runs):
    """per_task.csv with the base row and `runs`: seed -> (greedy f[N], sampled f[N])."""
    folder.mkdir(parents=True, exist_ok=True)
    fields = ["env", "policy", "seed", "task", "greedy_success", "sampled_success"]
    with open(folder / "per_task.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        rows = [("base", "", base_greedy, base_sampled)]
        rows += [("rl", s, g, x) for s, (g, x) in runs.items()]
        for policy, seed, greedy, sampled in rows:
            for task in reversed(range(len(greedy))):  # out of order: sorted by task on read
                w.writerow(
                    dict(
                        env="maze",
                        policy=policy,
                        seed=seed,
                        task=task,
                        greedy_success=greedy[task],
                        sampled_success=sampled[task],
                    )
                )


def test_compare__seed_paired_difference_and_skips_sampled_at_another_temperature(
    compare_rows, tmp_path
):
    base = [1.0, 0.0, 0.0, 1.0]
    a = {"0": ([1, 1, 0, 1], [1, 0, 0, 0]), "1": ([1, 1, 1, 1], [0, 0, 0, 0])}
    b = {"0": ([1, 0, 0, 1], [1, 1, 0, 0]), "1": ([0, 0, 0, 1], [1, 0, 0, 0]), "2": (base, base)}
    _write(tmp_path / "a", base, [0.0, 0.0, 1.0, 1.0], a)
    _write(tmp_path / "b", base, [0.0, 0.0, 1.0, 1.0], b)
    greedy, sampled = compare_rows.compare(str(tmp_path / "a"), str(tmp_path / "b"), "maze")
    # seeds 0 and 1 pair (B's seed 2 has no partner): A 7/8, B 3/8.
    assert (greedy["mean_a"], greedy["mean_b"], greedy["seeds"], greedy["tasks"]) == (
        0.875,
        0.375,
        2,
        4,
    )
    expected = results.paired_bootstrap_ci(
        np.array([[1, 1, 0, 1], [1, 1, 1, 1]], float), np.array([[1, 0, 0, 1], [0, 0, 0, 1]], float)
    )
    assert greedy["diff"] == pytest.approx(0.5)
    assert (greedy["ci_low"], greedy["ci_high"]) == pytest.approx(expected[1:])
    assert sampled["diff"] == pytest.approx(1 / 8 - 3 / 8)
    _write(tmp_path / "c", base, [1.0, 1.0, 1.0, 1.0], a)  # sampled at another temperature
    _, sampled = compare_rows.compare(str(tmp_path / "c"), str(tmp_path / "b"), "maze")
    assert sampled == {"env": "maze", "mode": "sampled", "skipped": "the base's outcomes differ"}


def test_compare__refuses_other_tasks_and_missing_rows(compare_rows, tmp_path):
    _write(tmp_path / "a", [1.0, 0.0], [0.0, 0.0], {"0": ([1, 1], [1, 1])})
    _write(tmp_path / "b", [0.0, 1.0], [0.0, 0.0], {"0": ([1, 1], [1, 1])})
    with pytest.raises(ValueError, match="greedy outcomes of 'maze' differ"):
        compare_rows.compare(str(tmp_path / "a"), str(tmp_path / "b"), "maze")
    with pytest.raises(ValueError, match="no base row"):
        compare_rows.compare(str(tmp_path / "a"), str(tmp_path / "b"), "sokoban")
    with pytest.raises(ValueError, match="no per_task.csv"):
        compare_rows.compare(str(tmp_path / "a"), str(tmp_path / "none"), "maze")
