"""Sandbox overhead against plain in-process exec (the unprotected reference).

    python bench/sandbox.py [--starts 100] [--steps 2000] [--episodes 256]

Prints one table: cold start of an episode (worker forked and jailed, module run, class
instantiated, reset done), round trip of one ``step`` on a trivial env, and episodes/s on a
short game (tests/sandbox_examples/boxed_game.py played by its own solution, 64 episodes in
flight, start + steps + close) with 1 and 2 workers. The reference runs the same program with
``exec`` in this process: module once, then instantiate/reset/step per episode. Targets:
step round trip < 1 ms median, episode start < 50 ms median. Run by hand, not in CI; on a
shared machine the numbers are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from spade_jax.envs import SUCCESS_REWARD, ToolUseEnv, extract_boxed
from spade_jax.sandbox import EpisodeSpec, SandboxConfig, SandboxPool

ROOT = Path(__file__).resolve().parents[1]

TRIVIAL = '''
class TrivialEnv:
    def __init__(self, max_turns=10 ** 9, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        return "ready", {}
    def step(self, action):
        return "ok", 0.0, False, False, {}
'''
GAME = (ROOT / "tests" / "sandbox_examples" / "boxed_game.py").read_text()
IN_FLIGHT = 64


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _class(source: str):
    scope = {"ToolUseEnv": ToolUseEnv, "extract_boxed": extract_boxed, "SUCCESS_REWARD": SUCCESS_REWARD,
             "__name__": "bench_env"}
    exec(compile(source, "<bench>", "exec"), scope)
    return next(v for k, v in scope.items() if k.endswith("Env") and isinstance(v, type) and v is not ToolUseEnv)


def reference(starts: int, steps: int, episodes: int) -> dict:
    start_s = []
    for _ in range(starts):
        t = time.perf_counter()
        env = _class(TRIVIAL)()
        env.reset(0)
        start_s.append(time.perf_counter() - t)
    env = _class(TRIVIAL)()
    env.reset(0)
    step_s = []
    for _ in range(steps):
        t = time.perf_counter()
        env.step("x")
        step_s.append(time.perf_counter() - t)
    cls = _class(GAME)
    t = time.perf_counter()
    for seed in range(episodes):
        env = cls()
        env.reset(seed)
        for action in env.solution().splitlines():
            env.step(action)
    rate = episodes / (time.perf_counter() - t)
    return {"start": start_s, "step": step_s, "rate1": rate, "rate2": rate}


def _episodes_per_s(workers: int, episodes: int, solutions: dict) -> float:
    with SandboxPool(SandboxConfig(num_workers=workers)) as pool:
        t = time.perf_counter()
        for first in range(0, episodes, IN_FLIGHT):
            seeds = list(range(first, min(episodes, first + IN_FLIGHT)))
            ids = [r.episode_id for r in pool.start([EpisodeSpec(GAME, seed=s) for s in seeds])]
            plans = {eid: solutions[s] for eid, s in zip(ids, seeds)}
            turn = 0
            while True:
                live = [eid for eid in ids if turn < len(plans[eid])]
                if not live:
                    break
                pool.step(live, [plans[eid][turn] for eid in live])
                turn += 1
            pool.close(ids)
        return episodes / (time.perf_counter() - t)


def sandboxed(starts: int, steps: int, episodes: int) -> tuple[dict, str]:
    with SandboxPool(SandboxConfig(num_workers=1)) as pool:
        isolation = pool.isolation
        start_s = []
        for _ in range(starts):
            t = time.perf_counter()
            result = pool.start([EpisodeSpec(TRIVIAL)])[0]
            start_s.append(time.perf_counter() - t)
            pool.close([result.episode_id])
        eid = pool.start([EpisodeSpec(TRIVIAL)])[0].episode_id
        step_s = []
        for _ in range(steps):
            t = time.perf_counter()
            pool.step([eid], ["x"])
            step_s.append(time.perf_counter() - t)
    cls = _class(GAME)
    solutions = {}
    for seed in range(episodes):
        env = cls()
        env.reset(seed)
        solutions[seed] = env.solution().splitlines()
    rates = {f"rate{w}": _episodes_per_s(w, episodes, solutions) for w in (1, 2)}
    iso = f"{isolation.method}, " + (f"missing {', '.join(isolation.missing)}" if isolation.missing
                                      else "every protection in force")
    return {"start": start_s, "step": step_s, **rates}, iso


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--episodes", type=int, default=256)
    args = parser.parse_args()
    ref = reference(args.starts, args.steps, args.episodes)
    box, iso = sandboxed(args.starts, args.steps, args.episodes)
    ms = 1e3
    rows = [  # (name, sandbox, reference, lower_is_better)
        ("episode start, median (ms)", ms * statistics.median(box["start"]), ms * statistics.median(ref["start"]), 1),
        ("episode start, p99 (ms)", ms * _pct(box["start"], 0.99), ms * _pct(ref["start"], 0.99), 1),
        ("step round trip, median (ms)", ms * statistics.median(box["step"]), ms * statistics.median(ref["step"]), 1),
        ("step round trip, p99 (ms)", ms * _pct(box["step"], 0.99), ms * _pct(ref["step"], 0.99), 1),
        ("episodes/s, 1 worker", box["rate1"], ref["rate1"], 0),
        ("episodes/s, 2 workers", box["rate2"], ref["rate2"], 0),
    ]
    print(f"command: python bench/sandbox.py --starts {args.starts} --steps {args.steps} --episodes {args.episodes}")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; isolation: {iso}")
    print("reference: plain exec in this process (no isolation, one thread); "
          "slowdown = how many times the sandbox is slower")
    print()
    print(f"| {'metric':30} | {'sandbox':>10} | {'in-process':>10} | {'slowdown':>9} |")
    print(f"|{'-' * 32}|{'-' * 11}:|{'-' * 11}:|{'-' * 10}:|")
    for name, sandbox, plain, lower in rows:
        slowdown = sandbox / plain if lower else plain / sandbox
        print(f"| {name:30} | {sandbox:10.3f} | {plain:10.4f} | {slowdown:8.0f}x |")


if __name__ == "__main__":
    main()
