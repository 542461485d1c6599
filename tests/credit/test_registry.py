"""Credit registry: errors, validation, defaults, and properties EVERY registered variant has.

The property tests run over `credit.names()`, so a newly registered estimator is covered
automatically. Inputs are complete: critic values for `requires_values`, and trajectories
carrying every optional field (`baseline_reward` for `requires_greedy`, `entropy_behavior`,
`token_penalty`), random anchors with repeats, unparsed actions and sparse group ids.
"""

from __future__ import annotations

import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from tests.credit.conftest import build_full, episodes_traj, regroup

EXTRA_PAD = 5
NAMES = credit.names()

# The estimator names and hyperparameter defaults that docs/methods.md documents
EXPECTED_DEFAULTS = {
    "grpo": {
        "eps": 1e-6,
        "scale": "group",
        "singleton_policy": "raw",
        "stats_over": "trajectories",
    },
    "dr_grpo": {"singleton_policy": "raw", "stats_over": "trajectories"},
    "rloo": {},
    "reinforce_pp": {"gamma": 1.0, "reset_on": "seq_end", "reward_placement": "outcome"},
    "reinforce_pp_baseline": {"singleton_policy": "raw"},
    "remax": {"reward_placement": "outcome"},
    "ppo_gae": {
        "gamma": 1.0,
        "lam": 1.0,
        "whiten": True,
        "reward_placement": "turn",
        "bootstrap_truncated": False,
    },
    "turn_gae": {
        "gamma": 1.0,
        "lam": 1.0,
        "turn_gamma": 0.95,
        "whiten": True,
        "bootstrap_truncated": False,
    },
    "step_gae": {"gamma": 1.0, "lam": 1.0, "whiten": True, "bootstrap_truncated": False},
    "gigpo": {
        "gamma": 0.95,
        "omega": 1.0,
        "mode": "mean_norm",
        "stats_over": "steps",
        "invalid_penalty": 0.1,
        "eps": 1e-6,
    },
    "mt_grpo": {
        "turn_coef": 1.0,
        "eps": 1e-4,
        "last_turn_outcome_only": True,
        "outcome": "last_turn",
    },
    "turn_return": {"gamma": 1.0, "norm": "group", "eps": 1e-6},
    "empg": {"k": 1.0, "k_future": 1.0, "zeta": 0.05, "eps": 1e-6},
}
NEEDS_VALUES = {"ppo_gae", "turn_gae", "step_gae"}
NEEDS_GREEDY = {"remax"}
# Critic-free estimators that centre each episode's score, or each turn's reward among the
# turns of one index, within its task group (docs/methods.md sections 2, 3.2 and 8: on a plain
# trajectory tree_grpo and arpo are GRPO's group z-score of the score, salt a mean of those):
# equal scores and turn rewards give exactly 0 in every group of two or more. Not here: the
# critic (ppo_gae, turn_gae, step_gae) and greedy-baseline (remax) estimators; reinforce_pp and
# reinforce_pp_baseline, which whiten over the whole batch (a singleton's raw score moves
# every token); those of turn returns, which differ with an episode's length even when its
# rewards are equal (vineppo, turn_return, at_grpo, gigpo, which also charges unparsed
# actions); and empg, whose entropy weights and bonus do not cancel.
ZERO_ON_TIES = {"grpo", "dr_grpo", "rloo", "opo", "mt_grpo", "tree_grpo", "arpo", "salt"}
# Known bugs (xfail strict: an XPASS means fixed, drop the entry).
IGNORES_PENALTY: dict[str, str] = {}


def _traj(seed, extra_pad=0, **kwargs):
    return regroup(build_full(seed, extra_pad=extra_pad, **kwargs))


def _values(traj, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=traj.tokens.shape).astype(np.float32))


def _call(name, traj, values):
    return credit.get(name)(traj, values if credit.requires_values(name) else None)


@functools.cache
def _jit(name):
    return jax.jit(functools.partial(_call, name))


def _assert_close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------- registry behaviour


def test_register__duplicate_raises():
    with pytest.raises(ValueError, match="already registered"):
        credit.register("grpo")(lambda traj, values: None)


@pytest.mark.parametrize("lookup", [credit.get, credit.defaults, credit.requires_values])
def test_unknown_name__lists_known_names(lookup):
    pattern = ".*".join(re.escape(repr(name)) for name in NAMES)
    with pytest.raises(KeyError, match=pattern):
        lookup("not_a_variant")


@pytest.mark.parametrize("name", NAMES)
def test_validate__unknown_field_lists_allowed(name):
    with pytest.raises(ValueError, match="not_a_field") as info:
        credit.validate(name, {"not_a_field": 1})
    message = str(info.value)
    assert name in message and all(field in message for field in credit.fields(name)), message
    assert credit.validate(name, {}) == credit.defaults(name)


def test_validate__merges_defaults():
    assert credit.validate("grpo", {"scale": "none"}) == {
        **EXPECTED_DEFAULTS["grpo"],
        "scale": "none",
    }
    with pytest.raises(KeyError, match="known"):
        credit.validate("gae_typo", {})


