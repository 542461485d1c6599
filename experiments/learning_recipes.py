"""One change at a time to the v5 temperature-1 recipe, for the environments it did not move.

At temperature 1, GRPO from base v5 did not move maze in 62-65 steps of 256 episodes (16 tasks
x 16 samples, about 17 s a step), although three quarters of its groups carried reward
variance; seven in ten of its episodes end at the 32-turn limit
(`experiments/results/learning_base_v5_t1/`). Each recipe changes one thing; everything else
is the temperature-1 runs' (settings, overrides, 18-minute budget, seeds 0-2, evaluation
tasks), so a recipe's rows pair with theirs seed by seed:

  batch8x8   8 tasks x 8 samples per step (64 episodes): the same budget buys about four times
             the updates, each from a noisier estimate (group size 8 is GiGPO's and
             verl-agent's); the in-run evaluation every 60 steps, about as many per run
  progress   the environment's potential-based progress reward, PROGRESS per unit of progress
             (maze: `progress_reward` x the drop in BFS distance to the goal, so an episode's
             shaping sums to PROGRESS x (start distance - end distance) and the optimal policy
             is unchanged, Ng et al. 1999); success, which the tables report, is still the goal
  minibatch4 each step's batch split into 4 minibatches, one pass: four clipped PPO updates per
             batch for the compute of one pass over it (verl's default shape, a PPO mini-batch
             a quarter of the rollout batch), so the budget buys about four times the updates
             from the same episodes; the ratio clip bounds how far the later three move
  seqmean    the loss averaged over each episode's tokens, then over episodes
             (`loss.ppo_clip.agg=seq-mean-token-mean`) instead of over all the batch's tokens
             (`token-mean`). Under token-mean an episode weighs as many tokens as it has, so
             where failures run longer than successes the zero-sum group advantages become a
             net push down on the actions that make episodes long (searching, browsing); the
             runs that shortened their episodes while losing greedy success (search_qa 3.1-3.3
             -> 2.5-2.7 turns, web_shop 6.1-6.4 -> 5.2-5.4) are the ones to test. Maze's
             settings already aggregate per episode, so this recipe refuses maze
  nopenalty  no penalty for an invalid turn (`env.<env>.invalid_penalty=0`): the reward is the
             task's alone. Where most sampled turns are invalid and success is rare, the
             penalty outweighs the success signal and GRPO learns validity first (wordle at
             temperature 0.5, first ten steps: 0.54 of the turns invalid, 0.075 successes, a
             mean reward of -0.23); countdown's and terminal's settings already have no penalty
  sparse     no invalid-turn penalty and no entropy bonus (`loss.entropy_coef=0`): the reward
             is the task's success alone and nothing else moves the policy, the settings
             countdown and terminal have. Without the penalty alone wordle's groups were
             mostly without variance (0.78 over the first ten steps), so its entropy bonus
             (0.02) was most of the update: entropy rose from 0.57 to 3.2 nats per action
             token in 100 steps and every turn became invalid
  bonus      web_shop only: a successful purchase pays 1 + BONUS instead of 1
             (`env.web_shop.success_bonus`); near misses keep WebShop's partial score. Under the
             partial score almost every group has reward variance even at a batch success of
             0.05-0.14, and the runs bought sooner for partial credit (episodes 6.1-6.4 -> 5.2-5.4
             turns) while greedy success fell
  remax      ReMax's credit (`credit.name=remax`, arXiv 2310.10505) instead of GRPO's: each
             episode's advantage is its return minus the return of one greedy episode on the
             same task, played by the same parameters in the same step. The measure is greedy
             success, and in every learning study so far greedy play moved only once sampled
             play had caught up with it (`experiments/results/learning/why_greedy.md`). Under
             GRPO a success counts against its group's mean, so most of the push goes to tasks
             the greedy policy already solves; under ReMax a sample's advantage is nonzero only
             where its outcome differs from greedy play's: up on the tasks greedy play fails and
             a sample solves, down on those it solves and a sample fails. One more rollout per
             step (one greedy episode per task)
  toppX      nucleus sampling: each token is drawn from the smallest set of tokens whose
             probability reaches X (`rollout.top_p`), at the same temperature. The base's own
             held-out outcomes (`experiments/results/learning/sampling_probe.csv`): at top_p
             0.7 a sampled episode solves 6.6% of web_shop's greedy failures and loses 57% of
             the tasks greedy play solves, against 3.6% and 79% at top_p 1 (countdown: 15.2%
             and 61% against 12.0% and 85%); lower temperatures (0.7, 0.5) lose fewer greedy
             wins too but solve 4.8-5.0% of web_shop's failures. One sample per task puts about
             +-2 points of noise on web_shop's shares, so this is a lead for pilots. The loss
             still treats the tokens as drawn from the full distribution at that temperature,
             as the recorded log-probs are (a tail token is never sampled, so never pushed down
             directly)
  lrX        the learning rate X instead of 3e-4 (for example `lr1e-4`), Adam without warmup
             as before. Where greedy success falls from the first in-run evaluation on, the
             first updates themselves did the damage: after 6 updates web_shop's greedy
             success was 0.055-0.125 on 128 tasks (the base: 0.137 on 512) and two_agent's
             0.375-0.445 (the base: 0.533), while their sampled success held or rose. Only a
             higher rate (1e-3, maze, `results/learning_lr/`) had been tried

  RECIPE=batch8x8 RECIPE_ENVS=maze python scripts/sweep.py experiments/learning_recipes.py \
      --out=runs/sweeps/learning_v5_rebuild_recipe_batch8x8_maze --workers=1 --devices=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_v5_rebuild_recipe_batch8x8_maze \
      --out=experiments/results/learning_v5_rebuild/recipe_batch8x8_maze --num_tasks=512 \
      --min_seeds=3 --envs=maze

(one sweep directory per recipe: paired_eval makes one row per environment of a sweep).
`RECIPE` picks the recipe (default batch8x8); a suffix `_tT` (for example `batch8x8_t0.5`)
samples at temperature T instead of 1, so the recipe's rows pair with the v5 runs at that
temperature (`experiments/learning_base_v5.py`, `V5_TEMPERATURE=T`) and differ from them in the
recipe's setting alone. Recipes joined by `+` (for example `lr1e-4+bonus`) apply together;
two that set the same setting are refused. `RECIPE_ENVS` picks the environments (default maze),
`RECIPE_SEEDS` the seeds (default 3; 1 is a pilot, and more seeds later reuse its run),
`RECIPE_SEED0` the first seed (default 0; fresh seeds for a confirmatory run of a recipe
chosen on seeds 0-2).
Cost: about 20 minutes a run, one at a time.
"""

