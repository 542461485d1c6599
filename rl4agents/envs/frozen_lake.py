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
import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.types import TimeStep

SPLITS = base.SPLITS
ACTIONS = ("up", "down", "left", "right")
DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)  # (row, col) per action id
# Gym's slippery rule: the intended move with probability `success_rate` (gym default 1/3),
# otherwise one of the two perpendicular ones with equal probability.
_PERPENDICULAR = np.array([[2, 3], [2, 3], [0, 1], [0, 1]], np.int32)
_MAX_ROUNDS = 16
_CELLS = {"frozen": "_", "hole": "O", "goal": "G", "agent": "P"}
_CHARS = tuple(_CELLS.values())  # cell code -> character, in the order of the fragment table

FrozenLakeParams = base.SplitParams


@dataclasses.dataclass(frozen=True)
class FrozenLakeConfig:
    """Static settings (the constructor's arguments; see `FrozenLake`), checked when built."""

    size: int = 4
    hole_prob: float = 0.2
    slippery: bool = False
    success_rate: float = 1.0 / 3.0
    progress_reward: float = 0.0
    invalid_penalty: float = 0.05
    goal_reward: float = 1.0
    test_fraction: float = 0.2
    ood_size: int = 0
    num_candidates: int = 64
    compact: bool = False
    view_radius: int = 0

    def __post_init__(self):
        base.check_range("size", self.size, 2)
        if not 0.0 <= self.hole_prob < 1.0:
            raise ValueError(f"hole_prob must be in [0, 1), got {self.hole_prob}")
        if not 0.0 < self.success_rate <= 1.0:
            raise ValueError(f"success_rate must be in (0, 1], got {self.success_rate}")
        if self.view_radius < 0:
            raise ValueError(
                f"view_radius must be >= 0 (0 = the whole grid), got {self.view_radius}"
            )
        if self.ood_size < 0:
            raise ValueError(f"ood_size must be >= 0 (0 = size + 2), got {self.ood_size}")
        if self.ood_size == 1:
            raise ValueError(f"ood_size must be 0 (= size + 2) or >= 2, got {self.ood_size}")
        base.check_shared_settings(self)


