"""Helpers the environment tests share: padded action tokens and batched, jitted episodes.

Each test file builds its batches once at import with a fixed batch size, so every jitted
function compiles once per environment.
"""

import jax
import jax.numpy as jnp
import numpy as np


def pad(env, ids, slots: int) -> tuple[jax.Array, jax.Array]:
    """(int32[slots] tokens, int32[] length) of the token ids `ids`, PAD-padded."""
    tokens = np.full((slots,), env.tokenizer.pad_id, np.int32)
    tokens[: len(ids)] = ids
    return jnp.asarray(tokens), jnp.asarray(len(ids), jnp.int32)


def encode(env, action: str, slots: int) -> tuple[jax.Array, jax.Array]:
    """(int32[slots] tokens, int32[] length) of any action text (valid or not), cut to `slots`
    tokens."""
    return pad(env, env.tokenizer.encode(action)[:slots], slots)


def action(env, action_id: int, slots: int) -> tuple[jax.Array, jax.Array]:
    """(int32[slots] tokens, int32[] length) of the action id `action_id`."""
    return pad(env, env.action_tokens(action_id), slots)


def action_table(env, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32[num_actions, slots] tokens, int32[num_actions] lengths) of every action id."""
    table = np.full((env.num_actions, slots), env.tokenizer.pad_id, np.int32)
    lengths = np.zeros((env.num_actions,), np.int32)
    for i in range(env.num_actions):
        ids = env.action_tokens(i)
        table[i, : len(ids)], lengths[i] = ids, len(ids)
    return table, lengths


def ids_to_tokens(env, action_ids, slots: int) -> tuple[jax.Array, jax.Array]:
    """int[...] action ids -> (int32[..., slots] tokens, int32[...] lengths)."""
    table, lengths = action_table(env, slots)
    ids = np.asarray(action_ids)
    return jnp.asarray(table[ids]), jnp.asarray(lengths[ids])


def index(tree, i):
    """Episode `i` of a batched pytree, as host numpy arrays."""
    return jax.tree.map(lambda x: np.asarray(x)[i], tree)


def keys(seed, n: int) -> jax.Array:
    """n typed PRNG keys split from `seed` (an int seed or a key)."""
    key = seed if isinstance(seed, jax.Array) else jax.random.key(seed)
    return jax.random.split(key, n)


class StepBatch:
    """jit(vmap(.)) reset and one step of `env` over `batch` episodes (compiled once each).

    Attributes:
      reset: (keys [n], params) -> (states, TimeSteps), [n] leading axes.
      step: (keys [n], states, tokens int32[n, slots], lengths int32[n], params) -> (states,
        TimeSteps).
      table, lengths: int32[num_actions, slots] tokens and int32[num_actions] lengths of every
        action id.
    """

    def __init__(self, env, slots: int, batch: int):
        self.env, self.slots, self.batch = env, slots, batch
        self.reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
        self.step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, 0, None)))
        self.table, self.lengths = action_table(env, slots)

    def keys(self, seed: int, n: int | None = None) -> jax.Array:
        """`n` (default: the batch) keys split from `seed`."""
        return keys(seed, self.batch if n is None else n)

    def act(self, states, action_ids, params, seed: int = 0):
        """One turn of n episodes from int[n] action ids, with the keys of `seed`."""
        ids = np.asarray(action_ids)
        tokens, lengths = jnp.asarray(self.table[ids]), jnp.asarray(self.lengths[ids])
        return self.step(self.keys(seed, len(ids)), states, tokens, lengths, params)

    def single_step(self, key, state, tokens, length, params):
        """One episode's step through the batched program (no extra compilation): the state
        and action tiled over the batch, keys split from `key`; returns episode 0's (state,
        TimeStep) as host arrays."""
        tile = lambda x: jnp.broadcast_to(jnp.asarray(x), (self.batch, *np.shape(x)))  # noqa: E731
        states, ts = self.step(
            keys(key, self.batch), jax.tree.map(tile, state), tile(tokens), tile(length), params
        )
        return index(states, 0), index(ts, 0)

    def play(self, state, actions, params=None):
        """[(state, TimeStep)] after each action from one state (`single_step` with key 0;
        default params: the train split's). An action is text (str), an action id (int) or
        raw token ids (a list)."""
        params = self.env.default_params() if params is None else params
        out = []
        for act in actions:
            if isinstance(act, str):
                tokens, length = encode(self.env, act, self.slots)
            elif isinstance(act, (int, np.integer)):
                tokens, length = action(self.env, act, self.slots)
            else:
                tokens, length = pad(self.env, act, self.slots)
            state, ts = self.single_step(jax.random.key(0), state, tokens, length, params)
            out.append((state, ts))
        return out

    def random_turns(self, params, seed: int, turns: int):
        """`turns` batched turns of random token actions (`random_actions` from the split of
        `key(turn)`) from `reset` with the keys of `seed`. Returns bool[turns, batch] invalid
        actions, f32[turns, batch] rewards and int32[turns, batch] observation lengths."""
        states, _ = self.reset(self.keys(seed), params)
        invalid, rewards, obs_len = [], [], []
        vocab = self.env.tokenizer.vocab_size
        for turn in range(turns):
            key_tokens, key_len = jax.random.split(jax.random.key(turn))
            tokens, lengths = random_actions(vocab, key_tokens, key_len, (self.batch,), self.slots)
            states, ts = self.step(self.keys(turn), states, tokens, lengths, params)
            invalid.append(~np.asarray(ts.valid_action))
            rewards.append(np.asarray(ts.reward))
            obs_len.append(np.asarray(ts.obs_len))
        return np.stack(invalid), np.stack(rewards), np.stack(obs_len)

    def oracle_turns(self, states, params, turns: int):
        """`turns` batched turns, each the first action of the env's oracle plan from every
        state (a done episode absorbs action 0); asserts every plan exists. Returns (final
        states, [per-turn TimeSteps])."""
        out = []
        for turn in range(turns):
            plans = [self.env.oracle_actions(index(states, i)) for i in range(self.batch)]
            assert all(p is not None for p in plans)
            ids = [p[0] if p else 0 for p in plans]
            states, ts = self.act(states, ids, params, seed=turn)
            out.append(ts)
        return states, out


class ScanBatch:
    """jit(vmap(.)) reset and a `length`-turn `lax.scan` of steps over `batch` episodes."""

    def __init__(self, env, batch: int, length: int):
        self.env, self.batch, self.length = env, batch, length
        self.reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))

        def play(key, state, tokens, lengths, params):
            def _turn(state, inputs):
                key_step, tok, length = inputs
                new, ts = env.step(key_step, state, tok, length, params)
                return new, (new, ts)

            step_keys = jax.random.split(key, tokens.shape[0])
            return jax.lax.scan(_turn, state, (step_keys, tokens, lengths))

        self._play = jax.jit(jax.vmap(play, in_axes=(0, 0, 0, 0, None)))

    def keys(self, seed: int) -> jax.Array:
        """`batch` keys split from `seed`."""
        return keys(seed, self.batch)

    def play(self, seed, states, tokens, lengths, params):
        """Plays int32[B, L, A] tokens and int32[B, L] lengths from the keys of `seed`; returns
        (final states, per-turn states, per-turn TimeSteps) with [B, L] leading axes."""
        final, (seq, ts) = self._play(self.keys(seed), states, tokens, lengths, params)
        return final, seq, ts


def random_actions(vocab_size: int, key_tokens, key_lengths, shape, slots: int):
    """Random token actions: (int32[*shape, slots] tokens uniform in [0, vocab_size) from
    `key_tokens`, int32[*shape] lengths uniform in [0, slots] from `key_lengths`)."""
    tokens = jax.random.randint(key_tokens, (*shape, slots), 0, vocab_size)
    lengths = jax.random.randint(key_lengths, tuple(shape), 0, slots + 1)
    return tokens, lengths


def assert_obs(env, ts, expected: str) -> None:
    """The TimeStep's observation is exactly the tokenization of `expected`, then PAD."""
    got = np.asarray(ts.obs_tokens)[: int(ts.obs_len)].tolist()
    assert got == env.tokenizer.encode(expected), (env.tokenizer.decode(got), expected)
    assert (np.asarray(ts.obs_tokens)[int(ts.obs_len) :] == env.tokenizer.pad_id).all()


def assert_same(a, b) -> None:
    """Two pytrees are equal leaf by leaf."""
    jax.tree.map(np.testing.assert_array_equal, a, b)
