"""Warm start: behaviour cloning on oracle demonstrations, then RL from those parameters.

Every built-in environment has an oracle (`env.oracle_actions(state)`: a plan from the current
state whose first action is what the oracle does next). `collect_demos` runs it closed-loop
through the jitted environment, re-planning every turn, and writes the episodes in the
rollout's slot layout (the same prompt, action and observation blocks the policy samples
into, end-of-action token included). `train` minimises the negative log-likelihood of the
demonstrated action tokens under the teacher-forced policy (`rollout.score`), and `save_params`
/ `load_params` hand the result to an RL run through `config.init.params`:

  python scripts/sft.py --config=configs/maze.py --workdir=runs/maze_sft
  python scripts/train.py --config=configs/maze.py --workdir=runs/maze_rl \
      --config.init.params=runs/maze_sft
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rl4agents import checkpoint as checkpoint_lib
from rl4agents import sharding
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import state as state_lib

PARAMS_DIR = "params"


@flax.struct.dataclass
class Demos:
    """N demonstrated episodes in the slot layout of a rollout (T = P + K * (A + O)).

    Attributes:
      tokens: int32[N, T] token ids, PAD in unused slots.
      valid_mask: bool[N, T] real tokens.
      action_mask: bool[N, T] demonstrated action tokens (end-of-action included): the targets.
      success: bool[N] the episode solved its task.
      num_turns: int32[N] turns taken.
      reward: f32[N] sum of the episode's rewards.
    """

    tokens: jax.Array
    valid_mask: jax.Array
    action_mask: jax.Array
    success: jax.Array
    num_turns: jax.Array
    reward: jax.Array

    def select(self, keep: np.ndarray) -> Demos:
        """The episodes where bool[N] `keep` is set."""
        return jax.tree.map(lambda x: np.asarray(x)[keep], self)


def collect_demos(
    env,
    env_params: Any,
    task_keys: jax.Array,
    lay: rollout_lib.Layout,
    key: jax.Array,
    eps: np.ndarray | None = None,
    action_key: jax.Array | None = None,
) -> Demos:
    """Run the environment's oracle closed-loop on each task and record the episodes.

    Each turn the oracle plans from the episode's current state (on the host) and its first
    action is stepped through the jitted, vmapped `env.step`; stochastic dynamics (a slippery
    lake) therefore get a re-planned answer every turn. An episode ends when the environment
    says done, when the oracle has no plan, or after `lay.turns` turns.

    With `eps`, the demonstrations are imperfect: each turn episode i takes, with probability
    `eps[i]`, a uniformly random action of the environment's action space
    (`env.action_tokens(j)`, j < `env.num_actions`) instead of the oracle's; the oracle
    re-plans from wherever that leads.

    Args:
      env: an environment with `oracle_actions(state)` and `action_tokens(action_id)` (and
        `num_actions` when `eps` is given).
      env_params: its params (for example `env.default_params("train")`).
      task_keys: key[N] one reset key per task.
      lay: the rollout layout the demonstrations are written in (`rollout.make_layout`).
      key: PRNG key for the environment's own randomness.
      eps: optional f32[N] in [0, 1], each episode's probability of a random action per turn
        (None: the oracle every turn).
      action_key: PRNG key for the random-action choices; required with `eps`.

    Returns:
      `Demos` of N episodes (numpy arrays).

    Raises:
      ValueError: an oracle action needs more than `lay.action` tokens, or `eps` is malformed.
      NotImplementedError: the environment has no oracle (`oracle_actions` not written).
    """
    n = int(task_keys.shape[0])
    if eps is not None:
        eps = np.asarray(eps, np.float32)
        if eps.shape != (n,) or not np.all((eps >= 0) & (eps <= 1)):
            raise ValueError(
                f"eps of shape {eps.shape} with range [{eps.min(initial=0):g}, "
                f"{eps.max(initial=0):g}]; allowed: shape ({n},), values in [0, 1]"
            )
        if action_key is None:
            raise ValueError("eps given without action_key; allowed: a PRNG key with eps")
        num_actions = int(env.num_actions)
    tok = env.tokenizer
    pad, bos, eoa = tok.pad_id, tok.bos_id, tok.eoa_id
    blk = lay.action + lay.obs
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, 0, None)))
    state, ts = reset(task_keys, env_params)

    tokens = np.full((n, lay.length), pad, np.int32)
    valid = np.zeros((n, lay.length), bool)
    action_mask = np.zeros((n, lay.length), bool)
    obs, obs_len = np.asarray(ts.obs_tokens), np.asarray(ts.obs_len)
    tokens[:, 0], valid[:, 0] = bos, True
    prompt_valid = np.arange(lay.prompt - 1)[None, :] < obs_len[:, None]
    tokens[:, 1 : lay.prompt] = np.where(prompt_valid, obs, pad)
    valid[:, 1 : lay.prompt] = prompt_valid

    done = np.zeros((n,), bool)
    success = np.zeros((n,), bool)
    reward = np.zeros((n,), np.float32)
    num_turns = np.zeros((n,), np.int32)
    cache: dict[int, np.ndarray] = {}
    for k in range(lay.turns):
        alive = ~done
        if not alive.any():
            break
        host_state = jax.device_get(state)
        act = np.full((n, lay.action), pad, np.int32)
        act_len = np.zeros((n,), np.int32)
        if eps is not None:
            k_coin, k_pick = jax.random.split(jax.random.fold_in(action_key, k))
            explore = np.asarray(jax.random.uniform(k_coin, (n,))) < eps
            random_id = np.asarray(jax.random.randint(k_pick, (n,), 0, num_actions))
        for i in np.flatnonzero(alive):
            plan = env.oracle_actions(jax.tree.map(lambda x, i=i: x[i], host_state))
            if not plan:  # no plan (a hole, an unsolvable state) or nothing left to do
                done[i] = True
                continue
            random_turn = eps is not None and explore[i]
            a = int(random_id[i]) if random_turn else plan[0]
            ids = cache.get(a)
            if ids is None:
                ids = cache[a] = np.asarray(env.action_tokens(a), np.int32)
            if len(ids) > lay.action:
                raise ValueError(
                    f"{'random' if random_turn else 'oracle'} action {a} has {len(ids)} "
                    f"tokens but rollout.max_action_len "
                    f"is {lay.action}; allowed: rollout.max_action_len >= {len(ids)}"
                )
            act[i, : len(ids)], act_len[i] = ids, len(ids)
        alive = ~done
        keys = jax.random.split(jax.random.fold_in(key, k), n)
        state, ts = step(keys, state, jnp.asarray(act), jnp.asarray(act_len), env_params)
        start = lay.prompt + k * blk
        # The action block as the policy writes it: tokens, then end-of-action if room is left.
        cols = np.arange(lay.action)[None, :]
        with_eoa = np.where(cols == act_len[:, None], eoa, act)
        on = (cols <= act_len[:, None]) & alive[:, None]
        tokens[:, start : start + lay.action] = np.where(on, with_eoa, pad)
        valid[:, start : start + lay.action] = on
        action_mask[:, start : start + lay.action] = on
        o_len = np.asarray(ts.obs_len)
        o_on = (np.arange(lay.obs)[None, :] < o_len[:, None]) & alive[:, None]
        o0 = start + lay.action
        tokens[:, o0 : o0 + lay.obs] = np.where(o_on, np.asarray(ts.obs_tokens), pad)
        valid[:, o0 : o0 + lay.obs] = o_on
        reward += np.where(alive, np.asarray(ts.reward), 0.0)
        success |= alive & np.asarray(ts.success)
        num_turns += alive
        done |= alive & np.asarray(ts.done)
    return Demos(tokens, valid, action_mask, success, num_turns, reward)


def nll_loss(
    params, graphdef, batch: Demos, mesh: jax.sharding.Mesh | None = None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean negative log-likelihood of the demonstrated action tokens.

    Args:
      params: the policy's state.
      graphdef: its static graph.
      batch: `Demos` with tokens int32[N, T], valid_mask and action_mask bool[N, T].
      mesh: optional; pins the model's hidden states to the batch sharding (see
        `Policy(..., shard=)`).

    Returns:
      The loss f32[] and metrics: `nll` (per action token) and `episode_nll` (per episode).
    """
    model = nnx.merge(graphdef, params)
    scores = rollout_lib.score(
        model, batch.tokens, batch.valid_mask, shard=sharding.batch_constraint(mesh)
    )
    mask = batch.action_mask.astype(jnp.float32)
    total = -(scores.logp * mask).sum()
    nll = total / jnp.maximum(mask.sum(), 1.0)
    return nll, {"nll": nll, "episode_nll": total / batch.tokens.shape[0]}


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = 300  # optimizer steps
    batch_size: int = 32  # episodes per step
    lr: float = 1e-3
    grad_clip: float = 1.0


