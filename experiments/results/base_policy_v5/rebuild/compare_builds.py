"""Per logged step, the largest difference in per-environment pretraining NLL between the
first build of base v5 (../metrics.jsonl, or --against=PATH) and the rebuild (metrics.jsonl
here, or a path).

  python experiments/results/base_policy_v5/rebuild/compare_builds.py [REBUILD_METRICS] [--all]
  # a later build (runs/base_policy_v5/metrics.jsonl) against this rebuild, every step:
  python experiments/results/base_policy_v5/rebuild/compare_builds.py \
      runs/base_policy_v5/metrics.jsonl \
      --against=experiments/results/base_policy_v5/rebuild/metrics.jsonl --all

Without --all: every logged step up to 1,000, then every 500th and the last.
"""

import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
args = [a for a in sys.argv[1:] if a != "--all" and not a.startswith("--against=")]
against = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--against=")]


def rows(path):
    merged = {}  # a step can have several rows (the final evaluation writes one per environment)
    with open(path) as f:
        for r in map(json.loads, f):
            merged.setdefault(r["step"], {}).update(r)
    return merged


first = rows(against[-1] if against else os.path.join(here, "..", "metrics.jsonl"))
rebuild = rows(args[0] if args else os.path.join(here, "metrics.jsonl"))
steps = sorted(set(first) & set(rebuild))
if "--all" not in sys.argv:
    steps = [s for s in steps if s <= 1000 or s % 500 == 0 or s == steps[-1]]
print("| step | environments logged in both | largest NLL difference |")
print("|---:|---:|---:|")
for step in steps:
    a, b = first[step], rebuild[step]
    keys = [k for k in a if k.startswith("pretrain/nll/") and k in b]
    if not keys:
        continue
    print(f"| {step} | {len(keys)} | {max(abs(a[k] - b[k]) for k in keys):.3g} |")

# Held-out success of the two builds on the same test tasks per environment. The interval
# is the unpaired normal one (per-task outcomes are not kept by the pretraining evaluation), so
# it is wider than a paired one would be.
first_eval = json.load(open(os.path.join(here, "..", "eval.json")))
rebuild_eval = json.load(open(os.path.join(here, "eval.json")))
n = json.load(open(os.path.join(here, "summary.json")))["eval_tasks"]
assert n == json.load(open(os.path.join(here, "..", "summary.json")))["eval_tasks"]
print()
print("| env | mode | first build | rebuild | difference | 95% interval (unpaired) |")
print("|---|---|---:|---:|---:|---|")
for env in first_eval:
    for mode in ("greedy", "sampled"):
        a = first_eval[env]["test"][f"{mode}_success"]
        b = rebuild_eval[env]["test"][f"{mode}_success"]
        half = 1.96 * ((a * (1 - a) + b * (1 - b)) / n) ** 0.5
        print(
            f"| {env} | {mode} | {a:.3f} | {b:.3f} | {b - a:+.3f} | "
            f"[{b - a - half:+.3f}, {b - a + half:+.3f}] |"
        )
