"""Maze with partial observability (a memory task) as a multi-turn text environment.

A perfect maze (exactly one path between any two cells) of `size x size` rooms is drawn on a
grid of `(2 * size + 1)` character cells per side: rooms sit at odd (row, col), the cells
between two rooms are passages (open when carved) and the border and every even-even cell are
walls. The agent moves one grid cell per turn ("up", "down", "left", "right"; a move into a wall
is a valid turn that leaves it in place) and sees only the `(2 * view_radius + 1)` square window
around itself, one row of single-character cells per line:

  "#" wall (or off-grid), "_" open, "G" goal (only when inside the window), "P" the agent.

No coordinates and no visited marks are shown: to find the goal the agent must remember where it
has been (dead reckoning from its own moves and views). Reaching the goal ends the episode with
`goal_reward`. A turn whose text is not an action costs `invalid_penalty`; its observation says
so and lists the allowed words before the view. Optional per-turn process signals:
`progress_reward * (d(s) - d(s'))` with d the BFS distance to the goal through the maze
(potential-based shaping; it uses the hidden goal position), and `explore_reward` for each
grid cell entered for the first time (the exploration sub-goal; it depends on the episode's
history, which the anchor leaves out, see `Maze.anchor`).

Generation (pure JAX, from the reset key): `num_candidates` mazes per round are carved in
parallel by `algorithm`, with fixed-size loops:
  "dfs" (default): randomized depth-first search (recursive backtracker), a `fori_loop` of
    `2 * size**2` push-or-pop iterations on a fixed-size stack. Long winding corridors with few
    branches, so dead ends are long and remembering explored branches matters. At 4 x 4 rooms
    the layouts repeat now and then (about 3.8k distinct in 20k draws);
  "prim": randomized Prim, `size**2 - 1` iterations each adding a random tree-to-new-room
    edge. Many short dead ends, shorter paths, more distinct layouts (16k in 20k draws at 4 x 4).
The first candidate whose layout class matches the split is kept (at most `_MAX_ROUNDS` rounds;
if none qualifies, probability about 0.81**256 < 1e-23 for the defaults, a fixed serpentine
maze of either class is used).
Then the goal is a uniformly random room and the start a uniformly random room at least
`min_distance` moves from it along the maze (capped at the farthest room). The default 2 allows
any other room, so difficulty varies from task to task and random play still reaches the goal
now and then (about 1 episode in 6 within 48 random turns at size 4): the sparse reward has some
signal from the start.

Splits: a layout is test-class when `hash_u32(walls) % 1000 < test_fraction * 1000`; "train"
only generates train-class layouts, "test" only test-class ones, so training never sees a test
maze (with any start and goal). "ood" is a larger maze (`size=ood_size`, default 6) of either
class.
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
ALGORITHMS = ("dfs", "prim")
_MAX_ROUNDS = 16
# Cell codes (also fragment ids: the cell fragments come first in the table).
WALL, OPEN, GOAL, AGENT = range(4)
_CELLS = {"wall": "#", "open": "_", "goal": "G", "agent": "P"}
_CHARS = tuple(_CELLS.values())
_VISITED_CHAR = "."  # render only: an open cell the agent has stood on


MazeParams = base.SplitParams


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
        if self.size < 2:
            raise ValueError(f"size must be >= 2 (rooms per side), got {self.size}")
        if self.view_radius < 1:
            raise ValueError(
                f"view_radius must be >= 1 (1 = the 3x3 window), got {self.view_radius}"
            )
        if self.min_distance < 2:
            raise ValueError(
                "min_distance must be >= 2 (start and goal are distinct rooms), got "
                f"{self.min_distance}"
            )
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"algorithm {self.algorithm!r} is not allowed; allowed: {list(ALGORITHMS)}"
            )
        base.check_test_fraction(self.test_fraction)
        if self.ood_size < 2:
            raise ValueError(f"ood_size must be >= 2, got {self.ood_size}")
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {self.num_candidates}")
        base.check_nonnegative("goal_reward", self.goal_reward)
        base.check_nonnegative("invalid_penalty", self.invalid_penalty, " (it is subtracted)")
        base.check_nonnegative("progress_reward", self.progress_reward, " (0 = off)")
        base.check_nonnegative("explore_reward", self.explore_reward, " (0 = off)")


@flax.struct.dataclass
class MazeState:
    """One episode; H = 2 * size + 1 grid cells per side, rooms at odd (row, col)."""

    walls: jax.Array  # bool[H, H] wall cells (border, even-even cells, uncarved passages)
    goal: jax.Array  # int32[2] goal (row, col), a room
    pos: jax.Array  # int32[2] agent (row, col)
    visited: jax.Array  # bool[H, H] cells the agent has stood on (its history, not shown)
    dist: jax.Array  # int32[H, H] BFS moves to the goal (a function of walls and goal)
    done: jax.Array  # bool[] reached the goal


def far_distance(side: int) -> int:
    """The distance `distance_map` gives walls and unreachable cells on a side x side grid."""
    return side * side


def distance_map(walls: jax.Array, goal: jax.Array) -> jax.Array:
    """BFS distance (in moves) from every cell to the goal through open cells.

    Args:
      walls: bool[H, H] wall cells.
      goal: int32[2] goal (row, col), an open cell.

    Returns:
      int32[H, H] moves to the goal; `far_distance(H)` on walls and unreachable cells.
    """
    side = walls.shape[0]
    far = far_distance(side)
    dist = jnp.full((side, side), far, jnp.int32).at[goal[0], goal[1]].set(0)

    def _relax(carry):
        d, _ = carry
        padded = jnp.pad(d, 1, constant_values=far)
        nearest = jnp.minimum(
            jnp.minimum(padded[:-2, 1:-1], padded[2:, 1:-1]),
            jnp.minimum(padded[1:-1, :-2], padded[1:-1, 2:]),
        )
        relaxed = jnp.where(walls, far, jnp.minimum(d, nearest + 1))
        return relaxed, jnp.any(relaxed != d)

    # One BFS layer per iteration, until nothing changes (at most one per open cell).
    dist, _ = jax.lax.while_loop(lambda c: c[1], _relax, (dist, jnp.ones((), bool)))
    return dist


def layout_hash(walls: jax.Array) -> jax.Array:
    """uint32[] hash of a maze layout bool[H, H] (decides its train/test class)."""
    return text.hash_u32(walls.astype(jnp.int32))


def serpentine_walls(size: int) -> np.ndarray:
    """bool[H, H] a fixed perfect maze: every row of rooms open, rows joined at alternate ends."""
    side = 2 * size + 1
    walls = np.ones((side, side), bool)
    walls[1:-1:2, 1:-1] = False  # each row of rooms and the passages between them
    for r in range(size - 1):
        col = 2 * size - 1 if r % 2 == 0 else 1
        walls[2 * r + 2, col] = False
    return walls


def _room_walls(size: int) -> np.ndarray:
    """bool[H, H] every cell a wall except the rooms (odd row, odd col)."""
    walls = np.ones((2 * size + 1, 2 * size + 1), bool)
    walls[1::2, 1::2] = False
    return walls


def _edges(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room pairs (int32[E] a, int32[E] b) of the room grid and the flat passage cell between."""
    side = 2 * size + 1
    a, b, passage = [], [], []
    for row in range(size):
        for col in range(size):
            for drow, dcol in ((0, 1), (1, 0)):
                if row + drow < size and col + dcol < size:
                    a.append(row * size + col)
                    b.append((row + drow) * size + col + dcol)
                    passage.append((2 * row + 1 + drow) * side + 2 * col + 1 + dcol)
    return np.array(a, np.int32), np.array(b, np.int32), np.array(passage, np.int32)


