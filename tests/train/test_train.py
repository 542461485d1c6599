"""Train step: sharding equivalence, determinism, interrupt + resume equals uninterrupted."""

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import base
from rl4agents import sharding
from rl4agents.train import experiment, loop, writers

# The step test and the loop tests' five runs train one config: built once (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("reuse_builds")


def tiny_config(**overrides):
    c = base.get_config()
    c.unlock()
    c.env.name = "frozen_lake"
    c.env.vocab = "minimal"
    c.rollout.num_tasks = 4
    c.rollout.group_size = 2
    c.rollout.max_turns = 3
    c.rollout.max_action_len = 1
    c.loss.entropy_coef = 0.01
    c.loss.kl_coef = 0.01
    c.train.num_steps = 4
    c.train.eval_every = 2
    c.train.eval_tasks = 8
    c.checkpoint.every = 2
    c.log.progress = False
    for key, value in overrides.items():
        *path, field = key.split(".")
        node = c
        for part in path:
            node = node[part]
        node[field] = value
    c.lock()
    return c


def _two_steps(config, mesh):
    exp = experiment.build(config, mesh=mesh)
    state = exp.init_state(jax.random.key(0))
    out = []
    for _ in range(2):
        state, metrics = exp.train_step(state, exp.root_key())
        out.append(jax.device_get(metrics))
    return jax.device_get(state.params), out


# Both cases are slow (~50 s each); the default suite compares 8 devices with 1 in
# tests/test_sharding.py on a (2, 2, 2) mesh.
@pytest.mark.slow
@pytest.mark.parametrize("credit_name", ["grpo", "ppo_gae"])
def test_train_step__8_devices_match_1_device(credit_name):
    config = tiny_config(
        **{
            "credit.name": credit_name,
            "model.value_head": "shared" if credit_name == "ppo_gae" else "none",
            "train.minibatches": 2,
            "model.num_layers": 1,  # a smaller program to compile; every layer shards alike
        }
    )
    devices = jax.devices()
    assert len(devices) == 8
    mesh8 = sharding.make_mesh(("data", "fsdp", "tensor"), (-1, 1, 1), devices=devices)
    mesh1 = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=devices[:1])
    p8, m8 = _two_steps(config, mesh8)
    p1, m1 = _two_steps(config, mesh1)
    for a, b in zip(m8, m1):
        for key in ("loss", "pg_loss", "reward", "entropy", "grad_norm"):
            # fp32 reductions in a different order across devices.
            np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-6, err_msg=key)
    # Adam divides by sqrt(v): fp32 reduction-order noise in tiny gradients moves a parameter
    # by up to a few 1e-6 after two steps (lr 1e-3), so parameters get atol 2e-5.
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=2e-5), p8, p1)


def loop_config(**overrides):
    """`tiny_config` with one layer, which compiles faster: this file's step and loop tests
    check updates, checkpoints and resume, not depth."""
    return tiny_config(**{"model.num_layers": 1, **overrides})


def test_train_step__params_change_and_metrics_finite():
    config = loop_config()  # the loop tests' config: one build serves them all
    exp = experiment.build(config)
    state = exp.init_state(jax.random.key(0))
    before = jax.device_get(state.params)
    # Another seed: other parameters from the same compiled program.
    other = jax.device_get(exp.init_state(jax.random.key(1)).params)
    assert exp._init_fn._cache_size() == 1
    assert any(np.any(a != b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(other)))
    state, metrics = exp.train_step(state, exp.root_key())
    after = jax.device_get(state.params)
    assert int(state.step) == 1
    assert all(np.isfinite(v) for v in jax.device_get(metrics).values())
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), before, after))
    assert max(diffs) > 0


# The loop tests share one uninterrupted run (a copy where a test writes). `scripts/test.sh`
# sends a file's tests to one pytest-xdist worker (`--dist loadfile`), so it is made once.
@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """Workdir of an uninterrupted 4-step run of `loop_config()` (checkpoints at 2 and 4)."""
    workdir = tmp_path_factory.mktemp("full")
    loop.run(loop_config(), str(workdir), quiet=True)
    return workdir


def _files(d):
    """{relative path: bytes} of every file under `d`."""
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def test_loop__interrupted_and_resumed_equals_uninterrupted(tmp_path, full_run):
    config = loop_config()
    full = full_run
    part = tmp_path / "part"
    loop.run(config, str(part), stop_after=3, quiet=True)  # killed after step 3
    assert (part / "checkpoints" / "3").exists()
    loop.run(config, str(part), quiet=True)  # resumes at step 3

    def rows(d):
        return [
            {k: v for k, v in r.items() if k != "wall_time"}
            for r in writers.read_metrics(d / "metrics.jsonl")
        ]

    assert rows(full) == rows(part)
    assert {r["step"] for r in rows(full)} >= {1, 2, 3, 4}
    s_full = json.loads((full / "summary.json").read_text())
    s_part = json.loads((part / "summary.json").read_text())
    assert s_full["eval_test"] == s_part["eval_test"]
    assert os.path.exists(full / "curves.png") and os.path.exists(full / "tb")


