"""Scripted policies for environment honesty checks and baselines.

A reward that a degenerate policy can collect (always the same action, always invalid, spam a
tool, answer at once) trains agents to game it. `probe_report` plays such policies on fixed
tasks, jitted and vmapped, next to a uniformly random valid policy; tests assert that none of
them scores well, and `scripts/env_table.py` reports the random baseline and steps per second.
Every policy here picks from the environment's action table (`num_actions`, `action_tokens`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

# (key, turn, action_table_size) -> int32[] action id, or -1 for an invalid (junk) action.
Chooser = Callable[[jax.Array, jax.Array, int], jax.Array]


def action_table(env) -> tuple[np.ndarray, np.ndarray]:
    """int32[N, W] tokens (PAD-padded) and int32[N] lengths of every valid action of `env`."""
    n = int(env.num_actions)
    rows = [np.asarray(env.action_tokens(i), np.int32) for i in range(n)]
    width = max(1, max(len(r) for r in rows))
    tokens = np.full((n, width), env.tokenizer.pad_id, np.int32)
    lengths = np.zeros((n,), np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)], lengths[i] = r, len(r)
    return tokens, lengths


def junk_tokens(env, width: int) -> np.ndarray:
    """int32[width] an action no environment accepts: the token for "?" repeated."""
    ids = env.tokenizer.encode("?")
    return np.full((width,), ids[0] if ids else env.tokenizer.pad_id, np.int32)


def play(
    env, env_params, task_keys: jax.Array, key: jax.Array, turns: int, choose: Chooser
) -> dict[str, jax.Array]:
    """Play a scripted policy on B tasks for up to `turns` turns (jitted, vmapped).

    Args:
      env: an environment with an action table.
      env_params: its params.
      task_keys: key[B] reset keys.
      key: key for the policy's and the environment's randomness.
      turns: K, turns per episode at most.
      choose: the policy, `(key, turn, N) -> action id` (-1: an invalid action).

    Returns:
      success f32[B], reward f32[B] (episode return), turns f32[B] (taken), invalid f32[B]
      (fraction of taken turns whose action did not parse).
    """
    table, lengths = action_table(env)
    n, width = table.shape
    junk = junk_tokens(env, width + 1)
    table = np.concatenate([table, np.full((n, 1), env.tokenizer.pad_id, np.int32)], axis=1)

    def episode(task_key, ep_key):
        state, _ = env.reset(task_key, env_params)

        def turn(carry, k):
            state, done, ret, success, taken, invalid = carry
            key_choose, key_step = jax.random.split(jax.random.fold_in(ep_key, k))
            a = choose(key_choose, k, n)
            tokens = jnp.where(a >= 0, jnp.asarray(table)[jnp.maximum(a, 0)], jnp.asarray(junk))
            length = jnp.where(a >= 0, jnp.asarray(lengths)[jnp.maximum(a, 0)], width + 1)
            state, ts = env.step(key_step, state, tokens, length, env_params)
            alive = ~done
            return (
                state,
                done | ts.done,
                ret + jnp.where(alive, ts.reward, 0.0),
                success | (alive & ts.success),
                taken + alive,
                invalid + (alive & ~ts.valid_action),
            ), None

        zero = jnp.zeros((), jnp.float32)
        init = (state, jnp.zeros((), bool), zero, jnp.zeros((), bool), zero, zero)
        (_, _, ret, success, taken, invalid), _ = jax.lax.scan(turn, init, jnp.arange(turns))
        return {
            "success": success.astype(jnp.float32),
            "reward": ret,
            "turns": taken,
            "invalid": invalid / jnp.maximum(taken, 1.0),
        }

    ep_keys = jax.random.split(key, task_keys.shape[0])
    return jax.jit(jax.vmap(episode))(task_keys, ep_keys)


_RANDOM = -2  # probe_report's policy code for `random_valid`


def random_valid(key, turn, n):
    """A uniformly random valid action each turn."""
    del turn
    return jax.random.randint(key, (), 0, n)


def always_invalid(key, turn, n):
    """An action that never parses, every turn."""
    del key, turn, n
    return jnp.asarray(-1, jnp.int32)


def constant(action_id: int) -> Chooser:
    """The same action every turn (spamming a tool, answering at once, repeating a move)."""

    def choose(key, turn, n):
        del key, turn, n
        return jnp.asarray(action_id, jnp.int32)

    return choose


def probe_report(
    env, env_params, num_tasks: int, turns: int, key: jax.Array, max_constant: int = 64
) -> dict[str, dict[str, float]]:
    """Success and mean return of the scripted policies on `num_tasks` fixed tasks.

    Probes: "random" (uniform valid actions), "invalid" (junk every turn) and "constant"
    (every action id, or `max_constant` ids spread over the table, each repeated every turn;
    reported as the best of them, with its action).

    Returns:
      {probe: {"success": mean success, "reward": mean return, ...}}.
    """
    task_keys = jax.random.split(jax.random.fold_in(key, 0), num_tasks)
    play_key = jax.random.fold_in(key, 1)

    n = int(env.num_actions)
    ids = np.unique(np.linspace(0, n - 1, min(n, max_constant)).round().astype(int))
    # One compilation for every probe, vmapped over a policy code: _RANDOM (`random_valid`),
    # -1 (junk, `always_invalid`) or an action id repeated every turn (`constant`).
    codes = np.concatenate([[_RANDOM, -1], ids]).astype(np.int32)

    def play_code(task_keys, code):
        def choose(key, turn, n):
            return jnp.where(code == _RANDOM, random_valid(key, turn, n), code)

        return play(env, env_params, task_keys, play_key, turns, choose)

    outs = jax.jit(jax.vmap(play_code, in_axes=(None, 0)))(task_keys, jnp.asarray(codes))
    outs = {k: np.asarray(v).mean(axis=1) for k, v in outs.items()}  # [policy] means
    report = {
        name: {k: float(v[i]) for k, v in outs.items()}
        for i, name in enumerate(("random", "invalid"))
    }
    success, reward = outs["success"][2:], outs["reward"][2:]
    best = int(np.lexsort((reward, success))[-1])
    report["constant"] = {
        "success": float(success[best]),
        "reward": float(reward[best]),
        "best_action": env.tokenizer.decode(env.action_tokens(int(ids[best]))),
        "actions_tried": len(ids),
    }
    return report


def steps_per_second(
    env, env_params, batch: int = 1024, turns: int = 32, repeats: int = 3, seed: int = 0
) -> float:
    """Environment steps per second: `batch` episodes of `turns` random valid actions.

    Reset and step run jitted and vmapped in one program; the best of `repeats` timed calls
    after a compile call is reported (resets are counted in the time, not in the steps).
    """
    fn = jax.jit(lambda tk, k: play(env, env_params, tk, k, turns, random_valid)["reward"].sum())
    keys = jax.random.split(jax.random.key(seed), batch)
    fn(keys, jax.random.key(1)).block_until_ready()
    best = float("inf")
    for r in range(repeats):
        t0 = time.perf_counter()
        fn(keys, jax.random.key(2 + r)).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return batch * turns / best
