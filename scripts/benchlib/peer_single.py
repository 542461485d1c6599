"""The peers' single-turn job as a one-turn rl4agents environment.

The peers generate from 32 random prompts of 64 tokens (ids 3..511) and, for GRPO, score each
completion by the fraction of its tokens equal to id 7. Here `reset` draws the prompt from its
key and `step` returns that reward and ends the episode. The rollout puts its begin token
before the prompt, so the begin token is the word `w3` and the environment draws the other
`prompt_len - 1` tokens: the model still reads exactly `prompt_len` prompt tokens.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from rl4agents import text
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.types import TimeStep

from . import vocab

VOCAB = 512
PROMPT_LEN = 64
TARGET_TOKEN = 7  # the reward counts this id ("w7")
FIRST_WORD = 3  # prompts draw ids in [FIRST_WORD, VOCAB)


def make_tokenizer(eos: bool = True) -> vocab.WordLevelTokenizer:
    """`<pad>`, `<eos>`, `<unk>`, `w3`..`w511`; `eos=False` disables the end-of-action token
    (the peers' generation benchmark decodes a fixed number of tokens)."""
    return vocab.WordLevelTokenizer(
        vocab.filler_vocab(VOCAB), bos_id=FIRST_WORD, eoa_id=vocab.EOS if eos else -1
    )


@flax.struct.dataclass
class RandomPromptState:
    done: jax.Array  # bool[]


class RandomPrompt:
    """One turn: a random prompt, any completion, reward = share of `TARGET_TOKEN` in it.

    Attributes:
      max_completion: the rollout's action budget A (the reward's denominator when no end
        token was sampled).
    """

    def __init__(self, prompt_len: int = PROMPT_LEN, max_completion: int = 64, eos: bool = True):
        self.tokenizer = make_tokenizer(eos)
        self.max_prompt_len = prompt_len - 1  # the begin token is the first prompt token
        self.max_obs_len = 1  # nothing follows the completion (the rollout needs O >= 1)
        self.max_action_len = 1
        self.max_completion = max_completion

    def default_params(self, split: str = "train"):
        del split
        return jnp.zeros((), jnp.int32)

    def reset(self, key: jax.Array, params) -> tuple[RandomPromptState, TimeStep]:
        del params
        obs = jax.random.randint(key, (self.max_prompt_len,), FIRST_WORD, VOCAB, jnp.int32)
        return RandomPromptState(jnp.zeros((), bool)), self._timestep(obs, self.max_prompt_len)

    def step(self, key, state, action_tokens, action_len, params):
        """Reward = #TARGET_TOKEN / completion length; the completion counts the end token
        when one was sampled (TRL passes completions up to and including `<eos>`)."""
        del key, params
        in_action = jnp.arange(action_tokens.shape[0]) < action_len
        hits = jnp.sum((action_tokens == TARGET_TOKEN) & in_action)
        ended = action_len < self.max_completion  # stopped by the end token
        length = jnp.maximum(action_len + ended.astype(jnp.int32), 1)
        reward = jnp.where(state.done, 0.0, hits / length)
        pad = jnp.full((self.max_obs_len,), self.tokenizer.pad_id, jnp.int32)
        ts = self._timestep(pad, 0, reward)
        return RandomPromptState(jnp.ones((), bool)), ts

    def _timestep(self, obs, obs_len, reward=0.0) -> TimeStep:
        return TimeStep(
            obs_tokens=obs,
            obs_len=jnp.asarray(obs_len, jnp.int32),
            reward=jnp.asarray(reward, jnp.float32),
            done=jnp.asarray(obs_len == 0, bool) if isinstance(obs_len, int) else obs_len == 0,
            anchor=text.hash_u32(obs[:1]),
            valid_action=jnp.ones((), bool),
            success=jnp.zeros((), bool),
        )

    def render(self, state) -> str:
        return f"done={bool(state.done)}"


def gen_rollout_config():
    """The generation job's rollout: 32 prompts x 1 sample, one turn of 64 sampled tokens."""
    return rollout_lib.RolloutConfig(num_tasks=32, group_size=1, max_turns=1, max_action_len=64)