def test_loop__cpu_time_and_peak_memory_count_every_process_of_a_resumed_run(tmp_path, full_run):
    # A resumed run's summary adds its earlier processes' CPU time (usage.json, rewritten
    # every step) to its own; a fresh run ignores a stale usage.json in its workdir.
    workdir = tmp_path / "run"
    shutil.copytree(full_run, workdir)
    shutil.rmtree(workdir / "checkpoints" / "4")  # resumes at step 2
    earlier = {"cpu_s": 5000.0, "peak_rss_gb": 99.0}  # as if an earlier process had used them
    (workdir / writers.USAGE_NAME).write_text(json.dumps(earlier))
    before = time.process_time()
    summary = loop.run(loop_config(), str(workdir), quiet=True)
    spent = time.process_time() - before
    assert summary["finished"] and summary["steps"] == 4
    assert 5000.0 < summary["process_cpu_s"] <= 5000.0 + spent + 0.1
    assert summary["peak_rss_gb"] == 99.0
    usage = json.loads((workdir / writers.USAGE_NAME).read_text())
    assert usage == {"cpu_s": summary["process_cpu_s"], "peak_rss_gb": 99.0}

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / writers.USAGE_NAME).write_text(json.dumps(earlier))
    summary = loop.run(loop_config(**{"train.num_steps": 1}), str(fresh), quiet=True)
    assert 0 < summary["process_cpu_s"] < 5000.0 and summary["peak_rss_gb"] < 99.0


def test_loop__killed_after_last_checkpoint_finishes_on_resume(tmp_path, full_run):
    workdir = tmp_path / "run"
    shutil.copytree(full_run, workdir)
    summary = json.loads((workdir / "summary.json").read_text())
    # As if killed after the step-4 checkpoint, before the final evaluation was written.
    (workdir / "summary.json").write_text(json.dumps({"steps": 4, "finished": False}))
    resumed = loop.run(loop_config(), str(workdir), quiet=True)
    assert resumed["finished"] and resumed["steps"] == 4
    assert resumed["eval_test"] == summary["eval_test"]


def test_loop__incompatible_checkpoint_fails_and_keeps_files(tmp_path, full_run):
    workdir = tmp_path / "run"
    shutil.copytree(full_run, workdir)
    assert (workdir / "checkpoints" / "4").is_dir()
    before = _files(workdir)
    with pytest.raises(ValueError, match=r"model.d_model: stored 0, new 32"):
        loop.run(loop_config(**{"model.d_model": 32}), str(workdir), quiet=True)
    assert _files(workdir) == before  # nothing written, nothing lost


def test_loop__resume_under_another_seed_is_refused(tmp_path, full_run):
    # A resumed run replays the randomness of the uninterrupted one: not under a new seed.
    workdir = tmp_path / "run"
    shutil.copytree(full_run, workdir)
    before = _files(workdir)
    seed = loop_config().seed
    with pytest.raises(ValueError, match=rf"seed: stored {seed}, new {seed + 1}"):
        loop.run(loop_config(**{"seed": seed + 1}), str(workdir), quiet=True)
    assert _files(workdir) == before


def test_loop__vocabulary_change_names_the_env_field(tmp_path, full_run):
    # The vocabulary follows from the environment's fields, not from one config key: a
    # changed one is refused with the field, not only with the embedding's shapes.
    workdir = tmp_path / "run"
    shutil.copytree(full_run, workdir)
    before = _files(workdir)
    config = loop_config()
    config.unlock()
    config.env.frozen_lake.compact = not config.env.frozen_lake.compact
    config.lock()
    pattern = (
        r"(?s)fields that differ from the stored run's.*env.frozen_lake.compact: stored false, "
        r"new true.*Use a new workdir.*Tensors that differ:.*embed"
    )
    with pytest.raises(ValueError, match=pattern):
        loop.run(config, str(workdir), quiet=True)
    assert _files(workdir) == before


def _set_stored(workdir, section, field, value):
    path = workdir / "checkpoints" / "config.json"
    stored = json.loads(path.read_text())
    stored[section][field] = value
    path.write_text(json.dumps(stored))


