"""Episode filters and collapse metrics (docs/methods.md, "Episode filters" and "Collapse
metrics"): SimpleTIR's void-turn filter, RAGEN-2's top-p reward-variance filter, what a
dropped episode leaves in the update (nothing), the config, the reward-spread metrics and the
prompt-swap mutual-information proxy.
"""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from rl4agents.train import sampling as sampling_lib
from rl4agents.train import step as step_lib
from tests.credit.conftest import build_full, regroup
from tests.train.test_step_options import (
    assert_finite,
    base_exp,
    base_state,
    build,
    hand_traj,
    loss_fn,
    prepare_fn,
    rollout_fn,
    score_logp,
)


def filter_cfg(name, group_size, **hparams):
    """The two attributes `filter_episodes` reads."""
    fn = functools.partial(sampling_lib.EPISODE_FILTERS.get(name), **hparams)
    return types.SimpleNamespace(
        sampling=step_lib.SamplingConfig(filter_fn=fn),
        rollout=types.SimpleNamespace(group_size=group_size),
    )


# --------------------------------------------------------------------------------------------
# 1. SimpleTIR's void-turn filter.


def test_void_turn__drops_episodes_with_a_turn_that_was_no_action():
    traj = hand_traj([[1, 2], [1, 1, 1], [2], [1, 1]], [[0, 1], [0, 0, 1], [1], [0, 0]])
    valid = np.asarray(traj.turn_valid).copy()
    parsed = valid.copy()
    parsed[1, 2] = False  # episode 1: its last turn was void
    parsed[3, 0] = False  # episode 3: its first turn
    parsed[2, 2] = False  # a turn that did not happen (episode 2 took one) is not void
    traj = traj.replace(turn_action_valid=jnp.asarray(parsed))
    keep = sampling_lib.void_turn(traj, 2)
    np.testing.assert_array_equal(keep, [True, False, True, False])
    out, metrics = sampling_lib.filter_episodes(traj, filter_cfg("void_turn", 2))
    np.testing.assert_allclose(metrics["filter/kept_frac"], 0.5)
    for name in ("action_mask", "obs_mask"):
        got, before = np.asarray(getattr(out, name)), np.asarray(getattr(traj, name))
        np.testing.assert_array_equal(got[[0, 2]], before[[0, 2]])
        assert not got[[1, 3]].any()
    assert not np.asarray(out.turn_valid)[[1, 3]].any()
    np.testing.assert_array_equal(out.outcome_reward, traj.outcome_reward)  # metrics count them


# --------------------------------------------------------------------------------------------
# 2. RAGEN-2's top-p reward-variance filter.


def _rewards_traj(rewards):
    traj = hand_traj([[1]] * len(rewards), [[0.0]] * len(rewards))
    return traj.replace(outcome_reward=jnp.asarray(rewards, jnp.float32))


@pytest.mark.parametrize(
    "p, kept_groups",
    [(0.9, [0, 2, 3]), (0.7, [0, 2]), (0.5, [2]), (1.0, [0, 2, 3])],
)
def test_top_p_variance__hand(p, kept_groups):
    # Groups of 2: variances .25, 0, 1, .25 (total 1.5). By decreasing variance (ties in task
    # order): g2 (before 0), g0 (before 1), g3 (before 1.25), g1 (before 1.5); a group is
    # kept while the variance before it is below p * 1.5.
    traj = _rewards_traj([0, 1, 0, 0, 0, 2, 1, 2])
    keep = np.asarray(sampling_lib.top_p_variance(traj, 2, p=p))
    np.testing.assert_array_equal(keep, np.repeat(np.isin(np.arange(4), kept_groups), 2))


def test_top_p_variance__all_equal_rewards_keep_every_group():
    keep = sampling_lib.top_p_variance(_rewards_traj([1.0] * 6), 3)
    assert np.asarray(keep).all()


def _top_p_loop(rewards, g, p):
    groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
    var = [float(np.mean((np.asarray(r) - np.mean(r)) ** 2)) for r in groups]
    order = sorted(range(len(var)), key=lambda j: (-var[j], j))
    total, acc, keep = sum(var), 0.0, [False] * len(var)
    for j in order:
        keep[j] = total <= 0 or acc < p * total
        acc += var[j]
    return np.repeat(keep, g)


@pytest.mark.parametrize("p", [0.3, 0.8, 0.95])
def test_top_p_variance__matches_loop_reference(p):
    rng = np.random.default_rng(2)
    rewards = rng.choice([0.0, 0.5, 1.0], size=40).astype(np.float32)  # ties and zero groups
    got = np.asarray(sampling_lib.top_p_variance(_rewards_traj(rewards), 4, p=p))
    np.testing.assert_array_equal(got, _top_p_loop(list(rewards), 4, p))
    assert 0 < got.sum() < len(rewards)