def make_step(graphdef, optimizer: optax.GradientTransformation, mesh: jax.sharding.Mesh):
    """A jitted `(params, opt_state, batch) -> (params, opt_state, metrics)` SFT update.

    Parameters and optimizer state keep the shardings of the logical-axis rules
    (`sharding.tree_shardings`, as in RL training) so the step compiles once; the batch's
    episodes are split over the mesh's batch axes.
    """
    rep = sharding.replicated(mesh)

    def out_shardings(params, opt_state, batch):
        del batch
        return (
            sharding.tree_shardings(params, mesh),
            sharding.tree_shardings(opt_state, mesh),
            rep,
        )

    def sft_step(params, opt_state, batch):
        batch = sharding.shard_batch(batch, mesh)
        grads, metrics = jax.grad(nll_loss, has_aux=True)(params, graphdef, batch, mesh)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return optax.apply_updates(params, updates), opt_state, metrics

    compiled = {}

    def step(params, opt_state, batch):
        if "fn" not in compiled:  # the output shardings follow the state's structure
            shapes = jax.eval_shape(lambda: (params, opt_state, batch))
            compiled["fn"] = jax.jit(sft_step, out_shardings=out_shardings(*shapes))
        return compiled["fn"](params, opt_state, batch)

    step.jitted = compiled
    return step


