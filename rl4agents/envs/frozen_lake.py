"""FrozenLake as a multi-turn text environment.

The agent walks on a `size x size` grid from the top-left corner to the goal in the bottom-right
corner, avoiding holes. Each turn it answers one of the words "up", "down", "left", "right"; the
environment replies with the grid, one row of single-character cells per line:

  "_" frozen, "O" hole, "G" goal, "P" agent (drawn over the cell it stands on).

Maps are drawn in JAX from the reset key: `num_candidates` Bernoulli(`hole_prob`) hole layouts
per round, the first one that is solvable and belongs to the split's class is kept. The train/test
split is by layout: a layout whose `hash_u32(holes) % 1000 < test_fraction * 1000` belongs to the
test class, so training never generates a test map. The "ood" split uses larger maps
(`ood_size`, by default `size + 2`) of either class. Rounds repeat (at most `_MAX_ROUNDS`, inside
a `while_loop`) until a candidate qualifies; if none does, which has probability below 1e-50 for
the defaults, the hole-free map is used.
"""

from __future__ import annotations

import collections

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.types import TimeStep

SPLITS = ("train", "test", "ood")
ACTIONS = ("up", "down", "left", "right")
DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)  # (row, col) per action id
# Gym's slippery rule: the intended move with probability `success_rate` (gym default 1/3),
# otherwise one of the two perpendicular ones with equal probability.
_PERPENDICULAR = np.array([[2, 3], [2, 3], [0, 1], [0, 1]], np.int32)
_MAX_ROUNDS = 16
_CELLS = {"frozen": "_", "hole": "O", "goal": "G", "agent": "P"}
_CHARS = tuple(_CELLS.values())  # cell code -> character, in the order of the fragment table


@flax.struct.dataclass
class FrozenLakeParams:
    """Per-run parameters: which layout class `reset` draws."""

    split: jax.Array  # int32[] 0 train class, 1 test class, 2 either class (ood)


@flax.struct.dataclass
class FrozenLakeState:
    """One episode's state; the goal is always the bottom-right cell."""

    holes: jax.Array  # bool[N, N] hole layout
    pos: jax.Array  # int32[2] agent (row, col)
    done: jax.Array  # bool[] fell into a hole or reached the goal


def _split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed splits: {list(SPLITS)}")
    return SPLITS.index(split)


def _shift(x: jax.Array, drow: int, dcol: int) -> jax.Array:
    """x moved by (drow, dcol) with zeros shifted in: out[r, c] = x[r - drow, c - dcol]."""
    n = x.shape[0]
    padded = jnp.pad(x, 1)
    return jax.lax.dynamic_slice(padded, (1 - drow, 1 - dcol), (n, n))


def solvable(holes: jax.Array) -> jax.Array:
    """Whether the goal is reachable from the start avoiding holes.

    Args:
      holes: bool[N, N] hole layout.

    Returns:
      bool[] the bottom-right cell is 4-connected to the top-left one through non-holes.
    """
    n = holes.shape[0]
    free = ~holes

    def _fill_step(_, reach):
        grown = reach | _shift(reach, 1, 0) | _shift(reach, -1, 0)
        grown = grown | _shift(reach, 0, 1) | _shift(reach, 0, -1)
        return grown & free

    reach = jnp.zeros((n, n), bool).at[0, 0].set(free[0, 0])
    reach = jax.lax.fori_loop(0, n * n, _fill_step, reach)
    return reach[n - 1, n - 1]


def layout_hash(holes: jax.Array) -> jax.Array:
    """uint32[] hash of a hole layout bool[N, N] (decides its train/test class)."""
    return text.hash_u32(holes.astype(jnp.int32))