def test_registry__has_every_agreed_variant_with_its_defaults():
    assert set(EXPECTED_DEFAULTS) <= set(NAMES)
    for name, want in EXPECTED_DEFAULTS.items():
        assert credit.defaults(name) == want, name


def test_registry__requires_values_and_greedy():
    assert {n for n in NAMES if credit.requires_values(n)} == NEEDS_VALUES
    assert {n for n in NAMES if credit.requires_greedy(n)} == NEEDS_GREEDY
    assert ZERO_ON_TIES <= set(NAMES) and not ZERO_ON_TIES & (NEEDS_VALUES | NEEDS_GREEDY)
    assert credit.get("ppo_gae").needs_values


@pytest.mark.parametrize("name", NAMES)
def test_variant__missing_inputs_raise(name):
    traj = _traj(0)
    if credit.requires_values(name):
        with pytest.raises(ValueError, match="values"):
            credit.get(name)(traj, None)
    if credit.requires_greedy(name):
        with pytest.raises(ValueError, match="baseline_reward"):
            credit.get(name)(traj.replace(baseline_reward=None), _values(traj))


@pytest.mark.parametrize("name", NAMES)
def test_variant__unknown_choice_raises(name):
    """Every string-valued hyperparameter rejects an unknown choice, listing the allowed ones."""
    traj = _traj(0)
    for field, default in credit.defaults(name).items():
        if isinstance(default, str):
            with pytest.raises(ValueError, match="allowed"):
                credit.get(name)(traj, _values(traj), **{field: "not_a_choice"})


# ------------------------------------------------------------- properties of every variant


@pytest.mark.parametrize("name", NAMES)
def test_variant__contract(name):
    """Shape [B, T], zero off action_mask, finite, jit == eager, no retrace, padding-invariant."""
    traj, values = _traj(5), _values(_traj(5))
    # Eager on the same episodes without the greedy score where it is optional, so this also
    # checks that only requires_greedy variants read it.
    greedy = credit.requires_greedy(name)
    eager = _call(name, traj if greedy else traj.replace(baseline_reward=None), values)
    batch, slots = traj.tokens.shape
    mask = np.asarray(traj.action_mask)
    chex.assert_shape(eager.advantages, (batch, slots))
    adv = np.asarray(eager.advantages)
    assert adv.dtype == np.float32
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0.0)
    assert np.any(adv != 0.0)
    if eager.returns is not None:
        chex.assert_shape(eager.returns, (batch, slots))
        returns = np.asarray(eager.returns)
        assert np.all(np.isfinite(returns)) and np.all(returns[~mask] == 0.0)
    for value in eager.metrics.values():
        chex.assert_shape(value, ())
        assert np.isfinite(np.asarray(value))

    traces = []

    @jax.jit
    def run(traj, values):
        traces.append(1)  # Python side effect: runs once per trace
        return _call(name, traj, values)

    jitted = run(traj, values)
    _assert_close(jitted.advantages, adv)
    if eager.returns is not None:
        _assert_close(jitted.returns, eager.returns)
    other = _traj(6)
    run(other, _values(other, seed=1))  # new data, same shapes: must not retrace
    assert len(traces) == 1

    padded = _traj(5, extra_pad=EXTRA_PAD)
    values_padded = jnp.pad(values, ((0, 0), (0, EXTRA_PAD)), constant_values=3.0)
    out_padded = run(padded, values_padded)
    _assert_close(out_padded.advantages[:, :slots], adv)
    np.testing.assert_array_equal(np.asarray(out_padded.advantages[:, slots:]), 0.0)
    if eager.returns is not None:
        _assert_close(out_padded.returns[:, :slots], eager.returns)


@pytest.mark.parametrize("name", NAMES)
def test_variant__vmap_over_leading_axis(name):
    trajs = [_traj(s) for s in (7, 8)]
    values = [_values(t, seed=s) for s, t in enumerate(trajs)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *trajs)
    out = jax.jit(jax.vmap(functools.partial(_call, name)))(stacked, jnp.stack(values))
    for i, (traj, v) in enumerate(zip(trajs, values, strict=True)):
        want = _jit(name)(traj, v)
        _assert_close(out.advantages[i], want.advantages)
        if want.returns is not None:
            _assert_close(out.returns[i], want.returns)


@pytest.mark.parametrize("name", NAMES)
def test_variant__ignores_turns_that_did_not_happen(name):
    """Junk rewards, anchors and parse flags on turns with turn_valid=False change nothing."""
    traj, values = _traj(9), _values(_traj(9))
    invalid = ~np.asarray(traj.turn_valid)
    assert invalid.any()
    junk = traj.replace(
        turn_rewards=jnp.where(invalid, 7.5, traj.turn_rewards),
        anchors=jnp.where(invalid, traj.anchors[:, :1], traj.anchors),
        turn_action_valid=jnp.where(invalid, ~traj.turn_action_valid, traj.turn_action_valid),
    )
    _assert_close(_jit(name)(junk, values).advantages, _jit(name)(traj, values).advantages)


