"""scripts/show_episodes.py: decoding a trajectory into text (a hand-built episode, and the
rollout's episodes against a replay of the environment), and its one-line flag errors."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import base
from rl4agents import text, types
from rl4agents.train import experiment
from tests import scripts

show = scripts.load_script("show_episodes")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _trajectory(tok: text.BuiltinTokenizer) -> types.Trajectory:
    """One frozen_lake-like episode of K = 2 turns in slots P = 6, A = 2, O = 3 (T = 16).

    Prompt "P _ / _ G"; turn 1: the action "ju" fills both action slots without
    end-of-action, is invalid, reward -0.05, observation "invalid action"; turn 2: "down" then
    end-of-action, valid, reward 1, observation "you won"; solved.
    """
    w = tok.encode
    pad, eoa = tok.pad_id, tok.eoa_id
    prompt = [tok.bos_id, *w("P _\n_ G")]
    turn1 = [*w("ju"), *w("invalid action"), pad]
    turn2 = [*w("down"), eoa, *w("you won"), pad]
    tokens = np.array([prompt + turn1 + turn2], np.int32)
    valid = tokens != pad
    action = np.zeros_like(valid)
    action[0, [6, 7, 11, 12]] = True
    obs = valid & ~action
    turn_ids = np.full(tokens.shape, -1, np.int32)
    turn_ids[0, 6:11], turn_ids[0, 11:16] = 0, 1
    turn_ids[~valid] = -1
    zeros = np.zeros(tokens.shape, np.float32)
    rewards = np.array([[-0.05, 1.0]], np.float32)
    return types.Trajectory(
        tokens=tokens,
        valid_mask=valid,
        action_mask=action,
        obs_mask=obs,
        turn_ids=turn_ids,
        turn_end=np.array([[7, 12]], np.int32),
        logp_behavior=zeros,
        turn_rewards=rewards,
        turn_valid=np.array([[True, True]]),
        turn_action_valid=np.array([[False, True]]),
        anchors=np.zeros((1, 2), np.uint32),
        outcome_reward=rewards.sum(1),
        success=np.array([True]),
        done=np.array([True]),
        truncated=np.array([False]),
        group_ids=np.zeros((1,), np.int32),
        num_turns=np.array([2], np.int32),
    )


def test_format__hand_built_episode_reads_as_written():
    tok = text.BuiltinTokenizer()
    (ep,) = show.decode_episodes(_trajectory(tok), tok)
    assert ep.turns[0] == show.Turn("j u", False, False, pytest.approx(-0.05), "invalid action")
    assert ep.turns[1] == show.Turn("down", True, True, 1.0, "you won")
    assert show.format_episode(ep, "episode 1: task 0", max_turns=2) == (
        "=== episode 1: task 0 ===\n"
        "prompt:\n"
        "    P _\n"
        "    _ G\n"
        "turn 1: action 'j u' (no end-of-action: cut at the budget) INVALID reward -0.05\n"
        "  observation:\n"
        "    invalid action\n"
        "turn 2: action 'down' valid reward +1.00\n"
        "  observation:\n"
        "    you won\n"
        "outcome: success, return +0.95, 2 of 2 turns, ended by the environment"
    )


def _tiny_config():
    c = base.get_config()
    c.unlock()
    c.env.name = "frozen_lake"
    c.env.vocab = "minimal"
    c.model.num_layers = 1
    c.rollout.num_tasks = 8
    c.rollout.max_turns = 4
    c.rollout.max_action_len = 1  # a random token: a move word (valid) or another (invalid)
    c.train.eval_tasks = 8
    c.log.progress = False
    c.lock()
    return c


@pytest.mark.parametrize("greedy", [True, False])
def test_episodes__match_a_replay_of_the_environment(greedy):
    # A random 1-layer policy: its episodes, decoded, against the environment's own reset and
    # steps on the same task keys, fed the same action tokens and decoded with its tokenizer.
    exp = experiment.build(_tiny_config())
    params = exp.init_state(jax.random.key(0)).params
    num, seed = 8, 7
    traj, _ = show.play(exp, params, "test", num, greedy, 1.0, seed)
    eps = show.decode_episodes(traj, exp.env.tokenizer, num)
    env, env_params = exp.env.make_split("test")
    tok = env.tokenizer
    root = jax.random.key(seed)
    task_keys = jax.random.split(jax.random.fold_in(root, 0), traj.tokens.shape[0])
    key_env = jax.random.split(jax.random.fold_in(root, 1), 3)[2]
    t = jax.device_get(traj)
    kinds = set()
    for b, ep in enumerate(eps):
        state, ts = env.reset(task_keys[b], env_params)
        assert ep.prompt == tok.decode(np.asarray(ts.obs_tokens)[: int(ts.obs_len)])
        total, done = 0.0, False
        for k, turn in enumerate(ep.turns):
            act = t.tokens[b][t.action_mask[b] & (t.turn_ids[b] == k)]
            act = act[act != tok.eoa_id]
            assert turn.action == tok.decode(act)
            padded = np.full((exp.rollout_cfg.max_action_len,), tok.pad_id, np.int32)
            padded[: act.size] = act
            key = jax.random.split(jax.random.fold_in(key_env, k), traj.tokens.shape[0])[b]
            state, ts = env.step(key, state, padded, np.int32(act.size), env_params)
            assert turn.valid == bool(ts.valid_action)
            assert turn.reward == pytest.approx(float(ts.reward))
            assert turn.observation == tok.decode(np.asarray(ts.obs_tokens)[: int(ts.obs_len)])
            total, done = total + float(ts.reward), bool(ts.done)
            kinds.add(turn.valid)
        assert ep.reward == pytest.approx(total) and ep.done == done
        assert done or len(ep.turns) == 4  # an episode the env did not end ran every turn
    assert kinds == {True, False} or greedy  # a random policy's sampled play: both kinds
    # The same tasks and outcomes as the evaluation's per-task rows (greedy is deterministic).
    if greedy:
        outcome = exp.task_outcomes_fn("test", 8)(params, seed)
        np.testing.assert_array_equal(
            np.asarray(outcome["greedy_success"])[:num], [float(ep.success) for ep in eps]
        )


def test_episodes_text__header_episodes_and_count():
    exp = experiment.build(_tiny_config())
    params = exp.init_state(jax.random.key(0)).params
    out = show.episodes_text(exp, params, "test", 2, False, 0.5, 3)
    assert out.startswith("# frozen_lake, test split, sampled at temperature 0.5, seed 3\n\n")
    assert out.count("=== episode ") == 2 and "=== episode 2: task 1 ===" in out
    assert out.rstrip().split("\n")[-1].startswith("# solved ")


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--config=configs/frozen_lake.py", "--num=0"], "--num=0; allowed: >= 1"),
        (
            ["--config=configs/frozen_lake.py", "--greedy", "--temperature=0.5"],
            "--temperature=0.5 with --greedy; allowed: one of the two",
        ),
        (["--config=configs/frozen_lake.py", "--temperature=-1"], "a finite number > 0"),
        (["--workdir=runs/x", "--params=runs/y"], "--workdir='runs/x' with --params"),
        ([], "no policy given; allowed: --config=FILE[:ARG] or --workdir=DIR"),
        (["--config=configs/frozen_lake.py", "--split=dev"], "--split='dev'; allowed: one of"),
    ],
)
def test_bad_flag__one_line_exit_2(flags, message):
    r = subprocess.run(
        [sys.executable, "scripts/show_episodes.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert message in r.stderr
