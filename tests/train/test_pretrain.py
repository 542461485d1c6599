"""Multi-task pretraining: noisy demonstrations, packing, the loop, and RL starting from it."""

import itertools

import jax
import numpy as np
import pytest

from configs import base_policy
from rl4agents import checkpoint
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment, loop, pretrain, sft, writers


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


def test_minibatches_from__continues_the_sft_stream_at_any_position():
    n, t = 10, 4
    demos = sft.Demos(
        tokens=np.arange(n * t, dtype=np.int32).reshape(n, t),
        valid_mask=np.ones((n, t), bool),
        action_mask=np.zeros((n, t), bool),
        success=np.arange(n) % 2 == 0,
        num_turns=np.arange(n, dtype=np.int32),
        reward=np.arange(n, dtype=np.float32),
    )
    key = jax.random.key(7)
    # 3 minibatches of 3 per pass: 8 of them span three passes (the tenth episode left out).
    reference = list(itertools.islice(sft.minibatches(demos, 3, key), 8))
    for start in (0, 2, 3, 5):
        got = list(itertools.islice(pretrain.minibatches_from(demos, 3, key, start), 8 - start))
        for a, b in zip(got, reference[start:], strict=True):
            jax.tree.map(np.testing.assert_array_equal, a, b)


def test_collect_corpus__same_key_same_corpus(lake):
    exp, _, _ = lake
    keys = pretrain.run_keys(0)
    a = pretrain.collect_corpus(exp, 4, (0.0, 0.5), keys.corpus(0))
    b = pretrain.collect_corpus(exp, 4, (0.0, 0.5), keys.corpus(0))
    c = pretrain.collect_corpus(exp, 4, (0.0, 0.5), keys.corpus(1))
    jax.tree.map(np.testing.assert_array_equal, a.demos, b.demos)
    assert pretrain.corpus_digest(a) == pretrain.corpus_digest(b)
    assert pretrain.corpus_digest(a) != pretrain.corpus_digest(c)


def test_check_recipe__names_the_first_differing_field():
    stored = {"pretrain.lr": 0.001, "seed": 0, "corpus.maze": "ab"}
    pretrain.check_recipe(stored, {"pretrain.lr": 0.001, "seed": 0}, "w")  # corpus not yet known
    pretrain.check_recipe(stored, dict(stored), "w")
    with pytest.raises(ValueError, match=r"^w holds .*: pretrain.lr=0.002 in the config, stored"):
        pretrain.check_recipe(stored, {**stored, "pretrain.lr": 0.002, "seed": 1}, "w")
    with pytest.raises(ValueError, match=r"corpus.maze='cd' in the corpus, stored 'ab'"):
        pretrain.check_recipe(stored, {**stored, "corpus.maze": "cd"}, "w")
    with pytest.raises(ValueError, match=r"seed='<missing>' in the config, stored 0"):
        pretrain.check_recipe(stored, {"pretrain.lr": 0.001}, "w")


# Batches of 8 (the 8 test devices split them): each step draws a new pass of the 8 episodes.
RESUME = {"pretrain.steps": 6, "pretrain.checkpoint_every": 2}


def _run(workdir, stop_after=None, **overrides):
    configs = {n: small_config(n, **{**RESUME, **overrides}) for n in ("frozen_lake", "maze")}
    pre = small_config("frozen_lake", **{**RESUME, **overrides})
    return pretrain.run(pre, configs, str(workdir), log=lambda _: None, stop_after=stop_after)


def _params(workdir):
    exp = experiment.build(small_config("maze"))
    keys = tuple(k for k in experiment.INIT_COMPAT_KEYS if k != "env.name")
    return sft.load_params(
        str(workdir), exp.abstract_state().params, exp.config.to_json_best_effort(), keys
    )