import os
import re

from rl4agents import config_utils

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", "runs/base_policy_v5")
TEMPERATURE = 1.0
PROGRESS = 0.05
BONUS = 1.0
ENVS = tuple(_learning.STEPS)
RECIPES = (
    "batch8x8",
    "minibatch4",
    "progress",
    "seqmean",
    "nopenalty",
    "sparse",
    "bonus",
    "remax",
    "toppX",
    "lrX",
)
# At 64 episodes a step the step caps of the learning studies would end runs before the clock.
SMALL_BATCH_STEPS = 2000


def recipe(name: str, env: str) -> tuple[dict, int | None, int | None]:
    """(overrides, step cap or None, in-run evaluation interval or None) of recipe `name`, or
    of recipes joined by `+` together."""
    if "+" in name:
        overrides, steps, eval_every = {}, None, None
        for part in name.split("+"):
            more, part_steps, part_every = recipe(part, env)
            if overrides.keys() & more.keys():
                raise ValueError(
                    f"RECIPE={name!r} sets {sorted(overrides.keys() & more.keys())} twice; "
                    "allowed: recipes that change different settings"
                )
            overrides.update(more)
            steps, eval_every = part_steps or steps, part_every or eval_every
        return overrides, steps, eval_every
    if name == "batch8x8":
        return {"rollout.num_tasks": 8, "rollout.group_size": 8}, SMALL_BATCH_STEPS, 60
    if name == "minibatch4":
        return {"train.minibatches": 4}, None, None
    if name == "progress":
        return {f"env.{env}.progress_reward": PROGRESS}, None, None
    if name == "seqmean":
        return {"loss.ppo_clip.agg": "seq-mean-token-mean"}, None, None
    if name == "nopenalty":
        return {f"env.{env}.invalid_penalty": 0.0}, None, None
    if name == "sparse":
        return {f"env.{env}.invalid_penalty": 0.0, "loss.entropy_coef": 0.0}, None, None
    if name == "bonus":
        if env != "web_shop":
            raise ValueError(f"RECIPE='bonus' on {env!r}; allowed: web_shop (success_bonus)")
        return {"env.web_shop.success_bonus": BONUS}, None, None
    if name == "remax":
        return {"credit.name": "remax"}, None, None
    m = re.fullmatch(r"topp(0?\.[0-9]+)", name)
    if m and 0 < float(m.group(1)) < 1:
        return {"rollout.top_p": float(m.group(1))}, None, None
    m = re.fullmatch(r"lr([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)", name)
    if m and float(m.group(1)) > 0:
        return {"optim.lr": float(m.group(1))}, None, None
    raise ValueError(
        f"RECIPE={name!r}; allowed: {list(RECIPES)} (lrX: X a learning rate > 0; toppX: 0 < X < 1)"
    )


