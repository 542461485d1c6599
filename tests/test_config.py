"""Bad configs fail at start-up with one message naming the field, value and what is allowed."""

import subprocess
import sys

import pytest

from configs import base, frozen_lake
from rl4agents import config_utils, credit, envs, losses, memory, sharding
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment, resolve


def _cfg(**overrides):
    c = frozen_lake.get_config()
    c.unlock()
    for key, value in overrides.items():
        node = c
        *path, field = key.split(".")
        for p in path:
            node = node[p]
        node[field] = value
    c.lock()
    return c


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"env.name": "frozen_lak"}, r"env.name='frozen_lak' is not allowed; allowed: \["),
        ({"credit.name": "grpoo"}, r"credit.name='grpoo' is not allowed; allowed: \[.*'grpo'"),
        ({"loss.policy": "ppo"}, r"loss.policy='ppo' is not allowed"),
        ({"rollout.group_size": 1}, r"rollout.group_size=1 is below 2.*'grpo'"),
        (
            {"rollout.num_tasks": 3, "rollout.group_size": 3},
            r"batch of 9 episodes is not divisible by the mesh's data size 8",
        ),
        ({"rollout.max_context_len": 10}, r"max_context_len=10 is too short for one turn"),
        ({"credit.name": "ppo_gae"}, r"needs a critic but model.value_head='none'"),
        ({"model.preset": "huge"}, r"model.preset='huge'; allowed: \["),
        ({"model.value_head": "both"}, r"model.value_head='both'"),
        ({"mesh.shape": (3, 1, 1)}, r"mesh.shape=\(3, 1, 1\)"),
        ({"optim.schedule": "linear"}, r"optim.schedule='linear'; allowed"),
        ({"loss.kl_estimator": "k4"}, r"loss.kl_estimator='k4' is not allowed"),
        ({"loss.kl_reward_estimator": "k5"}, r"loss.kl_reward_estimator='k5' is not allowed"),
        ({"loss.ppo_clip.agg": "sum"}, r"ppo_clip.agg='sum' is not a loss aggregation mode"),
        ({"rollout.temperature": 0.0}, r"rollout.temperature=0.0; allowed: > 0"),
    ],
)
def test_build__bad_config_names_field_and_allowed(overrides, pattern):
    with pytest.raises((ValueError, KeyError), match=pattern):
        experiment.build(_cfg(**overrides))


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"train.eval_every": 0}, r"train.eval_every=0; allowed: >= 1"),
        ({"train.minibatches": 0}, r"train.minibatches=0; allowed: >= 1"),
        ({"train.num_steps": -1}, r"train.num_steps=-1; allowed: >= 1"),
        ({"train.max_minutes": -1.0}, r"train.max_minutes=-1.0; allowed: >= 0 \(0 = no limit\)"),
        ({"checkpoint.every": 0}, r"checkpoint.every=0; allowed: >= 1"),
        ({"log.every": 0}, r"log.every=0; allowed: >= 1"),
        ({"optim.lr": 0.0}, r"optim.lr=0.0; allowed: > 0"),
        ({"optim.b2": 1.0}, r"optim.b2=1.0; allowed: in \[0, 1\)"),
        ({"optim.lr": float("nan")}, r"optim.lr=nan; allowed: a finite number > 0"),
        ({"rollout.top_p": 0.0}, r"rollout.top_p=0.0; allowed: in \(0, 1\]"),
        ({"model.d_model": -1}, r"model.d_model=-1; allowed: >= 0 \(0 = the preset's\)"),
        # 0 would hold the critic at V_old (no gradient once V moves); None is "off".
        ({"loss.value_clip": 0.0}, r"loss.value_clip=0.0; allowed: > 0 or None \(None = no"),
        # A variant's values, checked by tracing its function at start-up (credit.validate):
        ({"credit.grpo.eps": -1.0}, r"credit.grpo: eps=-1.0; allowed: > 0"),
        ({"credit.grpo.stats_over": "turns"}, r"credit.grpo: unknown stats_over 'turns'"),
        ({"loss.ppo_clip.clip_low": 1.5}, r"loss.ppo_clip: clip_low=1.5; allowed: in \[0, 1\]"),
        ({"loss.ppo_clip.dual_clip_c": 0.5}, r"loss.ppo_clip: dual_clip_c=0.5; allowed: > 1"),
    ],
)
def test_build__value_out_of_range_names_field_value_and_range(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        experiment.build(_cfg(**overrides))


@pytest.mark.parametrize(
    "name, hparams, pattern",
    [
        ("gigpo", {"gamma": 1.5}, r"credit.gigpo: gamma=1.5; allowed: in \[0, 1\]"),
        ("gigpo", {"invalid_penalty": -0.1}, r"credit.gigpo: invalid_penalty=-0.1; allowed: >= 0"),
        ("ppo_gae", {"lam": -0.5}, r"credit.ppo_gae: lam=-0.5"),
        ("turn_gae", {"turn_gamma": 2.0}, r"credit.turn_gae: turn_gamma=2.0"),
        ("step_gae", {"gamma": -1.0}, r"credit.step_gae: gamma=-1.0"),
        ("mt_grpo", {"eps": 0.0}, r"credit.mt_grpo: eps=0.0; allowed: > 0"),
        ("turn_return", {"norm": "std"}, r"credit.turn_return: unknown norm 'std'"),
        ("empg", {"zeta": -1.0}, r"credit.empg: zeta=-1.0; allowed: >= 0"),
        ("reinforce_pp", {"gamma": 1.01}, r"credit.reinforce_pp: gamma=1.01"),
        ("opo", {"length": "chars"}, r"credit.opo: unknown length 'chars'"),
    ],
)
def test_credit_validate__refuses_out_of_range_values(name, hparams, pattern):
    with pytest.raises(ValueError, match=pattern):
        credit.validate(name, hparams)


def test_credit_validate__eps_is_checked_only_where_the_std_divides():
    for name, hparams in [
        ("grpo", {"scale": "none"}),
        ("gigpo", {"mode": "mean_norm"}),
        ("turn_return", {"norm": "none"}),
    ]:
        assert credit.validate(name, {**hparams, "eps": 0.0})["eps"] == 0.0
    for name, hparams in [
        ("grpo", {"scale": "batch"}),
        ("gigpo", {"mode": "mean_std_norm"}),
        ("turn_return", {"norm": "group"}),
    ]:
        with pytest.raises(ValueError, match=rf"credit.{name}: eps=0.0; allowed: > 0"):
            credit.validate(name, {**hparams, "eps": 0.0})


@pytest.mark.parametrize(
    "name, hparams, pattern",
    [
        ("gspo", {"clip_high": -1e-4}, r"loss.gspo: clip_high=-0.0001; allowed: >= 0"),
        ("gspo", {"sequence": "episode"}, r"loss.gspo: unknown GSPO sequence 'episode'"),
        ("cispo", {"ratio_high": 0.0}, r"loss.cispo: ratio_high=0.0; allowed: > 0 or None"),
        ("cispo", {"ratio_low": 2.0, "ratio_high": 1.0}, r"loss.cispo: .*ratio_low <= ratio_high"),
        (
            "reinforce",
            {"agg": "seq-mean-token-sum-norm", "agg_scale": -2.0},
            r"loss.reinforce: agg_scale=-2.0; allowed: > 0 or None",
        ),
    ],
)
def test_loss_validate__refuses_out_of_range_values(name, hparams, pattern):
    with pytest.raises(ValueError, match=pattern):
        losses.validate(name, hparams)


def test_build__value_clip_none_turns_value_clipping_off():
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rl4agents.train import objective

    # rows of random tokens, not a rollout's groups: no prompt shared within a group
    exp = experiment.build(
        _cfg(
            **{
                "credit.name": "ppo_gae",
                "model.value_head": "shared",
                "model.num_layers": 1,
                "train.share_prompt": False,
                "loss.value_clip": None,
            }
        )
    )
    off = exp.step_cfg
    assert off.loss.value_clip is None and off.loss.agg == "token-mean"
    on = dataclasses.replace(off, loss=dataclasses.replace(off.loss, value_clip=0.5))
    params = exp.init_state(jax.random.key(0)).params
    # a non-zero value projection (it starts at 0), so that the values differ between slots
    params = jax.tree.map(lambda x: x + 0.05 if x.ndim == 2 and x.shape[1] == 1 else x, params)
    b, t = 2, 6
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, exp.model_cfg.vocab_size)
    valid = jnp.ones((b, t), bool)
    action = jnp.broadcast_to(jnp.arange(t) >= 2, (b, t))  # two prompt slots, two turns of 2
    values = rollout_lib.score_params(
        off.graphdef, params, tokens, valid, off.rollout.temperature, True
    ).values
    assert float(jnp.abs(values).max()) > 1e-3
    # V_old is 1 above V, farther than the clip range 0.5; the return R is d below V
    d = jnp.linspace(0.1, 0.4, b * t).reshape(b, t)
    zeros = jnp.zeros((b, t), jnp.float32)
    batch = objective.Batch(
        tokens=tokens,
        valid_mask=valid,
        action_mask=action,
        logp_old=zeros,
        advantages=zeros,
        returns=values - d,
        values_old=values + 1.0,
        logp_ref=zeros,
        weights=jnp.ones((b, t), jnp.float32),
        obs_target=~action,
        turn_ids=jnp.broadcast_to(jnp.asarray([-1, -1, 0, 0, 1, 1], jnp.int32), (b, t)),
    )
    d_act = np.asarray(d)[np.asarray(action)]
    for cfg, clipped in ((off, False), (on, True)):
        _, m = jax.jit(lambda p, bt, cfg=cfg: objective.loss_fn(p, bt, cfg))(params, batch)
        # unclipped: 0.5 mean (V - R)^2 = 0.5 mean d^2; clipped: V_clip = V_old - 0.5 = V + 0.5
        # on every action token, so 0.5 mean (0.5 + d)^2, and every token counts as clipped
        want = 0.5 * np.mean(((0.5 if clipped else 0.0) + d_act) ** 2)
        np.testing.assert_allclose(float(m["value_loss"]), want, rtol=1e-5)
        assert float(m["vf_clipfrac"]) == (1.0 if clipped else 0.0)


