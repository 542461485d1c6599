"""The held-out table of README.md, from the two bases' eval.json (run from the repository root):

python experiments/results/base_policy_v5/compare_v4.py
"""

import json

v4 = json.load(open("experiments/results/base_policy_v4/eval.json"))
v5 = json.load(open("experiments/results/base_policy_v5/eval.json"))
print(
    "| env | greedy, v4 | greedy, v5 | sampled, v4 | sampled, v5 "
    "| greedy invalid rate, v4 -> v5 | in 0.1-0.6 (v5) |"
)
print("|---|---:|---:|---:|---:|---|---|")
for env in v5:
    a, b = v4[env]["test"], v5[env]["test"]
    g = b["greedy_success"]
    band = "yes" if 0.1 <= g <= 0.6 else ("no (above)" if g > 0.6 else "no")
    invalid = f"{a['greedy_invalid_rate']:.3f} -> {b['greedy_invalid_rate']:.3f}"
    print(
        f"| {env} | {a['greedy_success']:.3f} | {g:.3f} | {a['sampled_success']:.3f} | "
        f"{b['sampled_success']:.3f} | {invalid} | {band} |"
    )
