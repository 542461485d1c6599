"""A small deterministic environment for rollout and training tests (not registered)."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from rl4agents import text
from rl4agents.envs import base
from rl4agents.types import TimeStep


@flax.struct.dataclass
class State:
    digit: jax.Array  # int32[] the digit to repeat
    turn: jax.Array  # int32[]
    done: jax.Array  # bool[]


@flax.struct.dataclass
class Params:
    num_turns: jax.Array  # int32[]


class RepeatDigit:
    """Shows a digit; the action must repeat it. Reward 1 per correct turn; `num_turns` turns.

    Invalid actions get -0.1 and an "invalid" message. Observation lengths vary by turn so
    padding shows up inside trajectories.
    """

    def __init__(self, tokenizer=None, num_turns: int = 3):
        self.tokenizer = tokenizer or text.BuiltinTokenizer()
        digits = {str(d): str(d) for d in range(10)}
        self.obs = text.FragmentTable.build(
            self.tokenizer, {**digits, "invalid": "invalid action", "nl": "\n", "ok": "yes"}
        )
        self.actions = text.FragmentTable.build(self.tokenizer, digits)
        self.num_turns = num_turns
        self.max_prompt_len = 2
        self.max_obs_len = 5
        self.max_action_len = 1

    def default_params(self, split="train"):
        return Params(num_turns=jnp.int32(self.num_turns))

    def _obs(self, digit, valid, correct, out_len):
        ids = jnp.stack(
            [
                jnp.where(valid, -1, self.obs.id("invalid")),
                jnp.where(correct, self.obs.id("ok"), -1),
                digit,
                self.obs.id("nl"),
            ]
        )
        return text.concat_fragments(self.obs, ids, self.tokenizer.pad_id, out_len)

    def reset(self, key, params):
        digit = jax.random.randint(key, (), 0, 10)
        state = State(digit, jnp.int32(0), jnp.bool_(False))
        tokens, n = self._obs(digit, True, False, self.max_prompt_len)
        return state, TimeStep(
            tokens,
            n,
            jnp.float32(0),
            jnp.bool_(False),
            text.hash_u32(digit),
            jnp.bool_(True),
            jnp.bool_(False),
        )

    def step(self, key, state, action_tokens, action_len, params):
        idx = text.match_action(self.actions, action_tokens, action_len)
        valid = idx >= 0
        correct = idx == state.digit
        reward = jnp.where(valid, correct.astype(jnp.float32), -0.1)
        digit = jax.random.randint(key, (), 0, 10)
        turn = state.turn + 1
        done = turn >= params.num_turns
        new = State(digit, turn, done)
        tokens, n = self._obs(digit, valid, correct, self.max_obs_len)
        ts = TimeStep(
            tokens,
            n,
            reward,
            done,
            text.hash_u32(jnp.stack([digit, turn])),
            valid,
            done & correct,
        )
        old_ts = base.empty_timestep(self.max_obs_len, text.hash_u32(state.digit), 0)
        return (
            jax.tree.map(lambda o, n_: jnp.where(state.done, o, n_), state, new),
            jax.tree.map(lambda o, n_: jnp.where(state.done, o, n_), old_ts, ts),
        )

    def render(self, state) -> str:
        return f"digit={int(state.digit)} turn={int(state.turn)} done={bool(state.done)}"
