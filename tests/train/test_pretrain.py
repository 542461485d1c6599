"""Multi-task pretraining: noisy demonstrations, packing, the loop, and RL starting from it."""

import jax
import numpy as np
import pytest

from configs import base_policy
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment, loop, pretrain, sft


def small_config(name: str, **overrides):
    """configs/base_policy.py:<name> with a tiny model and short episodes."""
    c = base_policy.env_config(name)
    c.unlock()
    c.model.preset = "tiny"
    c.rollout.max_turns = 6
    c.rollout.num_tasks = 8
    c.rollout.group_size = 2
    c.train.minibatches = 1
    c.train.eval_tasks = 8
    c.log.progress = False
    p = c.pretrain
    p.envs = "frozen_lake,maze"
    p.demos_per_env = 8
    p.steps = 4
    p.batch_size = 8
    p.warmup_steps = 1
    p.eval_tasks = 8
    for key, value in overrides.items():
        section, field = key.rsplit(".", 1)
        c[section][field] = value
    c.lock()
    return c


@pytest.fixture(scope="module")
def lake():
    exp = experiment.build(small_config("frozen_lake"))
    lay = rollout_lib.make_layout(exp.env, exp.step_cfg.rollout)
    keys = jax.random.split(jax.random.key(3), 12)
    return exp, lay, keys


def test_collect_demos__eps_zero_is_the_oracle_collector(lake):
    exp, lay, keys = lake
    params = exp.env.default_params("train")
    oracle = sft.collect_demos(exp.env, params, keys, lay, jax.random.key(4))
    noisy = sft.collect_demos(
        exp.env,
        params,
        keys,
        lay,
        jax.random.key(4),
        eps=np.zeros(12),
        action_key=jax.random.key(5),
    )
    jax.tree.map(np.testing.assert_array_equal, noisy, oracle)


def test_collect_demos__eps_one_takes_only_random_valid_actions(lake):
    exp, lay, keys = lake
    env = exp.env
    params = env.default_params("train")
    oracle = sft.collect_demos(env, params, keys, lay, jax.random.key(4))
    noisy = sft.collect_demos(
        env, params, keys, lay, jax.random.key(4), eps=np.ones(12), action_key=jax.random.key(5)
    )
    allowed = {tuple(env.action_tokens(j)) + (env.tokenizer.eoa_id,) for j in range(4)}
    allowed |= {tuple(env.action_tokens(j)) for j in range(4)}  # no room left for the eoa
    blk = lay.action + lay.obs
    taken = []
    for i in range(12):
        for k in range(int(noisy.num_turns[i])):
            start = lay.prompt + k * blk
            on = noisy.action_mask[i, start : start + lay.action]
            action = tuple(noisy.tokens[i, start : start + lay.action][on].tolist())
            assert action in allowed, (i, k, action)
            taken.append(action)
    assert len(set(taken)) == 4  # every move is drawn
    assert noisy.success.mean() < oracle.success.mean() == 1.0
    with pytest.raises(ValueError, match=r"allowed: shape \(12,\), values in \[0, 1\]"):
        sft.collect_demos(env, params, keys, lay, keys[0], eps=np.full(12, 2.0), action_key=keys[1])
    with pytest.raises(ValueError, match="without action_key"):
        sft.collect_demos(env, params, keys, lay, keys[0], eps=np.zeros(12))


