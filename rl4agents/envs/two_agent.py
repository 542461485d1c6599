"""Two-agent cooperation: a guide that sees the map and a walker that moves, one shared policy.

A `size x size` grid holds walls, a goal and the walker. The two agents take turns within one
episode, the guide first (`agent_of_turn(k) = k % 2`), and the same policy plays both roles,
told which one by a role prompt:

  guide turns   observation "guide:" and the whole map, one row of cells per line:
                "_" floor, "#" wall, "G" goal, "W" walker;
                action: a message "say up", "say down", "say left", "say right" or "say stay".
  walker turns  observation "walker:", the guide's last message ("guide says up", or
                "guide says nothing" after an invalid message) and the (2r+1) x (2r+1) cells
                around the walker (`view_radius` r; off-grid cells "#", the goal looks like
                floor: the walker cannot see it); action: "up", "down", "left", "right",
                "stay". Moving into a wall or off the grid leaves the walker in place.

A message on a walker turn or a move on a guide turn is as invalid as junk: that agent's turn
is penalised (`-invalid_penalty`, `valid_action=False`), the observation says so and lists the
role's actions, and the roles still alternate. The team reward `goal_reward` comes on the walker
turn that reaches the goal (done, success). With `progress_reward` c > 0 each walker turn also
earns the potential-based `c * (d(s) - d(s'))`, d the shortest-path distance to the goal. The
episode ends unsolved (done) after `max_steps` turns of either agent.

Credit per agent: `per_agent_returns` splits a batch of turn rewards into the guide's and the
walker's returns: each gets the whole team reward (goal and progress) plus the penalties of its
own invalid turns only. This env trains "one shared policy with role prompts": the rollout
samples every turn from the same policy. Two separate policies would route turn k to policy
`agent_of_turn(k)`: sample its action from that policy, train each policy only on the action
tokens of its own turns (`turn_ids % 2 == agent` in a Trajectory), with `per_agent_returns(...)
[:, agent]` (or per-turn rewards masked the same way) as its return.

Maps are drawn in JAX from the reset key like FrozenLake's: `num_candidates` Bernoulli
(`wall_prob`) wall layouts with a random start and goal per round, the first whose goal is
reachable at a shortest-path distance in [`min_distance`, `max_steps // 2`] and whose class
matches the split. The train/test split is by map: `hash_u32(walls, start, goal) % 1000 <
test_fraction * 1000` is the test class. "ood" is larger maps (`ood_size`, with
`ood_max_steps`), either class.
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
AGENTS = ("guide", "walker")
GUIDE, WALKER = range(2)
DIRECTIONS = ("up", "down", "left", "right", "stay")
DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1], [0, 0]], np.int32)  # (row, col)
# Action ids 0..4 are the guide's messages, 5..9 the walker's moves, in DIRECTIONS order.
ACTIONS = tuple(f"say {d}" for d in DIRECTIONS) + DIRECTIONS
NO_MESSAGE = len(DIRECTIONS)  # message id after an invalid guide turn ("guide says nothing")
STAY = DIRECTIONS.index("stay")
_MAX_ROUNDS = 16
_CELLS = {"floor": "_", "wall": "#", "goal": "G", "walker": "W"}
FLOOR, WALL, GOAL, WALKER_CELL = range(4)  # cell codes = fragment ids (cells come first)


@flax.struct.dataclass
class TwoAgentParams:
    """Per-run parameters: which map class `reset` draws."""

    split: jax.Array  # int32[] 0 train class, 1 test class, 2 either class (ood)


@flax.struct.dataclass
class TwoAgentState:
    """One episode; the agent to act is `agent_of_turn(steps)`."""

    walls: jax.Array  # bool[N, N]
    goal: jax.Array  # int32[2] (row, col)
    pos: jax.Array  # int32[2] walker (row, col)
    dist: jax.Array  # int32[N, N] shortest-path distance to the goal (N * N = unreachable)
    message: jax.Array  # int32[] guide's message for the walker to act on, NO_MESSAGE if none
    steps: jax.Array  # int32[] turns taken (both agents)
    done: jax.Array  # bool[] goal reached or step limit hit


def _split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed splits: {list(SPLITS)}")
    return SPLITS.index(split)


def _shift(x: jax.Array, drow: int, dcol: int, fill) -> jax.Array:
    """x moved by (drow, dcol), `fill` shifted in: out[r, c] = x[r - drow, c - dcol]."""
    n = x.shape[0]
    padded = jnp.pad(x, 1, constant_values=fill)
    return jax.lax.dynamic_slice(padded, (1 - drow, 1 - dcol), (n, n))


def distance_map(walls: jax.Array, goal: jax.Array) -> jax.Array:
    """Shortest-path distances to the goal through non-walls (4-connected).

    Args:
      walls: bool[N, N] wall layout.
      goal: int32[2] goal cell (not a wall).

    Returns:
      int32[N, N] distance of every cell to the goal; N * N for walls and unreachable cells.
    """
    n = walls.shape[0]
    far = n * n
    init = jnp.full((n, n), far, jnp.int32).at[goal[0], goal[1]].set(0)

    def _relax(_, dist):
        near = [_shift(dist, dr, dc, far) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))]
        best = jnp.minimum(dist, jnp.min(jnp.stack(near), axis=0) + 1)
        return jnp.where(walls, far, jnp.minimum(best, far))

    return jax.lax.fori_loop(0, n * n, _relax, init)


def map_hash(walls: jax.Array, start: jax.Array, goal: jax.Array) -> jax.Array:
    """uint32[] hash of a map (walls bool[N, N], start and goal int32[2]): its split class."""
    return text.hash_u32(jnp.concatenate([walls.astype(jnp.int32).ravel(), start, goal]))


@registry.register("two_agent")
class TwoAgent:
    """Guide-and-walker text environment (see the module docstring).

    Attributes:
      tokenizer: tokenizer the fragments were encoded with.
      size: N, side of the square map.
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
        if size < 3:
            raise ValueError(f"size must be >= 3, got {size}")
        if not 0.0 <= wall_prob < 1.0:
            raise ValueError(f"wall_prob must be in [0, 1), got {wall_prob}")
        if view_radius < 1:
            raise ValueError(f"view_radius must be >= 1, got {view_radius}")
        if not 1 <= min_distance <= 2 * (size - 1):
            raise ValueError(f"min_distance must be in [1, {2 * (size - 1)}], got {min_distance}")
        for name, value in (("max_steps", max_steps), ("ood_max_steps", ood_max_steps)):
            if value < 2 * min_distance:
                raise ValueError(
                    f"{name} must be >= 2 * min_distance = {2 * min_distance} (a guide and a "
                    f"walker turn per move), got {value}"
                )
        base.check_test_fraction(test_fraction)
        if not goal_reward > 0.0:
            raise ValueError(f"goal_reward must be > 0, got {goal_reward}")
        base.check_nonnegative("progress_reward", progress_reward, " (0 = off)")
        base.check_nonnegative("invalid_penalty", invalid_penalty, " (it is subtracted)")
        if ood_size < 3:
            raise ValueError(f"ood_size must be >= 3, got {ood_size}")
        if min_distance > 2 * (ood_size - 1):
            raise ValueError(
                f"min_distance must be <= 2 * (ood_size - 1) = {2 * (ood_size - 1)} (the ood "
                f"maps), got {min_distance}"
            )
        if num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
        self._kwargs = dict(
            size=size,
            wall_prob=wall_prob,
            view_radius=view_radius,
            min_distance=min_distance,
            max_steps=max_steps,
            goal_reward=goal_reward,
            progress_reward=progress_reward,
            invalid_penalty=invalid_penalty,
            test_fraction=test_fraction,
            ood_size=ood_size,
            ood_max_steps=ood_max_steps,
            num_candidates=num_candidates,
            tokenizer=tokenizer,
        )
        self.tokenizer = text.BuiltinTokenizer() if tokenizer is None else tokenizer
        self.size = size
        self.wall_prob = wall_prob
        self.view_radius = view_radius
        self.min_distance = min_distance
        self.max_steps = max_steps
        self.goal_reward = goal_reward
        self.progress_reward = progress_reward
        self.invalid_penalty = invalid_penalty
        self.test_threshold = int(round(test_fraction * 1000))
        self.ood_size = ood_size
        self.ood_max_steps = ood_max_steps
        self.num_candidates = num_candidates

        self._actions = text.FragmentTable.build(self.tokenizer, {a: a for a in ACTIONS})
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **_CELLS,
                **{f"msg:{d}": d for d in DIRECTIONS},
                "msg:nothing": "nothing",
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
        self.max_action_len = int(self._actions.lengths.max())
        lens = self._frags.lengths
        ln = lambda *keys: int(sum(lens[self._f[k]] for k in keys))  # noqa: E731
        cell_len = int(lens[: len(_CELLS)].max())
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
        return turn % 2

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
            if self.progress_reward:
                raise ValueError(
                    "per_agent_returns needs turn_action_valid when progress_reward != 0 "
                    f"(got progress_reward={self.progress_reward}): a step away from the goal "
                    "is negative too"
                )
            penalty = rewards < 0
        else:
            penalty = np.asarray(turn_valid) & ~np.asarray(turn_action_valid)
        own = np.where(penalty, rewards, 0.0)
        team = (rewards - own).sum(axis=1)
        agent = self.agent_of_turn(np.arange(rewards.shape[1]))
        per_agent = [team + own[:, agent == i].sum(axis=1) for i in range(self.num_agents)]
        return np.stack(per_agent, axis=1).astype(np.float32)

    def default_params(self, split: str = "train") -> TwoAgentParams:
        """Params selecting the map class `split` ("ood": either class) for this size."""
        return TwoAgentParams(split=jnp.asarray(_split_id(split), jnp.int32))

    def make_split(self, split: str) -> tuple[TwoAgent, TwoAgentParams]:
        """(env, params) for "train", "test" or "ood" (a new env: ood_size, ood_max_steps)."""
        _split_id(split)
        env = self
        if split == "ood":
            ood = {"size": self.ood_size, "max_steps": self.ood_max_steps}
            env = TwoAgent(**{**self._kwargs, **ood, "tokenizer": self.tokenizer})
        return env, env.default_params(split)

    def reset(self, key: jax.Array, params: TwoAgentParams) -> tuple[TwoAgentState, TimeStep]:
        """Draws a map of the params' class; the guide acts first.

        Args:
          key: typed PRNG key.
          params: `TwoAgentParams`.

        Returns:
          The state and a TimeStep whose obs_tokens int32[P] hold the intro and guide's view.
        """
        state = self._generate(key, params.split)
        ids = jnp.concatenate([jnp.array([self._f["intro"]]), self._guide_ids(state)])
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_prompt_len
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
        state: TwoAgentState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: TwoAgentParams,
    ) -> tuple[TwoAgentState, TimeStep]:
        """One turn of the agent `agent_of_turn(state.steps)`: a message or a move.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `TwoAgentState`.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `TwoAgentParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O] (the next agent's view);
          absorbing once done.
        """
        del key, params
        state = jax.tree.map(jnp.asarray, state)  # host (numpy) states work eagerly too
        n = self.size
        role = self.agent_of_turn(state.steps)
        action = text.match_action(self._actions, action_tokens, action_len)
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
        timeout = ~success & (steps >= self.max_steps)
        new_state = state.replace(pos=pos, message=message, steps=steps, done=success | timeout)

        reward = jnp.where(success, self.goal_reward, 0.0)
        reward = reward - jnp.where(valid, 0.0, self.invalid_penalty)
        if self.progress_reward:
            # Potential-based shaping on the shortest-path distance (zero on guide turns).
            gain = state.dist[state.pos[0], state.pos[1]] - state.dist[pos[0], pos[1]]
            reward = reward + self.progress_reward * gain
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
        timestep = TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=new_state.done,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=success,
        )
        frozen = base.empty_timestep(self.max_obs_len, self.anchor(state), self.tokenizer.pad_id)
        return base.absorbing(state.done, (state, frozen), (new_state, timestep))

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

    def action_tokens(self, action: int) -> np.ndarray:
        """int32[len] tokens of action id `action` (ACTIONS[action])."""
        return self._actions.tokens[action, : self._actions.lengths[action]].copy()

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
        r = self.view_radius
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

    # ---------------------------------------------------------------------------- generation

    def _generate(self, key: jax.Array, split: jax.Array) -> TwoAgentState:
        """First qualifying candidate map of the split's class over while_loop rounds.

        If no round finds one (probability below 1e-50 for the defaults) an open map with the
        walker and the goal in opposite corners is used.
        """
        n, num = self.size, self.num_candidates

        def _candidate(bits):
            walls = (bits[: n * n] < jnp.uint32(self.wall_prob * 2**32)).reshape(n, n)
            cells = (bits[n * n :] % (n * n)).astype(jnp.int32)
            start, goal = jnp.stack(jnp.divmod(cells[0], n)), jnp.stack(jnp.divmod(cells[1], n))
            walls = walls.at[start[0], start[1]].set(False).at[goal[0], goal[1]].set(False)
            dist = distance_map(walls, goal)
            d = dist[start[0], start[1]]
            ok = (d >= self.min_distance) & (2 * d <= self.max_steps)
            ok = ok & base.in_split_class(map_hash(walls, start, goal), self.test_threshold, split)
            return self._state(walls, goal, start, dist), ok

        walls, goal = jnp.zeros((n, n), bool), jnp.array([n - 1, n - 1], jnp.int32)
        fallback = self._state(walls, goal, jnp.zeros((2,), jnp.int32), distance_map(walls, goal))
        return base.first_qualifying(
            key,
            jax.vmap(_candidate),
            fallback,
            num_candidates=num,
            bits_per_candidate=n * n + 2,
            max_rounds=_MAX_ROUNDS,
        )

    def _state(self, walls, goal, pos, dist) -> TwoAgentState:
        return TwoAgentState(
            walls=walls,
            goal=jnp.asarray(goal, jnp.int32),
            pos=jnp.asarray(pos, jnp.int32),
            dist=dist,
            message=jnp.asarray(NO_MESSAGE, jnp.int32),
            steps=jnp.zeros((), jnp.int32),
            done=jnp.zeros((), bool),
        )

    # ---------------------------------------------------------------------------- host side

    def state_from_text(self, grid: str, steps: int = 0, message: str = "nothing") -> TwoAgentState:
        """A state from rows of "_", "#", "G", "W" (one G, one W; the inverse of `render`).

        Args:
          grid: the map, one row per line.
          steps: turns already taken (even: the guide acts next).
          message: the pending guide message (a DIRECTIONS word or "nothing").
        """
        rows = grid.strip().split("\n")
        n = len(rows)
        if n != self.size or any(len(r) != n for r in rows):
            raise ValueError(f"expected a {self.size}x{self.size} grid, got {rows}")
        if any(set(r) - set(_CELLS.values()) for r in rows):
            raise ValueError(f"allowed cells: {list(_CELLS.values())}, got {rows}")
        if message not in (*DIRECTIONS, "nothing"):
            raise ValueError(f"unknown message {message!r}; allowed: {[*DIRECTIONS, 'nothing']}")
        chars = np.array([list(r) for r in rows])
        (goal,) = np.argwhere(chars == "G")
        (pos,) = np.argwhere(chars == "W")
        walls = jnp.asarray(chars == "#")
        goal = jnp.asarray(goal, jnp.int32)
        state = self._state(walls, goal, pos, distance_map(walls, goal))
        msg = DIRECTIONS.index(message) if message in DIRECTIONS else NO_MESSAGE
        return state.replace(
            message=jnp.asarray(msg, jnp.int32),
            steps=jnp.asarray(steps, jnp.int32),
            done=jnp.asarray(steps >= self.max_steps),
        )

    def render(self, state: TwoAgentState) -> str:
        """The whole map ("W" over "G" once reached), then whose turn it is (host side)."""
        codes = np.asarray(jax.device_get(self.cell_codes(state)))
        chars = tuple(_CELLS.values())
        grid = "".join("".join(chars[c] for c in row) + "\n" for row in codes)
        steps, message = int(np.asarray(state.steps)), int(np.asarray(state.message))
        words = (*DIRECTIONS, "nothing")
        status = "done" if bool(np.asarray(state.done)) else f"{AGENTS[steps % 2]} to act"
        return grid + f"turn {steps}/{self.max_steps}, {status}, message: {words[message]}\n"

    def _path(self, walls: np.ndarray, start: tuple, goal: tuple) -> list[int] | None:
        """Moves (DIRECTIONS ids) of a shortest path from start to goal (BFS), or None."""
        n = walls.shape[0]
        parent = {start: None}
        queue = collections.deque([start])
        while queue:
            cell = queue.popleft()
            if cell == goal:
                moves = []
                while parent[cell] is not None:
                    cell, move = parent[cell]
                    moves.append(move)
                return moves[::-1]
            for move, (dr, dc) in enumerate(DELTAS[:STAY].tolist()):
                nxt = (cell[0] + dr, cell[1] + dc)
                if 0 <= nxt[0] < n and 0 <= nxt[1] < n and not walls[nxt] and nxt not in parent:
                    parent[nxt] = (cell, move)
                    queue.append(nxt)
        return None

    def oracle_actions(self, state: TwoAgentState) -> list[int] | None:
        """Action ids for both roles: the guide says the first move of a shortest path (it
        sees the map), the walker does what the message says ("stay" after "nothing"); each
        role uses only its own observation.

        Returns:
          The alternating plan from `state`; [] once the goal is reached; None when the
          episode is over unsolved or the goal is unreachable.
        """
        s = jax.tree.map(np.asarray, jax.device_get(state))
        walls, goal = s.walls, tuple(s.goal.tolist())
        pos = tuple(s.pos.tolist())
        if pos == goal:
            return []
        if bool(s.done):
            return None
        plan = []
        if int(s.steps) % 2 == WALKER:
            move = int(s.message) if int(s.message) < NO_MESSAGE else STAY
            plan.append(len(DIRECTIONS) + move)
            nxt = (pos[0] + DELTAS[move][0], pos[1] + DELTAS[move][1])
            n = walls.shape[0]
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and not walls[nxt]:
                pos = nxt
            if pos == goal:
                return plan
        moves = self._path(walls, pos, goal)
        if moves is None:
            return None
        for move in moves:
            plan += [move, len(DIRECTIONS) + move]
        return plan
