"""scripts/learning_table.py: which source row heads each environment, and why the others
do not."""

import csv
import json
import subprocess
import sys

import pytest

from configs import base_policy
from tests.scripts import SCRIPTS, load_script

ROOT_DIR = SCRIPTS.parent

COLUMNS = "env,base_test,rl_test,delta,delta_ci_low,delta_ci_high,seeds,eval_tasks,minutes"


def _source(root, name, rows, starts, columns=COLUMNS):
    """A paired_eval.py-like folder: table.csv from `rows` (lists of values) and, per env,
    one run_data config whose init.params is `starts[env]` (plus `starts[env, "lr"]`)."""
    folder = root / name
    (folder / "run_data").mkdir(parents=True)
    lines = [columns] + [",".join(str(v) for v in row) for row in rows]
    (folder / "table.csv").write_text("\n".join(lines) + "\n")
    for env, start in starts.items():
        config = json.loads(base_policy.get_config(env).to_json_best_effort())
        config["init"]["params"] = start
        config["loss"]["entropy_coef"] = 0.125
        config["train"]["num_steps"] = 7  # a budget field: not a setting
        run = folder / "run_data" / f"{env}_seed0"
        run.mkdir()
        (run / "config.json").write_text(json.dumps(config))
    return str(folder)


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def lt():
    return load_script("learning_table")