def test_validate__every_variant_accepts_its_reference_defaults():
    for name in credit.names():
        assert credit.validate(name) == credit.defaults(name)
    for name in losses.names():
        assert losses.validate(name) == losses.defaults(name)


def test_check_range__boundaries_types_and_tracers():
    import jax
    import numpy as np

    from rl4agents.checks import check_range

    check_range("g", 0.0, 0.0, 1.0)  # closed bounds include their ends
    check_range("g", 1, 0.0, 1.0)
    check_range("g", np.float32(0.5), 0.0, 1.0)
    check_range("c", None, 1.0, low_open=True, allow_none=True)
    for bad in (True, "0.5", float("inf"), None):
        with pytest.raises(ValueError, match=r"g=.*; allowed: (a finite number )?in \[0, 1\]"):
            check_range("g", bad, 0.0, 1.0)
    # A non-finite value is named as such: "inf; allowed: > 0" would read as allowed.
    with pytest.raises(ValueError, match=r"^t=inf; allowed: a finite number > 0$"):
        check_range("t", float("inf"), 0.0, low_open=True)
    with pytest.raises(ValueError, match=r"^t=nan; allowed: a finite number$"):
        check_range("t", float("nan"))
    with pytest.raises(ValueError, match=r"^n=4294967296; allowed: in \[0, 4294967295\]$"):
        check_range("n", 2**32, 0, 2**32 - 1)  # whole-number bounds in full, not 4.29497e+09
    with pytest.raises(ValueError, match=r"eps=0.0; allowed: > 0$"):
        check_range("eps", 0.0, 0.0, low_open=True)
    with pytest.raises(ValueError, match=r"b=1; allowed: < 1$"):
        check_range("b", 1, high=1.0, high_open=True)
    # A hyperparameter vmapped over is a tracer: not checked, not an error.
    out = jax.vmap(lambda g: (check_range("g", g, 0.0, 1.0), g * 2)[1])(np.array([0.5, 2.0]))
    np.testing.assert_allclose(out, [1.0, 4.0])