@registry.register("maze")
class Maze(base.TextEnv):
    """Partially observable maze text environment (see the module docstring).

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
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **_CELLS,
                # compact: no row breaks and a one-word message, for fast CPU training.
                "newline": "" if compact else "\n",
                # Ends every observation: the policy's next token is its action.
                "end": "\n",
                "invalid": "invalid" if compact else "invalid action allowed: up down left right\n",
            },
        )
        cell_len = int(self._frags.lengths[: len(_CELLS)].max())
        newline_len = int(self._frags.lengths[self._frags.id("newline")])
        end_len = int(self._frags.lengths[self._frags.id("end")])
        view = 2 * view_radius + 1
        self.num_actions = len(ACTIONS)
        self.max_action_len = int(self.action_table.lengths.max())
        self.max_prompt_len = view * view * cell_len + (view - 1) * newline_len + end_len
        invalid_len = int(self._frags.lengths[self._frags.id("invalid")])
        self.max_obs_len = invalid_len + self.max_prompt_len

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
        state = self._generate(key, params.split)
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

        prefix = jnp.where(valid, -1, self._frags.id("invalid"))[None]
        ids = jnp.concatenate([prefix, self._view_ids(new_state)])
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )
        reward = jnp.where(valid, jnp.where(at_goal, c.goal_reward, 0.0), -c.invalid_penalty)
        if c.progress_reward:
            # Potential-based shaping on the BFS distance to the goal, c * (d(s) - d(s')),
            # which keeps the optimal policy (Ng et al., 1999); it uses the hidden goal.
            gain = state.dist[state.pos[0], state.pos[1]] - state.dist[pos[0], pos[1]]
            reward = reward + c.progress_reward * gain
        if c.explore_reward:
            reward = reward + c.explore_reward * first_visit
        return new_state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=at_goal,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=at_goal,
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
        newline = jnp.full((view, 1), self._frags.id("newline"))
        ids = jnp.concatenate([cells, newline], axis=1).ravel().astype(jnp.int32)
        return ids.at[-1].set(self._frags.id("end"))

    @property
    def carve_bits(self) -> int:
        """Random uint32 words `carve` consumes per maze."""
        n = self.config.size
        if self.config.algorithm == "dfs":
            return 1 + 4 * 2 * n * n  # root, then 4 direction scores per push-or-pop iteration
        return 1 + (n * n - 1) * 2 * n * (n - 1)  # root, then a score per edge per added room

    def carve(self, bits: jax.Array) -> jax.Array:
        """One perfect maze by `algorithm` ("dfs" or "prim"), as a wall grid.

        Args:
          bits: uint32[carve_bits] random words.

        Returns:
          bool[H, H] walls: every room open, exactly size**2 - 1 passages carved.
        """
        dfs = self.config.algorithm == "dfs"
        return self._carve_dfs(bits) if dfs else self._carve_prim(bits)

    def _carve_dfs(self, bits: jax.Array) -> jax.Array:
        """Randomized depth-first search (recursive backtracker) on a fixed-size stack.

        Each of 2 * n^2 iterations (n^2 - 1 pushes and at most n^2 - 1 pops before the last
        push) carves from the top room to a random unvisited neighbour, or pops when it has none.
        """
        n, side = self.config.size, self.side
        iterations = 2 * n * n
        deltas = jnp.asarray(DELTAS)
        root = (bits[0] % (n * n)).astype(jnp.int32)
        # Scores >= 1 for any direction; 0 marks a blocked one.
        scores = (bits[1:].reshape(iterations, 4) >> 1) + jnp.uint32(1)
        cells = jnp.arange(side * side)
        rooms = jnp.arange(n * n)
        slots = jnp.arange(n * n + 1)

        # Updates are one-hot selects, not scatters.
        def _iteration(i, carry):
            walls, seen, stack, depth = carry
            top = stack[jnp.maximum(depth - 1, 0)]
            row, col = top // n, top % n
            nrow, ncol = row + deltas[:, 0], col + deltas[:, 1]
            inside = (nrow >= 0) & (nrow < n) & (ncol >= 0) & (ncol < n)
            neighbour = jnp.clip(nrow, 0, n - 1) * n + jnp.clip(ncol, 0, n - 1)
            can = inside & ~seen[neighbour] & (depth > 0)
            pick = jnp.argmax(jnp.where(can, scores[i], jnp.uint32(0)))
            push = can.any()
            nxt = neighbour[pick]
            passage = (2 * row + 1 + deltas[pick, 0]) * side + 2 * col + 1 + deltas[pick, 1]
            walls = walls & ~(push & (cells == passage))
            seen = seen | (push & (rooms == nxt))
            stack = jnp.where(push & (slots == depth), nxt, stack)
            depth = jnp.where(push, depth + 1, jnp.maximum(depth - 1, 0))
            return walls, seen, stack, depth

        init = (
            jnp.asarray(_room_walls(n).ravel()),
            rooms == root,
            jnp.where(slots == 0, root, 0),
            jnp.ones((), jnp.int32),
        )
        walls, _, _, _ = jax.lax.fori_loop(0, iterations, _iteration, init)
        return walls.reshape(side, side)

    def _carve_prim(self, bits: jax.Array) -> jax.Array:
        """Randomized Prim: n^2 - 1 times, carve a random edge from the tree to a new room."""
        n, side = self.config.size, self.side
        room_a, room_b, passage = _edges(n)
        num_edges = len(passage)
        root = (bits[0] % (n * n)).astype(jnp.int32)
        scores = (bits[1:].reshape(n * n - 1, num_edges) >> 1) + jnp.uint32(1)
        cells = jnp.arange(side * side)
        rooms = jnp.arange(n * n)
        room_a, room_b, passage = jnp.asarray(room_a), jnp.asarray(room_b), jnp.asarray(passage)

        def _iteration(i, carry):
            walls, tree = carry
            frontier = tree[room_a] ^ tree[room_b]  # never empty before the tree spans
            pick = jnp.argmax(jnp.where(frontier, scores[i], jnp.uint32(0)))
            walls = walls & (cells != passage[pick])
            tree = tree | (rooms == room_a[pick]) | (rooms == room_b[pick])
            return walls, tree

        init = (jnp.asarray(_room_walls(n).ravel()), rooms == root)
        walls, _ = jax.lax.fori_loop(0, n * n - 1, _iteration, init)
        return walls.reshape(side, side)

    def _generate(self, key: jax.Array, split: jax.Array) -> MazeState:
        """A maze of the split's class (while_loop rounds of candidates), goal and start.

        One threefry call per round serves every candidate and the placement of the goal and
        the start (each random sampler in the graph costs compilation time).
        """
        n, num = self.config.size, self.config.num_candidates
        carve_bits = self.carve_bits
        place_bits = 1 + n * n

        def _qualifies(walls):
            return self.in_split(layout_hash(walls), split)

        def _round(carry):
            round_index, _, best, _ = carry
            shape = (num * carve_bits + place_bits,)
            bits = jax.random.bits(jax.random.fold_in(key, round_index), shape, jnp.uint32)
            walls = jax.vmap(self.carve)(bits[: num * carve_bits].reshape(num, carve_bits))
            ok = jax.vmap(_qualifies)(walls)
            found = ok.any()
            best = jnp.where(found, walls[jnp.argmax(ok)], best)
            return round_index + 1, found, best, bits[num * carve_bits :]

        init = (
            jnp.zeros((), jnp.int32),
            jnp.zeros((), bool),
            jnp.asarray(serpentine_walls(n)),
            jnp.zeros((place_bits,), jnp.uint32),
        )
        _, _, walls, bits = jax.lax.while_loop(lambda c: ~c[1] & (c[0] < _MAX_ROUNDS), _round, init)

        goal_room = (bits[0] % (n * n)).astype(jnp.int32)
        goal = jnp.stack([2 * (goal_room // n) + 1, 2 * (goal_room % n) + 1])
        dist = distance_map(walls, goal)
        room_dist = dist[1::2, 1::2].ravel()
        eligible = room_dist >= jnp.minimum(self.config.min_distance, room_dist.max())
        # Scores >= 1 for eligible rooms (never the goal: min_distance >= 2), 0 otherwise.
        scores = jnp.where(eligible, (bits[1:] >> 1) + jnp.uint32(1), jnp.uint32(0))
        start_room = jnp.argmax(scores).astype(jnp.int32)
        pos = jnp.stack([2 * (start_room // n) + 1, 2 * (start_room % n) + 1])
        return MazeState(
            walls=walls,
            goal=goal,
            pos=pos,
            visited=jnp.zeros_like(walls).at[pos[0], pos[1]].set(True),
            dist=dist,
            done=jnp.zeros((), bool),
        )

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
        state = jax.device_get(state)
        walls = np.asarray(state.walls)
        pos, goal = tuple(np.asarray(state.pos).tolist()), tuple(np.asarray(state.goal).tolist())
        return _bfs_plan(~walls, pos, lambda cell: cell == goal)

    def seen_cells(self, state: MazeState) -> np.ndarray:
        """bool[H, H] cells inside the window of some visited cell: what the agent has seen."""
        visited = np.asarray(jax.device_get(state.visited))
        r, side = self.config.view_radius, self.side
        padded = np.zeros((side + 2 * r, side + 2 * r), bool)
        for dr in range(-r, r + 1):
            for dc in range(-r, r + 1):
                padded[r + dr : r + dr + side, r + dc : r + dc + side] |= visited
        return padded[r : r + side, r : r + side]

    def explore_actions(self, state: MazeState) -> list[int] | None:
        """An imitable oracle: nearest-frontier exploration over the cells seen so far.

        Uses only what the agent has observed (the windows around the cells it visited, in
        `state.visited`, and whether the goal was among them). If the goal has been seen, the
        plan is the shortest path to it through seen open cells; otherwise it is the shortest
        path through seen open cells to the nearest frontier, a seen open cell whose window
        still holds unseen cells (ties: the first found by a BFS expanding up, down, left,
        right). Called every turn, this explores the maze depth-first-like until the goal
        comes into view. Returns [] at the goal and None when nothing is left to explore.
        """
        state = jax.device_get(state)
        walls, goal = np.asarray(state.walls), tuple(np.asarray(state.goal).tolist())
        pos = tuple(np.asarray(state.pos).tolist())
        seen = self.seen_cells(state)
        known_open = seen & ~walls
        if seen[goal]:
            return _bfs_plan(known_open, pos, lambda cell: cell == goal)
        r = self.config.view_radius
        unseen = np.pad(~seen, r, constant_values=False)

        def _frontier(cell):
            window = unseen[cell[0] : cell[0] + 2 * r + 1, cell[1] : cell[1] + 2 * r + 1]
            return bool(window.any())

        return _bfs_plan(known_open, pos, _frontier)


def _bfs_plan(free: np.ndarray, start: tuple, is_target) -> list[int] | None:
    """Shortest action ids from start to the first cell with is_target(cell) through free cells."""
    side = free.shape[0]
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        cell = queue.popleft()
        if is_target(cell):
            plan = []
            while parent[cell] is not None:
                cell, action = parent[cell]
                plan.append(action)
            return plan[::-1]
        for action, (dr, dc) in enumerate(DELTAS.tolist()):
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < side and 0 <= nxt[1] < side and free[nxt] and nxt not in parent:
                parent[nxt] = (cell, action)
                queue.append(nxt)
    return None