@pytest.mark.parametrize("name", NAMES)
def test_variant__empty_response_episode(name):
    """An episode that took no turn (no action tokens) gets zeros and keeps the rest finite."""
    traj = _traj(3, empty=(0, 6))
    out = _jit(name)(traj, _values(traj))
    adv = np.asarray(out.advantages)
    assert np.all(np.isfinite(adv))
    np.testing.assert_array_equal(adv[[0, 6]], 0.0)
    if out.returns is not None:
        assert np.all(np.isfinite(np.asarray(out.returns)))


@pytest.mark.parametrize("name", NAMES)
def test_variant__all_equal_rewards_are_finite(name):
    """Every score and turn reward equal (zero std everywhere): finite, no NaN from 0/0; and
    exactly 0 in every group of two or more for the estimators that centre them in groups."""
    traj = _traj(4)
    traj = traj.replace(
        turn_rewards=jnp.where(traj.turn_valid, 1.0, 0.0),
        outcome_reward=jnp.ones_like(traj.outcome_reward),
        token_penalty=jnp.zeros_like(traj.token_penalty),
    )
    out = _jit(name)(traj, _values(traj))
    adv = np.asarray(out.advantages)
    assert np.all(np.isfinite(adv))
    if name in ZERO_ON_TIES:
        gids = np.asarray(traj.group_ids)
        grouped = np.array([np.sum(gids == g) > 1 for g in gids])
        assert grouped.sum() == len(gids) - 1  # all but the singleton
        np.testing.assert_array_equal(adv[grouped], 0.0)


@pytest.mark.parametrize("name", NAMES)
def test_variant__gradient_wrt_rewards_is_finite(name):
    """d(sum A)/d(outcome, turn rewards) is finite even with tied groups (sqrt at 0)."""
    traj = _traj(4)
    traj = traj.replace(outcome_reward=traj.outcome_reward.at[:4].set(1.0))
    values = _values(traj)

    def total(outcome, turn_rewards):
        t = traj.replace(outcome_reward=outcome, turn_rewards=turn_rewards)
        return jnp.sum(_call(name, t, values).advantages)

    grads = jax.jit(jax.grad(total, argnums=(0, 1)))(traj.outcome_reward, traj.turn_rewards)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("name", NAMES)
def test_variant__ids_are_exact_keys(name):
    """Relabelling group ids and anchors injectively to values near the int32 / uint32 maxima
    (adjacent there, so any float32 cast would merge them) changes nothing."""
    traj, values = _traj(2), _values(_traj(2))
    gids = np.asarray(traj.group_ids).astype(np.int64)
    anchors = np.asarray(traj.anchors).astype(np.int64)
    relabelled = traj.replace(
        group_ids=jnp.asarray(2**31 - 1 - gids, jnp.int32),
        anchors=jnp.asarray(2**32 - 1 - anchors, jnp.uint32),
    )
    _assert_close(_jit(name)(relabelled, values).advantages, _jit(name)(traj, values).advantages)


@pytest.mark.parametrize("name", NAMES)
def test_variant__single_step_batch_is_finite(name):
    """One episode with one turn (every group, step group and batch statistic has one
    sample; whitening sees a single step): the advantages stay finite."""
    traj = episodes_traj([[1.0]], [0], entropy=[[0.7]], baseline=[0.5])
    out = credit.get(name)(traj, jnp.full(traj.tokens.shape, 0.25))
    assert np.all(np.isfinite(np.asarray(out.advantages)))
    if out.returns is not None:
        assert np.all(np.isfinite(np.asarray(out.returns)))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=IGNORES_PENALTY[n]))
        if n in IGNORES_PENALTY
        else n
        for n in NAMES
    ],
)
def test_variant__token_penalty_is_used(name):
    """`token_penalty` (the train step's KL in the reward: docs/methods.md, "KL in the loss vs
    in the reward") is subtracted from the token rewards, so every estimator's advantages must
    move when it is added; one that ignores it silently drops the KL term."""
    traj, values = _traj(1), _values(_traj(1))
    with_penalty = _jit(name)(traj, values).advantages
    without = _jit(name)(traj.replace(token_penalty=jnp.zeros_like(traj.token_penalty)), values)
    assert not np.allclose(np.asarray(with_penalty), np.asarray(without.advantages), atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_variant__batch_permutation_equivariant(name):
    """Shuffling the episodes (groups no longer contiguous) shuffles the advantages."""
    traj, values = _traj(3), _values(_traj(3))
    perm = np.random.default_rng(0).permutation(traj.batch_size)
    shuffled = jax.tree.map(lambda x: x[perm], traj)
    got = _jit(name)(shuffled, values[perm]).advantages
    _assert_close(got, np.asarray(_jit(name)(traj, values).advantages)[perm])