def _rows(workdir):
    rows = writers.read_metrics(workdir / writers.METRICS_NAME)
    timing = lambda k: k == "wall_time" or k.endswith("/seconds")  # noqa: E731
    return [{k: v for k, v in r.items() if not timing(k)} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    return workdir, _run(workdir)


def test_run__resumed_and_cut_runs_end_as_the_uninterrupted_one(uninterrupted, tmp_path):
    full_dir, full = uninterrupted
    assert full["finished"] and full["cut"] is None and full["steps"] == 6
    assert checkpoint.saved_steps(full_dir / "checkpoints") == [4, 6]
    # Killed after 3 steps: the checkpoint of step 2 and the one saved on stopping.
    part = _run(tmp_path, stop_after=3)
    assert part == {"steps": 3, "finished": False}
    assert checkpoint.saved_steps(tmp_path / "checkpoints") == [2, 3]
    assert not (tmp_path / "summary.json").exists()
    # Resumed, then cut by the time budget at once: parameters, evaluation, a summary.
    cut = _run(tmp_path, **{"pretrain.max_minutes": 1e-9})
    assert cut["steps"] == 3 and cut["start_step"] == 3 and not cut["finished"]
    assert cut["cut"].startswith("pretrain.max_minutes=1e-09 reached at step 3")
    # Resumed again: runs to the end.
    done = _run(tmp_path)
    assert done["finished"] and done["start_step"] == 3 and done["steps"] == 6
    assert done["steps_per_env"] == full["steps_per_env"]
    # CPU time and peak memory count every invocation (usage.json carries them on).
    assert done["process_cpu_s"] > cut["process_cpu_s"] > 0
    assert done["peak_rss_gb"] >= cut["peak_rss_gb"] > 0
    a, b = _params(full_dir), _params(tmp_path)
    assert len(jax.tree.leaves(a)) > 0
    jax.tree.map(np.testing.assert_array_equal, a, b)
    # The same rows, and the cut's evaluation of its step-3 parameters.
    rows = _rows(tmp_path)
    assert [r for r in rows if r["step"] != 3] == _rows(full_dir)
    assert {k.split("/")[0] for r in rows if r["step"] == 3 for k in r} == {"step", "eval_test"}
    assert [r["step"] for r in _rows(full_dir) if "pretrain/nll/maze" in r] == [6]
    # A finished run is not redone; another recipe in its workdir is refused in one line.
    again = _run(tmp_path)
    assert again["finished"] and again["wall_s"] == done["wall_s"]  # its summary, read back
    with pytest.raises(
        ValueError,
        match=r"^\S+ holds checkpoints of another pretraining run: "
        r"pretrain.lr=0.002 in the config, stored 0.001; allowed",
    ):
        _run(tmp_path, **{"pretrain.lr": 0.002})


def test_run__init_continues_a_saved_base(uninterrupted, tmp_path):
    base_dir, _ = uninterrupted
    base = _params(base_dir)
    # lr 0: the run's parameters are the base's.
    _run(tmp_path / "lr0", **{"pretrain.init": str(base_dir), "pretrain.lr": 0.0})
    jax.tree.map(np.testing.assert_array_equal, _params(tmp_path / "lr0"), base)
    # One step: its NLL is the base's NLL on the run's first minibatch.
    _run(tmp_path / "one", **{"pretrain.init": str(base_dir), "pretrain.steps": 1})
    [row] = [
        r
        for r in _rows(tmp_path / "one")
        if "pretrain/nll/maze" in r or "pretrain/nll/frozen_lake" in r
    ]
    names = ("frozen_lake", "maze")
    keys = pretrain.run_keys(0)
    i = int(pretrain.env_schedule(np.full(2, 0.5), 1, keys.schedule())[0])
    exp = experiment.build(small_config(names[i]))
    corpus = pretrain.collect_corpus(exp, 8, (0.0, 0.1, 0.25, 0.5), keys.corpus(i))
    batch = next(pretrain.minibatches_from(corpus.demos, 8, keys.stream(i)))
    nll = lambda p: float(sft.nll_loss(p, exp.step_cfg.graphdef, batch)[1]["nll"])  # noqa: E731
    assert row[f"pretrain/nll/{names[i]}"] == pytest.approx(nll(base), rel=1e-5)
    fresh = exp.init_state(keys.init()).params
    # The check tells the base from a random start: 100x the tolerance apart.
    assert abs(nll(fresh) - nll(base)) > 1e-3 * nll(base)