def init_opt_state(optimizer: optax.GradientTransformation, params, mesh: jax.sharding.Mesh):
    """The optimizer state for `params`, in the shardings the SFT step keeps it in."""
    shapes = jax.eval_shape(optimizer.init, params)
    return jax.jit(optimizer.init, out_shardings=sharding.tree_shardings(shapes, mesh))(params)


def minibatches(demos: Demos, batch_size: int, key: jax.Array):
    """Endless minibatches of `batch_size` episodes, without replacement within each pass.

    Pass p shuffles with `fold_in(key, p)`; a pass yields N // batch_size minibatches.

    Args:
      demos: N episodes.
      batch_size: episodes per minibatch (at most N).
      key: the run's SFT key.

    Yields:
      `Demos` of `batch_size` episodes (device arrays).
    """
    host = jax.tree.map(np.asarray, demos)
    n = host.tokens.shape[0]
    for pass_id in itertools.count():
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, pass_id), n))
        for slot in range(n // batch_size):
            idx = perm[slot * batch_size : (slot + 1) * batch_size]
            yield jax.tree.map(lambda x, idx=idx: jnp.asarray(x[idx]), host)


def save_params(directory: str, params: Any, step: int, config_json: str, compat_keys) -> None:
    """Atomically save policy parameters to `directory/params` (with the run's config)."""
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(directory, PARAMS_DIR), config_json=config_json, compat_keys=compat_keys
    )
    ckpt.save(step, params, force=True)
    ckpt.close()


# The parameters of a value head (policy.Policy): a policy saved without one can start a run
# that has one, the head coming from the run's own initialisation (`load_params`'s `fresh`).
VALUE_HEAD_KEYS = ("critic", "value_proj")
CRITIC_INITS = ("fresh", "policy")


