"""Plain-loop NumPy references of the credit estimators, written from docs/methods.md.

Independent of `rl4agents.credit`: float64, Python loops, one formula per line. Steps on the
slot layout (docs/methods.md, "The slot layout and step rows"): a step is a valid turn
`(b, k)`; its action tokens are `action_mask & (turn_ids == k)`; `turn_end[b, k]` is the slot
of its last action token.
Every function returns f64[B, T] advantages (and returns where the estimator has them).
"""

from __future__ import annotations

import math

import numpy as np

WHITEN_EPS = 1e-8


def _np(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def trainable(traj, b: int) -> bool:
    """The episode has an action token; one without is in no group or batch statistic."""
    return bool(np.asarray(traj.action_mask)[b].any())


def valid_turns(traj, b: int) -> list[int]:
    return [k for k in range(traj.turn_valid.shape[1]) if bool(traj.turn_valid[b, k])]


def steps(traj) -> list[tuple[int, int]]:
    """All valid (episode, turn) rows in order."""
    return [(b, k) for b in range(traj.batch_size) for k in valid_turns(traj, b)]


def turn_slots(traj, b: int, k: int) -> list[int]:
    mask, ids = np.asarray(traj.action_mask), np.asarray(traj.turn_ids)
    return [t for t in range(mask.shape[1]) if mask[b, t] and ids[b, t] == k]


def mean(xs) -> float:
    return sum(xs) / len(xs)


def std1(xs) -> float:
    """Unbiased (ddof=1) standard deviation; 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    mu = mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def zscore(x: float, members: list[float], eps: float) -> float:
    """`(x - mean) / (std + eps)` over `members`; a group of one gives 0."""
    if len(members) == 1:
        return 0.0
    return (x - mean(members)) / (std1(members) + eps)


def scores(traj) -> list[float]:
    """`s_i = outcome_reward_i - sum_t token_penalty_{i,t}` (just the outcome without one)."""
    out = _np(traj.outcome_reward)
    if traj.token_penalty is not None:
        out = out - _np(traj.token_penalty).sum(1)
    return [float(x) for x in out]


def masked_whiten(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """verl `masked_whiten` over all masked entries, result multiplied by the mask."""
    xs = [x[idx] for idx in zip(*np.nonzero(mask), strict=True)]
    n = len(xs)
    mu = sum(xs) / (n + WHITEN_EPS)
    var = sum((v - mu) ** 2 for v in xs) / (n + WHITEN_EPS) * n / (n - 1)
    return (x - mu) / math.sqrt(var + WHITEN_EPS) * mask


def per_episode_to_tokens(traj, values) -> np.ndarray:
    out = np.zeros(traj.tokens.shape)
    mask = np.asarray(traj.action_mask)
    for b in range(traj.batch_size):
        out[b, mask[b]] = values[b]
    return out


def per_turn_to_tokens(traj, table: dict) -> np.ndarray:
    out = np.zeros(traj.tokens.shape)
    for (b, k), v in table.items():
        for t in turn_slots(traj, b, k):
            out[b, t] = v
    return out


def token_rewards(traj, placement: str) -> np.ndarray:
    """`"turn"`: turn k's reward at turn_end[b, k]; `"outcome"`: outcome at the last turn end."""
    turn_end = np.asarray(traj.turn_end)
    rewards = np.zeros(traj.tokens.shape)
    for b in range(traj.batch_size):
        ends = [k for k in valid_turns(traj, b) if turn_end[b, k] >= 0]
        if placement == "turn":
            for k in ends:
                rewards[b, turn_end[b, k]] += float(traj.turn_rewards[b, k])
        elif ends:
            rewards[b, turn_end[b, ends[-1]]] += float(traj.outcome_reward[b])
    return rewards


def penalised_token_rewards(traj, placement: str) -> np.ndarray:
    rewards = token_rewards(traj, placement)
    if traj.token_penalty is not None:
        rewards = rewards - _np(traj.token_penalty)
    return rewards


# ---------------------------------------- docs/methods.md, "Outcome-level, critic-free estimators"


def grpo(traj, eps=1e-6, scale="group", singleton_policy="raw", stats_over="trajectories"):
    """docs/methods.md, `grpo`; "steps" weights each score by its number of valid turns."""
    s, gids = scores(traj), [int(g) for g in np.asarray(traj.group_ids)]
    n = len(s)
    if stats_over == "steps":
        w = [len(valid_turns(traj, b)) * trainable(traj, b) for b in range(n)]
    else:
        w = [int(trainable(traj, b)) for b in range(n)]

    def stats(members):
        total = sum(w[j] for j in members)
        mu = sum(w[j] * s[j] for j in members) / total
        var = sum(w[j] * (s[j] - mu) ** 2 for j in members) / (total - 1)
        return mu, math.sqrt(var)

    w_batch = [int(trainable(traj, b)) for b in range(n)]  # one sample per episode
    everyone = [b for b in range(n) if w_batch[b]]
    batch_std = std1([s[b] for b in everyone])
    adv = []
    for i in range(n):
        if not trainable(traj, i):
            adv.append(0.0)
            continue
        members = [j for j in range(n) if gids[j] == gids[i]]
        k_is_singleton = sum(w[j] for j in members) <= 1
        if k_is_singleton:
            if singleton_policy == "zero":
                adv.append(0.0)
                continue
            mu, sd = 0.0, 1.0
        else:
            mu, sd = stats(members)
        denom = {"group": sd + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        if k_is_singleton and scale == "batch":  # a singleton keeps its own std of 1
            denom = sd + eps
        adv.append((s[i] - mu) / denom)
    return per_episode_to_tokens(traj, adv)


def dr_grpo(traj, singleton_policy="raw", stats_over="trajectories"):
    """docs/methods.md, `dr_grpo`: `s - mean_g` (the group std is not used)."""
    return grpo(traj, 0.0, "none", singleton_policy, stats_over)


def rloo(traj):
    """docs/methods.md, `rloo`: `s_i - mean_{j != i} s_j`; a group of one keeps the raw score."""
    s, gids = scores(traj), list(np.asarray(traj.group_ids))
    adv = []
    for i in range(len(s)):
        others = [
            s[j] for j in range(len(s)) if gids[j] == gids[i] and j != i and trainable(traj, j)
        ]
        adv.append(s[i] - mean(others) if others else s[i])
    return per_episode_to_tokens(traj, adv)


def opo(traj, length="tokens", singleton_policy="raw"):
    """docs/methods.md, `opo`: `s_i - sum_g L_j s_j / sum_g L_j`; L = action tokens or turns."""
    s, gids = scores(traj), list(np.asarray(traj.group_ids))
    mask = np.asarray(traj.action_mask)
    if length == "tokens":
        lengths = [int(mask[b].sum()) for b in range(len(s))]
    else:
        lengths = [len(valid_turns(traj, b)) for b in range(len(s))]
    adv = []
    for i in range(len(s)):
        members = [j for j in range(len(s)) if gids[j] == gids[i] and trainable(traj, j)]
        if len(members) <= 1:
            adv.append(s[i] if singleton_policy == "raw" else 0.0)
            continue
        total = sum(lengths[j] for j in members)
        base = sum(lengths[j] * s[j] for j in members) / total if total else 0.0
        adv.append(s[i] - base)
    return per_episode_to_tokens(traj, adv)


def reinforce_pp(traj, gamma=1.0, reset_on="seq_end", reward_placement="outcome"):
    """docs/methods.md, `reinforce_pp`; returns (advantages, returns G on action tokens)."""
    mask = np.asarray(traj.action_mask)
    r = penalised_token_rewards(traj, reward_placement)
    g = np.zeros(r.shape)
    for b in range(r.shape[0]):
        running = 0.0
        for t in reversed(range(r.shape[1])):
            if reset_on == "mask":  # verl: write, then multiply the running return by m_t
                running = r[b, t] + gamma * running
                g[b, t] = running
                running *= float(mask[b, t])
            elif mask[b, t]:  # "seq_end": discount per action token, carry across the rest
                running = r[b, t] + gamma * running
                g[b, t] = running
    return masked_whiten(g, mask), g * mask


def reinforce_pp_baseline(traj, singleton_policy="raw"):
    """docs/methods.md, `reinforce_pp_baseline`: `s - mean_g` on action tokens, then whitened."""
    centred = grpo(traj, 0.0, "none", singleton_policy)
    return masked_whiten(centred, np.asarray(traj.action_mask))


def remax(traj, reward_placement="outcome"):
    """docs/methods.md, `remax`: reverse cumsum of masked token rewards minus the greedy score."""
    mask = np.asarray(traj.action_mask)
    r = penalised_token_rewards(traj, reward_placement)
    base = _np(traj.baseline_reward)
    returns = np.zeros(r.shape)
    for b in range(r.shape[0]):
        acc = 0.0
        for t in reversed(range(r.shape[1])):
            acc += r[b, t] * mask[b, t]
            returns[b, t] = acc
    return (returns - base[:, None]) * mask, returns * mask


# ------------------------------------------------------ docs/methods.md, "Critic-based estimators"


def ppo_gae(traj, values, gamma=1.0, lam=1.0, whiten=True, reward_placement="turn"):
    """docs/methods.md, `ppo_gae`: token GAE over action tokens; rewards minus token_penalty."""
    mask, v = np.asarray(traj.action_mask), _np(values)
    r = penalised_token_rewards(traj, reward_placement)
    adv = np.zeros(v.shape)
    for b in range(v.shape[0]):
        next_v, gae = 0.0, 0.0
        for t in reversed([t for t in range(v.shape[1]) if mask[b, t]]):
            gae = r[b, t] + gamma * next_v - v[b, t] + gamma * lam * gae
            next_v = v[b, t]
            adv[b, t] = gae
    returns = (adv + v) * mask
    return (masked_whiten(adv, mask) if whiten else adv * mask), returns


def turn_gae(traj, values, gamma=1.0, lam=1.0, turn_gamma=0.95, whiten=True):
    """docs/methods.md, `turn_gae` (RAGEN bi-level GAE) with explicit turn ends."""
    mask, v = np.asarray(traj.action_mask), _np(values)
    turn_end = np.asarray(traj.turn_end)
    adv, ret = np.zeros(v.shape), np.zeros(v.shape)
    for b in range(v.shape[0]):
        ks = [k for k in valid_turns(traj, b) if turn_end[b, k] >= 0]
        ends = [int(turn_end[b, k]) for k in ks]
        reward = np.zeros(v.shape[1])
        high = 0.0  # high level: one step per turn end, discount turn_gamma
        for i in reversed(range(len(ks))):
            next_v = v[b, ends[i + 1]] if i + 1 < len(ks) else 0.0
            delta = float(traj.turn_rewards[b, ks[i]]) + turn_gamma * next_v - v[b, ends[i]]
            high = delta + turn_gamma * lam * high
            reward[ends[i]] = high + v[b, ends[i]]
        slots = [t for t in range(v.shape[1]) if mask[b, t]]
        low = 0.0  # low level: token GAE restarting at every turn end
        for i in reversed(range(len(slots))):
            t = slots[i]
            if t in ends:
                next_v, low = 0.0, 0.0
            else:
                next_v = v[b, slots[i + 1]]
            delta = reward[t] + gamma * next_v - v[b, t]
            low = delta + gamma * lam * low
            adv[b, t] = low
            ret[b, t] = low + v[b, t]
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv * mask, ret * mask


def step_gae(traj, values, gamma=1.0, lam=1.0, whiten=True):
    """docs/methods.md, `step_gae` (StepPO): GAE over valid turns, whitened over steps."""
    v = _np(values)
    penalty = np.zeros(v.shape) if traj.token_penalty is None else _np(traj.token_penalty)
    a_table, r_table = {}, {}
    for b in range(traj.batch_size):
        ks = valid_turns(traj, b)
        vk = {k: v[b, turn_slots(traj, b, k)[0]] for k in ks}
        next_v, gae = 0.0, 0.0
        for k in reversed(ks):
            # r_k = sum of the turn's token rewards: its turn reward minus its token penalties
            r_k = float(traj.turn_rewards[b, k]) - sum(
                penalty[b, t] for t in turn_slots(traj, b, k)
            )
            delta = r_k + gamma * next_v - vk[k]
            gae = delta + gamma * lam * gae
            a_table[b, k], r_table[b, k] = gae, gae + vk[k]
            next_v = vk[k]
    if whiten:
        xs = list(a_table.values())
        mu, sd = mean(xs), std1(xs)
        a_table = {key: (x - mu) / (sd + WHITEN_EPS) for key, x in a_table.items()}
    return per_turn_to_tokens(traj, a_table), per_turn_to_tokens(traj, r_table)


# ------------------------------------------------------------------------ docs/methods.md, `gigpo`


def gigpo(
    traj,
    gamma=0.95,
    omega=1.0,
    mode="mean_norm",
    stats_over="steps",
    invalid_penalty=0.1,
    eps=1e-6,
):
    """docs/methods.md, `gigpo`, on valid turns; the penalty hits the score and the step return."""
    gids, anchors = np.asarray(traj.group_ids), np.asarray(traj.anchors)
    rows = steps(traj)
    penalty = {
        (b, k): invalid_penalty * (1.0 - float(traj.turn_action_valid[b, k])) for b, k in rows
    }
    score = {(b, k): float(traj.outcome_reward[b]) - penalty[b, k] for b, k in rows}
    ret = {}
    for b in range(traj.batch_size):
        acc = 0.0
        for k in reversed(valid_turns(traj, b)):
            acc = float(traj.turn_rewards[b, k]) + gamma * acc
            ret[b, k] = acc  # discounted before the penalty (step 1, then step 2)
    ret = {key: ret[key] - penalty[key] for key in rows}

    def normalise(x, members, singleton_mean):
        if len(members) == 1:
            mu, sd = singleton_mean, 1.0
        else:
            mu, sd = mean(members), std1(members)
        return (x - mu) / (sd + eps) if mode == "mean_std_norm" else x - mu

    out = {}
    for b, k in rows:
        if stats_over == "steps":
            episode = [score[r] for r in rows if gids[r[0]] == gids[b]]
        else:  # one value per trajectory: the score of its first row
            episode = [
                score[j, valid_turns(traj, j)[0]]
                for j in range(traj.batch_size)
                if gids[j] == gids[b] and valid_turns(traj, j)
            ]
        a_episode = normalise(score[b, k], episode, 0.0)
        group = [ret[r] for r in rows if gids[r[0]] == gids[b] and anchors[r] == anchors[b, k]]
        a_step = normalise(ret[b, k], group, ret[b, k])
        out[b, k] = a_episode + omega * a_step
    return per_turn_to_tokens(traj, out)


# --------------------------------------------- docs/methods.md, "Step-level (per-turn) estimators"


def turn_returns(traj, gamma) -> dict:
    out = {}
    for b in range(traj.batch_size):
        acc = 0.0
        for k in reversed(valid_turns(traj, b)):
            acc = float(traj.turn_rewards[b, k]) + gamma * acc
            out[b, k] = acc
    return out


def turn_return(traj, gamma=1.0, norm="group", eps=1e-6):
    """docs/methods.md, `turn_return`: discounted turn returns, z-scored over batch /
    (group, k) / anchor."""
    gids, anchors = np.asarray(traj.group_ids), np.asarray(traj.anchors)
    g = turn_returns(traj, gamma)
    keys = {
        "none": None,
        "batch": lambda b, k: 0,
        "group": lambda b, k: (gids[b], k),
        "anchor": lambda b, k: (gids[b], anchors[b, k]),
    }
    key = keys[norm]
    if key is None:
        return per_turn_to_tokens(traj, g)
    out = {}
    for b, k in g:
        members = [g[r] for r in g if key(*r) == key(b, k)]
        out[b, k] = zscore(g[b, k], members, eps)
    return per_turn_to_tokens(traj, out)


def mt_grpo(traj, turn_coef=1.0, eps=1e-4, last_turn_outcome_only=True, outcome="last_turn"):
    """docs/methods.md, `mt_grpo`, for K turns: R^O is the last turn's reward ("last_turn") or the
    episode's score ("episode"), z-scored per group; R^T the turn's reward, z-scored per
    (group, k) over the turns that get a turn term."""
    gids = np.asarray(traj.group_ids)
    rows = steps(traj)
    last = {b: valid_turns(traj, b)[-1] for b in range(traj.batch_size) if valid_turns(traj, b)}
    if outcome == "last_turn":
        r_out = [
            float(traj.turn_rewards[b, last[b]]) if b in last else 0.0
            for b in range(traj.batch_size)
        ]
    else:
        r_out = scores(traj)
    gets_turn = [r for r in rows if not (last_turn_outcome_only and r[1] == last[r[0]])]
    out = {}
    for b, k in rows:
        group = [j for j in range(len(r_out)) if gids[j] == gids[b] and trainable(traj, j)]
        a_out = zscore(r_out[b], [r_out[j] for j in group], eps)
        if (b, k) not in gets_turn:
            out[b, k] = a_out
            continue
        same_turn = [
            float(traj.turn_rewards[r]) for r in gets_turn if gids[r[0]] == gids[b] and r[1] == k
        ]
        out[b, k] = a_out + turn_coef * zscore(float(traj.turn_rewards[b, k]), same_turn, eps)
    return per_turn_to_tokens(traj, out)


def empg(traj, k=1.0, k_future=1.0, zeta=0.05, eps=1e-6):
    """docs/methods.md, `empg`: entropy-modulated GRPO advantage with a future-clarity bonus."""
    base = grpo(traj, eps, "group", "raw", "trajectories")
    mask = np.asarray(traj.action_mask)
    a_episode = [base[b][mask[b]][0] if mask[b].any() else 0.0 for b in range(traj.batch_size)]
    ent = _np(traj.entropy_behavior)
    rows = steps(traj)
    h = {(b, j): mean([ent[b, t] for t in turn_slots(traj, b, j)]) for b, j in rows}
    lo, hi = min(h.values()), max(h.values())
    h_hat = {key: (x - lo) / (hi - lo + 1e-8) for key, x in h.items()}
    e = {key: math.exp(-k * x) for key, x in h_hat.items()}
    e_mean = mean(list(e.values()))
    mod = {}
    for b, j in rows:
        bonus = zeta * math.exp(-k_future * h_hat[b, j + 1]) if (b, j + 1) in h_hat else 0.0
        mod[b, j] = e[b, j] / e_mean * a_episode[b] + bonus
    centre = mean(list(mod.values()))
    return per_turn_to_tokens(traj, {key: x - centre for key, x in mod.items()})
