"""Prints why_greedy.md's table from the learning studies' committed table.csv files (the
rollout temperature from each row's first run config in `run_data/`).

python experiments/results/learning/why_greedy.py   # from the project root
"""

import csv
import json
import os

RESULTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = (
    "learning/study_15min",
    "learning_fixes",
    "maze_length_bias",
    "learning_lr/lr1e-3",
    "learning_full_budget",
    "learning_base_v3",
    "learning_base_v4",
    "learning_v4_temperature",
    "learning_base_v5",
    "learning_base_v5_t1",
    "learning_v5_rebuild/t1",
    "learning_v5_rebuild/t0.5",
    "learning_v5_rebuild/recipe_batch8x8_maze",
    "learning_v5_rebuild/pilot_batch8x8_countdown",
    "learning_v5_rebuild/pilot_batch8x8_t0.5_search_qa",
    "learning_v5_rebuild/pilot_t0.5_wordle",
    "learning_v5_rebuild/pilot_sparse_t0.5_wordle",
    "learning_v5_rebuild/recipe_seqmean_t0.5_search_qa",
    "learning_v5_rebuild/pilot_seqmean_web_shop",
    "learning_v5_rebuild/pilot_lr1e-4_web_shop",
    "learning_v5_rebuild/recipe_lr1e-4+bonus_web_shop",
    "learning_v5_rebuild/pilot_progress_household",
    "learning_v5_rebuild/recipe_lr1e-4_two_agent",
    "learning_v5_rebuild/recipe_lr1e-4_countdown",
    "learning_v5_rebuild/pilot_remax_countdown",
)
NUMBERS = (
    "base_test",
    "base_sampled",
    "rl_test",
    "rl_sampled",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
)
HEADER = (
    "| study | env | temperature | steps (mean) | base greedy | base sampled | RL sampled "
    "| RL greedy | greedy change [95% CI] | RL sampled >= base greedy |"
)


def temperature(source: str, env: str) -> float:
    """The rollout temperature of `source`'s runs in `env` (its first run's config)."""
    run_data = os.path.join(RESULTS, source, "run_data")
    run = sorted(d for d in os.listdir(run_data) if d.startswith(f"{env}_seed"))[0]
    with open(os.path.join(run_data, run, "config.json")) as f:
        return float(json.load(f)["rollout"]["temperature"])


def main() -> None:
    print(HEADER)
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for source in SOURCES:
        with open(os.path.join(RESULTS, source, "table.csv")) as f:
            for r in csv.DictReader(f):
                steps = [int(x) for x in r["steps"].split()]
                v = {k: float(r[k]) for k in NUMBERS}
                caught = "yes" if v["rl_sampled"] >= v["base_test"] else "no"
                ci = f"{v['delta']:+.3f} [{v['delta_ci_low']:+.3f}, {v['delta_ci_high']:+.3f}]"
                print(
                    f"| {source} | {r['env']} | {temperature(source, r['env']):g} "
                    f"| {sum(steps) / len(steps):.0f} "
                    f"| {v['base_test']:.3f} | {v['base_sampled']:.3f} | {v['rl_sampled']:.3f} "
                    f"| {v['rl_test']:.3f} | {ci} | {caught} |"
                )


if __name__ == "__main__":
    main()
