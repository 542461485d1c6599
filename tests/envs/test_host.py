"""Host text environments: slot layout, log-probs, one compile, failures, training, TextArena."""

import dataclasses
import functools
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

from rl4agents import text
from rl4agents.envs import host
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import host as host_rollout
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment, host_run, resolve
from rl4agents.train import state as state_lib

WORDS = ("<pad>", "<bos>", "<eoa>", "<unk>", "\n", "up", "down", "you", "are", "at", "goal")
TOK = text.BuiltinTokenizer(words=WORDS + tuple("0123456789"))
CFG = rollout_lib.RolloutConfig(num_tasks=4, group_size=2, max_turns=4, max_action_len=3)
NUM_STEPS = 3  # a walk ends after this many steps
TIMEOUT_S = 0.3
PENALTY = -1.0


class Walk:
    """Position on a line; "up" moves up. Reward: the share of "up" words in the action."""

    def reset(self, seed):
        self.pos, self.t = seed % 7, 0
        return f"you are at {self.pos}"

    def step(self, action):
        self.t += 1
        words = action.split()
        self.pos += words[:1] == ["up"]
        reward = words.count("up") / max(len(words), 1)
        obs = f"you are at {self.pos}" + (" goal" if self.t >= NUM_STEPS else "")
        return obs, reward, self.t >= NUM_STEPS, {"valid_action": words[:1] in (["up"], ["down"])}


class LongWalk(Walk):
    """A gymnasium-style 5-tuple walk whose observations overflow the O slots."""

    def step(self, action):
        obs, reward, done, info = super().step(action)
        return obs + " 1 2 3 4 5 6 7 8 9", reward, done, False, info


class RaisesOnTurn1(Walk):
    def step(self, action):
        if self.t == 1:
            raise RuntimeError("simulator crashed")
        return super().step(action)


class SleepsOnTurn1(Walk):
    def step(self, action):
        if self.t == 1:
            time.sleep(10 * TIMEOUT_S)
        return super().step(action)


class RaisesOnReset(Walk):
    def reset(self, seed):
        raise OSError("no such game")


def _pool(*classes, **kw):
    kw = {"max_prompt_len": 6, "max_obs_len": 6, "step_timeout_s": TIMEOUT_S, **kw}
    return host.HostPool(lambda task: classes[task](), failure_reward=PENALTY, **kw)


@functools.lru_cache
def _model():
    # The tiny preset, narrowed: compile time dominates these tests on a CPU.
    model_cfg = policy_lib.make_config("tiny", TOK.vocab_size, d_model=32, num_layers=1, d_ff=64)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))
    return model_cfg, graphdef, params


@functools.lru_cache
def _faulty_rollout(seed=0):
    _, graphdef, params = _model()
    with _pool(Walk, LongWalk, RaisesOnTurn1, SleepsOnTurn1) as pool:
        return host_rollout.host_rollout_info(
            jax.random.key(seed), graphdef, params, pool, TOK, CFG
        )


def test_sample_turn__compiles_once_for_all_turns():
    _, graphdef, params = _model()
    host_rollout.sample_turn.clear_cache()  # this file's first test: nothing to lose
    host_rollout.prefill_prompt.clear_cache()
    with _pool(Walk, Walk, Walk, Walk) as pool:
        for seed in range(2):  # a sampled then a greedy rollout
            cfg = dataclasses.replace(CFG, greedy=bool(seed))
            traj = host_rollout.host_rollout(jax.random.key(seed), graphdef, params, pool, TOK, cfg)
            assert int(np.asarray(traj.turn_valid).sum()) == CFG.batch_size * NUM_STEPS
            assert host_rollout.sample_turn._cache_size() == 1  # K turns, two rollouts: one program
            assert host_rollout.prefill_prompt._cache_size() == 1


