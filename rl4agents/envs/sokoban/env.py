"""The Sokoban environment: its settings, the turn dynamics and the room's text (the package
docstring describes the task)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.sokoban import generator, oracle
from rl4agents.envs.sokoban.world import (
    _CELL_NAMES,
    _CHARS,
    ACTIONS,
    BOX,
    BOX_ON_TARGET,
    DELTAS,
    PLAYER,
    PLAYER_ON_TARGET,
    TARGET,
    WALL,
    SokobanParams,
    SokobanState,
    cell_codes,
    move,
    room_hash,
)
from rl4agents.types import TimeStep


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
        base.check_range("size", size, 5, note=" (a 3x3 interior at least)")
        base.check_range("num_boxes", num_boxes, 1, size - 2)
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
        ood_size = self.ood_size
        base.check_range("ood_size", ood_size, 5, note=" (a 3x3 interior at least)")
        base.check_range("ood_num_boxes", self.ood_num_boxes, 1, ood_size - 2)
        base.check_shared_settings(self)


@registry.register("sokoban")
class Sokoban(base.TextEnv):
    """Sokoban text environment (see the package docstring).

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
        self.num_actions = len(ACTIONS)
        self.max_action_len = int(self.action_table.lengths.max())
        # compact: the interior only (the border is always wall).
        rows = size - 2 if compact else size
        cells = dict(zip(_CELL_NAMES, _CHARS, strict=True))
        grid = base.grid_text(
            self.tokenizer, cells, rows, compact=compact, invalid="invalid action\n"
        )
        self._frags, self.max_prompt_len, self.max_obs_len = grid

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
        c = self.config
        state = generator.generate(
            key,
            params.split,
            size=c.size,
            num_boxes=c.num_boxes,
            carve_steps=self.carve_steps,
            reverse_steps=self.reverse_steps,
            min_box_distance=self.min_box_distance,
            num_candidates=c.num_candidates,
            in_split=self.in_split,
        )
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
        new_state = move(state, jnp.asarray(DELTAS)[jnp.maximum(action, 0)], valid)
        on_before = (state.boxes & state.targets).sum()
        on_after = (new_state.boxes & new_state.targets).sum()
        solved = new_state.done
        reward = (
            -c.step_penalty
            + c.box_reward * (on_after - on_before)
            + jnp.where(solved, c.finish_reward, 0.0)
            - jnp.where(valid, 0.0, c.invalid_penalty)
        )
        obs, obs_len = base.grid_observation(
            self._frags, valid, self._grid_ids(new_state), self.tokenizer.pad_id, self.max_obs_len
        )
        return self.end_turn(
            new_state, obs, obs_len, reward, done=solved, valid=valid, success=solved
        )

    def anchor(self, state: SokobanState) -> jax.Array:
        """uint32[] hash of the room (walls, targets, boxes, player)."""
        return room_hash(state)

    def _grid_ids(self, state: SokobanState) -> jax.Array:
        """int32[N * (N + 1)] fragment ids of the room, one newline after each row."""
        cells = cell_codes(state)
        if self.config.compact:
            cells = cells[1:-1, 1:-1]
        return base.grid_ids(self._frags, cells)

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
        return oracle.solve(state, max_nodes)