@registry.register("frozen_lake")
class FrozenLake:
    """FrozenLake text environment (see the module docstring).

    Attributes:
      tokenizer: tokenizer the fragments were encoded with.
      size: N, side of the square map.
      max_prompt_len: P, length of the grid observation returned by `reset`.
      max_obs_len: O, length of the observation returned by `step` (message + grid).
      max_action_len: longest action word in tokens.
      num_actions: 4 (up, down, left, right).

    Args (a value out of its range raises ValueError at construction):
      size: side of the square map, >= 2.
      hole_prob: probability that a cell is a hole, in [0, 1).
      slippery: gym's slippery moves (see `success_rate`).
      success_rate: probability of the intended move when slippery (gym's default 1/3), in
        (0, 1].
      progress_reward: per-turn process reward `c * (d(s) - d(s'))` on the Manhattan distance d
        to the goal, >= 0 (0 = the sparse task).
      invalid_penalty: subtracted on a turn whose action does not parse, >= 0.
      goal_reward: reward for reaching the goal, >= 0.
      test_fraction: share of layouts in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_size: side of the "ood" maps, 0 (= size + 2) or >= 2.
      num_candidates: layouts drawn per generation round, >= 1.
      compact: no row breaks, one-word messages.
      view_radius: 0 = the whole grid each turn; r >= 1 = the (2r+1)^2 window around the agent.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        size: int = 4,
        hole_prob: float = 0.2,
        slippery: bool = False,
        success_rate: float = 1.0 / 3.0,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.05,
        goal_reward: float = 1.0,
        test_fraction: float = 0.2,
        ood_size: int = 0,
        num_candidates: int = 64,
        compact: bool = False,
        view_radius: int = 0,
        tokenizer: text.Tokenizer | None = None,
    ):
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if not 0.0 <= hole_prob < 1.0:
            raise ValueError(f"hole_prob must be in [0, 1), got {hole_prob}")
        base.check_test_fraction(test_fraction)
        if not 0.0 < success_rate <= 1.0:
            raise ValueError(f"success_rate must be in (0, 1], got {success_rate}")
        if view_radius < 0:
            raise ValueError(f"view_radius must be >= 0 (0 = the whole grid), got {view_radius}")
        if ood_size < 0:
            raise ValueError(f"ood_size must be >= 0 (0 = size + 2), got {ood_size}")
        if ood_size == 1:
            raise ValueError(f"ood_size must be 0 (= size + 2) or >= 2, got {ood_size}")
        base.check_nonnegative("progress_reward", progress_reward, " (0 = off)")
        base.check_nonnegative("invalid_penalty", invalid_penalty, " (it is subtracted)")
        base.check_nonnegative("goal_reward", goal_reward)
        if num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
        self._kwargs = dict(
            size=size,
            hole_prob=hole_prob,
            slippery=slippery,
            success_rate=success_rate,
            progress_reward=progress_reward,
            invalid_penalty=invalid_penalty,
            goal_reward=goal_reward,
            test_fraction=test_fraction,
            ood_size=ood_size,
            num_candidates=num_candidates,
            compact=compact,
            view_radius=view_radius,
            tokenizer=tokenizer,
        )
        self.tokenizer = text.BuiltinTokenizer() if tokenizer is None else tokenizer
        self.size = size
        self.hole_prob = hole_prob
        self.slippery = slippery
        self.success_rate = success_rate
        self.progress_reward = progress_reward
        self.invalid_penalty = invalid_penalty
        self.goal_reward = goal_reward
        self.test_threshold = int(round(test_fraction * 1000))
        self.ood_size = ood_size or size + 2  # 0: two cells larger than the training maps
        self.num_candidates = num_candidates
        self.view_radius = view_radius

        self._actions = text.FragmentTable.build(self.tokenizer, {a: a for a in ACTIONS})
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **_CELLS,
                "wall": "#",  # off-grid cells of a local view
                # compact: no row breaks and a one-word message, for fast CPU training.
                "newline": "" if compact else "\n",
                # Ends every observation: the policy's next token is its action.
                "end": "\n",
                "invalid": "invalid" if compact else "invalid action\n",
            },
        )
        cell_len = int(self._frags.lengths[: len(_CELLS)].max())
        newline_len = int(self._frags.lengths[self._frags.id("newline")])
        self.num_actions = len(ACTIONS)
        self.max_action_len = int(self._actions.lengths.max())
        end_len = int(self._frags.lengths[self._frags.id("end")])
        side = 2 * view_radius + 1 if view_radius else size
        self.max_prompt_len = side * side * cell_len + (side - 1) * newline_len + end_len
        invalid_len = int(self._frags.lengths[self._frags.id("invalid")])
        self.max_obs_len = invalid_len + self.max_prompt_len

    def default_params(self, split: str = "train") -> FrozenLakeParams:
        """Params selecting the layout class `split` ("ood": either class) for this size."""
        return FrozenLakeParams(split=jnp.asarray(_split_id(split), jnp.int32))

    def make_split(self, split: str) -> tuple[FrozenLake, FrozenLakeParams]:
        """(env, params) for "train", "test" or "ood" (a new env with `size=ood_size`)."""
        _split_id(split)
        ood = {"size": self.ood_size, "ood_size": 0, "tokenizer": self.tokenizer}
        env = self if split != "ood" else FrozenLake(**{**self._kwargs, **ood})
        return env, env.default_params(split)

    def reset(self, key: jax.Array, params: FrozenLakeParams) -> tuple[FrozenLakeState, TimeStep]:
        """Draws a solvable map of the params' class; the agent starts at (0, 0).

        Args:
          key: typed PRNG key.
          params: `FrozenLakeParams`.

        Returns:
          The state and a TimeStep whose obs_tokens int32[P] hold the grid.
        """
        holes = self._generate(key, params.split)
        state = FrozenLakeState(
            holes=holes, pos=jnp.zeros((2,), jnp.int32), done=jnp.zeros((), bool)
        )
        obs, obs_len = text.concat_fragments(
            self._frags, self._grid_ids(state), self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=jnp.zeros((), jnp.float32),
            done=jnp.zeros((), bool),
            anchor=self.anchor(state),
            valid_action=jnp.ones((), bool),
            success=jnp.zeros((), bool),
        )

    def step(
        self,
        key: jax.Array,
        state: FrozenLakeState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: FrozenLakeParams,
    ) -> tuple[FrozenLakeState, TimeStep]:
        """One turn: parse the action, move (slipping if enabled), observe the grid.

        Args:
          key: typed PRNG key (used only when slippery).
          state: current `FrozenLakeState`.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `FrozenLakeParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O]; absorbing once done.
        """
        del params
        state = jax.tree.map(jnp.asarray, state)  # host (numpy) states work eagerly too
        n = self.size
        action = text.match_action(self._actions, action_tokens, action_len)
        valid = action >= 0
        move = jnp.maximum(action, 0)
        if self.slippery:
            options = jnp.concatenate([move[None], jnp.asarray(_PERPENDICULAR)[move]])
            slip = (1.0 - self.success_rate) / 2.0
            probs = jnp.asarray([self.success_rate, slip, slip], jnp.float32)
            move = options[jax.random.choice(key, 3, p=probs)]
        pos = jnp.clip(state.pos + jnp.asarray(DELTAS)[move], 0, n - 1)  # off-grid: stay
        pos = jnp.where(valid, pos, state.pos)
        at_goal = jnp.all(pos == n - 1)
        done = state.holes[pos[0], pos[1]] | at_goal
        new_state = state.replace(pos=pos, done=done)

        prefix = jnp.where(valid, -1, self._frags.id("invalid"))[None]
        ids = jnp.concatenate([prefix, self._grid_ids(new_state)])
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )
        reward = jnp.where(valid, jnp.where(at_goal, self.goal_reward, 0.0), -self.invalid_penalty)
        if self.progress_reward:
            # Process signal: potential-based shaping on the Manhattan distance to the goal,
            # `c * (d(s) - d(s'))`, which keeps the optimal policy (Ng et al., 1999).
            dist = lambda p: 2 * (n - 1) - p.sum()  # noqa: E731
            reward = reward + self.progress_reward * (dist(state.pos) - dist(pos))
        timestep = TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=done,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=at_goal,
        )
        frozen = base.empty_timestep(self.max_obs_len, self.anchor(state), self.tokenizer.pad_id)
        return base.absorbing(state.done, (state, frozen), (new_state, timestep))

    def anchor(self, state: FrozenLakeState) -> jax.Array:
        """uint32[] hash of (hole layout, agent position)."""
        return text.hash_u32(jnp.concatenate([state.holes.astype(jnp.int32).ravel(), state.pos]))

    def _grid_ids(self, state: FrozenLakeState) -> jax.Array:
        """int32[S * (S + 1)] fragment ids of the view, one newline after each row.

        The view is the whole grid (S = N), or with `view_radius` r the (2r+1) x (2r+1) window
        centred on the agent (S = 2r + 1), off-grid cells shown as walls ("#").
        """
        n = self.size
        cells = jnp.where(state.holes, 1, 0).at[n - 1, n - 1].set(2)
        cells = cells.at[state.pos[0], state.pos[1]].set(3)
        side = n
        if self.view_radius:
            r = self.view_radius
            side = 2 * r + 1
            wall = self._frags.id("wall")
            cells = jnp.pad(cells, r, constant_values=wall)
            cells = jax.lax.dynamic_slice(cells, (state.pos[0], state.pos[1]), (side, side))
        newline = jnp.full((side, 1), self._frags.id("newline"))
        ids = jnp.concatenate([cells, newline], axis=1).ravel().astype(jnp.int32)
        return ids.at[-1].set(self._frags.id("end"))

    def _generate(self, key: jax.Array, split: jax.Array) -> jax.Array:
        """bool[N, N] first solvable candidate layout of the split's class (while_loop rounds)."""
        n, num = self.size, self.num_candidates

        def _qualifies(holes):
            in_class = base.in_split_class(layout_hash(holes), self.test_threshold, split)
            return solvable(holes) & in_class

        def _round(carry):
            round_index, _, best = carry
            key_round = jax.random.fold_in(key, round_index)
            holes = jax.random.bernoulli(key_round, self.hole_prob, (num, n, n))
            holes = holes.at[:, 0, 0].set(False).at[:, n - 1, n - 1].set(False)
            ok = jax.vmap(_qualifies)(holes)
            found = ok.any()
            return round_index + 1, found, jnp.where(found, holes[jnp.argmax(ok)], best)

        init = (jnp.zeros((), jnp.int32), jnp.zeros((), bool), jnp.zeros((n, n), bool))
        _, _, holes = jax.lax.while_loop(lambda c: ~c[1] & (c[0] < _MAX_ROUNDS), _round, init)
        return holes

    def action_tokens(self, action: int) -> np.ndarray:
        """int32[len] tokens of action id `action` (0 up, 1 down, 2 left, 3 right)."""
        return self._actions.tokens[action, : self._actions.lengths[action]].copy()

    def render(self, state: FrozenLakeState) -> str:
        """The whole grid as text, one row per line (host side), whatever the policy's view."""
        holes, pos = np.asarray(jax.device_get(state.holes)), np.asarray(state.pos)
        grid = np.where(holes, _CELLS["hole"], _CELLS["frozen"]).astype(object)
        grid[-1, -1] = _CELLS["goal"]
        grid[pos[0], pos[1]] = _CELLS["agent"]
        return "".join("".join(row) + "\n" for row in grid)

    def state_from_text(self, grid: str) -> FrozenLakeState:
        """Builds a state from rows of "_", "O", "G", "P" (goal bottom-right, one "P")."""
        rows = [r for r in grid.strip().split("\n")]
        n = len(rows)
        if n != self.size or any(len(r) != n for r in rows):
            raise ValueError(f"expected a {self.size}x{self.size} grid, got {rows}")
        holes = np.array([[ch == "O" for ch in r] for r in rows])
        (pos,) = [(r, c) for r in range(n) for c in range(n) if rows[r][c] == "P"]
        done = holes[pos] or pos == (n - 1, n - 1)
        return FrozenLakeState(
            holes=jnp.asarray(holes),
            pos=jnp.asarray(pos, jnp.int32),
            done=jnp.asarray(done),
        )

    def oracle_actions(self, state: FrozenLakeState) -> list[int] | None:
        """Shortest action-id sequence to the goal (BFS, deterministic moves), or None.

        Returns [] at the goal and None when the agent is in a hole or the goal is unreachable.
        With `slippery=True` the sequence is the deterministic plan, not a guaranteed solution.
        """
        holes, pos = np.asarray(jax.device_get(state.holes)), tuple(np.asarray(state.pos).tolist())
        n = holes.shape[0]
        goal = (n - 1, n - 1)
        if holes[pos]:
            return None
        parent = {pos: None}
        queue = collections.deque([pos])
        while queue:
            cell = queue.popleft()
            if cell == goal:
                plan = []
                while parent[cell] is not None:
                    cell, action = parent[cell]
                    plan.append(action)
                return plan[::-1]
            for action, (dr, dc) in enumerate(DELTAS.tolist()):
                nxt = (cell[0] + dr, cell[1] + dc)
                if 0 <= nxt[0] < n and 0 <= nxt[1] < n and not holes[nxt] and nxt not in parent:
                    parent[nxt] = (cell, action)
                    queue.append(nxt)
        return None
