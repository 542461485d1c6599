"""LOOP (leave-one-out PPO, arXiv 2502.01600) is `rloo` credit with `ppo_clip` and several
epochs of shuffled minibatch updates (docs/methods.md, "LOOP"; configs/loop.py).

Each part of the algorithm is pinned on the tiny experiment of test_step_options.py with the
algorithmic settings of configs/loop.py: the advantage is the leave-one-out one (a NumPy
loop), the loss is the per-token clipped surrogate, one step makes epochs x minibatches
optimiser updates, and there is neither a critic nor a reference copy of the policy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import loop
from rl4agents import config_utils
from rl4agents.losses import policy as policy_losses
from rl4agents.train import experiment
from tests.train.test_step_options import one_device_mesh, prepare_fn, rollout_fn, tiny_config

# The settings that make a run LOOP (the rest of configs/loop.py is the environment's).
ALGORITHM_FIELDS = (
    "credit.name",
    "loss.policy",
    "loss.ppo_clip.clip_low",
    "loss.ppo_clip.clip_high",
    "loss.ppo_clip.dual_clip_c",
    "loss.ppo_clip.agg",
    "loss.kl_coef",
    "loss.entropy_coef",
    "model.value_head",
    "train.epochs",
    "train.minibatches",
)


def _get(c, dotted):
    node = c
    for part in dotted.split("."):
        node = node[part]
    return node


def loop_experiment(group_size=3):
    """The tiny experiment with configs/loop.py's algorithmic settings."""
    src = loop.get_config()
    c = tiny_config(**{"rollout.group_size": group_size})
    c.unlock()
    for dotted in ALGORITHM_FIELDS:
        *path, leaf = dotted.split(".")
        _get(c, ".".join(path))[leaf] = _get(src, dotted)
    c.lock()
    return experiment.build(c, mesh=one_device_mesh())


def test_loop_config__is_rloo_with_ppo_clip_and_several_epochs():
    for env in loop.ENVS:
        c = config_utils.load_config_file(f"configs/loop.py:{env}")
        assert c.env.name == env
        assert c.credit.name == "rloo" and c.loss.policy == "ppo_clip"
        assert c.rollout.group_size == 6  # K in the paper
        assert c.loss.ppo_clip.dual_clip_c is None and c.loss.ppo_clip.agg == "token-mean"
        assert c.loss.kl_coef == 0.0 and c.model.value_head == "none"
        assert c.train.epochs > 1 and c.train.minibatches > 1
        experiment.build(c, check_only=True)


def test_loop__advantage_is_leave_one_out_without_scaling():
    exp = loop_experiment(group_size=3)
    state = exp.init_state(jax.random.key(0))
    traj = rollout_fn(exp.step_cfg.rollout)(jax.random.key(1), state.params)
    rewards = np.random.default_rng(0).normal(size=traj.outcome_reward.shape).astype(np.float32)
    traj = traj.replace(outcome_reward=jnp.asarray(rewards))
    batch, _ = jax.device_get(prepare_fn(exp.step_cfg)(state, traj))
    # A_i = R_i - mean_{j != i, same task} R_j, on every action token of episode i.
    k = exp.step_cfg.rollout.group_size
    want = np.zeros_like(rewards)
    for i in range(len(rewards)):
        g = i // k
        others = [rewards[j] for j in range(g * k, (g + 1) * k) if j != i]
        want[i] = rewards[i] - sum(others) / len(others)
    mask = np.asarray(batch.action_mask)
    assert mask.any(axis=1).all()
    got = np.where(mask, batch.advantages, np.nan)
    for i in range(len(rewards)):
        np.testing.assert_allclose(got[i][mask[i]], want[i], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(batch.advantages[~mask], 0.0)


def test_loop__loss_is_the_per_token_clipped_surrogate():
    exp = loop_experiment()
    fn = exp.step_cfg.loss.policy_fn
    assert fn.func is policy_losses.ppo_clip
    assert fn.keywords["dual_clip_c"] is None and fn.keywords["agg"] == "token-mean"
    # A token-mean of max(-A rho, -A clip(rho, 0.8, 1.2)) by hand, two tokens.
    logp = jnp.log(jnp.asarray([[1.5, 0.9]]))
    adv = jnp.asarray([[1.0, -2.0]])
    loss, _ = fn(logp, jnp.zeros_like(logp), adv, jnp.ones((1, 2), bool))
    np.testing.assert_allclose(float(loss), (-1.2 + 2 * 0.9) / 2, rtol=1e-6)


def test_loop__one_step_is_epochs_x_minibatches_updates_with_one_policy_copy():
    exp = loop_experiment()
    cfg = exp.step_cfg
    assert (cfg.epochs, cfg.minibatches) == (2, 4) and not cfg.needs_values
    state = exp.init_state(jax.random.key(0))
    assert state.ref_params is None  # no KL reference: one copy of the policy
    new_state, metrics = exp.train_step(state, exp.root_key())
    assert np.isfinite(float(metrics["loss"]))
    counts = [
        int(s.count)
        for s in jax.tree.leaves(
            new_state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
        )
        if isinstance(s, optax.ScaleByAdamState)
    ]
    assert counts == [cfg.epochs * cfg.minibatches]