@flax.struct.dataclass
class FrozenLakeState:
    """One episode's state; the goal is always the bottom-right cell."""

    holes: jax.Array  # bool[N, N] hole layout
    pos: jax.Array  # int32[2] agent (row, col)
    done: jax.Array  # bool[] fell into a hole or reached the goal


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
class FrozenLake(base.TextEnv):
    """FrozenLake text environment (see the module docstring).

    Attributes:
      config: `FrozenLakeConfig`, the settings below.
      tokenizer: tokenizer the fragments were encoded with.
      max_prompt_len: P, length of the grid observation returned by `reset`.
      max_obs_len: O, length of the observation returned by `step` (message + grid).
      max_action_len: longest action word in tokens.
      num_actions: 4 (up, down, left, right).

    Args (a value out of its range raises ValueError at construction):
      size: N, side of the square map, >= 2.
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
        super().__init__(base.settings(FrozenLakeConfig, locals()), tokenizer)
        self.action_table = text.FragmentTable.build(self.tokenizer, {a: a for a in ACTIONS})
        self.num_actions = len(ACTIONS)
        self.max_action_len = int(self.action_table.lengths.max())
        side = 2 * view_radius + 1 if view_radius else size
        extra = {"wall": "#"}  # off-grid cells of a local view
        grid = base.grid_text(
            self.tokenizer, _CELLS, side, compact=compact, invalid="invalid action\n", extra=extra
        )
        self._frags, self.max_prompt_len, self.max_obs_len = grid

    def ood_config(self) -> FrozenLakeConfig:
        """Maps of side `ood_size` (0: two cells larger than the training maps)."""
        c = self.config
        return dataclasses.replace(c, size=c.ood_size or c.size + 2, ood_size=0)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: FrozenLakeParams
    ) -> tuple[FrozenLakeState, jax.Array, jax.Array]:
        """Draws a solvable map of the params' class; the agent starts at (0, 0).

        Returns:
          The state, the grid obs_tokens int32[P] and obs_len int32[].
        """
        holes = self._generate(key, params.split)
        state = FrozenLakeState(
            holes=holes, pos=jnp.zeros((2,), jnp.int32), done=jnp.zeros((), bool)
        )
        obs, obs_len = text.concat_fragments(
            self._frags, self._grid_ids(state), self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
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
          state: current `FrozenLakeState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `FrozenLakeParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del params
        c = self.config
        n = c.size
        action = text.match_action(self.action_table, action_tokens, action_len)
        valid = action >= 0
        move = jnp.maximum(action, 0)
        if c.slippery:
            options = jnp.concatenate([move[None], jnp.asarray(_PERPENDICULAR)[move]])
            slip = (1.0 - c.success_rate) / 2.0
            probs = jnp.asarray([c.success_rate, slip, slip], jnp.float32)
            move = options[jax.random.choice(key, 3, p=probs)]
        pos = jnp.clip(state.pos + jnp.asarray(DELTAS)[move], 0, n - 1)  # off-grid: stay
        pos = jnp.where(valid, pos, state.pos)
        at_goal = jnp.all(pos == n - 1)
        done = state.holes[pos[0], pos[1]] | at_goal
        new_state = state.replace(pos=pos, done=done)

        obs, obs_len = base.grid_observation(
            self._frags, valid, self._grid_ids(new_state), self.tokenizer.pad_id, self.max_obs_len
        )
        reward = jnp.where(valid, jnp.where(at_goal, c.goal_reward, 0.0), -c.invalid_penalty)
        if c.progress_reward:
            # Process signal: potential-based shaping on the Manhattan distance to the goal,
            # `c * (d(s) - d(s'))`, which keeps the optimal policy (Ng et al., 1999).
            dist = lambda p: 2 * (n - 1) - p.sum()  # noqa: E731
            reward = reward + c.progress_reward * (dist(state.pos) - dist(pos))
        return self.end_turn(
            new_state, obs, obs_len, reward, done=done, valid=valid, success=at_goal
        )

    def anchor(self, state: FrozenLakeState) -> jax.Array:
        """uint32[] hash of (hole layout, agent position)."""
        return text.hash_u32(jnp.concatenate([state.holes.astype(jnp.int32).ravel(), state.pos]))

    def _grid_ids(self, state: FrozenLakeState) -> jax.Array:
        """int32[S * (S + 1)] fragment ids of the view, one newline after each row.

        The view is the whole grid (S = N), or with `view_radius` r the (2r+1) x (2r+1) window
        centred on the agent (S = 2r + 1), off-grid cells shown as walls ("#").
        """
        n = self.config.size
        cells = jnp.where(state.holes, 1, 0).at[n - 1, n - 1].set(2)
        cells = cells.at[state.pos[0], state.pos[1]].set(3)
        side = n
        if self.config.view_radius:
            r = self.config.view_radius
            side = 2 * r + 1
            wall = self._frags.id("wall")
            cells = jnp.pad(cells, r, constant_values=wall)
            cells = jax.lax.dynamic_slice(cells, (state.pos[0], state.pos[1]), (side, side))
        return base.grid_ids(self._frags, cells)

    def _generate(self, key: jax.Array, split: jax.Array) -> jax.Array:
        """bool[N, N] first solvable candidate layout of the split's class (`_MAX_ROUNDS`
        rounds of `num_candidates` Bernoulli(`hole_prob`) layouts; the hole-free map if none
        qualifies)."""
        n, c = self.config.size, self.config

        def _candidates(bits):
            holes = base.uniform_from_bits(bits).reshape(-1, n, n) < c.hole_prob
            holes = holes.at[:, 0, 0].set(False).at[:, n - 1, n - 1].set(False)
            in_class = jax.vmap(lambda h: self.in_split(layout_hash(h), split))(holes)
            return holes, jax.vmap(solvable)(holes) & in_class

        return base.first_qualifying(
            key,
            _candidates,
            jnp.zeros((n, n), bool),
            num_candidates=c.num_candidates,
            bits_per_candidate=n * n,
            max_rounds=_MAX_ROUNDS,
        )

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
        n, size = len(rows), self.config.size
        if n != size or any(len(r) != n for r in rows):
            raise ValueError(f"expected a {size}x{size} grid, got {rows}")
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