# --------------------------------------------------------------------------------------------
# 3. A dropped episode is in no statistic and no loss term.


@pytest.mark.parametrize("name", credit.names())
def test_filter__dropped_episodes_change_no_other_advantage(name):
    """Episodes with a void turn are dropped; giving them other rewards leaves every kept
    episode's advantage as it is, and theirs is 0 (every estimator)."""
    traj = regroup(build_full(3))
    keep = np.asarray(sampling_lib.void_turn(traj, 1))
    assert keep.any() and not keep.all()
    cfg = filter_cfg("void_turn", 1)
    values = jnp.asarray(np.random.default_rng(0).normal(size=traj.tokens.shape), jnp.float32)
    fn = jax.jit(lambda t: credit.get(name)(t, values if credit.requires_values(name) else None))
    base = np.asarray(fn(sampling_lib.filter_episodes(traj, cfg)[0]).advantages)
    drop = jnp.asarray(~keep)
    rescored = traj.replace(
        outcome_reward=jnp.where(drop, 7.0, traj.outcome_reward),
        turn_rewards=jnp.where(drop[:, None], 3.0, traj.turn_rewards),
    )
    got = np.asarray(fn(sampling_lib.filter_episodes(rescored, cfg)[0]).advantages)
    np.testing.assert_allclose(got[keep], base[keep], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[~keep], 0.0)