def test_host_rollout__fields_well_formed():
    traj, info = _faulty_rollout()
    lay = rollout_lib.make_layout(host.HostSpec(6, 6), CFG)
    b, t, k = CFG.batch_size, lay.length, lay.turns
    assert traj.tokens.shape == (b, t) and traj.turn_rewards.shape == (b, k)
    tok, valid, act, obs = (
        np.asarray(x) for x in (traj.tokens, traj.valid_mask, traj.action_mask, traj.obs_mask)
    )
    assert not np.any(act & obs)
    np.testing.assert_array_equal(valid, act | obs | (np.arange(t) == 0))
    assert np.all(tok[~valid] == TOK.pad_id) and np.all(tok[:, 0] == TOK.bos_id)
    np.testing.assert_array_equal(np.asarray(traj.group_ids), np.arange(b) // CFG.group_size)
    # The samples of a task share its reset seed, hence its prompt.
    np.testing.assert_array_equal(tok[0::2, : lay.prompt], tok[1::2, : lay.prompt])
    assert info.observations[0][0] == f"you are at {info.seeds[0] % 7}"
    blk = lay.action + lay.obs
    for i in range(b):
        for turn in range(k):
            start = lay.prompt + turn * blk
            n = int(act[i, start : start + lay.action].sum())
            assert np.all(act[i, start : start + n]) and not np.any(act[i, start + n : start + blk])
            if n and n < lay.action:
                assert tok[i, start + n - 1] == TOK.eoa_id
            if bool(traj.turn_valid[i, turn]):
                assert n >= 1 and int(traj.turn_end[i, turn]) == start + n - 1
                assert np.all(np.asarray(traj.turn_ids)[i, start : start + n] == turn)
                # The observation slots hold the encoded text (clipped to O).
                ids = TOK.encode(info.observations[i][turn + 1])[: lay.obs]
                np.testing.assert_array_equal(tok[i, start + lay.action :][: len(ids)], ids)
            else:
                assert n == 0 and int(traj.turn_end[i, turn]) == -1
    # Walks end after NUM_STEPS turns; done is absorbing: no tokens or reward afterwards.
    np.testing.assert_array_equal(np.asarray(traj.num_turns)[:4], [NUM_STEPS] * 4)
    assert np.all(np.asarray(traj.done)) and not np.any(np.asarray(traj.truncated))
    assert not np.any(np.asarray(traj.turn_valid)[:, NUM_STEPS:])
    assert np.all(np.asarray(traj.turn_rewards)[:, NUM_STEPS:] == 0)
    np.testing.assert_allclose(traj.outcome_reward, np.asarray(traj.turn_rewards).sum(1))
    # Anchors: the CRC-32 of the observation each turn acted from.
    anchors = np.asarray(traj.anchors)
    assert anchors.dtype == np.uint32
    for i in range(4):
        for turn in range(NUM_STEPS):
            assert anchors[i, turn] == host.text_anchor(info.observations[i][turn])
    # LongWalk's observations overflow the O slots: clipped and flagged; Walk's fit.
    assert np.all(info.obs_clipped[2:4, :NUM_STEPS]) and not np.any(info.obs_clipped[:2])
    assert not np.any(info.prompt_clipped)
    # Actions were decoded with the tokenizer; the env's valid_action flag is recorded.
    for i in range(4):
        for turn, a in enumerate(info.actions[i]):
            expect = a.split()[:1] in (["up"], ["down"])
            assert bool(traj.turn_action_valid[i, turn]) == expect


def test_host_rollout__logp_equals_teacher_forced_pass():
    traj, _ = _faulty_rollout()
    _, graphdef, params = _model()
    scores = rollout_lib.score(nnx.merge(graphdef, params), traj.tokens, traj.valid_mask)
    mask = np.asarray(traj.action_mask)
    assert mask.sum() > 20
    np.testing.assert_allclose(
        np.asarray(scores.logp)[mask], np.asarray(traj.logp_behavior)[mask], atol=1e-5
    )
    assert np.all(np.asarray(traj.logp_behavior)[~mask] == 0)
    ent = np.asarray(traj.entropy_behavior)
    assert np.all(ent[mask] > 0) and np.all(ent[~mask] == 0)


def test_host_rollout__same_key_is_identical():
    a, info_a = _faulty_rollout(0)
    _, graphdef, params = _model()
    with _pool(Walk, LongWalk, RaisesOnTurn1, SleepsOnTurn1) as pool:
        b, info_b = host_rollout.host_rollout_info(
            jax.random.key(0), graphdef, params, pool, TOK, CFG
        )
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert info_a.actions == info_b.actions


def test_host_pool__exception_and_timeout_end_only_their_episode():
    traj, info = _faulty_rollout()
    failed = np.zeros(CFG.batch_size, bool)
    failed[4:] = True  # tasks 2 (raises) and 3 (sleeps past the timeout), 2 samples each
    np.testing.assert_array_equal(info.failed, failed)
    kinds = {f.episode: (f.kind, f.turn) for f in info.failures}
    assert kinds == {4: ("exception", 1), 5: ("exception", 1), 6: ("timeout", 1), 7: ("timeout", 1)}
    assert "simulator crashed" in info.failures[0].message
    rewards, turn_valid = np.asarray(traj.turn_rewards), np.asarray(traj.turn_valid)
    # The failed step is the episode's last turn: penalty, empty observation, done.
    np.testing.assert_array_equal(rewards[4:, 1], PENALTY)
    np.testing.assert_array_equal(np.asarray(traj.num_turns)[4:], 2)
    assert not np.any(turn_valid[4:, 2:]) and np.all(np.asarray(traj.done)[4:])
    assert all(obs[-1] == "" for obs in info.observations[4:])
    assert not np.any(np.asarray(traj.success)[4:])
    # The other episodes ran to their end; the sleeper cost about one timeout, not its sleep.
    np.testing.assert_array_equal(np.asarray(traj.num_turns)[:4], NUM_STEPS)
    assert info.env_seconds < 5 * TIMEOUT_S
    assert info.metrics()["host/failed"] == 0.5


def test_host_pool__reset_failure_gives_an_empty_flagged_episode():
    _, graphdef, params = _model()
    with _pool(RaisesOnReset, Walk, Walk, Walk) as pool:
        traj, info = host_rollout.host_rollout_info(
            jax.random.key(1), graphdef, params, pool, TOK, CFG
        )
    np.testing.assert_array_equal(info.failed, [True, True] + [False] * 6)
    assert {f.turn for f in info.failures} == {-1} and "OSError" in info.failures[0].message
    assert not np.any(np.asarray(traj.action_mask)[:2]) and not np.any(traj.turn_valid[:2])
    assert np.all(np.asarray(traj.valid_mask)[:2].sum(1) == 1)  # BOS only
    np.testing.assert_array_equal(np.asarray(traj.num_turns)[2:], NUM_STEPS)


def test_host_pool__timed_out_worker_is_replaced():
    release = threading.Event()

    class Hangs(Walk):
        def step(self, action):
            release.wait(10)
            return super().step(action)

    pool = host.HostPool(
        lambda task: Hangs() if task == 0 else Walk(),
        max_prompt_len=4,
        max_obs_len=4,
        num_workers=1,
        step_timeout_s=TIMEOUT_S,
    )
    try:
        assert [oc.result.obs for oc in pool.reset([0, 1], [3, 3])] == ["you are at 3"] * 2
        out = pool.step({0: "up", 1: "up"}, turn=0)
        assert out[0].failure.kind == "timeout" and out[1].failure is None
        # The lone worker is still stuck in episode 0's call (for 10 s): its replacement
        # serves this one at once.
        start = time.perf_counter()
        assert pool.step({1: "down"}, turn=1)[1].result.obs == "you are at 4"
        assert time.perf_counter() - start < 3.0
        with pytest.raises(ValueError, match="no live environment"):
            pool.step({0: "up"}, turn=1)  # a failed episode is never stepped again
    finally:
        release.set()
        pool.close()


def test_normalize_step__accepts_gym_shapes_and_rejects_others():
    r = host.normalize_step(("a", 1, False))
    assert r == host.StepResult("a", 1.0, False, False, True)
    r = host.normalize_step(("b", 0.5, True, {"success": True, "invalid_action": True}))
    assert r == host.StepResult("b", 0.5, True, True, False)
    r = host.normalize_step(("c", 0, False, True, {}))  # gymnasium truncation ends it too
    assert r.done
    assert host.normalize_reset(("d", {})).obs == "d"
    for bad in [("a", 1.0), ["a", 1.0, True], (3, 1.0, True), ("a", float("nan"), True)]:
        with pytest.raises((TypeError, ValueError)):
            host.normalize_step(bad)


def test_host_train__update_steps_change_params_with_finite_metrics():
    model_cfg, _, _ = _model()
    pool_ = _pool(Walk, Walk, LongWalk, Walk)
    optim = state_lib.make_optimizer(lr=1e-2)
    step_cfg = resolve.step_config(pool_.spec, model_cfg, CFG, None, optim=optim)
    state = experiment.make_state(model_cfg, step_cfg, jax.random.key(0))
    update_fn = host_run.jit_update(step_cfg)
    before = jax.device_get(state.params)
    advantages = []
    with pool_:
        for _ in range(3):
            state, metrics, info = host_run.host_train_step(
                state, jax.random.key(0), pool_, TOK, step_cfg, update_fn
            )
            assert all(np.isfinite(v) for v in metrics.values()), metrics
            assert not info.failed.any()
            advantages.append(metrics["adv_abs"])
    assert int(state.step) == 3 and max(advantages) > 0
    after = jax.device_get(state.params)
    moved = jax.tree.leaves(jax.tree.map(lambda x, y: np.abs(x - y).max(), before, after))
    assert max(moved) > 1e-4
    assert update_fn._cache_size() == 1


# --------------------------------------------------------------- TextArena (PyPI: textarena)

GAMES = ("GuessTheNumber-v0", "FrozenLake-v0", "TowerOfHanoi-v0")


def test_textarena__adapter_plays_a_game_to_a_win():
    pytest.importorskip("textarena")
    env = host.TextArenaEnv("GuessTheNumber-v0")
    prompt = env.reset(seed=7)
    assert "Guess The Number" in prompt
    again = host.TextArenaEnv("GuessTheNumber-v0")
    assert again.reset(seed=7) == prompt
    r = host.normalize_step(env.step("banana"))  # no number: an invalid move, not the end
    assert not r.valid_action and not r.done and r.reward == 0
    lo, hi = 1, 20
    for _ in range(10):  # binary search on the hints
        guess = (lo + hi) // 2
        r = host.normalize_step(env.step(f"[{guess}]"))
        if r.done:
            break
        assert r.valid_action and r.reward == 0
        if "higher" in r.obs:
            lo = guess + 1
        else:
            assert "lower" in r.obs
            hi = guess - 1
    assert r.done and r.success and r.reward == 1.0 and "Congratulations" in r.obs


def test_textarena__invalid_moves_are_flagged():
    pytest.importorskip("textarena")
    env = host.TextArenaEnv("FrozenLake-v0")
    assert "Frozen Lake" in env.reset(seed=0)
    r = host.normalize_step(env.step("fly away"))
    assert not r.valid_action and not r.done and "invalid" in r.obs
    assert host.bracket_action("[ up ]") == "[up]" and host.bracket_action(" A C ") == "[A C]"


def test_textarena__host_rollout_on_three_games():
    pytest.importorskip("textarena")
    _, graphdef, params = _model()
    cfg = rollout_lib.RolloutConfig(num_tasks=3, group_size=2, max_turns=3, max_action_len=4)
    pool = host.HostPool(
        lambda task: host.TextArenaEnv(GAMES[task]), max_prompt_len=64, max_obs_len=24
    )
    with pool:
        traj, info = host_rollout.host_rollout_info(
            jax.random.key(3), graphdef, params, pool, TOK, cfg
        )
    assert not info.failed.any(), info.failures
    # Each game's prompt came from TextArena, clipped to the prompt block and flagged.
    assert "Guess The Number" in info.observations[0][0]
    assert "Frozen Lake" in info.observations[2][0]
    assert "Tower of Hanoi" in info.observations[4][0]
    assert info.prompt_clipped.all()
    np.testing.assert_array_equal(info.observations[0][0], info.observations[1][0])
    assert np.all(np.asarray(traj.num_turns) >= 1)
    # Random actions are mostly invalid moves; TextArena says so and ends some games.
    assert not np.asarray(traj.turn_action_valid)[np.asarray(traj.turn_valid)].all()
    scores = rollout_lib.score(nnx.merge(graphdef, params), traj.tokens, traj.valid_mask)
    mask = np.asarray(traj.action_mask)
    np.testing.assert_allclose(
        np.asarray(scores.logp)[mask], np.asarray(traj.logp_behavior)[mask], atol=1e-5
    )
    assert np.all(np.isfinite(np.asarray(traj.turn_rewards)))
