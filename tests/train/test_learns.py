"""A few GRPO steps raise the reward of a task that any correct update improves.

`PickGood` is a one-turn bandit: the prompt shows "pick" and a task letter (observation
tokens, never trained on); the one action token earns 1 when it is one of four "good" words,
whatever the prompt. Raising the probability of the good words is the only way to more reward,
and any correct policy-gradient step does so; the test reads that probability exactly (a
softmax sum on fixed prompts, no sampling noise) before and after a few steps of the train
step that `experiment.build` makes from a config.

Two negative controls run the same steps with the update corrupted, and must not improve it:
the advantages' sign flipped (a credit function returning -A), and the loss applied to the
observation tokens instead of the action tokens (the mask swapped in the update's batch).
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
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import step as step_lib
from rl4agents.types import TimeStep

ENV_NAME = "pick_good"
TASKS = ("e", "f", "g", "h")
GOOD = ("a", "b", "c", "d")
STEPS = 5


@flax.struct.dataclass
class State:
    task: jax.Array  # int32[] index into TASKS
    done: jax.Array  # bool[]


class PickGood:
    """One turn. Prompt: "pick" and a task letter; action: one token. Reward 1 when the
    action is a word of `GOOD` (any task), else 0; the episode then ends with "yes" or "no".

    A 16-word vocabulary: at initialisation a good word is sampled about a quarter of the
    time, so every group of 8 samples is likely to hold both rewards.
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
        return State(task, jnp.bool_(False)), ts

    def step(self, key, state, action_tokens, action_len, params):
        hit = text.match_action(self.good, action_tokens, action_len) >= 0
        reply = jnp.where(hit, self.replies.id("yes"), self.replies.id("no"))
        tokens, n = text.concat_fragments(
            self.replies, reply[None], self.tokenizer.pad_id, self.max_obs_len
        )
        ts = TimeStep(
            obs_tokens=tokens,
            obs_len=n,
            reward=hit.astype(jnp.float32),
            done=jnp.bool_(True),
            anchor=text.hash_u32(state.task),
            valid_action=jnp.bool_(True),
            success=hit,
        )
        return State(state.task, jnp.bool_(True)), ts

    def render(self, state) -> str:
        return f"task={TASKS[int(state.task)]} done={bool(state.done)}"


def _config():
    c = base.get_config()  # with PickGood registered: it holds the env's (empty) section
    c.unlock()
    c.env.name = ENV_NAME
    c.rollout.num_tasks = 4
    c.rollout.group_size = 8
    c.rollout.max_turns = 1
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
    """Jitted params -> f32[]: the exact probability that the action token is a good word,
    averaged over the four prompts (the expected reward of an episode of a random task)."""
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


def _observation_masked(batch: step_lib.Batch, state, cfg) -> step_lib.Batch:
    """The update's batch moved onto the observation tokens: each episode's advantage,
    on-policy old log-probs and the loss mask on its valid non-action slots after BOS (here
    the prompt), every slot scored. The wrong-masking bug of the negative control."""
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

        prepare_batch = step_lib.prepare_batch

        def prepare(state, traj, cfg, rows=None):
            batch, metrics = prepare_batch(state, traj, cfg, rows)
            batch = batch._replace(score_slots=None)
            wrong = _observation_masked(batch, state, cfg)
            batch = jax.tree.map(lambda w, b: jnp.where(observation_mask, w, b), wrong, batch)
            return batch, metrics

        # `update` looks `prepare_batch` up when this function is traced (its first call)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(step_lib, "prepare_batch", prepare)
            return step_lib.train_step(
                state, key_root, dataclasses.replace(cfg, credit_fn=credit_fn)
            )

    return step


def _train(setup: Setup, step) -> tuple[float, float, list[float]]:
    """(p_good before, p_good after STEPS steps of `step`, each step's mean sampled reward)."""
    exp = setup.exp
    state = exp.init_state(jax.random.key(0))
    before = float(setup.p_good(state.params))
    rewards = []
    for _ in range(STEPS):
        state, metrics = step(state, exp.root_key())
        rewards.append(float(metrics["reward"]))
    return before, float(setup.p_good(state.params)), rewards


def test_grpo__a_few_steps_raise_the_reward(setup):
    before, after, rewards = _train(setup, setup.exp.train_step)
    assert 0.15 < before < 0.35, before  # 4 good words of 16 at initialisation
    assert after > before + 0.4, (before, after)
    assert rewards[-1] > rewards[0] + 0.3, rewards


@pytest.fixture(scope="module")
def corruptible(setup):
    return _corruptible_step(setup.exp.step_cfg)


def test_corruptible_step__with_the_switches_off_is_the_real_step(setup, corruptible):
    # so in the negative controls below the corruption alone makes the difference
    _, real, real_rewards = _train(setup, setup.exp.train_step)
    _, same, rewards = _train(
        setup, functools.partial(corruptible, flip_sign=False, observation_mask=False)
    )
    np.testing.assert_allclose(same, real, atol=1e-3)
    assert rewards == real_rewards


@pytest.mark.parametrize("corruption", ["advantage_sign", "observation_mask"])
def test_grpo__corrupted_updates_do_not_raise_the_reward(setup, corruptible, corruption):
    flip = corruption == "advantage_sign"
    step = functools.partial(corruptible, flip_sign=flip, observation_mask=not flip)
    before, after, rewards = _train(setup, step)
    if flip:  # the reward falls
        assert after < before - 0.15, (before, after, rewards)
    else:  # within a group the prompt is shared and the advantages sum to 0: nothing moves
        assert abs(after - before) < 0.05, (before, after, rewards)