def test_filter__loss_equals_the_loss_of_the_kept_episodes_alone():
    # top_p_variance drops whole groups: the filtered batch's advantages and token-mean loss
    # terms equal those of a batch holding the kept groups only.
    state = base_state()
    traj = rollout_fn()(jax.random.key(4), state.params)
    rewards = np.array([0, 1, 0, 0, 0, 3, 1, 2], np.float32)  # group variances .25 0 2.25 .25
    traj = traj.replace(outcome_reward=jnp.asarray(rewards))
    cfg = base_exp().step_cfg
    filtered, _ = sampling_lib.filter_episodes(traj, filter_cfg("top_p_variance", 2, p=0.85))
    rows = np.array([0, 1, 4, 5])  # g2 (before 0) and g0 (before 2.25 < 0.85 * 2.75)
    kept = jax.tree.map(lambda x: None if x is None else x[rows], traj)
    batch, _ = prepare_fn(cfg)(state, filtered)
    kept_batch, _ = prepare_fn(cfg)(state, kept)
    np.testing.assert_allclose(batch.advantages[rows], kept_batch.advantages, atol=1e-6)
    assert not np.asarray(batch.action_mask)[[2, 3, 6, 7]].any()
    # Move the PPO anchor off the current policy (same shift on the same tokens of both
    # batches), so that the policy loss is not 0 (GRPO advantages sum to 0 at ratio 1).
    shift = jnp.asarray(np.random.default_rng(1).normal(scale=0.3, size=batch.logp_old.shape))
    batch = batch._replace(logp_old=batch.logp_old + shift * batch.action_mask)
    kept_batch = kept_batch._replace(
        logp_old=kept_batch.logp_old + shift[rows] * kept_batch.action_mask
    )
    _, m = jax.device_get(loss_fn(cfg)(state.params, batch))
    _, m_kept = jax.device_get(loss_fn(cfg)(state.params, kept_batch))
    assert abs(float(m["pg_loss"])) > 1e-6
    for key in ("pg_loss", "entropy", "loss"):
        np.testing.assert_allclose(m[key], m_kept[key], rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------------
# 4. Config and train step.


def test_train_step__filter_and_collapse_metrics():
    exp = build(**{"sampling.filter": "void_turn", "log.collapse_metrics": True})
    assert exp.step_cfg.sampling.filter_fn.func is sampling_lib.void_turn
    assert build().step_cfg.sampling.filter_fn is None  # the default: "none"
    state = exp.init_state(jax.random.key(0))
    _, metrics = exp.train_step(state, exp.root_key())
    assert_finite(metrics)
    assert 0.0 <= float(metrics["filter/kept_frac"]) <= 1.0
    for key in ("reward_std", "reward_group_std", "zero_std_groups", "entropy"):
        assert key in metrics
    assert "mi/gap" not in metrics  # opt-in
    plain = build()
    _, default = plain.train_step(plain.init_state(jax.random.key(0)), plain.root_key())
    assert "reward_std" not in default and "filter/kept_frac" not in default


def test_build__top_p_hyperparameter_reaches_the_step():
    c_exp = build(**{"sampling.filter": "top_p_variance"})
    assert c_exp.step_cfg.sampling.filter_fn.keywords == {"p": 0.9}


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"sampling.filter": "zero_adv"}, r"sampling\.filter='zero_adv' is not allowed"),
        (
            {"sampling.filter": "void_turn", "rollout.context": "window"},
            r"sampling\.filter='void_turn' is not supported with rollout\.context='window'",
        ),
        (
            {
                "sampling.filter": "top_p_variance",
                "rollout.group_size": 1,
                "credit.name": "reinforce_pp",
            },
            r"rollout\.group_size=1; allowed: rollout\.group_size >= 2",
        ),
        (
            {"log.mi_proxy": True, "rollout.num_tasks": 1},
            r"log\.mi_proxy=True .* rollout\.num_tasks=1; allowed: >= 2",
        ),
    ],
    ids=["unknown", "window", "top_p_group_of_one", "mi_one_task"],
)
def test_build__rejects_bad_filter_settings(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        build(**overrides)


def test_validate_filter__bad_p_names_the_field():
    with pytest.raises(ValueError, match=r"sampling\.top_p_variance: p=0\.0; allowed: in \(0, 1\]"):
        sampling_lib.validate_filter("top_p_variance", {"p": 0.0}, 2)
    with pytest.raises(ValueError, match=r"\['q'\].*'top_p_variance'.*\['p'\]"):
        sampling_lib.validate_filter("top_p_variance", {"q": 0.5}, 2)


# --------------------------------------------------------------------------------------------
# 5. Collapse metrics.


def test_rollout_metrics__reward_spread_by_hand():
    traj = _rewards_traj([0, 1, 2, 2, 0, 4])  # groups of 2: stds .5, 0, 2
    m = {**step_lib.rollout_metrics(traj, 2), **step_lib.reward_spread(traj, 2)}
    np.testing.assert_allclose(m["reward_std"], np.std([0, 1, 2, 2, 0, 4]), rtol=1e-6)
    np.testing.assert_allclose(m["reward_group_std"], 2.5 / 3, rtol=1e-6)
    np.testing.assert_allclose(m["zero_std_groups"], 1 / 3, rtol=1e-6)


def test_prompt_mi_gap__matches_scoring_with_swapped_prompts():
    # Reference: swap the prompt block in NumPy, score both batches with the policy, take the
    # per-episode mean log-prob of the action tokens and average the difference.
    cfg = base_exp().step_cfg
    state = base_state()
    params = jax.tree.map(
        lambda x: x * 3.0 if jnp.issubdtype(x.dtype, jnp.floating) else x, state.params
    )  # a sharper policy: the prompt matters
    traj = rollout_fn()(jax.random.key(4), params)
    got = jax.device_get(jax.jit(lambda p, t: step_lib.prompt_mi_gap(p, t, cfg))(params, traj))
    t = cfg.layout.length - cfg.layout.obs
    tokens, valid = np.asarray(traj.tokens)[:, :t], np.asarray(traj.valid_mask)[:, :t]
    mask = np.asarray(traj.action_mask)[:, :t]
    b, p, g = tokens.shape[0], cfg.layout.prompt, cfg.rollout.group_size
    other = (np.arange(b) + g) % b
    sw_tokens, sw_valid = tokens.copy(), valid.copy()
    sw_tokens[:, :p], sw_valid[:, :p] = tokens[other, :p], valid[other, :p]
    own = np.asarray(score_logp(params, tokens, valid))
    swapped = np.asarray(score_logp(params, sw_tokens, sw_valid))
    rows = [i for i in range(b) if mask[i].any()]
    gap = np.mean([own[i][mask[i]].mean() - swapped[i][mask[i]].mean() for i in rows])
    np.testing.assert_allclose(got["mi/gap"], gap, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        got["mi/logp_own"], np.mean([own[i][mask[i]].mean() for i in rows]), rtol=1e-5
    )
    assert abs(float(got["mi/gap"])) > 1e-4  # the prompts differ and the policy reads them


def test_train_step__mi_proxy_is_logged():
    exp = build(**{"log.mi_proxy": True})
    assert exp.step_cfg.mi_proxy
    _, metrics = exp.train_step(exp.init_state(jax.random.key(0)), exp.root_key())
    assert_finite(metrics)
    assert {"mi/gap", "mi/logp_own", "mi/logp_swapped"} <= set(metrics)
