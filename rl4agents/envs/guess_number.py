"""Guess the number: find a secret in [0, max_value] from "higher" / "lower" replies."""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.types import TimeStep

REPLIES = ("higher", "lower", "correct")  # fragment ids 0, 1, 2


@dataclasses.dataclass(frozen=True)
class GuessNumberConfig:
    """Static settings: the constructor's arguments, checked when built."""

    max_value: int = 63
    max_turns: int = 8
    invalid_penalty: float = 0.1
    test_fraction: float = 0.25
    ood_max_value: int = 99

    def __post_init__(self):
        base.check_range("max_value", self.max_value, 1, 99)
        base.check_range("ood_max_value", self.ood_max_value, 1, 99)
        base.check_range("max_turns", self.max_turns, 1)
        # test_fraction, num_candidates and the reward fields every built-in env shares
        # (invalid_penalty, goal_reward, progress_reward, ...), each with a one-line error.
        base.check_shared_settings(self)


@flax.struct.dataclass
class GuessNumberState:
    """One episode."""

    secret: jax.Array  # int32[] the number to find
    low: jax.Array  # int32[] smallest value the replies so far allow
    high: jax.Array  # int32[] largest value the replies so far allow
    turn: jax.Array  # int32[] turns taken
    solved: jax.Array  # bool[] guessed the secret
    done: jax.Array  # bool[] solved or out of turns


@registry.register("guess_number")
class GuessNumber(base.TextEnv):
    """Each turn the agent answers a number n; the reply says "higher", "lower" or "correct".

    A correct guess pays 1 and ends the episode; `max_turns` turns end it unsolved; a turn
    that names no number in [0, max_value] costs `invalid_penalty`. Secrets split by
    `hash_u32(secret)`; "ood" draws from [0, ood_max_value].
    """

    def __init__(
        self,
        max_value: int = 63,
        max_turns: int = 8,
        invalid_penalty: float = 0.1,
        test_fraction: float = 0.25,
        ood_max_value: int = 99,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(GuessNumberConfig, locals()), tokenizer)
        guesses = {str(v): str(v) for v in range(max_value + 1)}
        self.action_table = text.FragmentTable.build(self.tokenizer, guesses)  # id = value
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **{r: r for r in REPLIES},
                "invalid": f"invalid action allowed: a number from 0 to {max_value}",
                "prompt": f"guess the number from 0 to {max_value} in {max_turns} turns",
                "end": "\n",  # ends every observation: the policy's next token is its action
            },
        )
        length = lambda name: int(self._frags.lengths[self._frags.id(name)])  # noqa: E731
        self.num_actions = max_value + 1
        self.max_action_len = int(self.action_table.lengths.max())
        self.max_prompt_len = length("prompt") + length("end")
        self.max_obs_len = max(length(n) for n in (*REPLIES, "invalid")) + length("end")

    def ood_config(self) -> GuessNumberConfig:
        return dataclasses.replace(self.config, max_value=self.config.ood_max_value)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(self, key, params):
        """A secret of the params' split: the first of 16 draws per round in its class."""
        c = self.config

        def _candidates(bits):  # uint32[16, 1] -> (int32[16] secrets, bool[16] in the split)
            secrets = (bits[:, 0] % (c.max_value + 1)).astype(jnp.int32)
            task_hash = jax.vmap(text.hash_u32)(secrets)
            return secrets, jax.vmap(self.in_split, (0, None))(task_hash, params.split)

        secret = base.first_qualifying(
            key,
            _candidates,
            jnp.zeros((), jnp.int32),
            num_candidates=16,
            bits_per_candidate=1,
            max_rounds=8,
        )
        zero, no = jnp.zeros((), jnp.int32), jnp.zeros((), bool)
        high = jnp.asarray(c.max_value, jnp.int32)
        state = GuessNumberState(secret, low=zero, high=high, turn=zero, solved=no, done=no)
        ids = jnp.asarray([self._frags.id("prompt"), self._frags.id("end")])
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(self, key, state, action_tokens, action_len, params):
        """One guess of a live episode; `TextEnv.step` makes it absorbing after `done`."""
        c = self.config
        guess = text.match_action(self.action_table, action_tokens, action_len)  # -1: none
        valid = guess >= 0
        solved = valid & (guess == state.secret)
        reply = jnp.where(guess < state.secret, 0, jnp.where(guess > state.secret, 1, 2))
        turn = state.turn + 1
        new_state = state.replace(
            low=jnp.where(valid & (guess < state.secret), guess + 1, state.low),
            high=jnp.where(valid & (guess > state.secret), guess - 1, state.high),
            turn=turn,
            solved=solved,
            done=solved | (turn >= c.max_turns),
        )
        ids = jnp.stack([jnp.where(valid, reply, self._frags.id("invalid")), self._frags.id("end")])
        obs, obs_len = text.concat_fragments(
            self._frags, ids.astype(jnp.int32), self.tokenizer.pad_id, self.max_obs_len
        )
        reward = jnp.where(solved, 1.0, 0.0) - jnp.where(valid, 0.0, c.invalid_penalty)
        return new_state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=new_state.done,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=solved,
        )

    def anchor(self, state: GuessNumberState) -> jax.Array:
        """uint32[] hash of (secret, low, high, turn): what the next turn depends on."""
        return text.hash_u32(jnp.stack([state.secret, state.low, state.high, state.turn]))

    def render(self, state: GuessNumberState) -> str:
        s = jax.device_get(state)
        return f"secret {s.secret} in [{s.low}, {s.high}], turn {s.turn}/{self.config.max_turns}\n"

    def oracle_actions(self, state: GuessNumberState) -> list[int] | None:
        """Binary search from the state's bounds (it reads the hidden secret), or None when
        the turns left do not suffice; [] once solved."""
        s = jax.device_get(state)
        low, high, secret, plan = int(s.low), int(s.high), int(s.secret), []
        if bool(s.done):
            return [] if bool(s.solved) else None
        while int(s.turn) + len(plan) < self.config.max_turns:
            plan.append((low + high) // 2)
            if plan[-1] == secret:
                return plan
            low, high = (plan[-1] + 1, high) if plan[-1] < secret else (low, plan[-1] - 1)
        return None