def test_pack__scores_like_the_slot_layout(lake):
    exp, lay, keys = lake
    demos = sft.collect_demos(
        exp.env,
        exp.env.default_params("train"),
        keys,
        lay,
        jax.random.key(4),
        eps=pretrain.noise_levels(12, (0.0, 0.5)),
        action_key=jax.random.key(5),
    )
    packed = pretrain.pack(demos, multiple=8)
    length = packed.tokens.shape[1]
    assert length % 8 == 0 and length < demos.tokens.shape[1]
    np.testing.assert_array_equal(packed.valid_mask.sum(1), demos.valid_mask.sum(1))
    np.testing.assert_array_equal(packed.action_mask.sum(1), demos.action_mask.sum(1))
    for i in range(12):
        np.testing.assert_array_equal(
            packed.tokens[i][packed.valid_mask[i]], demos.tokens[i][demos.valid_mask[i]]
        )
    params = exp.init_state(jax.random.key(0)).params
    nll = jax.jit(lambda p, b: sft.nll_loss(p, exp.step_cfg.graphdef, b)[0])
    full, short = nll(params, jax.tree.map(np.asarray, demos)), nll(params, packed)
    np.testing.assert_allclose(short, full, rtol=1e-5)


def test_parsers__bad_values_fail_in_one_line():
    envs = ("maze", "wordle")
    assert pretrain.parse_envs(" maze,wordle ", envs) == envs
    with pytest.raises(ValueError, match="unknown environment 'lake'"):
        pretrain.parse_envs("maze,lake", envs)
    assert pretrain.parse_eps("0, 0.5") == (0.0, 0.5)
    with pytest.raises(ValueError, match=r"pretrain.eps='0,2'; allowed: .* in \[0, 1\]"):
        pretrain.parse_eps("0,2")
    np.testing.assert_allclose(pretrain.parse_weights("maze=3", envs), [0.75, 0.25])
    with pytest.raises(ValueError, match="pretrain.weights: 'sokoban=1'"):
        pretrain.parse_weights("sokoban=1", envs)
    # A known environment left out of the corpus: its weight is ignored; a typo still fails.
    known = ("maze", "wordle", "sokoban")
    np.testing.assert_allclose(pretrain.parse_weights("sokoban=2", envs, known), [0.5, 0.5])
    with pytest.raises(ValueError, match="pretrain.weights: 'sokobn=2'"):
        pretrain.parse_weights("sokobn=2", envs, known)
    np.testing.assert_array_equal(pretrain.noise_levels(5, (0.0, 0.5)), [0, 0.5, 0, 0.5, 0])


def test_run__two_envs_then_rl_starts_from_it_in_a_listed_env_only(tmp_path):
    configs = {n: small_config(n) for n in ("frozen_lake", "maze")}
    pre = small_config("frozen_lake")
    summary = pretrain.run(pre, configs, str(tmp_path), log=lambda _: None)
    assert summary["envs"] == ["frozen_lake", "maze"]
    assert sum(summary["steps_per_env"].values()) == 4
    for name in ("frozen_lake", "maze"):
        assert 0.0 <= summary["test"][name]["greedy_success"] <= 1.0
        stats = summary["corpus"]["envs"][name]
        assert stats["episodes"] == 8 and {"success_eps0", "success_eps0.5"} <= set(stats)
    assert (tmp_path / "summary.json").exists() and (tmp_path / "eval.json").exists()
    rows = pretrain.publish(str(tmp_path), str(tmp_path / "results"), "python scripts/x.py")
    assert [r["env"] for r in rows] == ["frozen_lake", "maze"]
    table = (tmp_path / "results" / "table.md").read_text()
    assert "python scripts/x.py" in table and "| maze |" in table

    maze = experiment.build(small_config("maze"))
    warm = loop._warm_start(maze, maze.init_state(jax.random.key(1)), str(tmp_path))
    assert jax.tree.structure(warm.params) == jax.tree.structure(maze.abstract_state().params)
    sokoban = experiment.build(small_config("sokoban"))
    with pytest.raises(ValueError, match=r'env.name: stored one of \["frozen_lake", "maze"\]'):
        loop._warm_start(sokoban, sokoban.init_state(jax.random.key(1)), str(tmp_path))
    wider = experiment.build(small_config("maze", **{"model.d_model": 32}))
    with pytest.raises(ValueError, match="model.d_model: stored 0, new 32"):
        loop._warm_start(wider, wider.init_state(jax.random.key(1)), str(tmp_path))
