"""The peers' multi-turn FrozenLake job as an rl4agents environment (JAX, token arrays).

Replicates the benchmark definition the peer scripts share (`mt_common.py` of the peer
benchmark), token for token:

- maps: the first `num_maps` distinct maps of gymnasium's
  `generate_random_map(size=4, p=0.8, seed=0, 1, ...)` (re-implemented here in NumPy with the
  same generator, so gymnasium is not needed); non-slippery FrozenLake-v1 dynamics.
- observation: `"turn t of K . you are at row r col c . last action a ."`, a newline, and the
  grid as 4 lines of space-separated cells (S/F/H/G, the agent's cell shown as P).
- context: `<sys> SYSTEM <user> OBS_0 <asst> ACT_0 <user> OBS_1 <asst> ...`; the rollout's
  begin token is `<sys>`, so `reset` returns `SYSTEM <user> OBS_0 <asst>` and `step` returns
  `<user> OBS <asst>` (nothing once the episode is over).
- action: the first of the words left/down/right/up among the sampled tokens; none = invalid
  (no move, reward -0.1); +1 on reaching the goal; the episode ends on goal or hole or after
  `max_turns` turns.
- tokenizer: the peers' WordLevel vocabulary of 512 entries (`vocab.WordLevelTokenizer`).

The map of an episode is chosen by `reset`'s key: `map_index(key)` reads the key's data, so
`task_keys(n)` fixes map i for task i (the peers' batch: maps 0..3, each repeated G times),
while a random key (as the train step draws) gives a random map of the set.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.types import TimeStep

from . import vocab

VOCAB = 512
MAX_TURNS = 8
NUM_MAPS = 4
INVALID_PENALTY = -0.1
SPECIALS = ("<pad>", "<eos>", "<unk>", "<nl>", "<sys>", "<user>", "<asst>")
ACTIONS = ("left", "down", "right", "up")  # gymnasium action ids 0..3
_TEXT_WORDS = (
    "you are on a frozen lake grid reach the goal and avoid holes marks "
    "answer with one word or turn of at row col last action none invalid"
)
WORDS = ACTIONS + ("S", "F", "H", "G", "P", ".") + tuple(str(i) for i in range(10))
WORDS = WORDS + tuple(_TEXT_WORDS.split())
SYSTEM = (
    "you are on a frozen lake grid . reach the goal G and avoid the holes H . "
    "P marks you . answer with one word left down right or up ."
)
_CELLS = "SFHG"  # cell codes 0..3
_MOVES = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]], np.int32)  # (row, col) per action id


def make_tokenizer() -> vocab.WordLevelTokenizer:
    """The peers' 512-word vocabulary; begin token `<sys>`, end of action `<eos>`."""
    words = vocab.pad_vocab(SPECIALS + WORDS, VOCAB)
    return vocab.WordLevelTokenizer(words, bos_id=words.index("<sys>"), newline="<nl>")


def _is_valid(board: np.ndarray, size: int) -> bool:
    """gymnasium's `is_valid`: depth-first search from (0, 0) to a "G"."""
    frontier, discovered = [(0, 0)], set()
    while frontier:
        r, c = frontier.pop()
        if (r, c) in discovered:
            continue
        discovered.add((r, c))
        for dr, dc in ((1, 0), (0, 1), (-1, 0), (0, -1)):
            rn, cn = r + dr, c + dc
            if not (0 <= rn < size and 0 <= cn < size):
                continue
            if board[rn][cn] == "G":
                return True
            if board[rn][cn] != "H":
                frontier.append((rn, cn))
    return False


