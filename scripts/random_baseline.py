"""Success of a uniformly random policy over the valid actions, for comparison with training.

  python scripts/random_baseline.py --config=configs/sokoban.py --split=test --episodes=2048

Uses the config's environment and turn limit; each turn picks one of the environment's
actions uniformly (so it never makes a format error, unlike an untrained model).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from rl4agents import config_utils  # noqa: E402
from rl4agents.train import experiment  # noqa: E402

_CONFIG = config_utils.define_config_flag()
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "test", "ood"], "Task split.")
_EPISODES = flags.DEFINE_integer("episodes", 2048, "Episodes.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed.")
_JSON = flags.DEFINE_string("json", None, "Write the result to this JSON file.")
flags.mark_flags_as_required(["config"])


def random_policy_stats(env, env_params, num_turns: int, episodes: int, seed: int) -> dict:
    """Mean success and return of uniform random valid actions over `episodes` episodes."""
    table = np.zeros((env.num_actions, env.max_action_len), np.int32)
    lens = np.zeros((env.num_actions,), np.int32)
    for a in range(env.num_actions):
        toks = env.action_tokens(a)
        table[a, : len(toks)], lens[a] = toks, len(toks)
    table, lens = jnp.asarray(table), jnp.asarray(lens)

    def episode(key):
        key_reset, key_run = jax.random.split(key)
        state, ts = env.reset(key_reset, env_params)

        def turn(carry, k):
            state, ret, success = carry
            key_act, key_env = jax.random.split(jax.random.fold_in(key_run, k))
            a = jax.random.randint(key_act, (), 0, env.num_actions)
            state, ts = env.step(key_env, state, table[a], lens[a], env_params)
            return (state, ret + ts.reward, success | ts.success), None

        (state, ret, success), _ = jax.lax.scan(
            turn, (state, jnp.float32(0), jnp.bool_(False)), jnp.arange(num_turns)
        )
        return ret, success

    keys = jax.random.split(jax.random.key(seed), episodes)
    ret, success = jax.jit(jax.vmap(episode))(keys)
    return {"success": float(success.mean()), "return": float(ret.mean()), "episodes": episodes}


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments: {argv[1:]}")
    if _EPISODES.value < 1:
        config_utils.fail(f"--episodes={_EPISODES.value}; allowed: >= 1")
    if _JSON.value and (
        os.path.isdir(_JSON.value) or not os.path.isdir(os.path.dirname(_JSON.value) or ".")
    ):
        config_utils.fail(f"--json={_JSON.value!r}; allowed: a file path in an existing directory")
    try:
        exp = experiment.build(_CONFIG.value)
    except (ValueError, KeyError) as e:
        config_utils.fail(str(e))
    env, params = exp.env.make_split(_SPLIT.value)
    stats = random_policy_stats(
        env, params, _CONFIG.value.rollout.max_turns, _EPISODES.value, _SEED.value
    )
    stats.update(
        env=_CONFIG.value.env.name, split=_SPLIT.value, max_turns=_CONFIG.value.rollout.max_turns
    )
    print(json.dumps(stats))
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump(stats, f, indent=2)


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_flags)