def load_params(
    directory: str,
    abstract_params: Any,
    config_json: str,
    compat_keys,
    *,
    fresh: Any = None,
    critic_init: str = "fresh",
    compat_defaults: Any = None,
) -> Any:
    """Restore the newest parameters saved by `save_params` onto `abstract_params`.

    A policy saved without a value head (its `model.value_head` "none") can start a run with
    one (`shared` or `separate`) when `fresh` is given: the policy's parameters are restored
    and the value head's are `fresh`'s (the run's own initialisation), or, with
    `critic_init="policy"` and a separate critic, the critic's decoder is a copy of the
    restored policy decoder (a critic initialised from the pretrained model, as in RLHF) and
    only its value projection is `fresh`'s.

    Args:
      directory: an SFT workdir (holding `params/`) or its `params/` folder itself.
      abstract_params: target shapes, dtypes and shardings (e.g. the RL state's params).
      config_json: the RL run's config; fields in `compat_keys` must match the stored one.
      compat_keys: dotted config fields that must agree (environment and model).
      fresh: the run's initial parameters (an nnx.State like `abstract_params`), or None.
      critic_init: "fresh" | "policy" (see above).
      compat_defaults: for compat keys added after the parameters were saved, the value they
        had (`experiment.COMPAT_DEFAULTS`), so older saves stay loadable.

    Raises:
      FileNotFoundError: no saved parameters there.
      ValueError: an incompatible config or parameter tree (names the fields or tensors).
    """
    if critic_init not in CRITIC_INITS:
        raise ValueError(f"init.critic={critic_init!r}; allowed: {list(CRITIC_INITS)}")
    path = directory
    if os.path.isdir(os.path.join(directory, PARAMS_DIR)):
        path = os.path.join(directory, PARAMS_DIR)
    config_path = os.path.join(path, checkpoint_lib.CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(
            f"init.params={directory!r} holds no saved parameters (expected a directory "
            f"written by scripts/sft.py, with {PARAMS_DIR}/{checkpoint_lib.CONFIG_NAME})"
        )
    head = [k for k in VALUE_HEAD_KEYS if k in abstract_params]
    add_head = fresh is not None and head and _stored_value_head(config_path) == "none"
    if add_head:
        compat_keys = tuple(k for k in compat_keys if k != "model.value_head")
        abstract_params = nnx.State({k: v for k, v in abstract_params.items() if k not in head})
    ckpt = checkpoint_lib.Checkpointer(
        path,
        config_json=config_json,
        compat_keys=compat_keys,
        compat_defaults=compat_defaults,
        remedy=(
            f"init.params={directory!r} was saved for another environment or model: start from "
            "parameters saved with these values, or set them as stored."
        ),
    )
    try:
        restored = ckpt.restore(None, abstract_params)
    finally:
        ckpt.close()
    if not add_head:
        return restored
    # The result has `fresh`'s tree (its exact node types): each leaf is the restored one at
    # the same path, or for the head `fresh`'s own (or the restored decoder's, for a critic
    # copied from the policy).
    saved = {_keys(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]}
    paths, treedef = jax.tree_util.tree_flatten_with_path(fresh)
    leaves = []
    for path, leaf in paths:
        keys = _keys(path)
        if keys[0] == "critic" and critic_init == "policy":
            leaf = jnp.copy(saved[("model",) + keys[1:]])
        elif keys[0] not in head:
            leaf = saved[keys]
        leaves.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _keys(path) -> tuple:
    """A tree path as a tuple of plain keys."""
    return tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)


def _stored_value_head(config_path: str) -> str:
    """`model.value_head` of the config saved beside the parameters ("none" if unset)."""
    return _stored(config_path, "model.value_head", "none")


def _stored(config_path: str, key: str, default: Any) -> Any:
    """The dotted `key` of the config file `config_path` (`default` where it is unset)."""
    with open(config_path) as f:
        node = json.load(f)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def stored_config_value(directory: str, key: str, default: Any) -> Any:
    """The dotted `key` of the config saved with the parameters in `directory` (a workdir
    holding `params/`, or that folder), `default` where it is unset or nothing is saved."""
    path = directory
    if os.path.isdir(os.path.join(directory, PARAMS_DIR)):
        path = os.path.join(directory, PARAMS_DIR)
    config_path = os.path.join(path, checkpoint_lib.CONFIG_NAME)
    return _stored(config_path, key, default) if os.path.isfile(config_path) else default


def make_optimizer(cfg: SFTConfig) -> optax.GradientTransformation:
    return state_lib.make_optimizer(lr=cfg.lr, grad_clip=cfg.grad_clip)