def test_loop__interrupted_during_evaluation_redoes_it_on_resume(tmp_path, full_run, monkeypatch):
    # Ctrl-C in step 2's evaluation: step 2's checkpoint is saved without its eval row. The
    # resumed run evaluates step 2 again and ends with the uninterrupted run's metrics.
    evaluate = loop.evaluate

    def interrupted(*args):
        raise KeyboardInterrupt

    workdir = tmp_path / "run"
    monkeypatch.setattr(loop, "evaluate", interrupted)
    summary = loop.run(loop_config(), str(workdir), quiet=True)
    assert summary["interrupted"] and not summary["finished"] and summary["steps"] == 2
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "config.json"]
    assert not any("eval_test/greedy_success" in r for r in _rows(workdir))
    monkeypatch.setattr(loop, "evaluate", evaluate)
    summary = loop.run(loop_config(), str(workdir), quiet=True)
    assert summary["finished"] and not summary["interrupted"]
    assert _rows(workdir) == _rows(full_run)
    assert 0 < summary["process_cpu_s"] <= time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    assert 0.05 < summary["peak_rss_gb"] <= peak + 1e-3  # this process: at least JAX's runtime


def test_loop__interrupted_in_the_final_evaluation_finishes_on_rerun(
    tmp_path, full_run, monkeypatch
):
    evaluate, calls = loop.evaluate, []

    def interrupted_third(*args):  # test and OOD at steps 2 and 4, then the final's first
        calls.append(args)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return evaluate(*args)

    workdir = tmp_path / "run"
    monkeypatch.setattr(loop, "evaluate", interrupted_third)
    summary = loop.run(loop_config(), str(workdir), quiet=True)
    assert summary == {"steps": 4, "finished": False, "interrupted": True}
    assert not (workdir / "summary.json").exists()
    monkeypatch.setattr(loop, "evaluate", evaluate)
    summary = loop.run(loop_config(), str(workdir), quiet=True)
    full = json.loads((full_run / "summary.json").read_text())
    assert summary["finished"] and summary["eval_test"] == full["eval_test"]
    assert _rows(workdir) == _rows(full_run)


def test_loop__eval_at_start_adds_step_0_and_leaves_training_as_it_was(
    tmp_path, full_run, monkeypatch
):
    # The start policy's evaluation rows come first; every later row is the plain run's. An
    # interruption inside that evaluation redoes it on resume.
    evaluate, calls = loop.evaluate, []

    def interrupted_first(*args):
        calls.append(args)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return evaluate(*args)

    config = loop_config(**{"train.eval_at_start": True})
    workdir = tmp_path / "run"
    monkeypatch.setattr(loop, "evaluate", interrupted_first)
    summary = loop.run(config, str(workdir), quiet=True)
    assert summary["interrupted"] and summary["steps"] == 0 and not _rows(workdir)
    monkeypatch.setattr(loop, "evaluate", evaluate)
    summary = loop.run(config, str(workdir), quiet=True)
    rows, plain = _rows(workdir), _rows(full_run)
    first = [r for r in rows if r["step"] == 0]
    assert [sorted(k for k in r if k.endswith("/greedy_success")) for r in first] == [
        ["eval_test/greedy_success"],
        ["eval_ood/greedy_success"],
    ]
    assert rows == first + plain
    full = json.loads((full_run / "summary.json").read_text())
    assert summary["finished"] and summary["eval_test"] == full["eval_test"]


def test_loop__rerun_of_a_finished_run_changes_nothing(tmp_path, full_run):
    workdir = tmp_path / "run"
    shutil.copytree(full_run, workdir)
    before = _files(workdir)
    summary = loop.run(loop_config(), str(workdir), quiet=True)
    assert summary == {**json.loads((full_run / "summary.json").read_text()), "interrupted": False}
    assert _files(workdir) == before


def test_loop__final_evaluation_uses_final_eval_tasks(tmp_path, full_run, monkeypatch):
    # The in-run evaluations keep train.eval_tasks; the final one (summary.json) takes
    # train.final_eval_tasks, not a reused in-run evaluation of the last step.
    workdir = tmp_path / "run"
    shutil.copytree(full_run, workdir)
    calls, real = [], loop.evaluate

    def spy(exp, params, split, num_tasks, **kw):
        calls.append((split, num_tasks))
        calls.append(real(exp, params, split, num_tasks, **kw))
        return calls[-1]

    monkeypatch.setattr(loop, "evaluate", spy)
    # A changed config reruns the finished run's final evaluation; nothing is trained.
    summary = loop.run(loop_config(**{"train.final_eval_tasks": 16}), str(workdir), quiet=True)
    splits = [c[0] for c in calls[0::2]]
    assert "test" in splits and calls[0::2] == [(split, 16) for split in splits]
    assert summary["final_eval_tasks"] == 16
    assert summary["eval_test"] == calls[2 * splits.index("test") + 1]
    assert json.loads((workdir / "summary.json").read_text())["final_eval_tasks"] == 16
    assert _rows(workdir) == _rows(full_run)
    default = json.loads((full_run / "summary.json").read_text())
    assert default["final_eval_tasks"] == 8  # 0: the in-run count