def generate_random_map(size: int = 4, p: float = 0.8, seed: int = 0) -> list[str]:
    """gymnasium's `generate_random_map` (same generator: PCG64 over `SeedSequence(seed)`)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[min(1, p), 1 - min(1, p)])
        board[0][0] = "S"
        board[-1][-1] = "G"
        if _is_valid(board, size):
            return ["".join(row) for row in board]


def task_maps(num_maps: int = NUM_MAPS) -> list[list[str]]:
    """The first `num_maps` distinct maps of generate_random_map(4, 0.8, seed=0, 1, ...)."""
    maps, seed = [], 0
    while len(maps) < num_maps:
        m = generate_random_map(size=4, p=0.8, seed=seed)
        if m not in maps:
            maps.append(m)
        seed += 1
    return maps


def task_keys(num_tasks: int) -> jax.Array:
    """key[num_tasks] whose task i plays map i (mod the number of maps)."""
    data = jnp.stack([jnp.zeros(num_tasks, jnp.uint32), jnp.arange(num_tasks, dtype=jnp.uint32)])
    return jax.random.wrap_key_data(data.T)


def map_index(key: jax.Array, num_maps: int) -> jax.Array:
    """int32[] map chosen by a reset key (see `task_keys`)."""
    return (jax.random.key_data(key).ravel()[-1] % num_maps).astype(jnp.int32)


@flax.struct.dataclass
class PeerLakeParams:
    maps: jax.Array  # int32[M, N, N] cell codes 0 S, 1 F, 2 H, 3 G


@flax.struct.dataclass
class PeerLakeState:
    cells: jax.Array  # int32[N, N] this episode's map
    pos: jax.Array  # int32[] flat agent position r * N + c
    turn: jax.Array  # int32[] turns taken
    last: jax.Array  # int32[] last action: 0..3 an action id, 4 invalid, 5 none (at reset)
    done: jax.Array  # bool[]


class PeerLake:
    """The peers' text FrozenLake (module docstring), following `rl4agents.envs.base`."""

    def __init__(self, num_maps: int = NUM_MAPS, max_turns: int = MAX_TURNS):
        self.tokenizer = make_tokenizer()
        self.maps = task_maps(num_maps)
        self.max_turns = max_turns
        self.size = 4
        tok = self.tokenizer
        # Observation template with placeholders; every word is one token.
        status = f"turn # of {max_turns} . you are at row # col # . last action # ."
        obs_words = status.split() + ["<nl>"] + " <nl> ".join(["# # # #"] * 4).split()
        slots = [i for i, w in enumerate(obs_words) if w == "#"]
        self._turn_slot, self._row_slot, self._col_slot, self._last_slot = slots[:4]
        self._cell_slots = np.array(slots[4:], np.int32)
        obs = np.array([tok.id(w) if w != "#" else tok.pad_id for w in obs_words], np.int32)
        self._obs_template = obs
        self._digits = np.array([tok.id(str(i)) for i in range(10)], np.int32)
        self._cell_ids = np.array([tok.id(c) for c in _CELLS + "P"], np.int32)
        self._last_ids = np.array([tok.id(w) for w in ACTIONS + ("invalid", "none")], np.int32)
        self._action_ids = np.array([tok.id(a) for a in ACTIONS], np.int32)
        self._head = np.array(tok.encode(f"{SYSTEM} <user>"), np.int32)  # after <sys>
        self._user, self._asst = tok.id("<user>"), tok.id("<asst>")
        self.max_prompt_len = len(self._head) + len(obs) + 1
        self.max_obs_len = 1 + len(obs) + 1
        self.max_action_len = 1  # one action word suffices

    def default_params(self, split: str = "train") -> PeerLakeParams:
        del split  # one fixed task set
        codes = [[[_CELLS.index(ch) for ch in row] for row in m] for m in self.maps]
        return PeerLakeParams(maps=jnp.asarray(codes, jnp.int32))

    def _observation(self, state: PeerLakeState) -> jax.Array:
        """int32[37] tokens of `render()`: status line, newline, grid."""
        n = self.size
        row, col = state.pos // n, state.pos % n
        digits = jnp.asarray(self._digits)
        grid = jnp.asarray(self._cell_ids)[state.cells.ravel()]
        grid = grid.at[state.pos].set(self._cell_ids[4])
        obs = jnp.asarray(self._obs_template)
        obs = obs.at[self._turn_slot].set(digits[state.turn + 1])
        obs = obs.at[self._row_slot].set(digits[row]).at[self._col_slot].set(digits[col])
        obs = obs.at[self._last_slot].set(jnp.asarray(self._last_ids)[state.last])
        return obs.at[self._cell_slots].set(grid)

    def anchor(self, state: PeerLakeState) -> jax.Array:
        """uint32[] hash of (map, position, turn, last action)."""
        return text.hash_u32(
            jnp.concatenate(
                [state.cells.ravel(), state.pos[None], state.turn[None], state.last[None]]
            )
        )

    def _timestep(self, state, obs, obs_len, reward, valid, success) -> TimeStep:
        return TimeStep(
            obs_tokens=obs,
            obs_len=jnp.asarray(obs_len, jnp.int32),
            reward=jnp.asarray(reward, jnp.float32),
            done=state.done,
            anchor=self.anchor(state),
            valid_action=jnp.asarray(valid, bool),
            success=jnp.asarray(success, bool),
        )

    def reset(self, key: jax.Array, params: PeerLakeParams) -> tuple[PeerLakeState, TimeStep]:
        """Start on map `map_index(key)`; obs int32[P] = `SYSTEM <user> OBS_0 <asst>`."""
        cells = params.maps[map_index(key, params.maps.shape[0])]
        zero = jnp.zeros((), jnp.int32)
        state = PeerLakeState(cells, zero, zero, jnp.full((), 5, jnp.int32), jnp.zeros((), bool))
        obs = jnp.concatenate(
            [jnp.asarray(self._head), self._observation(state), jnp.array([self._asst])]
        )
        return state, self._timestep(state, obs, self.max_prompt_len, 0.0, True, False)

    def step(
        self,
        key: jax.Array,
        state: PeerLakeState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: PeerLakeParams,
    ) -> tuple[PeerLakeState, TimeStep]:
        """One turn: the first action word among the tokens moves the agent; obs int32[O]."""
        del key, params
        n = self.size
        in_action = jnp.arange(action_tokens.shape[0]) < action_len
        matches = action_tokens[:, None] == jnp.asarray(self._action_ids)[None, :]  # [A, 4]
        is_word = (matches.any(axis=1) & in_action).astype(jnp.int32)
        valid = is_word.sum() > 0
        word_action = jnp.argmax(matches.astype(jnp.int32), axis=1)  # [A]
        action = word_action[jnp.argmax(is_word)].astype(jnp.int32)
        move = jnp.asarray(_MOVES)[action]
        row = jnp.clip(state.pos // n + move[0], 0, n - 1)
        col = jnp.clip(state.pos % n + move[1], 0, n - 1)
        pos = jnp.where(valid, row * n + col, state.pos)
        cell = state.cells.ravel()[pos]
        at_goal = valid & (cell == 3)
        turn = state.turn + 1
        done = (valid & (cell >= 2)) | (turn >= self.max_turns)
        new_state = PeerLakeState(
            state.cells, pos, turn, jnp.where(valid, action, 4).astype(jnp.int32), done
        )
        obs = jnp.concatenate(
            [jnp.array([self._user]), self._observation(new_state), jnp.array([self._asst])]
        )
        obs = jnp.where(done, self.tokenizer.pad_id, obs)
        reward = jnp.where(valid, jnp.where(at_goal, 1.0, 0.0), INVALID_PENALTY)
        ts = self._timestep(
            new_state, obs, jnp.where(done, 0, self.max_obs_len), reward, valid, at_goal
        )
        frozen = base.empty_timestep(self.max_obs_len, self.anchor(state), self.tokenizer.pad_id)
        return base.absorbing(state.done, (state, frozen), (new_state, ts))

    def render(self, state: PeerLakeState) -> str:
        """The observation text of `state` (host side), as mt_common's `render()` writes it."""
        return self.tokenizer.decode(np.asarray(self._observation(state)))


def rollout_config(turn_groups: int = 1):
    """The multi-turn job's rollout: 4 maps x 8 samples, 8 turns of up to 16 action tokens."""
    return rollout_lib.RolloutConfig(
        num_tasks=NUM_MAPS,
        group_size=8,
        max_turns=MAX_TURNS,
        max_action_len=16,
        turn_groups=turn_groups,
    )
