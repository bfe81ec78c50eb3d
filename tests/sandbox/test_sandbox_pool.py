"""SandboxPool behaviour: the batch API, deadlines, limits, isolation modes and bounded resources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import psutil
import pytest

from spade_jax.sandbox import (EpisodeSpec, IsolationUnavailable, SandboxConfig, SandboxError, SandboxPool,
                               StepResult)

# Wall-clock and process-count bounds: run alone, not beside other tests (tests/run.sh).
pytestmark = pytest.mark.serial

EXAMPLES = Path(__file__).parents[1] / "sandbox_examples"
GAME = (EXAMPLES / "boxed_game.py").read_text()
TOOL = (EXAMPLES / "tool_env.py").read_text()

REWARDS = textwrap.dedent('''
    class RewardEnv:
        """Echoes the action as the reward; never ends by itself."""
        def __init__(self, max_turns=50, **kwargs):
            self.max_turns = max_turns
            self.scale = kwargs.get("scale", 1.0)
        def reset(self, seed=None):
            print("reset", seed)
            return f"seed {seed}", {"seed": seed}
        def step(self, action):
            if action == "raise":
                raise ValueError("asked to raise")
            return f"got {action}", float(action) * self.scale, False, False, {"n": 1}
        def solution(self):
            return "1"
''')
SLEEPY = textwrap.dedent('''
    import time
    class SleepyEnv:
        def __init__(self, max_turns=5, **kwargs):
            pass
        def reset(self, seed=None):
            return "ready", {}
        def step(self, action):
            time.sleep(float(action))
            return "slept", 0.0, False, False, {}
''')


def _namespaces_expected() -> bool:
    """Whether this kernel lets us create the namespaces the sandbox uses (root or unprivileged userns)."""
    if sys.platform != "linux" or not shutil.which("unshare") or os.environ.get("SPADE_SANDBOX_NO_NAMESPACES"):
        return False
    cmd = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--map-root-user", "true"]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def _in_process(source: str, seed: int, actions: list[str]) -> list[tuple]:
    """Reference run of a trusted test program without the sandbox (for parity)."""
    from spade_jax.envs import SUCCESS_REWARD, ToolUseEnv, extract_boxed
    scope = {"SUCCESS_REWARD": SUCCESS_REWARD, "ToolUseEnv": ToolUseEnv, "extract_boxed": extract_boxed,
             "__name__": "reference"}
    exec(compile(source, "<reference>", "exec"), scope)
    cls = next(v for k, v in scope.items() if k.endswith("Env") and isinstance(v, type) and k != "ToolUseEnv")
    env = cls()
    out = [env.reset(seed)]
    out += [env.step(a) for a in actions]
    return out


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2, call_timeout_s=1.0, load_timeout_s=2.0)) as p:
        yield p


def _tree(pool: SandboxPool) -> list[psutil.Process]:
    return psutil.Process(pool.host_pid).children(recursive=True)


def test_isolation_report_matches_what_the_kernel_allows(pool):
    report = pool.isolation
    assert report.rlimits["processes"] == 1 and report.rlimits["open_files"] == 64
    if _namespaces_expected():
        assert report.full and report.method in ("namespaces", "user-namespaces")
    else:
        assert report.method == "rlimits" and report.notes


def test_batch_start_step_solution_match_an_in_process_run(pool):
    seeds = [0, 1, 2, 3, 4]
    starts = pool.start([EpisodeSpec(GAME, seed=s) for s in seeds] + [EpisodeSpec(TOOL, seed=7)])
    assert all(r.ok for r in starts), [r.error for r in starts]
    ids = [r.episode_id for r in starts]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    assert [r.env_class for r in starts] == ["SumTargetEnv"] * 5 + ["ShelfLookupEnv"]
    assert [r.turn_limit for r in starts] == [8] * 5 + [10]
    solutions = pool.solution(ids)
    for seed, start, solution in zip(seeds + [7], starts, solutions):
        source = GAME if start.env_class == "SumTargetEnv" else TOOL
        reference = _in_process(source, seed, solution.splitlines())
        assert (start.observation, start.info) == reference[0]
    # step everything with its first solution line, in a shuffled order: results follow the order asked
    order = [5, 2, 0, 4, 1, 3]
    results = pool.step([ids[i] for i in order], [solutions[i].splitlines()[0] for i in order])
    assert [r.episode_id for r in results] == [ids[i] for i in order]
    for i, result in zip(order, results):
        source = GAME if i < 5 else TOOL
        expected = _in_process(source, ([0, 1, 2, 3, 4, 7])[i], solutions[i].splitlines()[:1])[1]
        assert (result.observation, result.raw_reward, result.terminated, result.truncated, result.info) == expected
        assert result.turn == 1 and result.ok
    pool.close(ids)


def test_rewards_are_clipped_and_raw_values_kept(pool):
    start = pool.start([EpisodeSpec(REWARDS, seed=5)])[0]
    eid = start.episode_id
    out = [pool.step([eid], [a])[0] for a in ("0.25", "7", "-3")]
    assert [(r.reward, r.raw_reward) for r in out] == [(0.25, 0.25), (1.0, 7.0), (-1.0, -3.0)]
    assert pool.output([eid]) == ["reset 5\n"] and pool.output([eid]) == [""]
    pool.close([eid])


def test_turn_limit_truncates_on_the_trusted_side(pool):
    eid = pool.start([EpisodeSpec(REWARDS, turn_limit=2)])[0].episode_id
    first, second = (pool.step([eid], ["0"])[0] for _ in range(2))
    assert not first.truncated and second.truncated and second.turn == 2
    after = pool.step([eid], ["0"])[0]
    assert after.failed_call == "limit" and "already ended" in after.error
    assert pool.solution([eid]) == ["1"]  # the env is still alive after the refusal
    pool.close([eid])


def test_failures_are_results_not_exceptions(pool):
    ok, broken = pool.start([EpisodeSpec(REWARDS), EpisodeSpec("class Nope: pass")])
    assert ok.ok and broken.failed_call == "load" and "exactly one class" in broken.error
    raised = pool.step([ok.episode_id], ["raise"])[0]
    assert raised.failed_call == "step" and "ValueError: asked to raise" in raised.error and raised.truncated
    again = pool.step([ok.episode_id, 12345], ["1", "1"])
    assert "is not live" in again[0].error and "unknown episode id 12345" in again[1].error
    twice = pool.step([broken.episode_id, broken.episode_id], ["1", "1"])
    assert "not live" in twice[0].error and "appears twice" in twice[1].error
    bad_action = pool.start([EpisodeSpec(REWARDS)])[0]
    refused = pool.step([bad_action.episode_id], [123])[0]
    assert "must be a str" in refused.error and not refused.truncated
    assert pool.solution_results([bad_action.episode_id])[0].solution == "1"
    no_solution = pool.start([EpisodeSpec(SLEEPY)])  # restricted imports: `time` is refused at load
    assert "import of 'time' is not allowed" in no_solution[0].error
    pool.close([ok.episode_id, broken.episode_id, bad_action.episode_id, no_solution[0].episode_id])


def test_usage_errors_raise_with_a_clear_message(pool):
    with pytest.raises(ValueError, match="2 episode ids but 1 actions"):
        pool.step([1, 2], ["a"])
    with pytest.raises(TypeError, match="EpisodeSpec"):
        pool.start(["class A: pass"])
    with pytest.raises(TypeError, match="episode ids are ints"):
        pool.close(["1"])
    assert pool.start([]) == [] and pool.step([], []) == [] and pool.solution([]) == []


def test_calls_run_concurrently_across_workers():
    config = dict(restrict_imports=False, call_timeout_s=2.0)
    for workers, low, high in ((4, 0.4, 1.0), (1, 1.6, 3.5)):
        with SandboxPool(SandboxConfig(num_workers=workers, **config)) as pool:
            ids = [r.episode_id for r in pool.start([EpisodeSpec(SLEEPY) for _ in range(4)])]
            started = time.monotonic()
            results = pool.step(ids, ["0.4"] * 4)
            elapsed = time.monotonic() - started
            assert all(r.observation == "slept" for r in results)
            assert low <= elapsed < high, (workers, elapsed)


def test_deadline_kills_only_the_late_episode():
    with SandboxPool(SandboxConfig(num_workers=2, restrict_imports=False, call_timeout_s=0.5)) as pool:
        ids = [r.episode_id for r in pool.start([EpisodeSpec(SLEEPY) for _ in range(3)])]
        started = time.monotonic()
        results = pool.step(ids, ["0", "30", "0.1"])
        assert time.monotonic() - started < 3.0
        assert [r.timed_out for r in results] == [False, True, False]
        assert results[1].reward == -0.5 and "timeout: step took longer than 0.5 s" in results[1].error
        again = pool.step(ids, ["0", "0", "0"])
        assert [r.ok for r in again] == [True, False, True]


def _host_proper(pool: SandboxPool) -> psutil.Process:
    """The host process itself, under the outer guard that removes the pool cgroup after it."""
    (inner,) = psutil.Process(pool.host_pid).children()
    return inner


def test_thousands_of_episodes_leave_no_processes_fds_or_temp_dirs(pool):
    inner = _host_proper(pool)
    temp_before = sorted(p for p in os.listdir(tempfile.gettempdir()) if p.startswith("spade_sandbox_"))
    fds_before, tree_before = inner.num_fds(), len(_tree(pool))
    total = 0
    for _ in range(25):
        starts = pool.start([EpisodeSpec(GAME, seed=s) for s in range(40)] + [EpisodeSpec("bad")] * 2)
        ids = [r.episode_id for r in starts]
        pool.step(ids, ["\\boxed{1}"] * len(ids))
        pool.close(ids)
        total += len(ids)
    assert total == 1050
    assert {k: v for k, v in pool.stats().items() if k != "memory_bytes"} == {"live": 0, "records": 0,
                                                                              "registered_fds": 0}
    assert inner.num_fds() == fds_before and len(_tree(pool)) == tree_before
    assert sorted(p for p in os.listdir(tempfile.gettempdir()) if p.startswith("spade_sandbox_")) == temp_before


def test_hundreds_of_live_episodes_share_memory(pool):
    starts = pool.start([EpisodeSpec(GAME, seed=s) for s in range(300)])
    assert all(r.ok for r in starts)
    ids = [r.episode_id for r in starts]
    workers = _host_proper(pool).children()[0].children()  # the zygote's children
    assert len(workers) == 300
    try:
        sample = workers[::15]
        private = sum(p.memory_full_info().uss for p in sample) / len(sample)
    except psutil.AccessDenied:
        private = None
    if private is not None:
        assert private < 12 * (1 << 20), f"{private / (1 << 20):.1f} MiB private per worker"
    results = pool.step(ids, ["\\boxed{2}"] * len(ids))
    assert all(r.observation == "Total is 2." for r in results)
    pool.close(ids)


def test_two_pools_side_by_side_do_not_interfere():
    with SandboxPool() as a, SandboxPool() as b:
        ra = a.start([EpisodeSpec(GAME, seed=1)])[0]
        rb = b.start([EpisodeSpec(GAME, seed=1)])[0]
        assert ra.observation == rb.observation and a.host_pid != b.host_pid
        a.close_all()
        assert b.step([rb.episode_id], ["\\boxed{1}"])[0].observation == "Total is 1."
        with pytest.raises(SandboxError, match="closed"):
            a.step([ra.episode_id], ["\\boxed{1}"])


def test_namespaces_demanded_but_unavailable_fails_closed(monkeypatch):
    monkeypatch.setenv("SPADE_SANDBOX_NO_NAMESPACES", "1")
    with pytest.raises(IsolationUnavailable, match="isolation='namespaces' requires namespaces.*user namespaces"):
        SandboxPool(SandboxConfig(isolation="namespaces"))
    with pytest.raises(IsolationUnavailable, match="isolation='strict'"):
        SandboxPool(SandboxConfig(isolation="strict"))
    with pytest.warns(RuntimeWarning, match="protections not in force: private_root"):
        pool = SandboxPool(SandboxConfig(isolation="auto"))
    with pool:
        assert pool.isolation.method == "rlimits" and not pool.isolation.full
        assert "SPADE_SANDBOX_NO_NAMESPACES" in pool.isolation.notes[0]


DAEMON = textwrap.dedent('''
    import os, time
    class DaemonEnv:
        def __init__(self, max_turns=5, **kwargs):
            pass
        def reset(self, seed=None):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    while True:
                        time.sleep(0.05)
                os._exit(0)
            return os.getcwd(), {}
        def step(self, action):
            return "x", 0.0, True, False, {}
''')


def test_rlimits_mode_still_confines_processes_and_private_dirs():
    config = SandboxConfig(isolation="rlimits", restrict_imports=False, max_processes=8)
    with pytest.warns(RuntimeWarning):
        pool = SandboxPool(config)
    with pool:
        report = pool.isolation
        assert not any(report.protections[name] for name in ("network_namespace", "private_root", "pid_namespace"))
        before = len(_tree(pool))
        start = pool.start([EpisodeSpec(DAEMON)])[0]
        scratch = start.observation
        assert start.ok and os.path.isdir(scratch) and os.path.basename(scratch) == f"episode-{start.episode_id}"
        time.sleep(0.2)
        assert len(_tree(pool)) > before + 1  # worker + detached daemon
        pool.close([start.episode_id])
        assert not os.path.exists(scratch)
        leftover = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and
                    os.path.dirname(scratch) in " ".join(p.info["cmdline"])]
        assert len(_tree(pool)) == before and not leftover
        pool_dir = os.path.dirname(scratch)
    assert not os.path.exists(pool_dir)


@pytest.mark.skipif(not _namespaces_expected(), reason="user namespaces not available here")
def test_user_namespace_mode_drops_capabilities():
    probe = textwrap.dedent('''
        import os, json
        class ProbeEnv:
            def __init__(self, max_turns=5, **kwargs):
                pass
            def reset(self, seed=None):
                out = {"uid": os.getuid()}
                try:
                    os.setuid(0); os.chroot("/"); out["chroot"] = "ok"
                except OSError as err:
                    out["chroot"] = type(err).__name__
                with open("/proc/self/status") if os.path.exists("/proc") else open(os.devnull) as f:
                    out["proc"] = f.read()
                return json.dumps(out), {}
            def step(self, action):
                return "x", 0.0, True, False, {}
    ''')
    with SandboxPool(SandboxConfig(user_namespace=True, restrict_imports=False)) as pool:
        assert pool.isolation.method == "user-namespaces" and not pool.isolation.per_episode_uid
        result = pool.start([EpisodeSpec(probe)])[0]
        assert '"chroot": "PermissionError"' in result.observation and '"proc": ""' in result.observation
        assert pool.start([EpisodeSpec(GAME)])[0].ok


CLIENT = textwrap.dedent('''
    import os, sys
    import jax  # the trainer may have imported JAX; the host it spawns must not have
    from spade_jax.sandbox import SandboxPool, EpisodeSpec
    pool = SandboxPool()
    result = pool.start([EpisodeSpec(open(sys.argv[1]).read())])[0]
    assert result.ok, result.error
    print(pool.host_pid, flush=True)
    os._exit(0)  # die without closing the pool
''')


def test_host_is_jax_free_and_dies_with_its_client(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    out = subprocess.run([sys.executable, str(script), str(EXAMPLES / "boxed_game.py")], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    host_pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(host_pid) and psutil.Process(host_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the host outlived its client"
        time.sleep(0.05)


def test_host_never_maps_jax():
    with SandboxPool() as pool:
        pool.start([EpisodeSpec(GAME)])
        for proc in [psutil.Process(pool.host_pid), *_tree(pool)]:
            paths = [m.path for m in proc.memory_maps()]
            assert not any("jax" in p for p in paths), proc.pid


def test_sandbox_and_envs_import_without_jax():
    code = ("import sys, spade_jax.sandbox, spade_jax.admission, spade_jax.admission.__main__, "
            "spade_jax.sandbox.host_start, spade_jax.sandbox.play, spade_jax.envs, spade_jax.envs.library; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax')]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_step_results_round_trip():
    result = StepResult(3, "o", 0.5, True, False, {"a": 1}, turn=2, env_class="X")
    assert StepResult.from_dict(result.__dict__) == result and result.done and result.ok


@pytest.mark.skipif(not _namespaces_expected(), reason="namespaces not available here")
def test_auto_falls_back_to_rlimits_when_namespace_setup_fails(tmp_path, monkeypatch):
    from spade_jax.sandbox import pool as pool_module
    (tmp_path / "sitecustomize.py").write_text(
        "import spade_jax.sandbox.isolation as iso\n"
        "def refuse(dirs):\n"
        "    raise OSError(1, 'simulated: pivot_root refused')\n"
        "iso.build_private_root = refuse\n")
    base = pool_module.host_environment()
    monkeypatch.setattr(pool_module, "host_environment",
                        lambda: {**base, "PYTHONPATH": f"{tmp_path}:{base['PYTHONPATH']}"})
    with pytest.raises(SandboxError, match="simulated: pivot_root refused"):
        SandboxPool(SandboxConfig(isolation="namespaces"))
    with pytest.warns(RuntimeWarning, match="setting them up failed"):
        pool = SandboxPool(SandboxConfig(isolation="auto"))
    with pool:
        assert pool.isolation.method == "rlimits" and "simulated" in pool.isolation.notes[0]
        assert pool.start([EpisodeSpec(GAME)])[0].ok


def _status_within(proc: psutil.Process, expected: str, seconds: float = 5.0) -> str:
    """The process's status once it reads `expected`, or the last one read after `seconds`.

    SIGSTOP is pending from the moment kill() returns (the worker runs no more user code), but
    /proc shows "stopped" only once the worker is next scheduled, which a loaded machine delays.
    """
    deadline = time.monotonic() + seconds
    while (status := proc.status()) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return status


def test_idle_workers_are_stopped_and_first_in_line_for_the_oom_killer(pool):
    """Between calls a worker is stopped (nothing it armed runs); the OOM killer takes workers first."""
    first = pool.start([EpisodeSpec(GAME, seed=1)])[0]
    (worker,) = _host_proper(pool).children()[0].children()
    assert _status_within(worker, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    with open(f"/proc/{worker.pid}/oom_score_adj") as f:
        assert int(f.read()) == 1000
    assert pool.step([first.episode_id], ["\\boxed{1}"])[0].observation == "Total is 1."
    assert _status_within(worker, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    pool.close([first.episode_id])


def test_strict_starts_only_when_every_protection_is_in_force():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with SandboxPool() as probe:
            missing = probe.isolation.missing
    if missing:
        with pytest.raises(IsolationUnavailable, match="not in force: " + missing[0]):
            SandboxPool(SandboxConfig(isolation="strict"))
    else:
        with SandboxPool(SandboxConfig(isolation="strict")) as pool:
            assert pool.isolation.full and pool.start([EpisodeSpec(GAME)])[0].ok
