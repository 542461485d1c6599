"""The maze environment: its settings, the turn dynamics and the text of the agent's window
(the package docstring describes the task)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.maze import generator, oracle
from rl4agents.envs.maze.world import (
    _CELLS,
    _CHARS,
    _VISITED_CHAR,
    ACTIONS,
    AGENT,
    ALGORITHMS,
    DELTAS,
    GOAL,
    OPEN,
    WALL,
    MazeParams,
    MazeState,
    distance_map,
)
from rl4agents.types import TimeStep


@dataclasses.dataclass(frozen=True)
class MazeConfig:
    """Static settings (the constructor's arguments; see `Maze`), checked when built."""

    size: int = 4
    view_radius: int = 1
    min_distance: int = 2
    algorithm: str = "dfs"
    goal_reward: float = 1.0
    invalid_penalty: float = 0.05
    progress_reward: float = 0.0
    explore_reward: float = 0.0
    test_fraction: float = 0.2
    ood_size: int = 6
    num_candidates: int = 16
    compact: bool = False

    def __post_init__(self):
        base.check_range("size", self.size, 2, note=" (rooms per side)")
        base.check_range("view_radius", self.view_radius, 1, note=" (1 = the 3x3 window)")
        note = " (start and goal are distinct rooms)"
        base.check_range("min_distance", self.min_distance, 2, note=note)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"algorithm {self.algorithm!r} is not allowed; allowed: {list(ALGORITHMS)}"
            )
        base.check_range("ood_size", self.ood_size, 2)
        base.check_shared_settings(self)


