"""The persistent compilation cache: where it goes, and a repeated or resumed run compiling nothing twice."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from spade_jax import compile_cache

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def jax_cache_dir():
    """Sets JAX's cache directory for one test (`set(None)` clears it), then puts it back."""
    before = jax.config.jax_compilation_cache_dir
    yield lambda value: jax.config.update("jax_compilation_cache_dir", value)
    jax.config.update("jax_compilation_cache_dir", before)


def test_cache_dir_follows_the_setting_then_jax_then_the_workdir(tmp_path, jax_cache_dir):
    jax_cache_dir(None)
    assert compile_cache.cache_dir("", tmp_path) == tmp_path / "xla_cache"
    assert compile_cache.cache_dir("", None) is None
    assert compile_cache.cache_dir("none", tmp_path) is None
    assert compile_cache.cache_dir(str(tmp_path / "shared"), tmp_path) == tmp_path / "shared"
    jax_cache_dir(str(tmp_path / "from_env"))
    assert compile_cache.cache_dir("", tmp_path) == tmp_path / "from_env"
    assert compile_cache.cache_dir("none", tmp_path) is None


def test_counts_since_subtracts_field_by_field():
    later = compile_cache.CompileCounts(programs=7, seconds=3.5, cache_hits=4)
    earlier = compile_cache.CompileCounts(programs=2, seconds=1.0, cache_hits=1)
    assert later.since(earlier) == compile_cache.CompileCounts(5, 2.5, 3)
    assert later.since(earlier).compiled == 2


_PROGRAMS = """
import json, sys
import jax, jax.numpy as jnp
from spade_jax import compile_cache
compile_cache.enable(sys.argv[1])
f = jax.jit(lambda x, n: jnp.cumsum(x * n) @ x, static_argnums=1)
for n in (1, 2, 3):
    f(jnp.arange(64.0), n).block_until_ready()
c = compile_cache.counts()
print(json.dumps({"programs": c.programs, "hits": c.cache_hits}))
"""


def _programs(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    out = subprocess.run([sys.executable, "-c", _PROGRAMS, str(cache)], cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_second_process_loads_every_program_the_first_compiled(tmp_path):
    first = _programs(tmp_path / "xla")
    assert first["programs"] >= 3 and first["hits"] == 0
    second = _programs(tmp_path / "xla")
    assert second == {"programs": first["programs"], "hits": first["programs"]}


def _run(workdir: Path, config: Path, cache: Path, *extra: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    proc = subprocess.run(
        [sys.executable, "-m", "spade_jax.main", f"--config={config}", f"--workdir={workdir}",
         f"--config.compile_cache_dir={cache}", *extra],
        cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_compiles_only_what_the_uninterrupted_run_compiled_after_the_resume_point(
        tmp_path, runlocal_config):
    config = runlocal_config(2)
    first = _run(tmp_path / "first", config, tmp_path / "xla")
    assert [m["time/programs_cached"] for m in first] == [0, 0]
    assert first[0]["time/programs_compiled"] > 0
    # Stopped after iteration 0 (a one-iteration run), then resumed to the end: iteration 1
    # compiles only the programs the uninterrupted run first needed at iteration 1 and loads
    # the ones the stopped process compiled.
    stopped = _run(tmp_path / "resumed", config, tmp_path / "xla_resumed", "--config.num_iterations=1")
    assert stopped[0]["time/programs_compiled"] == first[0]["time/programs_compiled"]
    resumed = _run(tmp_path / "resumed", config, tmp_path / "xla_resumed")
    assert len(resumed) == 2
    assert resumed[1]["time/programs_compiled"] == first[1]["time/programs_compiled"]
    assert resumed[1]["time/programs_cached"] > 0
