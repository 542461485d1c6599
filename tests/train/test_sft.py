"""Warm start: oracle demonstrations in the rollout layout, cloning, and RL from the result."""

import json

import jax
import numpy as np
import pytest

from configs import base
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment, loop, sft, writers


def tiny_config(**overrides):
    c = base.get_config()
    c.unlock()
    c.env.name = "frozen_lake"
    c.env.vocab = "minimal"
    c.env.frozen_lake.compact = True
    c.rollout.num_tasks = 4
    c.rollout.group_size = 2
    c.rollout.max_turns = 8
    c.rollout.max_action_len = 2
    c.train.num_steps = 2
    c.train.eval_tasks = 8
    c.log.progress = False
    c.sft.num_demos = 16
    c.sft.steps = 40
    c.sft.batch_size = 8
    c.sft.lr = 3e-3
    for key, value in overrides.items():
        section, field = key.split(".")
        c[section][field] = value
    c.lock()
    return c


@pytest.fixture(scope="module")
def setup():
    exp = experiment.build(tiny_config())
    lay = rollout_lib.make_layout(exp.env, exp.step_cfg.rollout)
    params = exp.env.default_params("train")
    keys = jax.random.split(jax.random.key(3), 16)
    demos = sft.collect_demos(exp.env, params, keys, lay, jax.random.key(4))
    return exp, lay, keys, demos


def test_collect_demos__oracle_solves_and_layout_matches_the_rollout(setup):
    exp, lay, keys, demos = setup
    env, tok = exp.env, exp.env.tokenizer
    assert demos.success.all()  # deterministic lake: the BFS oracle always reaches the goal
    blk = lay.action + lay.obs
    reset, step = jax.jit(env.reset), jax.jit(env.step)  # one compile each, not one per op
    for i in range(4):
        state, ts = reset(keys[i], env.default_params("train"))
        plan = env.oracle_actions(state)
        assert demos.num_turns[i] == len(plan)
        np.testing.assert_array_equal(
            demos.tokens[i, 1 : 1 + int(ts.obs_len)], np.asarray(ts.obs_tokens[: int(ts.obs_len)])
        )
        for k, a in enumerate(plan):
            start = lay.prompt + k * blk
            ids = env.action_tokens(a)
            action = demos.tokens[i, start : start + lay.action]
            on = demos.action_mask[i, start : start + lay.action]
            # The action's tokens then the end-of-action token, all of them targets.
            np.testing.assert_array_equal(action[on], np.append(ids, tok.eoa_id))
            act = np.full((lay.action,), tok.pad_id, np.int32)
            act[: len(ids)] = ids
            state, ts = step(jax.random.key(0), state, act, len(ids), None)
            obs = demos.tokens[i, start + lay.action : start + blk]
            valid = demos.valid_mask[i, start + lay.action : start + blk]
            np.testing.assert_array_equal(obs[valid], np.asarray(ts.obs_tokens[: int(ts.obs_len)]))
            assert not demos.action_mask[i, start + lay.action : start + blk].any()
        assert bool(ts.success)
        assert not demos.valid_mask[i, lay.prompt + len(plan) * blk :].any()
    assert demos.reward.min() >= 1.0


def test_collect_demos__action_longer_than_the_budget_raises(setup):
    exp, lay, keys, _ = setup
    short = lay._replace(action=0)
    with pytest.raises(ValueError, match="rollout.max_action_len"):
        sft.collect_demos(exp.env, exp.env.default_params("train"), keys[:2], short, keys[0])


# ~70 s (SFT to a clone, then an RL run from it): slow suite; the default suite keeps the
# demonstrations, the warm start's errors and the minibatch passes below
@pytest.mark.slow
def test_sft__clones_the_oracle_and_rl_starts_from_it(setup, tmp_path):
    exp, lay, _, demos = setup
    state = exp.init_state(jax.random.key(0))
    opt = sft.make_optimizer(sft.SFTConfig(lr=3e-3))
    step = sft.make_step(exp.step_cfg.graphdef, opt, exp.mesh)
    params, opt_state = state.params, sft.init_opt_state(opt, state.params, exp.mesh)
    nll = []
    for _, batch in zip(range(100), sft.minibatches(demos, 8, jax.random.key(1))):
        params, opt_state, m = step(params, opt_state, batch)
        nll.append(float(m["nll"]))
    assert step.jitted["fn"]._cache_size() == 1
    # From ~log(vocab) per action token to a near-deterministic copy of the oracle.
    assert nll[0] > 1.0 and np.mean(nll[-10:]) < 0.15, nll
    before = loop.evaluate(exp, state.params, "train", 8)["greedy_success"]
    after = loop.evaluate(exp, params, "train", 8)["greedy_success"]
    assert after > before, (before, after)

    sft.save_params(str(tmp_path), params, 100, exp.config_json, experiment.INIT_COMPAT_KEYS)
    # init.count_wall: the run's clock starts with the warm start's wall time.
    (tmp_path / "summary.json").write_text(json.dumps({"wall_s": 500.0}))
    rl = tiny_config(
        **{"init.params": str(tmp_path), "loss.kl_coef": 0.01, "init.count_wall": True}
    )
    rl_exp = experiment.build(rl)
    warm = loop._warm_start(rl_exp, rl_exp.init_state(jax.random.key(5)), str(tmp_path))
    jax.tree.map(np.testing.assert_array_equal, warm.params, params)
    jax.tree.map(np.testing.assert_array_equal, warm.ref_params, params)  # KL to the SFT policy
    summary = loop.run(rl, str(tmp_path / "rl"), quiet=True)
    assert summary["finished"]
    rows = writers.read_metrics(tmp_path / "rl" / "metrics.jsonl")
    assert summary["wall_s"] >= 500 and all(r["wall_time"] >= 500 for r in rows)


def test_warm_start__incompatible_or_missing_parameters_fail_clearly(setup, tmp_path):
    exp, *_ = setup
    state = exp.init_state(jax.random.key(0))
    sft.save_params(str(tmp_path), state.params, 1, exp.config_json, experiment.INIT_COMPAT_KEYS)
    wider = experiment.build(tiny_config(**{"model.d_model": 32}))
    with pytest.raises(
        ValueError, match=r"(?s)model.d_model: stored 0, new 32.*init.params=.*another environment"
    ):
        loop._warm_start(wider, wider.init_state(jax.random.key(0)), str(tmp_path))
    with pytest.raises(FileNotFoundError, match="init.params"):
        loop._warm_start(exp, state, str(tmp_path / "nothing"))
    timed = tiny_config(**{"init.params": str(tmp_path), "init.count_wall": True})
    with pytest.raises(ValueError, match=r"init.count_wall=True but .*summary.json.* no wall_s"):
        loop._init_wall(timed)


def test_minibatches__each_pass_covers_every_episode_once(setup):
    *_, demos = setup
    stream = sft.minibatches(demos, 4, jax.random.key(2))
    for _ in range(2):  # two passes of 16 // 4 minibatches, reshuffled between them
        rows = np.concatenate([np.asarray(next(stream).tokens) for _ in range(4)])
        got = sorted(map(bytes, rows))
        assert got == sorted(map(bytes, np.asarray(demos.tokens)))