def _rows(d):
    return [
        {k: v for k, v in r.items() if k != "wall_time"}
        for r in writers.read_metrics(d / "metrics.jsonl")
    ]


def test_loop__unwritable_workdir_is_refused_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("keep me\n")
    with pytest.raises(ValueError, match=r"is not a writable folder \(Not a directory\)"):
        loop.run(loop_config(), str(tmp_path / "afile" / "run"), quiet=True)
    assert os.listdir(tmp_path) == ["afile"]


def _eval_cli(*flags):
    return subprocess.run(
        [sys.executable, "scripts/eval.py", *flags], capture_output=True, text=True, timeout=600
    )


def test_eval_cli__prints_table_and_refuses_bad_flags_in_one_line(tmp_path, full_run):
    # A run saved before some fields existed (here the KL controller's): they take today's
    # defaults, which keep the behaviour it was trained with.
    old = tmp_path / "old"
    shutil.copytree(full_run, old)
    config_path = old / "checkpoints" / "config.json"
    stored = json.loads(config_path.read_text())
    for field in ("kl_ctrl", "kl_target", "kl_horizon"):
        del stored["loss"][field]
    config_path.write_text(json.dumps(stored))
    out = _eval_cli(f"--workdir={old}", "--split=test", "--num_tasks=8", "--step=2")
    assert out.returncode == 0, out.stderr
    assert "checkpoint step 2" in out.stdout and "greedy_success" in out.stdout
    evaluated = json.loads((old / "eval_provenance.json").read_text())["eval"]  # beside the run
    assert evaluated["step"] == 2 and [r["split"] for r in evaluated["rows"]] == ["test"]
    # A stored config that no longer builds (a value outside its range).
    broken = tmp_path / "broken"
    shutil.copytree(full_run, broken)
    config_path = broken / "checkpoints" / "config.json"
    stored = json.loads(config_path.read_text())
    stored["train"]["eval_every"] = 0
    config_path.write_text(json.dumps(stored))
    before = _files(broken)
    cases = [
        ((f"--workdir={full_run}", "--split=dev"), "--split='dev' is not allowed"),
        ((f"--workdir={full_run}", "--num_tasks=-1"), "--num_tasks=-1; allowed: >= 1"),
        ((f"--workdir={full_run}", "--step=3"), "--step=3 is not saved; saved steps: [2, 4]"),
        ((f"--workdir={tmp_path / 'none'}",), "holds no run"),
        ((f"--workdir={broken}",), "train.eval_every=0; allowed: >= 1"),
        ((f"--workdir={full_run}", "--split="), "--split='': no split"),
        ((f"--workdir={full_run}", "--step=-5"), "--step=-5; allowed: a saved step, or -1"),
        ((f"--workdir={full_run}", "--seed=-5"), "--seed=-5; allowed: >= 0, or -1"),
        ((f"--workdir={full_run}", "extra"), "unexpected arguments ['extra']"),
        ((f"--workdir={full_run}", "--swap_roles"), "--swap_roles: this run has model.role_p"),
        # 8 devices in the tests (tests/conftest.py): the tasks are split over them.
        ((f"--workdir={full_run}", "--num_tasks=3"), "--num_tasks=3: batch of 3 episodes"),
    ]
    # A stored config that is no JSON, or whose fields have other types; a damaged step.
    for name, damage in [
        ("nojson", lambda d: (d / "checkpoints" / "config.json").write_text("{not json")),
        ("types", lambda d: _set_stored(d, "optim", "lr", "fast")),
        ("damaged", lambda d: (d / "checkpoints" / "4" / "default" / "_METADATA").unlink()),
    ]:
        shutil.copytree(full_run, tmp_path / name)
        damage(tmp_path / name)
    cases += [
        ((f"--workdir={tmp_path / 'nojson'}",), "is not this project's run config: Expecting"),
        ((f"--workdir={tmp_path / 'types'}",), "is not this project's run config"),
        ((f"--workdir={tmp_path / 'damaged'}",), "Checkpoint step 4 in"),
    ]
    for flags, message in cases:
        out = _eval_cli(*flags)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2 and len(lines) == 1, (flags, out.stderr)
        assert lines[0].startswith("error: ") and message in lines[0], (flags, lines)
    assert _files(broken) == before
