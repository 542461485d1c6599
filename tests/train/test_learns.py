"""A few GRPO steps raise the reward of a task that any correct update improves.

`PickGood` is a two-turn bandit: the prompt shows "pick" and a task letter, each turn's one
action token earns 1 when it is one of four "good" words, whatever the context, and the
environment replies "yes" or "no" (observation tokens, never trained on). Raising the
probability of the good words is the only way to more reward, and any correct
policy-gradient step does so; the test reads that probability at the first turn exactly (a
softmax sum on the fixed prompts, no sampling noise) before and after a few steps of the
train step that `experiment.build` makes from a config.

Two negative controls run the same steps with the update corrupted, and must not improve it:
the advantages' sign flipped (a credit function returning -A), and the loss applied to the
observation tokens instead of the action tokens (the mask swapped in the update's batch; the
first turn's reply, which the reward decides, is among them, so that loss has a gradient).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base
from rl4agents import envs, sharding, text
from rl4agents.envs import base as base_env
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import objective as objective_lib
from rl4agents.train import step as step_lib
from rl4agents.types import TimeStep

ENV_NAME = "pick_good"
TASKS = ("e", "f", "g", "h")
GOOD = ("a", "b", "c", "d")
STEPS = 5
TURNS = 2


@flax.struct.dataclass
class State:
    task: jax.Array  # int32[] index into TASKS
    turn: jax.Array  # int32[] turns taken
    done: jax.Array  # bool[]


class PickGood:
    """TURNS turns. Prompt: "pick" and a task letter; action: one token. Reward 1 when the
    action is a word of `GOOD` (any task and turn), else 0; the reply is "yes" or "no".

    A 16-word vocabulary: at initialisation a good word is sampled about a quarter of the
    time, so every group of 8 samples is likely to hold different rewards.
    """

    def __init__(self, tokenizer=None):
        words = ("<pad>", "<bos>", "<eoa>", "<unk>", "\n", "pick", "yes", "no") + TASKS + GOOD
        self.tokenizer = tokenizer or text.BuiltinTokenizer(words=words)
        self.prompts = text.FragmentTable.build(self.tokenizer, {t: f"pick {t}" for t in TASKS})
        self.good = text.FragmentTable.build(self.tokenizer, {g: g for g in GOOD})
        self.replies = text.FragmentTable.build(self.tokenizer, {"yes": "yes", "no": "no"})
        self.max_prompt_len = 2
        self.max_obs_len = 1
        self.max_action_len = 1

    def default_params(self, split="train"):
        return None

    def reset(self, key, params):
        task = jax.random.randint(key, (), 0, len(TASKS))
        tokens, n = text.concat_fragments(
            self.prompts, task[None], self.tokenizer.pad_id, self.max_prompt_len
        )
        ts = TimeStep(
            obs_tokens=tokens,
            obs_len=n,
            reward=jnp.float32(0),
            done=jnp.bool_(False),
            anchor=text.hash_u32(task),
            valid_action=jnp.bool_(True),
            success=jnp.bool_(False),
        )
        return State(task, jnp.int32(0), jnp.bool_(False)), ts

    def step(self, key, state, action_tokens, action_len, params):
        turn = state.turn + 1
        done = turn >= TURNS
        hit = text.match_action(self.good, action_tokens, action_len) >= 0
        reply = jnp.where(hit, self.replies.id("yes"), self.replies.id("no"))
        tokens, n = text.concat_fragments(
            self.replies, reply[None], self.tokenizer.pad_id, self.max_obs_len
        )
        ts = TimeStep(
            obs_tokens=tokens,
            obs_len=n,
            reward=hit.astype(jnp.float32),
            done=done,
            anchor=text.hash_u32(jnp.stack([state.task, turn])),
            valid_action=jnp.bool_(True),
            success=hit,
        )
        new = State(state.task, turn, done)
        old_ts = base_env.empty_timestep(self.max_obs_len, text.hash_u32(state.task), 0)
        return base_env.absorbing(state.done, (state, old_ts), (new, ts))

    def render(self, state) -> str:
        return f"task={TASKS[int(state.task)]} done={bool(state.done)}"


def _config():
    c = base.get_config()  # with PickGood registered: it holds the env's (empty) section
    c.unlock()
    c.env.name = ENV_NAME
    c.rollout.num_tasks = 4
    c.rollout.group_size = 8
    c.rollout.max_turns = TURNS
    c.rollout.max_action_len = 1
    c.model.num_layers = 1  # a smaller program to compile; depth is not what is tested
    c.credit.name = "grpo"
    c.loss.policy = "ppo_clip"
    c.optim.lr = 1e-2
    c.train.num_steps = STEPS
    c.log.progress = False
    c.lock()
    return c


class Setup(NamedTuple):
    exp: experiment.Experiment
    p_good: Callable[[Any], jax.Array]  # params -> f32[]


@pytest.fixture(scope="module")
def setup():
    """The experiment of `_config()` on one device, built with `PickGood` registered under
    ENV_NAME (for this module only), and its `_p_good_fn`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(envs.registry._REGISTRY, ENV_NAME, PickGood)
        mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])
        exp = experiment.build(_config(), mesh=mesh)
        yield Setup(exp, _p_good_fn(exp))