def parse(spec: str) -> tuple[str, float]:
    """(recipe name, sampling temperature) of a `RECIPE` value: `NAME` or `NAME_tT`, T > 0."""
    m = re.fullmatch(r"(.+?)(?:_t([0-9]*\.?[0-9]+))?", spec)
    temperature = float(m.group(2)) if m.group(2) else TEMPERATURE
    if temperature <= 0:
        raise ValueError(f"RECIPE={spec!r}: temperature {temperature} must be > 0")
    return m.group(1), temperature


def get_sweep():
    name, temperature = parse(os.environ.get("RECIPE", "batch8x8"))
    seeds = int(os.environ.get("RECIPE_SEEDS", "3"))
    first_seed = int(os.environ.get("RECIPE_SEED0", "0"))
    if first_seed < 0:
        raise ValueError(f"RECIPE_SEED0={first_seed}; allowed: >= 0")
    envs = [e for e in os.environ.get("RECIPE_ENVS", "maze").split(",") if e]
    unknown = sorted(set(envs) - set(ENVS))
    if unknown:
        raise ValueError(f"RECIPE_ENVS names {unknown}; allowed: {list(ENVS)}")
    points = []
    for env in envs:
        overrides, steps, eval_every = recipe(name, env)
        same = {k: v for k, v in overrides.items() if _v3.OVERRIDES.get(env, {}).get(k) == v}
        if same:
            raise ValueError(
                f"RECIPE={name!r} would not change {sorted(same)} on {env}: its settings "
                f"already have {same}; allowed: a recipe that changes each of its settings"
            )
        points += _learning.env_sweep(
            env,
            steps or _learning.STEPS[env],
            minutes=_full.MINUTES,
            seeds=seeds,
            first_seed=first_seed,
            eval_tasks=_full.EVAL_TASKS,
            eval_every=eval_every or _v3.EVAL_EVERY.get(env) or _full.EVAL_EVERY.get(env, 15),
            overrides={
                **_v3.OVERRIDES.get(env, {}),
                "init.params": BASE_POLICY,
                "rollout.temperature": temperature,
                **overrides,
            },
        )
    return points