def test_config__misspelt_key_is_rejected():
    c = frozen_lake.get_config()
    with pytest.raises(AttributeError, match="lrr"):
        c.optim.lrr = 1.0


def test_config__unknown_variant_field_is_rejected():
    c = frozen_lake.get_config()
    c.unlock()
    c.credit.grpo.epsilon = 1e-4
    c.lock()
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['epsilon'\].*allowed fields"):
        experiment.build(c)


def test_config__every_registered_variant_has_a_section():
    c = base.get_config()
    for name in credit.names():
        assert name in c.credit
    for name in losses.names():
        assert name in c.loss
    for name in envs.names():
        assert name in c.env


def test_cli__misspelt_override_fails_with_suggestion(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "scripts/train.py",
            "--config=configs/frozen_lake.py",
            f"--workdir={tmp_path}",
            "--config.optim.lrr=1e-3",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr
    # One line naming the override, the key, the suggestion and the section's keys.
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(
        "error: unknown config key 'optim.lrr' (from --config.optim.lrr=1e-3)"
    )
    assert "did you mean 'optim.lr'" in lines[0] and "allowed in 'optim': ['b1'" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing written


def test_mesh__bad_shape_fails():
    with pytest.raises(ValueError, match=r"mesh.shape=\(16, 1, 1\) needs 16 devices"):
        sharding.make_mesh(("data", "fsdp", "tensor"), (16, 1, 1))


def test_frozen_lake_sft_variant__the_quickstart_recipe():
    c = frozen_lake.get_config("sft")
    assert c.credit.name == "grpo" and c.init.count_wall
    assert (c.sft.num_demos, c.sft.steps, c.optim.lr, c.loss.entropy_coef) == (2048, 600, 1e-4, 0)
    assert c.loss.kl_coef > 0  # anchored to the cloned policy
    assert frozen_lake.get_config().init.count_wall is False


ENV_CONFIGS = (
    "countdown",
    "frozen_lake",
    "guess_number",
    "household",
    "maze",
    "search_qa",
    "sokoban",
    "terminal",
    "two_agent",
    "web_shop",
    "wordle",
)


@pytest.mark.parametrize("name", ENV_CONFIGS)
def test_env_configs__every_critic_variant_gets_a_value_head(name):
    """`configs/<env>.py:<variant>` selects a value head from the variant's registry entry
    (`needs_values`), so every critic estimator builds, not only ppo_gae."""
    for variant in credit.names():
        c = config_utils.load_config_file(f"configs/{name}.py:{variant}")
        assert (c.model.value_head != "none") == credit.requires_values(variant), variant
    experiment.build(config_utils.load_config_file(f"configs/{name}.py:turn_gae"), check_only=True)


def test_resolve__one_reader_of_the_config():
    """`resolve` returns every piece a run needs; `build` and the memory estimate use it."""
    c = frozen_lake.get_config()
    run = resolve.resolve(c, check_only=True)
    assert run.backend == "jax" and run.step_cfg is None and run.mesh is None
    assert run.layout == rollout_lib.make_layout(run.env, run.rollout_cfg)
    assert run.model_cfg.vocab_size == run.tokenizer.vocab_size
    est = memory.estimate(run, {"data": 1, "fsdp": 1, "tensor": 1})
    assert est.num_params == memory.num_params(run.model_cfg)
