"""The benchmark's replica of the peers' jobs, and a smoke run of scripts/bench.py.

Reference strings and ids below were produced by the peers' own `mt_common.py` (gymnasium
1.4.0 FrozenLake-v1, `tokenizers` WordLevel through `PreTrainedTokenizerFast`): for each map,
the first prompt and, for a scripted episode, every `obs_turn_text` with reward, done and
whether the action parsed. If the peer scripts are given (`RL4AGENTS_PEERS_SRC`, the folder
holding `mt_common.py`) their vocabulary and system prompt are compared too.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.rollout import rollout as rollout_lib

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The benchmark's jobs live beside the scripts that run them, as the package `benchlib`; the
# scripts find it on their own folder, so the test puts that folder on the path too (appended:
# nothing there shadows an installed module).
sys.path.append(os.path.join(_REPO, "scripts"))
from benchlib import jobs, peer_lake, peer_single  # noqa: E402

MAPS = [
    ["SFFF", "HHFF", "FHHF", "HFFG"],
    ["SHFH", "FFHF", "FFFF", "FFFG"],
    ["SFHF", "FFFF", "FFFF", "FFFG"],
    ["SHFF", "FHFF", "FFFH", "FFFG"],
]
FIRST_PROMPT_0 = (
    "<sys> you are on a frozen lake grid . reach the goal G and avoid the holes H . P marks you"
    " . answer with one word left down right or up . <user> turn 1 of 8 . you are at row 0 col"
    " 0 . last action none .\nP F F F\nH H F F\nF H H F\nH F F G <asst>"
)
# fmt: off
FIRST_IDS_0 = [
    4, 27, 28, 29, 30, 31, 32, 33, 16, 34, 35, 36, 14, 37, 38, 35, 39, 13, 16, 15, 40, 27, 16,
    41, 42, 43, 44, 7, 8, 9, 45, 10, 16, 5, 46, 18, 47, 25, 16, 27, 28, 48, 49, 17, 50, 17, 16,
    51, 52, 53, 16, 3, 15, 12, 12, 12, 3, 13, 13, 12, 12, 3, 12, 13, 13, 12, 3, 13, 12, 12, 14, 6,
]
OBS_IDS_0_1 = [
    5, 46, 19, 47, 25, 16, 27, 28, 48, 49, 17, 50, 18, 16, 51, 52, 9, 16, 3, 11, 15, 12, 12, 3,
    13, 13, 12, 12, 3, 12, 13, 13, 12, 3, 13, 12, 12, 14, 6,
]
# fmt: on


def _obs(turn, row, col, last, grid):
    return (
        f"<user> turn {turn} of 8 . you are at row {row} col {col} . last action {last} .\n"
        + "\n".join(grid)
        + " <asst>"
    )


# (map, [(action text, reward, done, parsed, next observation or None)]) from mt_common.
EPISODES = [
    (
        0,
        [
            (
                "right",
                0.0,
                False,
                True,
                _obs(2, 0, 1, "right", ["S P F F", "H H F F", "F H H F", "H F F G"]),
            ),
            ("w33 down <eos>", 0.0, True, True, None),
        ],
    ),
    (
        1,
        [
            (
                "down",
                0.0,
                False,
                True,
                _obs(2, 1, 0, "down", ["S H F H", "P F H F", "F F F F", "F F F G"]),
            ),
            (
                "down",
                0.0,
                False,
                True,
                _obs(3, 2, 0, "down", ["S H F H", "F F H F", "P F F F", "F F F G"]),
            ),
            (
                "right",
                0.0,
                False,
                True,
                _obs(4, 2, 1, "right", ["S H F H", "F F H F", "F P F F", "F F F G"]),
            ),
            (
                "right",
                0.0,
                False,
                True,
                _obs(5, 2, 2, "right", ["S H F H", "F F H F", "F F P F", "F F F G"]),
            ),
            (
                "down",
                0.0,
                False,
                True,
                _obs(6, 3, 2, "down", ["S H F H", "F F H F", "F F F F", "F F P G"]),
            ),
            ("right", 1.0, True, True, None),
        ],
    ),
    (
        2,
        [
            (
                "w5 <nl> <user> w9",
                -0.1,
                False,
                False,
                _obs(2, 0, 0, "invalid", ["P F H F"] + ["F F F F"] * 2 + ["F F F G"]),
            ),
            (
                "left",
                0.0,
                False,
                True,
                _obs(3, 0, 0, "left", ["P F H F", "F F F F", "F F F F", "F F F G"]),
            ),
            (
                "up",
                0.0,
                False,
                True,
                _obs(4, 0, 0, "up", ["P F H F", "F F F F", "F F F F", "F F F G"]),
            ),
            (
                "zzz",
                -0.1,
                False,
                False,
                _obs(5, 0, 0, "invalid", ["P F H F", "F F F F", "F F F F", "F F F G"]),
            ),
            (
                "right",
                0.0,
                False,
                True,
                _obs(6, 0, 1, "right", ["S P H F", "F F F F", "F F F F", "F F F G"]),
            ),
            (
                "left",
                0.0,
                False,
                True,
                _obs(7, 0, 0, "left", ["P F H F", "F F F F", "F F F F", "F F F G"]),
            ),
            (
                "up",
                0.0,
                False,
                True,
                _obs(8, 0, 0, "up", ["P F H F", "F F F F", "F F F F", "F F F G"]),
            ),
            ("down", 0.0, True, True, None),
        ],
    ),
]


def _find_mt_common():
    path = os.environ.get("RL4AGENTS_PEERS_SRC", "")
    return path if path and os.path.isfile(os.path.join(path, "mt_common.py")) else None


def test_peer_lake__maps_match_gymnasium_reference():
    assert peer_lake.task_maps() == MAPS


def test_peer_lake__vocabulary_matches_mt_common_if_present():
    path = _find_mt_common()
    if path is None:
        pytest.skip("peer scripts not found")
    sys.path.insert(0, path)
    try:
        import mt_common  # pure Python at import; tokenizers/gymnasium only inside functions
    finally:
        sys.path.remove(path)
    tok = peer_lake.make_tokenizer()
    assert list(tok.words) == list(mt_common.vocab_dict())
    assert peer_lake.SYSTEM == mt_common.SYSTEM
    assert peer_lake.MAX_TURNS == mt_common.MAX_TURNS


def test_peer_lake__episodes_match_mt_common_text_and_rewards():
    env = peer_lake.PeerLake()
    tok = env.tokenizer
    params = env.default_params()
    keys = peer_lake.task_keys(4)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    _, ts = reset(keys[0], params)
    first = [tok.bos_id, *np.asarray(ts.obs_tokens[: ts.obs_len]).tolist()]
    assert first == FIRST_IDS_0
    assert tok.decode(first) == FIRST_PROMPT_0
    assert tok.encode(FIRST_PROMPT_0) == FIRST_IDS_0
    for task, script in EPISODES:
        state, _ = reset(keys[task], params)
        for action, reward, done, parsed, obs_text in script:
            ids = tok.encode(action)
            content = ids[: ids.index(tok.eoa_id)] if tok.eoa_id in ids else ids
            action_tokens = jnp.zeros(16, jnp.int32).at[: len(content)].set(jnp.array(content))
            state, ts = step(jax.random.key(0), state, action_tokens, len(content), params)
            assert float(ts.reward) == pytest.approx(reward)
            assert bool(ts.done) == done and bool(ts.valid_action) == parsed
            obs = np.asarray(ts.obs_tokens[: ts.obs_len]).tolist()
            if obs_text is None:
                assert obs == []
            else:
                assert tok.decode(obs) == obs_text
                assert obs == tok.encode(obs_text)
    _, ts = reset(keys[0], params)
    state, ts = step(
        jax.random.key(0),
        reset(keys[0], params)[0],
        jnp.zeros(16, jnp.int32).at[0].set(tok.id("right")),
        1,
        params,
    )
    assert np.asarray(ts.obs_tokens).tolist() == OBS_IDS_0_1


def test_peer_lake__rollout_layout_matches_peer_context():
    env = peer_lake.PeerLake()
    cfg = rollout_lib.RolloutConfig(num_tasks=4, group_size=8, max_turns=8, max_action_len=16)
    lay = rollout_lib.make_layout(env, cfg)
    # <sys> SYSTEM <user> OBS <asst> = 72 tokens; each later turn adds <user> OBS <asst> = 39.
    assert (lay.prompt, lay.obs, lay.action, lay.turns) == (72, 39, 16, 8)


def test_random_prompt__reward_counts_target_and_end_token():
    env = peer_single.RandomPrompt(max_completion=8, eos=True)
    state, ts = env.reset(jax.random.key(0), env.default_params())
    assert ts.obs_len == 63 and int(ts.obs_tokens.min()) >= peer_single.FIRST_WORD
    tokens = jnp.array([7, 7, 9, 0, 0, 0, 0, 0], jnp.int32)
    _, ts = env.step(None, state, tokens, jnp.int32(3), None)  # 3 tokens then <eos>: 2 / 4
    assert float(ts.reward) == pytest.approx(0.5) and bool(ts.done)
    _, ts = env.step(None, state, jnp.full((8,), 7, jnp.int32), jnp.int32(8), None)
    assert float(ts.reward) == pytest.approx(1.0)


def test_env_throughput__reports_rates():
    env = peer_lake.PeerLake()
    env.num_actions = 4
    env.action_tokens = lambda a: np.array([env.tokenizer.id(peer_lake.ACTIONS[a])], np.int32)
    out = jobs.env_throughput(env, num_envs=8, num_steps=2, repeats=1, key=jax.random.key(0))
    assert out["steps_per_s"] > 0 and out["resets_per_s"] > 0


@pytest.mark.slow  # about 35 s on a loaded 2-core CPU (compiles a rollout and a train step)
def test_bench_script__quick_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(_REPO, "scripts/bench.py"), "--quick", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train step: steady state" in proc.stdout
    assert out.exists()
