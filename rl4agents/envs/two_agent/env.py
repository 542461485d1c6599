"""The registered `TwoAgent` environment: its static tables, `reset`, `step`, the two roles'
views as fragment ids, and the per-agent split of the team's returns."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.two_agent import generator, host
from rl4agents.envs.two_agent.world import (
    ACTIONS,
    CELLS,
    DELTAS,
    DIRECTIONS,
    FLOOR,
    GOAL,
    GUIDE,
    NO_MESSAGE,
    STAY,
    WALKER,
    WALKER_CELL,
    WALL,
    TwoAgentParams,
    TwoAgentState,
    agent_of_turn,
)
from rl4agents.types import TimeStep


@dataclasses.dataclass(frozen=True)
class TwoAgentConfig:
    """Static settings (the constructor's arguments; see `TwoAgent`), checked when built."""

    size: int = 5
    wall_prob: float = 0.2
    view_radius: int = 1
    min_distance: int = 3
    max_steps: int = 40
    goal_reward: float = 1.0
    progress_reward: float = 0.0
    invalid_penalty: float = 0.05
    test_fraction: float = 0.2
    ood_size: int = 7
    ood_max_steps: int = 64
    num_candidates: int = 64

    def __post_init__(self):
        c = self
        base.check_range("size", c.size, 3)
        if not 0.0 <= c.wall_prob < 1.0:
            raise ValueError(f"wall_prob must be in [0, 1), got {c.wall_prob}")
        base.check_range("view_radius", c.view_radius, 1)
        base.check_range("min_distance", c.min_distance, 1, 2 * (c.size - 1))
        for name, value in (("max_steps", c.max_steps), ("ood_max_steps", c.ood_max_steps)):
            if value < 2 * c.min_distance:
                raise ValueError(
                    f"{name} must be >= 2 * min_distance = {2 * c.min_distance} (a guide and a "
                    f"walker turn per move), got {value}"
                )
        base.check_shared_settings(c, positive=("goal_reward",))
        base.check_range("ood_size", c.ood_size, 3)
        if c.min_distance > 2 * (c.ood_size - 1):
            raise ValueError(
                f"min_distance must be <= 2 * (ood_size - 1) = {2 * (c.ood_size - 1)} (the ood "
                f"maps), got {c.min_distance}"
            )


@registry.register("two_agent")
class TwoAgent(base.TextEnv):
    """Guide-and-walker text environment (see the `two_agent` package docstring).

    Attributes:
      config: `TwoAgentConfig`, the settings below (N = size).
      tokenizer: tokenizer the fragments were encoded with.
      num_agents: 2 (guide = 0, walker = 1).
      max_prompt_len: P, length of the intro and the guide's first view returned by `reset`.
      max_obs_len: O, length of the observation returned by `step`.
      max_action_len: longest action in tokens.
      num_actions: 10 (ACTIONS: five messages, five moves).

    Args (a value out of its range raises ValueError at construction):
      size: side of the square map, >= 3.
      wall_prob: probability that a cell is a wall, in [0, 1).
      view_radius: r, the walker's (2r+1)^2 window, >= 1.
      min_distance: least shortest-path distance from the walker to the goal, in
        [1, 2 * (size - 1)] (and <= 2 * (ood_size - 1)).
      max_steps: turns of either agent per episode, >= 2 * min_distance.
      goal_reward: the team reward for reaching the goal, > 0.
      progress_reward: potential-based shaping per walker turn, >= 0 (0 = off).
      invalid_penalty: subtracted on an invalid turn, >= 0.
      test_fraction: share of maps in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_size: `size` of the "ood" maps, >= 3.
      ood_max_steps: `max_steps` of the "ood" env, >= 2 * min_distance.
      num_candidates: maps drawn per generation round, >= 1.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    num_agents = 2

    def __init__(
        self,
        size: int = 5,
        wall_prob: float = 0.2,
        view_radius: int = 1,
        min_distance: int = 3,
        max_steps: int = 40,
        goal_reward: float = 1.0,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.05,
        test_fraction: float = 0.2,
        ood_size: int = 7,
        ood_max_steps: int = 64,
        num_candidates: int = 64,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(TwoAgentConfig, locals()), tokenizer)

        self.action_table = text.FragmentTable.build(self.tokenizer, {a: a for a in ACTIONS})
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **CELLS,
                # The message follows "guide says": a leading space keeps the words apart.
                **{f"msg:{d}": f" {d}" for d in DIRECTIONS},
                "msg:nothing": " nothing",
                "newline": "\n",
                # Ends every observation: the policy's next token is its action.
                "end": "\n",
                "intro": (
                    "the guide sees the map and says a move , the walker sees only nearby "
                    "cells and moves : bring the walker W to the goal G .\n"
                ),
                "role:guide": "guide:",
                "role:walker": "walker:",
                "says": "guide says",
                "invalid:guide": (
                    "invalid message . allowed: say up , say down , say left , say right , "
                    "say stay\n"
                ),
                "invalid:walker": "invalid move . allowed: up , down , left , right , stay\n",
                "success": "the walker reached the goal .\n",
                "timeout": "out of turns .\n",
            },
        )
        self._f = {name: i for i, name in enumerate(self._frags.names)}
        self.num_actions = len(ACTIONS)
        self.max_action_len = int(self.action_table.lengths.max())
        lens = self._frags.lengths
        ln = lambda *keys: int(sum(lens[self._f[k]] for k in keys))  # noqa: E731
        cell_len = int(lens[: len(CELLS)].max())
        side = 2 * view_radius + 1
        guide_len = ln("role:guide", "newline") + size * size * cell_len + size * ln("newline")
        msg_len = int(lens[[self._f[f"msg:{d}"] for d in (*DIRECTIONS, "nothing")]].max())
        walker_len = ln("role:walker", "newline", "says", "newline") + msg_len
        walker_len += side * side * cell_len + side * ln("newline")
        prefix = max(ln("invalid:guide"), ln("invalid:walker"))
        self.max_prompt_len = ln("intro") + guide_len
        self.max_obs_len = prefix + max(ln("success"), ln("timeout")) + max(guide_len, walker_len)
        self._view_width = max(2 + size * (size + 1), 5 + side * (side + 1))  # fragment slots

    # ----------------------------------------------------------------------------- public API

    @staticmethod
    def agent_of_turn(turn):
        """The agent acting at turn index `turn` (int or int array): 0 guide, 1 walker."""
        return agent_of_turn(turn)

    def per_agent_returns(
        self,
        turn_rewards: np.ndarray,
        turn_valid: np.ndarray,
        turn_action_valid: np.ndarray | None = None,
    ) -> np.ndarray:
        """Per-agent returns of a batch of episodes (host side).

        A turn's reward is either a team reward (goal and progress, only on valid walker
        turns) or the penalty of an invalid action (its whole reward: nothing moves). Each
        agent's return is the sum of all team rewards plus the penalties of its own turns.

        Args:
          turn_rewards: f32[B, K] reward after each turn (`Trajectory.turn_rewards`).
          turn_valid: bool[B, K] the turn happened (`Trajectory.turn_valid`).
          turn_action_valid: bool[B, K] the turn's action parsed for its role
            (`Trajectory.turn_action_valid`). Without it a negative reward is read as a
            penalty, which is exact only when `progress_reward == 0`.

        Returns:
          f32[B, 2] returns of the guide (column 0) and the walker (column 1).
        """
        rewards = np.where(turn_valid, np.asarray(turn_rewards, np.float32), 0.0)
        if turn_action_valid is None:
            if self.config.progress_reward:
                raise ValueError(
                    "per_agent_returns needs turn_action_valid when progress_reward != 0 "
                    f"(got progress_reward={self.config.progress_reward}): a step away from the "
                    "goal is negative too"
                )
            penalty = rewards < 0
        else:
            penalty = np.asarray(turn_valid) & ~np.asarray(turn_action_valid)
        own = np.where(penalty, rewards, 0.0)
        team = (rewards - own).sum(axis=1)
        agent = self.agent_of_turn(np.arange(rewards.shape[1]))
        per_agent = [team + own[:, agent == i].sum(axis=1) for i in range(self.num_agents)]
        return np.stack(per_agent, axis=1).astype(np.float32)

    def ood_config(self) -> TwoAgentConfig:
        """The "ood" maps: side `ood_size`, `ood_max_steps` turns."""
        c = self.config
        return dataclasses.replace(c, size=c.ood_size, max_steps=c.ood_max_steps)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: TwoAgentParams
    ) -> tuple[TwoAgentState, jax.Array, jax.Array]:
        """Draws a map of the params' class; the guide acts first.

        Returns:
          The state, the intro-and-guide-view obs_tokens int32[P] and obs_len int32[].
        """
        state = generator.generate(self, key, params.split)
        ids = jnp.concatenate([jnp.array([self._f["intro"]]), self._guide_ids(state)])
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
        self,
        key: jax.Array,
        state: TwoAgentState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: TwoAgentParams,
    ) -> tuple[TwoAgentState, TimeStep]:
        """One turn of the agent `agent_of_turn(state.steps)`: a message or a move.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `TwoAgentState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `TwoAgentParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O] (the next agent's view).
        """
        del key, params
        c = self.config
        n = c.size
        role = self.agent_of_turn(state.steps)
        action = text.match_action(self.action_table, action_tokens, action_len)
        is_message = (action >= 0) & (action < len(DIRECTIONS))
        is_move = action >= len(DIRECTIONS)
        valid = jnp.where(role == GUIDE, is_message, is_move)
        move = jnp.where((role == WALKER) & valid, action - len(DIRECTIONS), STAY)
        nxt = state.pos + jnp.asarray(DELTAS)[move]
        inside = jnp.all((nxt >= 0) & (nxt < n))
        nxt = jnp.clip(nxt, 0, n - 1)
        pos = jnp.where(inside & ~state.walls[nxt[0], nxt[1]], nxt, state.pos)
        # The walker consumes the message; an invalid one reaches it as "nothing".
        message = jnp.where((role == GUIDE) & valid, action, NO_MESSAGE).astype(jnp.int32)
        success = jnp.all(pos == state.goal)
        steps = state.steps + 1
        timeout = ~success & (steps >= c.max_steps)
        new_state = state.replace(pos=pos, message=message, steps=steps, done=success | timeout)

        reward = jnp.where(success, c.goal_reward, 0.0)
        reward = reward - jnp.where(valid, 0.0, c.invalid_penalty)
        if c.progress_reward:
            # Potential-based shaping on the shortest-path distance (zero on guide turns).
            gain = state.dist[state.pos[0], state.pos[1]] - state.dist[pos[0], pos[1]]
            reward = reward + c.progress_reward * gain
        f = self._f
        prefix = jnp.where(
            valid, -1, jnp.where(role == GUIDE, f["invalid:guide"], f["invalid:walker"])
        )
        status = jnp.where(success, f["success"], jnp.where(timeout, f["timeout"], -1))
        view = jnp.where(role == GUIDE, self._walker_ids(new_state), self._guide_ids(new_state))
        ids = jnp.concatenate([jnp.stack([prefix, status]), view]).astype(jnp.int32)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )
        return self.end_turn(
            new_state, obs, obs_len, reward, done=new_state.done, valid=valid, success=success
        )

    def anchor(self, state: TwoAgentState) -> jax.Array:
        """uint32[] hash of (walls, goal, walker, agent to act, pending message).

        The step counter enters only through whose turn it is: it is not shown to the policy,
        and the same situation reached at different turns should share an anchor. `dist` is a
        function of walls and goal.
        """
        parts = [
            state.walls.astype(jnp.int32).ravel(),
            state.goal,
            state.pos,
            jnp.stack([self.agent_of_turn(state.steps), state.message]),
        ]
        return text.hash_u32(jnp.concatenate([jnp.asarray(p, jnp.int32) for p in parts]))

    # ---------------------------------------------------------------------------- views

    def cell_codes(self, state: TwoAgentState) -> jax.Array:
        """int32[N, N] the guide's map: FLOOR, WALL, GOAL, WALKER_CELL (walker on top)."""
        cells = jnp.where(state.walls, WALL, FLOOR)
        cells = cells.at[state.goal[0], state.goal[1]].set(GOAL)
        return cells.at[state.pos[0], state.pos[1]].set(WALKER_CELL).astype(jnp.int32)

    def _rows(self, cells: jax.Array) -> jax.Array:
        """int32[S * (S + 1)] fragment ids of S x S cells, a newline after each row."""
        newline = jnp.full((cells.shape[0], 1), self._f["newline"], jnp.int32)
        return jnp.concatenate([cells, newline], axis=1).ravel()

    def _pad(self, ids: jax.Array) -> jax.Array:
        return jnp.pad(ids, (0, self._view_width - ids.shape[0]), constant_values=-1)

    def _guide_ids(self, state: TwoAgentState) -> jax.Array:
        """int32[V] "guide:" and the whole map (padded with -1 to the view width)."""
        head = jnp.array([self._f["role:guide"], self._f["newline"]], jnp.int32)
        ids = jnp.concatenate([head, self._rows(self.cell_codes(state))])
        return self._pad(ids.at[-1].set(self._f["end"]))

    def _walker_ids(self, state: TwoAgentState) -> jax.Array:
        """int32[V] "walker:", the guide's message and the local view (padded with -1)."""
        r = self.config.view_radius
        side = 2 * r + 1
        cells = jnp.where(state.walls, WALL, FLOOR)  # the goal is not visible to the walker
        cells = jnp.pad(cells, r, constant_values=WALL)
        cells = jax.lax.dynamic_slice(cells, (state.pos[0], state.pos[1]), (side, side))
        cells = cells.at[r, r].set(WALKER_CELL)
        f = self._f
        msg = jnp.asarray([f[f"msg:{d}"] for d in (*DIRECTIONS, "nothing")])[state.message]
        head = jnp.stack([f["role:walker"], f["newline"], f["says"], msg, f["newline"]])
        ids = jnp.concatenate([head.astype(jnp.int32), self._rows(cells)])
        return self._pad(ids.at[-1].set(f["end"]))

    # ---------------------------------------------------------------------------- host side

    def state_from_text(self, grid: str, steps: int = 0, message: str = "nothing") -> TwoAgentState:
        """A state from rows of "_", "#", "G", "W" (see `host.state_from_text`)."""
        return host.state_from_text(self, grid, steps, message)

    def render(self, state: TwoAgentState) -> str:
        """The whole map ("W" over "G" once reached), then whose turn it is (host side)."""
        return host.render(self, state)

    def oracle_actions(self, state: TwoAgentState) -> list[int] | None:
        """Action ids for both roles from `state` (see `host.oracle_actions`)."""
        return host.oracle_actions(self, state)