def _p_good_fn(exp):
    """Jitted params -> f32[]: the exact probability that the first action token is a good
    word, averaged over the four prompts (the expected first-turn reward of a random task)."""
    cfg, tok = exp.step_cfg, exp.env.tokenizer
    rows = [[tok.bos_id, *tok.encode(f"pick {t}"), *tok.encode(g)] for t in TASKS for g in GOOD]
    tokens = jnp.asarray(rows, jnp.int32)  # int32[tasks * good, 4]
    valid = jnp.ones(tokens.shape, bool)

    @jax.jit
    def p_good(params):
        model = nnx.merge(cfg.graphdef, params)
        logp = rollout_lib.score(model, tokens, valid, cfg.rollout.temperature).logp[:, -1]
        return jnp.exp(logp).reshape(len(TASKS), len(GOOD)).sum(axis=1).mean()

    return p_good


def _observation_masked(batch: objective_lib.Batch, state, cfg) -> objective_lib.Batch:
    """The update's batch moved onto the observation tokens: each episode's advantage,
    on-policy old log-probs and the loss mask on its valid non-action slots after BOS (here
    the prompt and the first reply), every slot scored. The negative control's masking bug."""
    act = batch.action_mask
    obs = batch.valid_mask & ~act & (jnp.arange(act.shape[1]) > 0)[None, :]
    per_episode = jnp.sum(jnp.where(act, batch.advantages, 0.0), axis=1) / jnp.maximum(
        act.sum(axis=1), 1
    )
    model = nnx.merge(cfg.graphdef, state.params)
    logp = rollout_lib.score(model, batch.tokens, batch.valid_mask, cfg.rollout.temperature).logp
    return batch._replace(
        action_mask=obs,
        advantages=jnp.where(obs, per_episode[:, None], 0.0),
        logp_old=jnp.where(obs, logp, 0.0),
    )


def _corruptible_step(cfg: step_lib.StepConfig):
    """`train_step` jitted with two traced switches, so one program serves both negative
    controls: `(state, key_root, flip_sign: bool[], observation_mask: bool[]) -> (state,
    metrics)`. `flip_sign`: the credit function returns -A. `observation_mask`: the loss
    trains the observation tokens (`_observation_masked`). Both off, it is the real step
    (every slot scored rather than the action slots: equal up to float summation order)."""

    @jax.jit
    def step(state, key_root, flip_sign, observation_mask):
        def credit_fn(traj, values):
            out = cfg.credit_fn(traj, values)
            return out._replace(advantages=jnp.where(flip_sign, -out.advantages, out.advantages))

        prepare_batch = objective_lib.prepare_batch

        def prepare(state, traj, cfg, rows=None):
            batch, metrics = prepare_batch(state, traj, cfg, rows)
            batch = batch._replace(score_slots=None)
            wrong = _observation_masked(batch, state, cfg)
            batch = jax.tree.map(lambda w, b: jnp.where(observation_mask, w, b), wrong, batch)
            return batch, metrics

        # `update` looks `prepare_batch` up when this function is traced (its first call)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(objective_lib, "prepare_batch", prepare)
            return step_lib.train_step(
                state, key_root, dataclasses.replace(cfg, credit_fn=credit_fn)
            )

    return step


class Run(NamedTuple):
    before: float  # p_good at initialisation
    after: float  # p_good after STEPS steps
    rewards: list[float]  # each step's mean sampled episode reward (0..TURNS)
    grad_norms: list[float]  # each step's gradient norm


def _train(setup: Setup, step) -> Run:
    """STEPS steps of `step` from the parameters of seed 0."""
    exp = setup.exp
    state = exp.init_state(jax.random.key(0))
    before = float(setup.p_good(state.params))
    rewards, grad_norms = [], []
    for _ in range(STEPS):
        state, metrics = step(state, exp.root_key())
        rewards.append(float(metrics["reward"]))
        grad_norms.append(float(metrics["grad_norm"]))
    return Run(before, float(setup.p_good(state.params)), rewards, grad_norms)


def test_grpo__a_few_steps_raise_the_reward(setup):
    run = _train(setup, setup.exp.train_step)
    assert 0.15 < run.before < 0.35, run  # 4 good words of 16 at initialisation
    assert run.after > run.before + 0.4, run  # ~0.25 -> ~0.95 over seeds 0-5
    assert run.rewards[-1] > run.rewards[0] + 0.5, run


@pytest.fixture(scope="module")
def corruptible(setup):
    return _corruptible_step(setup.exp.step_cfg)


def test_corruptible_step__with_the_switches_off_is_the_real_step(setup, corruptible):
    # so in the negative controls below the corruption alone makes the difference
    real = _train(setup, setup.exp.train_step)
    same = _train(setup, functools.partial(corruptible, flip_sign=False, observation_mask=False))
    np.testing.assert_allclose(same.after, real.after, atol=1e-3)
    assert same.rewards == real.rewards


@pytest.mark.parametrize("corruption", ["advantage_sign", "observation_mask"])
def test_grpo__corrupted_updates_do_not_raise_the_reward(setup, corruptible, corruption):
    flip = corruption == "advantage_sign"
    run = _train(setup, functools.partial(corruptible, flip_sign=flip, observation_mask=not flip))
    if flip:  # the good words die out: ~0.25 -> ~0.01 over seeds 0-5
        assert run.after < run.before - 0.15, run
    else:  # a live gradient, but on the replies and prompts: p_good drifts (-0.14..+0.06
        # over seeds 0-5), far from the correct update's +0.4
        assert np.mean(run.grad_norms) > 0.1, run
        assert run.after < run.before + 0.1, run
