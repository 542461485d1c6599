"""Host environments from a config: `env.name="host"` through `loop.run` and scripts/eval.py's
path (build, train, evaluate, checkpoint, exact resume), and its start-up errors."""

import json

import jax
import ml_collections
import numpy as np
import pytest

from configs import base
from rl4agents.envs import host
from rl4agents.envs.host import registry
from rl4agents.train import experiment, host_run, loop, writers


class Count:
    """Say a number; the episode is won by saying the reset seed's digit (mod 10).

    Reward 1 on a win, else 0 after 3 turns; "valid" when the action is one digit."""

    def __init__(self, offset: int = 0):
        self.offset = offset

    def reset(self, seed):
        self.target, self.t = (seed + self.offset) % 10, 0
        return "say the number"

    def step(self, action):
        self.t += 1
        word = action.strip()
        won = word == str(self.target)
        done = won or self.t >= 3
        obs = "yes" if won else ("no" if not done else "no end")
        return obs, float(won), done, {"success": won, "valid_action": word.isdigit()}


def count_factory(split, offset: int = 0):
    """Train and test splits only (no OOD): the held-out split's seeds are odd."""
    if split == "ood":
        return None
    return lambda task: Count(offset)


if "count_test" not in registry.names():
    registry.register("count_test")(count_factory)


def host_config(factory="count_test", **overrides):
    c = base.get_config()
    c.unlock()
    c.env.name = "host"
    c.env.host.factory = factory
    c.env.host.args = ml_collections.ConfigDict({"offset": 3})
    c.env.host.max_prompt_len = 16
    c.env.host.max_obs_len = 8
    c.env.host.num_workers = 2
    c.rollout.num_tasks = 4
    c.rollout.group_size = 2
    c.rollout.max_turns = 3
    c.rollout.max_action_len = 2
    c.model.d_model = 32
    c.model.num_layers = 1
    c.train.num_steps = 3
    c.train.eval_every = 2
    c.train.eval_tasks = 8
    c.checkpoint.every = 1
    c.log.progress = False
    for key, value in overrides.items():
        section, field = key.rsplit(".", 1)
        node = c
        for part in section.split("."):
            node = node[part]
        node[field] = value
    c.lock()
    return c


def _rows(d):
    return [
        {k: v for k, v in r.items() if k not in ("wall_time",) and not k.endswith("_seconds")}
        for r in writers.read_metrics(d / "metrics.jsonl")
    ]


def test_host_loop__trains_evaluates_and_resumes_exactly(tmp_path):
    config = host_config()
    full, part = tmp_path / "full", tmp_path / "part"
    summary = loop.run(config, str(full), quiet=True)
    assert summary["finished"] and summary["steps"] == 3
    # The factory has no OOD split: the final evaluation covers train and test.
    assert {"eval_train", "eval_test"} <= set(summary) and "eval_ood" not in summary
    rows = _rows(full)
    train_rows = [r for r in rows if "train/loss" in r]
    assert len(train_rows) == 3
    assert all(r["train/host/failed"] == 0 for r in train_rows)
    assert all(np.isfinite(v) for r in train_rows for v in r.values())
    # Interrupted after step 1 and resumed: the same metrics and evaluation.
    loop.run(config, str(part), stop_after=1, quiet=True)
    assert (part / "checkpoints" / "1").exists()
    loop.run(config, str(part), quiet=True)
    assert _rows(part) == rows
    s_part = json.loads((part / "summary.json").read_text())
    assert s_part["eval_test"] == summary["eval_test"]


def test_host_experiment__splits_seeds_and_module_path():
    exp = experiment.build(host_config(factory=f"{__name__}:count_factory"))
    assert isinstance(exp, host_run.HostExperiment) and exp.splits == ("train", "test")
    assert exp.env_label == f"host:{__name__}:count_factory"
    assert (exp.env.max_prompt_len, exp.env.max_obs_len) == (16, 8)
    seeds = np.arange(10)
    train, test = registry.split_seeds(seeds, "train"), registry.split_seeds(seeds, "test")
    assert (train % 2 == 0).all() and (test % 2 == 1).all()
    try:
        state = exp.init_state(jax.random.key(0))
        m = exp.eval_fn("test", 8)(state.params, 0)
        assert set(m) == {f"{mode}_{k}" for mode in ("greedy", "sampled") for k in loop.EVAL_KEYS}
        assert 0 <= float(m["greedy_success"]) <= 1 and 0 <= float(m["sampled_success"]) <= 1
        with pytest.raises(ValueError, match=r"split='ood'.*allowed: \['train', 'test'\]"):
            exp.eval_fn("ood", 8)
    finally:
        exp.close()


@pytest.mark.parametrize(
    "factory, overrides, match",
    [
        ("", {}, r"env.name='host' needs env.host.factory; allowed: one of \[.*'textarena'"),
        ("nope", {}, r"env.host.factory='nope' is unknown; allowed: one of \[.*'count_test'"),
        ("no.such.module:fn", {}, r"env.host.factory='no.such.module:fn' does not import"),
        ("count_test", {"env.host.max_obs_len": 0}, r"env.host.max_obs_len=0; allowed: >= 1"),
        ("count_test", {"env.vocab": "minimal"}, r"env.vocab='minimal' with env.name='host'"),
        ("count_test", {"rollout.context": "window"}, r"rollout.context='window' with env.name"),
        ("count_test", {"sampling.dynamic": True}, r"sampling.dynamic=True with env.name='host'"),
        ("count_test", {"credit.name": "remax"}, r"credit.name='remax' needs greedy rollouts"),
        ("count_test", {"env.name": "hots"}, r"env.name.*'hots'.*'host'"),
    ],
)
def test_host_config__bad_input_names_field_and_allowed(factory, overrides, match):
    with pytest.raises(ValueError, match=match):
        experiment.build(host_config(factory=factory, **overrides))


def test_host_config__unknown_factory_argument():
    c = host_config()
    with c.unlocked():
        c.env.host.args = ml_collections.ConfigDict({"offest": 1})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['offest'\].*allowed: \['offset'\]"):
        experiment.build(c)


def test_textarena_factory__splits():
    make = registry.resolve("textarena")
    assert make("ood", games="GuessTheNumber-v0", ood_games="") is None
    pytest.importorskip("textarena")
    env = make("train", games="GuessTheNumber-v0,TowerOfHanoi-v0")(1)
    assert isinstance(env, host.TextArenaEnv) and env.env_id == "TowerOfHanoi-v0"


def test_textarena_config__builds_with_three_splits():
    from configs import textarena

    exp = experiment.build(textarena.get_config())
    assert isinstance(exp, host_run.HostExperiment)
    assert exp.splits == ("train", "test", "ood")
    assert exp.env.factory == "textarena" and exp.env.max_prompt_len == 400
