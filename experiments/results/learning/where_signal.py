"""Prints why_greedy.md's second table: where the rebuild of base v5's sampled play finds the
successes its greedy play misses, from the committed per-task outcomes of the base (one greedy
and one sampled episode per held-out task, `per_task.csv` of each learning_v5_rebuild study).

python experiments/results/learning/where_signal.py   # from the project root

Per environment (the first study listed for it; every study of an environment at the same
temperature evaluates the same base on the same 512 tasks):
  P(sampled ok | greedy fails)  the share of greedy play's failures that a sampled episode solves
  new wins                      (1 - greedy success) x that share: the held-out tasks per task
                                on which sampling finds a success greedy play misses
  P(sampled fails | greedy ok)  how often a sampled episode loses a task greedy play solves
"""

import csv
import os

from why_greedy import temperature

RESULTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REBUILD = os.path.join(RESULTS, "learning_v5_rebuild")
# env -> the study whose base outcomes are shown (its temperature is the runs').
SOURCES = {
    "frozen_lake": "t1",
    "maze": "recipe_batch8x8_maze",
    "sokoban": "t1",
    "two_agent": "t1",
    "countdown": "t1",
    "search_qa": "t0.5",
    "web_shop": "t1",
    "wordle": "pilot_t0.5_wordle",
    "household": "pilot_progress_household",
}
# The headline row's greedy change per environment (experiments/results/learning/table.csv);
# wordle and household: their one-seed pilots.
HEADLINE = os.path.join(RESULTS, "learning", "table.csv")


def shares(greedy, sampled) -> tuple[float, float, float]:
    """(P(sampled ok | greedy fails), P(sampled fails | greedy ok), new wins) of per-task 0/1
    outcomes (sequences of equal length); NaN where a condition never holds."""
    fails = [s for g, s in zip(greedy, sampled, strict=True) if g == 0]
    oks = [s for g, s in zip(greedy, sampled, strict=True) if g == 1]
    ok_given_fail = sum(fails) / len(fails) if fails else float("nan")
    fail_given_ok = 1 - sum(oks) / len(oks) if oks else float("nan")
    return ok_given_fail, fail_given_ok, (1 - sum(greedy) / len(greedy)) * ok_given_fail


def base_outcomes(study: str, env: str) -> list[tuple[float, float]]:
    with open(os.path.join(REBUILD, study, "per_task.csv")) as f:
        return [
            (float(r["greedy_success"]), float(r["sampled_success"]))
            for r in csv.DictReader(f)
            if r["env"] == env and r["policy"] == "base"
        ]


def main() -> None:
    with open(HEADLINE) as f:
        headline = {r["env"]: r for r in csv.DictReader(f)}
    print(
        "| env | temperature | tasks | base greedy | base sampled | P(sampled ok \\| greedy fails) "
        "| new wins | P(sampled fails \\| greedy ok) | headline greedy change [95% CI] |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for env, study in SOURCES.items():
        out = base_outcomes(study, env)
        n = len(out)
        greedy = sum(g for g, _ in out) / n
        sampled = sum(s for _, s in out) / n
        ok_given_fail, fail_given_ok, new_wins = shares(*zip(*out, strict=True))
        row = headline.get(env)
        change = (
            f"{float(row['delta']):+.3f} [{float(row['delta_ci_low']):+.3f}, "
            f"{float(row['delta_ci_high']):+.3f}]"
            if row
            else "no eligible row"
        )
        t = temperature(f"learning_v5_rebuild/{study}", env)
        print(
            f"| {env} | {t:g} | {n} | {greedy:.3f} | {sampled:.3f} "
            f"| {ok_given_fail:.3f} | {new_wins:.3f} | {fail_given_ok:.3f} "
            f"| {change} |"
        )


if __name__ == "__main__":
    main()
