"""Per logged step, the largest difference in per-environment pretraining NLL between the
first build of base v5 (../metrics.jsonl) and the rebuild (metrics.jsonl here, or a path).

  python experiments/results/base_policy_v5/rebuild/compare_builds.py [REBUILD_METRICS]
"""

import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    with open(path) as f:
        return {r["step"]: r for r in map(json.loads, f)}


first = rows(os.path.join(here, "..", "metrics.jsonl"))
rebuild = rows(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "metrics.jsonl"))
print("| step | environments logged in both | largest NLL difference |")
print("|---:|---:|---:|")
for step in sorted(set(first) & set(rebuild)):
    a, b = first[step], rebuild[step]
    keys = [k for k in a if k.startswith("pretrain/nll/") and k in b]
    print(f"| {step} | {len(keys)} | {max(abs(a[k] - b[k]) for k in keys):.3g} |")
