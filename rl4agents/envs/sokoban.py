"""Sokoban as a multi-turn text environment, with rooms generated in JAX.

The room is `size x size` cells including the outer wall border (gym-sokoban's `dim_room`).
Each turn the agent answers "up", "down", "left" or "right"; walking into a box pushes it when the
cell behind it is free (floor or target), otherwise nothing moves. The observation is the room,
one row of single-character cells per line:

  "#" wall, "_" floor, "." target, "$" box, "*" box on target, "@" player, "+" player on target.

Rewards follow gym-sokoban: -`step_penalty` per turn, +`box_reward` for each box pushed onto a
target, -`box_reward` for each box pushed off one, +`finish_reward` when every box is on a target
(done, success). An unparsable action costs `step_penalty + invalid_penalty` and moves nothing.

Generation (pure JAX, from the reset key), after gym-sokoban's reverse-play generator:
  1. topology: a random walk carves floor inside the border (`carve_steps` steps, default
     1.7 * 2 * size as in gym-sokoban, each opening one of gym-sokoban's 3x3 masks; the
     direction changes with probability 0.35 per step);
  2. `num_boxes` targets and the player on distinct floor cells; every box starts on a target;
  3. reverse play: a random walk of `reverse_steps` player moves (default twice the carve steps)
     in which a move away from an adjacent box pulls it along; half of the moves pull some
     adjacent box when one can be pulled. Every reverse move undoes as a forward move or push,
     so the room is solvable (the tests check it with the BFS oracle).
`num_candidates` rooms are generated in parallel per round; the first one whose boxes are at least
`min_box_distance` from the targets (summed Manhattan distance to the nearest target; 1 = "some
box moved off its target"; the default 2 per box removes most one-push rooms) and whose hash class
matches the split is kept. Rounds repeat up to `_MAX_ROUNDS`; the astronomically rare fallback
is a fixed open room.

Splits: a room's class is test when `puzzle_hash(room) % 1000 < test_fraction * 1000`, a hash
of its walls, targets and boxes but not the player, so the same puzzle from another start (the
player walks to the other start, then plays the same moves) never lands in both splits; "train"
only generates train-class rooms, "test" only test-class ones. "ood" is a larger room with more
boxes: `size=ood_size` (default 7) and `num_boxes=ood_num_boxes` (default 2), either class.
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
_MAX_ROUNDS = 16
_P_CHANGE_DIRECTION = 0.35
_P_PREFER_PULL = 0.5
# Cell codes (also fragment ids: the cell fragments come first in the table).
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = range(7)
_CHARS = ("#", "_", ".", "$", "*", "@", "+")
# gym-sokoban's carving patterns: each topology step opens one of these 3x3 masks.
_CARVE_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    bool,
)
_CELL_NAMES = ("wall", "floor", "target", "box", "box_on_target", "player", "player_on_target")


SokobanParams = base.SplitParams


@dataclasses.dataclass(frozen=True)
class SokobanConfig:
    """Static settings (the constructor's arguments; see `Sokoban`), checked when built."""

    size: int = 6
    num_boxes: int = 1
    reverse_steps: int | None = None
    carve_steps: int | None = None
    min_box_distance: int | None = None
    step_penalty: float = 0.1
    box_reward: float = 1.0
    finish_reward: float = 10.0
    invalid_penalty: float = 0.1
    test_fraction: float = 0.2
    ood_size: int = 7
    ood_num_boxes: int = 2
    num_candidates: int = 64
    compact: bool = False

    def __post_init__(self):
        size, num_boxes = self.size, self.num_boxes
        if size < 5:
            raise ValueError(f"size must be >= 5 (a 3x3 interior at least), got {size}")
        if not 1 <= num_boxes <= size - 2:
            raise ValueError(f"num_boxes must be in [1, {size - 2}], got {num_boxes}")
        base.check_test_fraction(self.test_fraction)
        if self.reverse_steps is not None and self.reverse_steps < 1:
            raise ValueError(
                f"reverse_steps must be >= 1 (None = the default), got {self.reverse_steps}"
            )
        if self.carve_steps is not None and self.carve_steps < 1:
            raise ValueError(
                f"carve_steps must be >= 1 (None = the default), got {self.carve_steps}"
            )
        if self.min_box_distance is not None and self.min_box_distance < 1:
            raise ValueError(
                f"min_box_distance must be >= 1 (0 allows solved rooms; None = 2 * num_boxes), "
                f"got {self.min_box_distance}"
            )
        base.check_nonnegative("step_penalty", self.step_penalty, " (it is subtracted)")
        base.check_nonnegative("box_reward", self.box_reward)
        base.check_nonnegative("finish_reward", self.finish_reward)
        base.check_nonnegative("invalid_penalty", self.invalid_penalty, " (it is subtracted)")
        ood_size, ood_num_boxes = self.ood_size, self.ood_num_boxes
        if ood_size < 5:
            raise ValueError(f"ood_size must be >= 5 (a 3x3 interior at least), got {ood_size}")
        if not 1 <= ood_num_boxes <= ood_size - 2:
            raise ValueError(f"ood_num_boxes must be in [1, {ood_size - 2}], got {ood_num_boxes}")
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {self.num_candidates}")


@flax.struct.dataclass
class SokobanState:
    """One episode's room; the outer border is always wall."""

    walls: jax.Array  # bool[N, N]
    targets: jax.Array  # bool[N, N]
    boxes: jax.Array  # bool[N, N]
    player: jax.Array  # int32[2] (row, col)
    done: jax.Array  # bool[] every box on a target


def _interior(n: int) -> np.ndarray:
    inside = np.zeros((n, n), bool)
    inside[1:-1, 1:-1] = True
    return inside


def _static_cells(state: SokobanState) -> jax.Array:
    """int32[N, N] codes of walls, floor, targets and boxes (no player)."""
    box = jnp.where(state.targets, BOX_ON_TARGET, BOX)
    empty = jnp.where(state.targets, TARGET, FLOOR)
    return jnp.where(state.walls, WALL, jnp.where(state.boxes, box, empty)).astype(jnp.int32)


def cell_codes(state: SokobanState) -> jax.Array:
    """int32[N, N] cell codes (WALL ... PLAYER_ON_TARGET); a bijection of the state's layout."""
    cells = _static_cells(state)
    row, col = state.player[0], state.player[1]
    on_target = state.targets[row, col]
    return cells.at[row, col].set(jnp.where(on_target, PLAYER_ON_TARGET, PLAYER))


def box_distance(state: SokobanState) -> jax.Array:
    """int32[] sum over boxes of the Manhattan distance to the nearest target (0 iff solved)."""
    n = state.walls.shape[0]
    rows, cols = jnp.divmod(jnp.arange(n * n), n)
    dist = jnp.abs(rows[:, None] - rows[None, :]) + jnp.abs(cols[:, None] - cols[None, :])
    dist = jnp.where(state.targets.ravel()[None, :], dist, 2 * n)
    return jnp.where(state.boxes.ravel(), dist.min(axis=1), 0).sum().astype(jnp.int32)


def room_hash(state: SokobanState) -> jax.Array:
    """uint32[] hash of walls, targets, boxes and player: the anchor (`text.hash_u32`, 32-bit
    FNV-1a, so distinct rooms can share one; within one room's states none was found)."""
    return text.hash_u32(cell_codes(state))


def puzzle_hash(state: SokobanState) -> jax.Array:
    """uint32[] hash of walls, targets and boxes, without the player: the split class, so one
    puzzle generated with two player starts is in one split."""
    return text.hash_u32(_static_cells(state))


@registry.register("sokoban")
class Sokoban(base.TextEnv):
    """Sokoban text environment (see the module docstring).

    Attributes:
      config: `SokobanConfig`, the settings below.
      tokenizer: tokenizer the fragments were encoded with.
      carve_steps, reverse_steps, min_box_distance: those settings with None resolved.
      max_prompt_len: P, length of the room observation returned by `reset`.
      max_obs_len: O, length of the observation returned by `step` (message + room).
      max_action_len: longest action word in tokens.
      num_actions: 4 (up, down, left, right).

    Args (a value out of its range raises ValueError at construction):
      size: N, side of the room including its wall border, >= 5.
      num_boxes: boxes (= targets) per room, in [1, size - 2].
      reverse_steps: reverse-play moves, >= 1 (None = twice the default carve steps).
      carve_steps: topology carving steps, >= 1 (None = int(1.7 * 2 * size), gym-sokoban's).
      min_box_distance: least summed box-to-target distance of a generated room, >= 1
        (None = 2 * num_boxes; 0 would allow rooms solved from the start).
      step_penalty: subtracted every turn, >= 0.
      box_reward: per box pushed onto a target (subtracted per box pushed off one), >= 0.
      finish_reward: when every box is on a target, >= 0.
      invalid_penalty: subtracted on top of `step_penalty` when the action does not parse,
        >= 0.
      test_fraction: share of rooms in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_size: `size` of the "ood" rooms, >= 5.
      ood_num_boxes: `num_boxes` of the "ood" rooms, in [1, ood_size - 2].
      num_candidates: rooms generated per round, >= 1.
      compact: the interior only, no row breaks, one-word messages.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        size: int = 6,
        num_boxes: int = 1,
        reverse_steps: int | None = None,
        carve_steps: int | None = None,
        min_box_distance: int | None = None,
        step_penalty: float = 0.1,
        box_reward: float = 1.0,
        finish_reward: float = 10.0,
        invalid_penalty: float = 0.1,
        test_fraction: float = 0.2,
        ood_size: int = 7,
        ood_num_boxes: int = 2,
        num_candidates: int = 64,
        compact: bool = False,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(SokobanConfig, locals()), tokenizer)
        # gym-sokoban carves for num_gen_steps = 1.7 * (width + height) steps; reverse play is a
        # random walk here (not an exhaustive search), so it gets twice as many moves.
        gym_steps = int(1.7 * 2 * size)
        self.carve_steps = gym_steps if carve_steps is None else carve_steps
        self.reverse_steps = 2 * gym_steps if reverse_steps is None else reverse_steps
        self.min_box_distance = 2 * num_boxes if min_box_distance is None else min_box_distance

        self.action_table = text.FragmentTable.build(self.tokenizer, {a: a for a in ACTIONS})
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **dict(zip(_CELL_NAMES, _CHARS, strict=True)),
                # compact: the interior only (the border is always wall), no row breaks and
                # a one-word message, for fast CPU training.
                "newline": "" if compact else "\n",
                # Ends every observation: the policy's next token is its action.
                "end": "\n",
                "invalid": "invalid" if compact else "invalid action\n",
            },
        )
        cell_len = int(self._frags.lengths[: len(_CHARS)].max())
        newline_len = int(self._frags.lengths[self._frags.id("newline")])
        self.num_actions = len(ACTIONS)
        self.max_action_len = int(self.action_table.lengths.max())
        rows = size - 2 if compact else size
        end_len = int(self._frags.lengths[self._frags.id("end")])
        self.max_prompt_len = rows * rows * cell_len + (rows - 1) * newline_len + end_len
        invalid_len = int(self._frags.lengths[self._frags.id("invalid")])
        self.max_obs_len = invalid_len + self.max_prompt_len

    def ood_config(self) -> SokobanConfig:
        """Rooms of side `ood_size` with `ood_num_boxes` boxes."""
        c = self.config
        return dataclasses.replace(c, size=c.ood_size, num_boxes=c.ood_num_boxes)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: SokobanParams
    ) -> tuple[SokobanState, jax.Array, jax.Array]:
        """Generates a room of the params' class by reverse play.

        Returns:
          The state, the room obs_tokens int32[P] and obs_len int32[].
        """
        state = self._generate(key, params.split)
        obs, obs_len = text.concat_fragments(
            self._frags, self._grid_ids(state), self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
        self,
        key: jax.Array,
        state: SokobanState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: SokobanParams,
    ) -> tuple[SokobanState, TimeStep]:
        """One turn: parse the action, move or push, observe the room.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `SokobanState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `SokobanParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del key, params
        c = self.config
        action = text.match_action(self.action_table, action_tokens, action_len)
        valid = action >= 0
        new_state = _move(state, jnp.asarray(DELTAS)[jnp.maximum(action, 0)], valid)
        on_before = (state.boxes & state.targets).sum()
        on_after = (new_state.boxes & new_state.targets).sum()
        solved = new_state.done
        reward = (
            -c.step_penalty
            + c.box_reward * (on_after - on_before)
            + jnp.where(solved, c.finish_reward, 0.0)
            - jnp.where(valid, 0.0, c.invalid_penalty)
        )
        prefix = jnp.where(valid, -1, self._frags.id("invalid"))[None]
        ids = jnp.concatenate([prefix, self._grid_ids(new_state)])
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )
        return new_state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=solved,
            anchor=room_hash(new_state),
            valid_action=valid,
            success=solved,
        )

    def anchor(self, state: SokobanState) -> jax.Array:
        """uint32[] hash of the room (walls, targets, boxes, player)."""
        return room_hash(state)

    def _grid_ids(self, state: SokobanState) -> jax.Array:
        """int32[N * (N + 1)] fragment ids of the room, one newline after each row."""
        cells = cell_codes(state)
        if self.config.compact:
            cells = cells[1:-1, 1:-1]
        newline = jnp.full((cells.shape[0], 1), self._frags.id("newline"), jnp.int32)
        ids = jnp.concatenate([cells, newline], axis=1).ravel()
        return ids.at[-1].set(self._frags.id("end"))

    @property
    def _bits_per_candidate(self) -> int:
        n = self.config.size
        return 2 + 3 * self.carve_steps + n * n + self.reverse_steps

    def _candidate(self, bits: jax.Array) -> SokobanState:
        """One room by topology carving, placement and reverse play (may be unusable).

        Args:
          bits: uint32[_bits_per_candidate] random bits (one threefry call serves every
            candidate: each random sampler costs compilation time).

        Returns:
          The candidate room.
        """
        n, num_boxes = self.config.size, self.config.num_boxes
        deltas = jnp.asarray(DELTAS)
        c, r = self.carve_steps, self.reverse_steps
        start = 1 + (bits[:2] % (n - 2)).astype(jnp.int32)
        change = bits[2 : 2 + c] < jnp.uint32(_P_CHANGE_DIRECTION * 2**32)
        turns = (bits[2 + c : 2 + 2 * c] % 4).astype(jnp.int32)
        masks = (bits[2 + 2 * c : 2 + 3 * c] % len(_CARVE_MASKS)).astype(jnp.int32)
        place_scores = (bits[2 + 3 * c : 2 + 3 * c + n * n] >> 8).reshape(n, n).astype(jnp.int32)
        move_bits = bits[2 + 3 * c + n * n : 2 + 3 * c + n * n + r]

        def _carve_step(i, carry):
            floor, pos, direction = carry
            direction = jnp.where(change[i], turns[i], direction)
            pos = jnp.clip(pos + deltas[direction], 1, n - 2)
            corner = (pos[0] - 1, pos[1] - 1)
            window = (
                jax.lax.dynamic_slice(floor, corner, (3, 3)) | jnp.asarray(_CARVE_MASKS)[masks[i]]
            )
            return jax.lax.dynamic_update_slice(floor, window, corner), pos, direction

        floor = jnp.zeros((n, n), bool).at[start[0], start[1]].set(True)
        floor, _, _ = jax.lax.fori_loop(
            0, self.carve_steps, _carve_step, (floor, start, jnp.zeros((), jnp.int32))
        )
        floor = floor & jnp.asarray(_interior(n))

        scores = jnp.where(floor, place_scores, -1).ravel()
        picked = jnp.argsort(-scores)[: num_boxes + 1]  # distinct floor cells (if enough floor)
        targets = jnp.zeros((n * n,), bool).at[picked[:num_boxes]].set(True).reshape(n, n)
        player = jnp.stack([picked[num_boxes] // n, picked[num_boxes] % n]).astype(jnp.int32)

        def _reverse_step(i, carry):
            boxes, player = carry
            word = move_bits[i]
            nxt, behind = player + deltas, player - deltas  # [4, 2] per direction
            can_move = floor[nxt[:, 0], nxt[:, 1]] & ~boxes[nxt[:, 0], nxt[:, 1]]
            can_pull = can_move & boxes[behind[:, 0], behind[:, 1]]
            # With probability _P_PREFER_PULL pull some adjacent box (first from a random
            # offset); else walk in a random direction (pulling if a box happens to be behind).
            order = ((word >> 2) + jnp.arange(4, dtype=jnp.uint32)) % 4
            pull_dir = order[jnp.argmax(can_pull[order])]
            prefer = (word >> 8) % 256 < jnp.uint32(256 * _P_PREFER_PULL)
            direction = jnp.where(prefer & can_pull.any(), pull_dir, word % 4).astype(jnp.int32)
            pulled = boxes.at[behind[direction, 0], behind[direction, 1]].set(False)
            pulled = pulled.at[player[0], player[1]].set(True)
            boxes = jnp.where(can_pull[direction], pulled, boxes)
            return boxes, jnp.where(can_move[direction], nxt[direction], player)

        boxes, player = jax.lax.fori_loop(0, self.reverse_steps, _reverse_step, (targets, player))
        return SokobanState(
            walls=~floor,
            targets=targets,
            boxes=boxes,
            player=player,
            done=jnp.zeros((), bool),
        )

    def _generate(self, key: jax.Array, split: jax.Array) -> SokobanState:
        """First usable candidate of the split's class over while_loop rounds."""

        def _qualifies(room):
            enough_floor = (~room.walls).sum() >= self.config.num_boxes + 2
            far_enough = box_distance(room) >= self.min_box_distance
            in_class = self.in_split(puzzle_hash(room), split)
            return enough_floor & far_enough & in_class

        def _candidates(bits):
            rooms = jax.vmap(self._candidate)(bits)
            return rooms, jax.vmap(_qualifies)(rooms)

        return base.first_qualifying(
            key,
            _candidates,
            self._fallback_room(),
            num_candidates=self.config.num_candidates,
            bits_per_candidate=self._bits_per_candidate,
            max_rounds=_MAX_ROUNDS,
        )

    def _fallback_room(self) -> SokobanState:
        """Open room: targets on row 1, boxes below them on row 2, player at (3, 1)."""
        n, k = self.config.size, self.config.num_boxes
        walls = np.ones((n, n), bool)
        walls[1:-1, 1:-1] = False
        targets = np.zeros((n, n), bool)
        targets[1, 1 : 1 + k] = True
        boxes = np.zeros((n, n), bool)
        boxes[2, 1 : 1 + k] = True
        return SokobanState(
            walls=jnp.asarray(walls),
            targets=jnp.asarray(targets),
            boxes=jnp.asarray(boxes),
            player=jnp.asarray([3, 1], jnp.int32),
            done=jnp.zeros((), bool),
        )

    def render(self, state: SokobanState) -> str:
        """The room as text, one row per line (host side)."""
        codes = np.asarray(jax.device_get(cell_codes(state)))
        return "".join("".join(_CHARS[c] for c in row) + "\n" for row in codes)

    def state_from_text(self, room: str) -> SokobanState:
        """Builds a state from rows of "#_.$*@+" (one player); the inverse of `render`."""
        rows = room.strip().split("\n")
        n, size = len(rows), self.config.size
        if n != size or any(len(r) != n for r in rows):
            raise ValueError(f"expected a {size}x{size} room, got {rows}")
        grid = np.array([[_CHARS.index(ch) for ch in r] for r in rows])
        border = np.ones((n, n), bool)
        border[1:-1, 1:-1] = False
        if not (grid[border] == WALL).all():
            raise ValueError("the room's border must be walls")
        boxes = np.isin(grid, (BOX, BOX_ON_TARGET))
        targets = np.isin(grid, (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET))
        (player,) = np.argwhere(np.isin(grid, (PLAYER, PLAYER_ON_TARGET)))
        return SokobanState(
            walls=jnp.asarray(grid == WALL),
            targets=jnp.asarray(targets),
            boxes=jnp.asarray(boxes),
            player=jnp.asarray(player, jnp.int32),
            done=jnp.asarray(bool((boxes <= targets).all())),
        )

    def oracle_actions(self, state: SokobanState, max_nodes: int = 200_000) -> list[int] | None:
        """Shortest action-id sequence solving the room (BFS over player and boxes), or None.

        Args:
          state: a single (unbatched) state; host or device arrays.
          max_nodes: give up (return None) after visiting this many states.

        Returns:
          Action ids (0 up, 1 down, 2 left, 3 right); [] when already solved; None when the
          room is unsolvable or the search exceeded `max_nodes`.
        """
        state = jax.device_get(state)
        walls = np.asarray(state.walls)
        n = walls.shape[0]
        free = ~walls.ravel()
        targets = frozenset(np.flatnonzero(np.asarray(state.targets)).tolist())
        start = (
            int(state.player[0]) * n + int(state.player[1]),
            frozenset(np.flatnonzero(np.asarray(state.boxes)).tolist()),
        )
        steps = [int(dr) * n + int(dc) for dr, dc in DELTAS]
        parent = {start: None}
        queue = collections.deque([start])
        while queue:
            node = queue.popleft()
            player, boxes = node
            if boxes <= targets:
                plan = []
                while parent[node] is not None:
                    node, action = parent[node]
                    plan.append(action)
                return plan[::-1]
            for action, step in enumerate(steps):
                nxt = player + step  # the border is walls, so nxt stays inside the grid
                if not free[nxt]:
                    continue
                new_boxes = boxes
                if nxt in boxes:
                    behind = nxt + step
                    if not free[behind] or behind in boxes:
                        continue
                    new_boxes = (boxes - {nxt}) | {behind}
                child = (nxt, new_boxes)
                if child not in parent:
                    parent[child] = (node, action)
                    if len(parent) > max_nodes:
                        return None
                    queue.append(child)
        return None


def _move(state: SokobanState, delta: jax.Array, valid: jax.Array) -> SokobanState:
    """The state after the player tries to move by delta int32[2] (no-op unless valid)."""
    n = state.walls.shape[0]
    player = state.player
    nxt = player + delta
    behind = jnp.clip(nxt + delta, 0, n - 1)  # only read when nxt holds a box (not a wall)
    box_ahead = state.boxes[nxt[0], nxt[1]]
    behind_free = ~state.walls[behind[0], behind[1]] & ~state.boxes[behind[0], behind[1]]
    moves = valid & ~state.walls[nxt[0], nxt[1]] & (~box_ahead | behind_free)
    push = moves & box_ahead
    pushed = state.boxes.at[nxt[0], nxt[1]].set(False).at[behind[0], behind[1]].set(True)
    boxes = jnp.where(push, pushed, state.boxes)
    return state.replace(
        boxes=boxes,
        player=jnp.where(moves, nxt, player),
        done=~(boxes & ~state.targets).any(),
    )
