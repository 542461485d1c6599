"""experiments/real_model_rl.py: its plan (one run of configs/real_model.py:guess_number, an
hour) and rl_summary.json written from a paired_eval table and the run's own files, checked
against hand-made inputs."""

from __future__ import annotations

import csv
import json
import pathlib

import pytest

from rl4agents import config_utils, sweep

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def study(monkeypatch):
    monkeypatch.chdir(ROOT)
    for var in (
        "REAL_MODEL_RL_SEEDS",
        "REAL_MODEL_RL_MINUTES",
        "REAL_MODEL_RL_TEMPERATURE",
        "REAL_MODEL_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    return config_utils.load_module(str(ROOT / "experiments/real_model_rl.py"), "real_model_rl")


def test_plan__one_hour_long_run_of_the_real_model_config(study, monkeypatch):
    (run,) = sweep.load_study("experiments/real_model_rl.py").runs
    assert run.config == "configs/real_model.py:guess_number"
    assert run.overrides["train.max_minutes"] == 60.0 and run.overrides["seed"] == 0
    assert run.overrides["rollout.temperature"] == 0.5
    monkeypatch.setenv("REAL_MODEL_RL_SEEDS", "2")
    monkeypatch.setenv("REAL_MODEL_DIR", "elsewhere")
    runs = sweep.load_study("experiments/real_model_rl.py").runs
    assert [r.overrides["seed"] for r in runs] == [0, 1]
    assert {r.overrides["model.checkpoint"] for r in runs} == {"elsewhere"}


def _sweep(tmp_path, finished: bool) -> pathlib.Path:
    out = tmp_path / "sweep"
    run = out / "real_model-guess_number__seed=0"
    run.mkdir(parents=True)
    plan = {"runs": [{"dir": run.name, "seed": 0, "env": "guess_number", "variant": []}]}
    (out / sweep.PLAN_NAME).write_text(json.dumps(plan))
    summary = {"steps": 30, "wall_s": 3720.0, "finished": finished, "peak_rss_gb": 9.5}
    (run / sweep.SUMMARY_NAME).write_text(json.dumps(summary))
    rows = [
        {"step": 1, "train/success": 0.25},
        {"step": 10, "train/success": 0.5, "eval_test/greedy_success": 0.3},
        {"step": 20, "eval_test/greedy_success": 0.4},
    ]
    (run / sweep.METRICS_NAME).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _table(tmp_path) -> pathlib.Path:
    path = tmp_path / "table.csv"
    row = {
        "env": "guess_number",
        "base_test": 0.2,
        "rl_test": 0.45,
        "delta": 0.25,
        "delta_ci_low": 0.2,
        "delta_ci_high": 0.3,
        "seeds": 1,
        "eval_tasks": 512,
        "base_sampled": 0.1,
        "rl_sampled": 0.3,
        "sampled_delta": 0.2,
        "sampled_ci_low": 0.15,
        "sampled_ci_high": 0.25,
    }
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow({k: row[k] for k in row})
    return path


def test_rl_summary__table_numbers_curves_and_peak_memory(study, tmp_path, capsys):
    out = tmp_path / "rl_summary.json"
    argv = [f"--sweep={_sweep(tmp_path, True)}", f"--table={_table(tmp_path)}", f"--out={out}"]
    assert study.main(argv) == 0
    got = json.loads(out.read_text())
    assert {k: got[k] for k in study.SUMMARY_KEYS} == {
        "base": 0.2,
        "final": 0.45,
        "delta": 0.25,
        "delta_ci_low": 0.2,
        "delta_ci_high": 0.3,
    }
    sampled = {"base": 0.1, "final": 0.3, "delta": 0.2, "ci_low": 0.15, "ci_high": 0.25}
    assert got["sampled"] == sampled
    (run,) = got["runs"]
    assert (run["steps"], run["minutes"], run["peak_rss_gb"]) == (30, 62.0, 9.5)
    assert run["curves"] == {
        "eval_test/greedy_success": [[10, 0.3], [20, 0.4]],
        "train/success": [[1, 0.25], [10, 0.5]],
    }
    assert json.loads(capsys.readouterr().out)["delta"] == 0.25


def test_rl_summary__refuses_a_missing_row_or_no_finished_run(study, tmp_path, capsys):
    unfinished = _sweep(tmp_path, False)
    table = _table(tmp_path)
    out = tmp_path / "x.json"
    assert study.main([f"--sweep={unfinished}", f"--table={table}", f"--out={out}"]) == 2
    assert "no finished run" in capsys.readouterr().err
    table.write_text("env,base_test\nfrozen_lake,0.1\n")
    assert study.main([f"--sweep={unfinished}", f"--table={table}", f"--out={out}"]) == 2
    assert "no 'guess_number' row" in capsys.readouterr().err and not out.exists()