def test_learning_table__chooses_highest_lower_bound_among_eligible_rows(tmp_path):
    good = "runs/base_v2"
    a = _source(
        tmp_path,
        "first",
        [
            ["maze", 0.1, 0.2, 0.1, 0.05, 0.15, 3, 512, 15.0],
            ["sokoban", 0.2, 0.5, 0.3, 0.2, 0.4, 3, 512, 15.0],  # other start policy
        ],
        {"maze": good, "sokoban": "runs/base_v1"},
    )
    b = _source(
        tmp_path,
        "second",
        [
            ["maze", 0.1, 0.15, 0.05, 0.05, 0.09, 4, 512, 18.0],  # ties: the later wins
            ["sokoban", 0.2, 0.3, 0.1, -0.01, 0.2, 4, 512, 18.0],
            ["wordle", 0.0, 0.1, 0.1, 0.05, 0.15, 2, 512, 18.0],  # 2 seeds
        ],
        {"maze": good, "sokoban": good, "wordle": good},
        columns=COLUMNS + ",sampled_delta",
    )
    c = _source(
        tmp_path,
        "third",
        [
            ["maze", 0.1, 0.3, 0.2, 0.1, 0.3, 3, 256, 18.0],  # 256 tasks
            ["countdown", 0.2, 0.3, 0.1, 0.05, 0.15, 3, 512, 25.0],  # 25 minutes
        ],
        {"maze": good, "countdown": good},
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/learning_table.py", f"--out={out}", f"--base={good}", a, b, c],
        cwd=ROOT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    table = _read(out / "table.csv")
    assert list(table[0])[:9] == COLUMNS.split(",")
    assert [(r["env"], r["study"], r["attempts"]) for r in table] == [
        ("maze", "second", "2"),
        ("sokoban", "second", "1"),
    ]
    assert table[0]["delta"] == "0.05" and table[0]["sampled_delta"] == ""
    # Detectable at 80%: (z_0.975 + z_0.8) x the interval's half-width / z_0.975; maze's
    # chosen row [0.05, 0.09]: 2.801585 x 0.02 / 1.959964 = 0.028588.
    assert list(table[0])[9] == "delta_mde80"
    assert float(table[0]["delta_mde80"]) == pytest.approx(0.0286, abs=1e-4)
    assert float(table[1]["delta_mde80"]) == pytest.approx(2.801585 * 0.105 / 1.959964, abs=1e-4)
    assert "detectable at 80%: 0.0286" in done.stdout
    md = (out / "table.md").read_text()
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    maze = [c.strip() for c in md.splitlines()[2].strip("|").split("|")]
    assert maze[header.index("delta_mde80")] == "0.0286"
    assert table[0]["settings"] == "loss.entropy_coef=0.125"
    why = {(r["study"], r["env"]): r["why_not"] for r in _read(out / "attempts.csv")}
    assert why == {
        ("first", "maze"): "",
        ("first", "sokoban"): "start policy runs/base_v1",
        ("second", "maze"): "",
        ("second", "sokoban"): "",
        ("second", "wordle"): "2 seeds",
        ("third", "maze"): "256 evaluation tasks",
        ("third", "countdown"): "25.0 minutes per run",
    }
    assert "wordle: no eligible row" in done.stdout and "countdown: no eligible row" in done.stdout
    assert "1 of 2 environments improved" in done.stdout
    assert "| maze " in (out / "table.md").read_text()


def test_learning_table__a_confirmatory_row_heads_its_env_whatever_its_lower_bound(lt):
    def row(source, low, confirmatory=0, eligible=True):
        return {"env": "countdown", "study": source, "delta_ci_low": str(low),
                "confirmatory": confirmatory, "eligible": eligible}  # fmt: skip

    explore = [row("a", 0.01), row("b", -0.003)]
    assert [r["study"] for r in lt.choose(explore)] == ["a"]
    # The confirmation's null (-0.02) replaces the exploratory rows, later ones too.
    chosen = lt.choose([*explore, row("confirm", -0.02, 1), row("c", 0.05)])
    assert [(r["study"], r["attempts"]) for r in chosen] == [("confirm", 4)]
    # An ineligible confirmation does not.
    chosen = lt.choose([*explore, row("confirm", 0.02, 1, eligible=False)])
    assert [r["study"] for r in chosen] == ["a"]


def test_learning_table__confirmatory_must_name_a_source(tmp_path):
    source = _source(tmp_path, "s", [["maze", 0.1, 0.2, 0.1, 0.05, 0.15, 3, 512, 15.0]], {})
    done = subprocess.run(
        [sys.executable, "scripts/learning_table.py", f"--out={tmp_path / 'out'}", "--base=x",
         "--confirmatory=elsewhere", source],
        cwd=ROOT_DIR, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--confirmatory names ['elsewhere']; allowed: sources given as positional" in done.stderr


def test_learning_table__settings_default_and_unknown(lt, tmp_path):
    source = _source(tmp_path, "s", [], {"frozen_lake": "x"})
    assert lt.settings(source, "frozen_lake") == "loss.entropy_coef=0.125"
    assert lt.settings(source, "maze") == ""  # no config kept


def test_learning_table__rejects_a_folder_without_a_table(lt, tmp_path):
    with pytest.raises(ValueError, match=r"has no table.csv; allowed: a paired_eval.py --out"):
        lt.read_rows(str(tmp_path))


def test_learning_table__base_digest_keeps_one_build_of_the_start_policy(lt):
    # Two builds of one checkpoint path: the path matches, the weights' digest does not.
    args = lt.argparse.Namespace(
        base="runs/base", base_digest="ab12", min_seeds=3, min_tasks=512, max_minutes=20.0
    )
    row = {"seeds": "3", "eval_tasks": "512", "minutes": "18.0"}
    assert lt.why_not({**row, "base_digest": "ab12"}, "runs/base", args) == ""
    assert lt.why_not({**row, "base_digest": "cd34"}, "runs/base", args) == (
        "another build of the start policy (base_digest cd34)"
    )
    assert lt.why_not(row, "runs/base", args) == (
        "another build of the start policy (base_digest none recorded)"
    )
    args.base_digest = None  # not asked for: any build of the path
    assert lt.why_not({**row, "base_digest": "cd34"}, "runs/base", args) == ""


def test_learning_table__study_is_the_path_below_the_results_folder(lt, tmp_path):
    out = str(tmp_path / "results" / "learning")
    nested = str(tmp_path / "results" / "rebuild" / "t1")
    assert lt.study_name(nested, out) == "rebuild/t1"
    assert lt.study_name(str(tmp_path / "results" / "fixes") + "/", out) == "fixes"
    assert lt.study_name(str(tmp_path / "elsewhere" / "t1"), out) == "t1"