@registry.register("maze")
class Maze(base.TextEnv):
    """Partially observable maze text environment (see the package docstring).

    Attributes:
      config: `MazeConfig`, the settings below.
      tokenizer: tokenizer the fragments were encoded with.
      side: H = 2 * size + 1, grid cells per side.
      max_prompt_len: P, length of the view returned by `reset`.
      max_obs_len: O, length of the observation returned by `step` (message + view).
      max_action_len: longest action word in tokens.
      num_actions: 4 (up, down, left, right).

    Args (a value out of its range raises ValueError at construction):
      size: rooms per side, >= 2; the grid has H = 2 * size + 1 cells per side.
      view_radius: r, the (2r+1)^2 window around the agent, >= 1 (1 = the 3x3 window).
      min_distance: least moves from the start to the goal, >= 2 (capped at the farthest room).
      algorithm: the carving algorithm, "dfs" or "prim".
      goal_reward: reward for reaching the goal, >= 0.
      invalid_penalty: subtracted on a turn whose action does not parse, >= 0.
      progress_reward: BFS-distance shaping `c * (d(s) - d(s'))`, >= 0 (0 = off).
      explore_reward: per newly entered grid cell, >= 0 (0 = off).
      test_fraction: share of layouts in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_size: `size` of the "ood" mazes, >= 2.
      num_candidates: mazes carved per generation round, >= 1.
      compact: no row breaks, one-word invalid message.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        size: int = 4,
        view_radius: int = 1,
        min_distance: int = 2,
        algorithm: str = "dfs",
        goal_reward: float = 1.0,
        invalid_penalty: float = 0.05,
        progress_reward: float = 0.0,
        explore_reward: float = 0.0,
        test_fraction: float = 0.2,
        ood_size: int = 6,
        num_candidates: int = 16,
        compact: bool = False,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(MazeConfig, locals()), tokenizer)
        self.side = 2 * size + 1
        self.action_table = text.FragmentTable.build(self.tokenizer, {a: a for a in ACTIONS})
        self.num_actions = len(ACTIONS)
        self.max_action_len = int(self.action_table.lengths.max())
        invalid = "invalid action allowed: up down left right\n"
        grid = base.grid_text(
            self.tokenizer, _CELLS, 2 * view_radius + 1, compact=compact, invalid=invalid
        )
        self._frags, self.max_prompt_len, self.max_obs_len = grid

    def ood_config(self) -> MazeConfig:
        """Mazes of `ood_size` rooms per side."""
        return dataclasses.replace(self.config, size=self.config.ood_size)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: MazeParams
    ) -> tuple[MazeState, jax.Array, jax.Array]:
        """Carves a maze of the params' class and places the goal and the start.

        Returns:
          The state, the start window obs_tokens int32[P] and obs_len int32[].
        """
        state = generator.generate(key, params.split, self.config, self.in_split)
        obs, obs_len = text.concat_fragments(
            self._frags, self._view_ids(state), self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
        self,
        key: jax.Array,
        state: MazeState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: MazeParams,
    ) -> tuple[MazeState, TimeStep]:
        """One turn: parse the action, move unless a wall is in the way, observe the window.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `MazeState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `MazeParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del key, params
        c = self.config
        action = text.match_action(self.action_table, action_tokens, action_len)
        valid = action >= 0
        # The agent stands on an open cell, never on the wall border: nxt stays on the grid.
        nxt = state.pos + jnp.asarray(DELTAS)[jnp.maximum(action, 0)]
        moves = valid & ~state.walls[nxt[0], nxt[1]]
        pos = jnp.where(moves, nxt, state.pos)
        at_goal = jnp.all(pos == state.goal)
        first_visit = ~state.visited[pos[0], pos[1]]
        new_state = state.replace(
            pos=pos, visited=state.visited.at[pos[0], pos[1]].set(True), done=at_goal
        )

        obs, obs_len = base.grid_observation(
            self._frags, valid, self._view_ids(new_state), self.tokenizer.pad_id, self.max_obs_len
        )
        reward = jnp.where(valid, jnp.where(at_goal, c.goal_reward, 0.0), -c.invalid_penalty)
        if c.progress_reward:
            # Potential-based shaping on the BFS distance to the goal, c * (d(s) - d(s')),
            # which keeps the optimal policy (Ng et al., 1999); it uses the hidden goal.
            gain = state.dist[state.pos[0], state.pos[1]] - state.dist[pos[0], pos[1]]
            reward = reward + c.progress_reward * gain
        if c.explore_reward:
            reward = reward + c.explore_reward * first_visit
        return self.end_turn(
            new_state, obs, obs_len, reward, done=at_goal, valid=valid, success=at_goal
        )

    def anchor(self, state: MazeState) -> jax.Array:
        """uint32[] hash of (walls, goal, agent position): the environment's full state.

        The maze is partially observable, yet the anchor hashes the full (hidden) state, not
        the observation: GiGPO groups turns taken from the same environment state, and two
        turns at the same cell of the same maze are exactly that, whatever the agent saw
        before. `visited` (the episode's history) and `dist` (a function of walls and goal) are
        left out; with `explore_reward` > 0 the shaped reward of a turn also depends on
        `visited`, so turns sharing an anchor may then differ in their exploration bonus.
        """
        state = jax.tree.map(jnp.asarray, state)
        cells = state.walls.astype(jnp.int32).ravel()
        return text.hash_u32(jnp.concatenate([cells, state.goal, state.pos]))

    def _view_ids(self, state: MazeState) -> jax.Array:
        """int32[S * (S + 1)] fragment ids of the (S = 2r + 1)^2 window, newline after each row.

        Off-grid cells show as walls; the goal shows only when inside the window.
        """
        r = self.config.view_radius
        view = 2 * r + 1
        cells = jnp.where(state.walls, WALL, OPEN).at[state.goal[0], state.goal[1]].set(GOAL)
        cells = cells.at[state.pos[0], state.pos[1]].set(AGENT)
        cells = jnp.pad(cells, r, constant_values=WALL)
        cells = jax.lax.dynamic_slice(cells, (state.pos[0], state.pos[1]), (view, view))
        return base.grid_ids(self._frags, cells)

    @property
    def carve_bits(self) -> int:
        """Random uint32 words `carve` consumes per maze."""
        return generator.carve_bits(self.config.size, self.config.algorithm)

    def carve(self, bits: jax.Array) -> jax.Array:
        """bool[H, H] walls of one perfect maze carved by `algorithm` from uint32[carve_bits]
        random words (see `generator.carve`)."""
        return generator.carve(bits, self.config.size, self.config.algorithm)

    def render(self, state: MazeState) -> str:
        """The whole maze as text, one row per line (host side), whatever the agent sees.

        Same characters as the observation, plus "." on open cells the agent has visited.
        """
        state = jax.device_get(state)
        walls, visited = np.asarray(state.walls), np.asarray(state.visited)
        grid = np.where(walls, _CELLS["wall"], _CELLS["open"]).astype(object)
        grid[visited & ~walls] = _VISITED_CHAR
        grid[tuple(np.asarray(state.goal))] = _CELLS["goal"]
        grid[tuple(np.asarray(state.pos))] = _CELLS["agent"]
        return "".join("".join(row) + "\n" for row in grid)

    def state_from_text(self, maze: str) -> MazeState:
        """Builds a state from rows of "#", "_", ".", "G", "P" (one "G", one "P").

        "." marks visited open cells; the agent's cell is visited too. The layout need not be
        a perfect maze, but its border must be walls.
        """
        rows = maze.strip().split("\n")
        side = self.side
        if len(rows) != side or any(len(r) != side for r in rows):
            raise ValueError(f"expected a {side}x{side} maze, got {rows}")
        grid = np.array([list(r) for r in rows])
        allowed = set(_CHARS) | {_VISITED_CHAR}
        if not set(grid.ravel()) <= allowed:
            raise ValueError(f"maze characters must be in {sorted(allowed)}, got {rows}")
        walls = grid == _CELLS["wall"]
        border = np.ones((side, side), bool)
        border[1:-1, 1:-1] = False
        if not walls[border].all():
            raise ValueError("the maze's border must be walls")
        (goal,) = np.argwhere(grid == _CELLS["goal"])
        (pos,) = np.argwhere(grid == _CELLS["agent"])
        visited = grid == _VISITED_CHAR
        visited[tuple(pos)] = True
        goal = jnp.asarray(goal, jnp.int32)
        return MazeState(
            walls=jnp.asarray(walls),
            goal=goal,
            pos=jnp.asarray(pos, jnp.int32),
            visited=jnp.asarray(visited),
            dist=distance_map(jnp.asarray(walls), goal),
            done=jnp.zeros((), bool),
        )

    def oracle_actions(self, state: MazeState) -> list[int] | None:
        """Shortest action-id sequence to the goal (BFS over the whole maze), or None.

        Uses hidden information: the full maze and the goal position, which the agent has not
        necessarily seen. For demonstrations that only use what the agent observed, see
        `explore_actions`. Returns [] at the goal and None when the goal is unreachable.
        """
        return oracle.shortest_plan(state)

    def seen_cells(self, state: MazeState) -> np.ndarray:
        """bool[H, H] cells inside the window of some visited cell: what the agent has seen."""
        return oracle.seen_cells(state.visited, self.config.view_radius)

    def explore_actions(self, state: MazeState) -> list[int] | None:
        """An imitable oracle: nearest-frontier exploration over the cells seen so far (see
        `oracle.explore_plan`); [] at the goal, None when nothing is left to explore."""
        return oracle.explore_plan(state, self.config.view_radius)
