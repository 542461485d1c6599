"""How many distinct tasks an evaluation of N held-out tasks holds, per environment.

  python scripts/task_coverage.py --out=experiments/results/envs/task_coverage

An evaluation (`Experiment.eval_fn`, `task_outcomes_fn`, `scripts/paired_eval.py`) plays task i
of N from row i of `jax.random.split(task stream, N)` (`experiment.eval_keys`): N independent
draws from the split's task distribution. Where that distribution has few tasks, or puts much
of its mass on a few, draws repeat: the N draws are still an unbiased sample of the
distribution (the success rate they estimate is the distribution's, and a bootstrap over them
is valid), but they hold fewer distinct tasks than N, and a greedy policy plays a repeated task
the same way every time. Per environment (configs/base_policy.py:<env>) and split, from the
initial state and observation of each draw (a task's identity):

  eval_draws          N, the evaluation's draws (seed --eval_seed, as the runs' train.eval_seed)
  distinct_in_eval    the distinct tasks among them
  mass_covered        the share of --fresh new draws (another seed) whose task is one of those:
                      how much of the split's distribution the evaluation's tasks cover
  distinct_in_fresh   the distinct tasks among the fresh draws (a lower bound on the split's
                      size; equal to --fresh means no repeat was seen)
  top_task_share      the share of the fresh draws taken by the most frequent task

Writes table.csv and table.md to --out (with the command).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import base_policy  # noqa: E402
from rl4agents import sweep  # noqa: E402
from rl4agents.train import experiment, writers  # noqa: E402

ENVS = base_policy.ENVS  # every environment of the base policy's configs
COLUMNS = (
    "env",
    "split",
    "eval_draws",
    "distinct_in_eval",
    "mass_covered",
    "distinct_in_fresh",
    "top_task_share",
)


def task_ids(env, env_params, keys: jax.Array) -> list[bytes]:
    """One identity per task key: the bytes of the task's initial state and observation.

    Args:
      env: a JAX environment (`reset_env(key, params) -> (state, obs, obs_len)`).
      env_params: its params for the split.
      keys: typed keys [K].
    """
    state, obs, obs_len = jax.jit(jax.vmap(lambda k: env.reset_env(k, env_params)))(keys)
    parts = [np.asarray(x).reshape(keys.shape[0], -1) for x in jax.tree.leaves(state)]
    parts += [np.asarray(obs).reshape(keys.shape[0], -1), np.asarray(obs_len).reshape(-1, 1)]
    rows = np.concatenate([p.astype(np.float64) for p in parts], axis=1)
    return [r.tobytes() for r in rows]


def coverage(eval_ids: list[bytes], fresh_ids: list[bytes]) -> dict:
    """The table's numbers from the evaluation's task identities and fresh draws' (see the
    module docstring)."""
    if not eval_ids or not fresh_ids:
        raise ValueError("coverage needs at least one evaluation draw and one fresh draw")
    seen = set(eval_ids)
    counts = collections.Counter(fresh_ids)
    return {
        "eval_draws": len(eval_ids),
        "distinct_in_eval": len(seen),
        "mass_covered": sum(n for t, n in counts.items() if t in seen) / len(fresh_ids),
        "distinct_in_fresh": len(counts),
        "top_task_share": counts.most_common(1)[0][1] / len(fresh_ids),
    }


def env_coverage(
    name: str, split: str, num_tasks: int, fresh: int, eval_seed: int, fresh_seed: int
) -> dict:
    """`coverage` of environment `name`'s `split` (configs/base_policy.py:<name>)."""
    exp = experiment.build(sweep.resolve(f"configs/base_policy.py:{name}", {}))
    try:
        env, env_params = exp.env.make_split(split)
        stream, _ = experiment.eval_keys(eval_seed)
        eval_ids = task_ids(env, env_params, jax.random.split(stream, num_tasks))
        fresh_stream, _ = experiment.eval_keys(fresh_seed)
        fresh_ids = task_ids(env, env_params, jax.random.split(fresh_stream, fresh))
    finally:
        exp.close()
    return {"env": name, "split": split, **coverage(eval_ids, fresh_ids)}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default=",".join(ENVS), help="comma-separated environments")
    p.add_argument("--split", default="test", choices=("train", "test", "ood"))
    p.add_argument("--num_tasks", type=int, default=512, help="the evaluation's draws")
    p.add_argument("--fresh", type=int, default=8192, help="fresh draws for the estimates")
    p.add_argument("--eval_seed", type=int, default=1234, help="the runs' train.eval_seed")
    p.add_argument("--fresh_seed", type=int, default=99, help="seed of the fresh draws")
    p.add_argument("--out", default="", help="write table.csv and table.md here")
    args = p.parse_args(argv)
    envs = [e for e in args.envs.split(",") if e]
    unknown = [e for e in envs if e not in ENVS]
    if unknown or not envs:
        p.error(f"--envs={args.envs!r}: unknown {unknown}; allowed: a comma list of {ENVS}")
    if args.num_tasks < 1 or args.fresh < 1:
        p.error(f"--num_tasks={args.num_tasks} --fresh={args.fresh}; allowed: >= 1 each")
    if args.eval_seed == args.fresh_seed:
        p.error(f"--fresh_seed={args.fresh_seed}; allowed: a seed other than --eval_seed")
    rows = []
    for name in envs:
        rows.append(
            env_coverage(
                name, args.split, args.num_tasks, args.fresh, args.eval_seed, args.fresh_seed
            )
        )
        r = rows[-1]
        print(
            f"{name}: {r['distinct_in_eval']} distinct of {r['eval_draws']} draws, covering "
            f"{r['mass_covered']:.1%} of the split's draws; {r['distinct_in_fresh']} distinct in "
            f"{args.fresh} fresh draws, the most frequent {r['top_task_share']:.1%}",
            flush=True,
        )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        out = [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows]
        writers.write_csv(os.path.join(args.out, "table.csv"), out, COLUMNS)
        writers.write_text(
            os.path.join(args.out, "table.md"), writers.format_table(out, COLUMNS) + "\n"
        )
        writers.append_command(
            args.out, "scripts/task_coverage.py", sys.argv[1:] if argv is None else argv
        )
    return rows


if __name__ == "__main__":
    main()
