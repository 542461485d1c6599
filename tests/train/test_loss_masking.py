"""Observation, prompt and padding tokens are never trained on."""

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import objective as objective_lib
from tests.train.test_train import tiny_config


def test_loss__ignores_everything_off_the_action_mask():
    # One layer (it compiles faster): the mask acts in the loss, whatever the depth.
    config = tiny_config(
        **{"model.value_head": "shared", "credit.name": "ppo_gae", "model.num_layers": 1}
    )
    exp = experiment.build(config)
    cfg = exp.step_cfg
    state = exp.init_state(jax.random.key(0))

    @jax.jit  # one program: op by op, the rollout's eager parts dominate this test's time
    def make_batch(state):
        traj = rollout_lib.rollout(
            jax.random.key(1), cfg.graphdef, state.params, cfg.env, cfg.env_params, cfg.rollout
        )
        return objective_lib.prepare_batch(state, traj, cfg)[0]

    batch = make_batch(state)
    off = ~batch.action_mask
    assert off.any() and batch.action_mask.any()
    noise = jax.random.normal(jax.random.key(2), batch.advantages.shape) * 100.0
    junk = batch._replace(
        advantages=jnp.where(off, noise, batch.advantages),
        logp_old=jnp.where(off, noise, batch.logp_old),
        returns=jnp.where(off, noise, batch.returns),
        values_old=jnp.where(off, noise, batch.values_old),
        logp_ref=jnp.where(off, noise, batch.logp_ref),
    )
    grad_fn = jax.jit(jax.grad(lambda p, b: objective_lib.loss_fn(p, b, cfg), has_aux=True))
    g1, m1 = grad_fn(state.params, batch)
    g2, m2 = grad_fn(state.params, junk)
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g1, g2)
