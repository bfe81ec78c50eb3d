"""Environment packs (`python -m spade_jax.envpack`): a run's admitted environments as an installable
package that Gymnasium and OpenEnv load, every step in the sandbox, no literal special token in any file.

Two runs: one whose environment log is written with the run's own `EnvLog` (a seed, a hostile
admitted design spelling every special token of the shipped tokenizers, a replay of it that
retired it, a design the sandbox's parse stage refuses, a rejected design, and a program whose
step never returns), and a real `configs/tiny.py:runlocal` run of one iteration. The OpenEnv
check runs in the venv `launch/setup_side_env.sh openenv` makes (tests/envpack_openenv_check.py);
without that venv it is skipped, except under CI, where it is made first.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from tests.special_tokens import literal_special_tokens, shipped_special_tokens
from spade_jax.envpack.manifest import PackError
from spade_jax.envpack.runtime import EpisodeError
from spade_jax.envs import library
from spade_jax.sandbox import SandboxConfig
from spade_jax.selfplay.runlog import EnvLog, EnvLogEntry

REPO = Path(__file__).resolve().parents[2]
HOSTILE_NAME = "spade_envs_hostile"

LOOPING = '''
class LoopingEnv:
    def reset(self, seed=None):
        return "Say anything.", {}

    def step(self, action):
        while True:
            pass
'''

REFUSED = '''
import os


class ShellEnv:
    def reset(self, seed=None):
        return os.getcwd(), {}
'''


def _env(*args: str) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(args))


def _pack_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spade_jax.envpack", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=_env(str(REPO)))


def _import_pack(out: Path, name: str):
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(name)


def _solution_actions(env) -> list[str]:
    return [line for line in env.unwrapped.solution().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tokens(smollm2_gguf_path, small_tokenizer):
    return shipped_special_tokens(smollm2_gguf_path, small_tokenizer)


@pytest.fixture(scope="module")
def hostile_source(tokens):
    """number_guess with every special token in a comment and a module constant: still a valid program."""
    spelled = "".join(tokens)
    return (library.load_source("number_guess") + f"\n# {' '.join(tokens)}\nBANNER = {spelled!r}\n")


@pytest.fixture(scope="module")
def designed_run(tmp_path_factory, tokens, hostile_source):
    """A run directory whose environment log the run's `EnvLog` wrote."""
    workdir = tmp_path_factory.mktemp("designed_run")
    spelled = "".join(tokens)
    calibration = {"level": "hard", "levels": [None, "easy", "medium", "hard"], "agent": [0.0, 0.9, 0.5, 0.25],
                   "solution": [1.0, 1.0, 1.0, 1.0], "gap": [1.0, 0.1, 0.5, 0.75], "admitted": True}
    EnvLog(workdir).append([
        EnvLogEntry(0, "seed-number_guess", skill="logical deduction", code=library.load_source("number_guess"),
                    admitted=True, is_seed=True, replay=True, win_rate=0.25, mean_plain=0.25, regret=0.5),
        EnvLogEntry(0, "it0000-slot00", skill="logical deduction " + spelled, doc_id="doc-" + spelled + "\ud800",
                    code=hostile_source, admitted=True, slot=0, difficulty="hard", level="hard",
                    calibration=calibration, win_rate=0.5, hinted_win_rate=1.0, mean_plain=0.5, mean_hinted=1.0,
                    regret=0.5, designer_reward=0.3),
        EnvLogEntry(0, None, skill="logical deduction", code="import os" + spelled, admitted=False, slot=1,
                    stage="parse", reason="import of 'os' refused"),
        EnvLogEntry(0, "it0000-slot02", skill="spatial reasoning", code=REFUSED, admitted=True, slot=2),
        EnvLogEntry(1, "it0000-slot00", skill="logical deduction " + spelled, code=hostile_source, admitted=True,
                    replay=True, level="hard", win_rate=0.75, mean_plain=0.75, regret=0.125,
                    retired="mastered: won 6 of its last 8 plays"),
        EnvLogEntry(1, "it0001-slot00", skill="pattern recognition", doc_id="loop", code=LOOPING, admitted=True),
    ])
    return workdir


@pytest.fixture(scope="module")
def hostile_pack(designed_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs") / "hostile"
    proc = _pack_cli(f"--workdir={designed_run}", f"--out={out}", f"--name={HOSTILE_NAME}", "--version=1.2.3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"packed 3 environment(s) (1 seed(s)) of {designed_run} as {HOSTILE_NAME} 1.2.3" in proc.stdout
    assert "skipped it0000-slot02: its program fails the parse stage" in proc.stderr and "'os'" in proc.stderr
    return out


@pytest.fixture(scope="module")
def hostile(hostile_pack):
    return _import_pack(hostile_pack, HOSTILE_NAME)


def test_a_pack_holds_the_runs_admitted_environments_with_their_statistics(hostile_pack, hostile, tokens,
                                                                           hostile_source):
    manifest = json.loads((hostile_pack / HOSTILE_NAME / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["name"] == HOSTILE_NAME and manifest["version"] == "1.2.3"
    assert manifest["run"]["last_iteration"] == 1
    assert [s[0] for s in manifest["run"]["skipped"]] == ["it0000-slot02"]
    seed, design, looping = manifest["environments"]
    assert [e["env_id"] for e in (seed, design, looping)] == ["seed-number_guess", "it0000-slot00", "it0001-slot00"]
    assert seed["is_seed"] and seed["win_rate"] == 0.25 and seed["regret"] == 0.5 and seed["plays"] == 1
    assert design["skill"] == "logical deduction " + "".join(tokens)  # designed text kept exactly, escaped in the file
    assert design["doc_id"] == "doc-" + "".join(tokens) + "\ud800"
    assert design["levels"] == ["easy", "medium", "hard"] and design["level"] == "hard"
    assert design["calibration"]["agent"] == [0.0, 0.9, 0.5, 0.25]
    assert (design["win_rate"], design["regret"], design["measured_iteration"], design["plays"]) == (0.75, 0.125, 1, 2)
    assert design["designer_reward"] is None and design["iteration_added"] == 0  # the replay's, as measured last
    assert design["retired"].startswith("mastered") and not design["is_seed"]
    assert looping["levels"] == [] and looping["win_rate"] is None and looping["plays"] == 0
    assert design["gym_id"] == f"{HOSTILE_NAME}/it0000-slot00-v0" and hostile.ENV_IDS[1] == design["gym_id"]
    program = json.loads((hostile_pack / HOSTILE_NAME / design["program"]).read_text(encoding="utf-8"))
    assert program["source"] == hostile_source  # byte for byte once decoded
    assert hostile.PACK.program("it0000-slot00") == hostile_source
    readme = (hostile_pack / "README.md").read_text(encoding="utf-8")
    assert f"`{design['gym_id']}`" in readme and "| easy, medium, hard | hard | 0.75 | 0.12 |" in readme


def test_no_file_of_a_pack_holds_a_special_token_of_a_shipped_tokenizer(hostile_pack, tokens):
    files = sorted(str(p.relative_to(hostile_pack)) for p in hostile_pack.rglob("*") if p.is_file())
    assert len(files) == 8 and "README.md" in files and "pyproject.toml" in files
    assert literal_special_tokens(hostile_pack, tokens) == {}
    for path in hostile_pack.rglob("*"):
        if path.is_file():
            path.read_bytes().decode("utf-8")  # valid UTF-8, the lone surrogate of the doc id escaped


def test_a_pack_installs_with_pip_and_lists_its_environments(hostile_pack, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(hostile_pack)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = target / HOSTILE_NAME
    assert (installed / "manifest.json").exists() and len(list((installed / "programs").glob("*.json"))) == 3
    listing = subprocess.run([sys.executable, "-m", HOSTILE_NAME, "list"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env=_env(str(target), str(REPO)))
    assert listing.returncode == 0, listing.stderr[-3000:]
    assert f"{HOSTILE_NAME} 1.2.3: 3 environment(s)" in listing.stdout
    assert f"{HOSTILE_NAME}/it0000-slot00-v0" in listing.stdout and "level=hard  win_rate=0.75" in listing.stdout
    serve = subprocess.run([sys.executable, "-m", HOSTILE_NAME, "serve", "--port", "0"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env=_env(str(target), str(REPO)))
    assert serve.returncode == 2 and "serving needs openenv-core" in serve.stderr  # .venv has no openenv


@pytest.mark.parametrize("env_id", ["seed-number_guess", "it0000-slot00"])
def test_gymnasium_checks_each_environment_and_its_solution_wins_in_the_sandbox(hostile, env_id):
    gym_id = f"{HOSTILE_NAME}/{env_id}-v0"
    checked = gymnasium.make(gym_id)
    check_env(checked.unwrapped)
    checked.close()
    env = gymnasium.make(gym_id)
    observation, info = env.reset(seed=11)
    assert env.observation_space.contains(observation) and info["episode_seed"] == 11
    again, _ = env.reset(seed=11)
    assert again == observation
    if env_id == "it0000-slot00":
        assert info["difficulty"] == "hard" and "from 1 to 200" in observation  # its calibrated level
    rewards = []
    for action in _solution_actions(env):
        observation, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
    assert terminated and not truncated and info["won"] is True and rewards[-1] == 1.0 and sum(rewards) == 1.0
    with pytest.raises(EpisodeError, match="reset first"):
        env.step("\\boxed{1}")
    env.close()
    env.close()


def test_a_step_that_never_returns_ends_in_the_sandbox_not_in_the_caller(hostile):
    env = gymnasium.make(f"{HOSTILE_NAME}/it0001-slot00-v0",
                         sandbox=SandboxConfig(num_workers=1, call_timeout_s=1.0, timeout_reward=-0.5))
    observation, _ = env.reset(seed=0)
    assert observation == "Say anything."
    observation, reward, terminated, truncated, info = env.step("hello")
    assert (reward, terminated, truncated, info["timed_out"]) == (-0.5, False, True, True) and info["error"]
    observation, _ = env.reset(seed=1)  # the same env plays on
    assert observation == "Say anything."
    env.close()


def test_envs_share_a_pool_the_caller_passes_and_leave_it_running(hostile):
    from spade_jax.sandbox import SandboxPool

    with SandboxPool(SandboxConfig(num_workers=1)) as pool:
        envs = [gymnasium.make(f"{HOSTILE_NAME}/{env_id}-v0", pool=pool)
                for env_id in ("seed-number_guess", "it0000-slot00")]
        for env in envs:
            env.reset(seed=2)
        assert pool.stats()["live"] == 2
        for env in envs:
            env.close()
        assert pool.stats()["live"] == 0
        envs[0].reset(seed=2)  # the pool still runs
        envs[0].close()


def test_reset_options_actions_and_a_changed_pack_are_checked(hostile, hostile_pack, tmp_path):
    env = gymnasium.make(f"{HOSTILE_NAME}/it0000-slot00-v0")
    with pytest.raises(EpisodeError, match="reset first"):
        env.unwrapped.step("\\boxed{1}")
    observation, info = env.reset(seed=5, options={"difficulty": "easy"})
    assert "from 1 to 10" in observation and info["difficulty"] == "easy"
    with pytest.raises(ValueError, match="no difficulty level 'extreme'; its program declares: easy, medium, hard"):
        env.reset(options={"difficulty": "extreme"})
    with pytest.raises(ValueError, match="unknown reset options \\['colour'\\]"):
        env.reset(options={"colour": "red"})
    env.reset(seed=5)
    with pytest.raises(TypeError, match="a str"):
        env.unwrapped.step(7)
    env.close()
    from spade_jax.envpack.runtime import Pack

    changed = tmp_path / HOSTILE_NAME
    import shutil

    shutil.copytree(hostile_pack / HOSTILE_NAME, changed)
    program = changed / "programs" / "it0000-slot00.json"
    data = json.loads(program.read_text(encoding="utf-8"))
    program.write_text(json.dumps({**data, "source": data["source"] + "\nX = 1\n"}), encoding="utf-8")
    with pytest.raises(PackError, match="the pack was changed after it was written"):
        Pack.load(changed).program("it0000-slot00")
    with pytest.raises(PackError, match="has no environment 'nope'; it has: seed-number_guess, it0000-slot00"):
        Pack.load(changed).env("nope")


def test_packing_errors_name_what_to_fix(designed_run, tmp_path):
    from spade_jax.envpack.source import admitted_envs
    from spade_jax.envpack.write import write_pack

    with pytest.raises(PackError, match="does not exist"):
        admitted_envs(str(tmp_path / "nowhere"))
    with pytest.raises(PackError, match="has no environment log \\(gallery/envs.jsonl\\)"):
        admitted_envs(str(tmp_path))
    admitted, _ = admitted_envs(str(designed_run))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(PackError, match="exists and is not an empty directory"):
        write_pack(admitted, str(tmp_path / "full"), name="spade_envs_x")
    for name in ("Bad-Name", "spade_jax", "class", "9lives"):
        with pytest.raises(PackError, match="must be a Python package name"):
            write_pack(admitted, str(tmp_path / "c"), name=name)
    with pytest.raises(PackError, match="numbers joined by dots"):
        write_pack(admitted, str(tmp_path / "c"), name="spade_envs_x", version="1.0-beta")
    rejected_only = tmp_path / "rejected_only"
    EnvLog(rejected_only).append([EnvLogEntry(0, None, code="x", admitted=False),
                                  EnvLogEntry(0, "seed-sequence", code=library.load_source("sequence"), admitted=True,
                                              is_seed=True, replay=True)])
    none = _pack_cli(f"--workdir={rejected_only}", f"--out={tmp_path / 'd'}", "--noseeds")
    assert none.returncode == 2 and "has no admitted environment besides seeds" in none.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_an_installed_packs_runtime_imports_no_jax(hostile_pack):
    code = (f"import sys, gymnasium, {HOSTILE_NAME}; gymnasium.make({HOSTILE_NAME}.ENV_IDS[0]).close(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax', 'orbax', 'absl'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_env(str(hostile_pack), str(REPO)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def runlocal_pack(runlocal_config, tmp_path_factory):
    """The pack of a real `configs/tiny.py:runlocal` run of one iteration."""
    workdir = tmp_path_factory.mktemp("runlocal")
    run = subprocess.run([sys.executable, "-m", "spade_jax.main", f"--config={runlocal_config(1)}",
                          f"--workdir={workdir}"], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=_env(str(REPO)))
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    out = tmp_path_factory.mktemp("packs") / "runlocal"
    proc = _pack_cli(f"--workdir={workdir}", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, f"spade_envs_{workdir.name.lower()}"


def test_a_pack_of_a_runlocal_run_loads_in_gymnasium_and_plays_each_solution_to_a_win(runlocal_pack):
    out, name = runlocal_pack
    pack = _import_pack(out, name)
    assert pack.ENV_IDS and all(e.is_seed for e in pack.PACK.environments)  # runlocal designs fail to parse
    for gym_id in pack.ENV_IDS:
        env = gymnasium.make(gym_id)
        check_env(env.unwrapped)
        env.reset(seed=3)
        for action in _solution_actions(env):
            *_, terminated, truncated, info = env.step(action)
        assert terminated and info["won"] is True, gym_id
        env.close()


@pytest.fixture(scope="session")
def openenv_python(side_python) -> str:
    return side_python("openenv")


def test_both_packs_play_each_solution_to_a_win_through_an_openenv_server(openenv_python, hostile_pack,
                                                                         runlocal_pack, tmp_path):
    runlocal_out, runlocal_name = runlocal_pack
    proc = subprocess.run([str(openenv_python), str(REPO / "tests" / "envpack" / "envpack_openenv_check.py"),
                           str(hostile_pack / HOSTILE_NAME), str(runlocal_out / runlocal_name)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=_env(str(REPO)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    hostile, runlocal = report["packs"]
    assert report["serve_command"]["health"]["status"] == "healthy"
    assert report["serve_command"]["action_required"] == ["text"]
    assert set(hostile["typed"]) == {"seed-number_guess", "it0000-slot00", "it0001-slot00"}
    for pack in (hostile, runlocal):
        played = {k: v for k, v in pack["typed"].items() if k != "it0001-slot00"}  # it has no solution
        assert played and pack["generic"]
        for env_id, result in [*played.items(), *pack["generic"].items()]:
            assert result["done"] and result["won"] is True and result["rewards"][-1] == 1.0, (env_id, result)
            assert result["first_observation"] and result["state"]["env_id"] == env_id
            assert result["state"]["step_count"] == len(result["rewards"]) and result["state"]["episode_seed"] == 3
        assert "has no environment 'no-such-env'" in pack["unknown_env_error"] and pack["action_required"] == ["text"]
    assert hostile["typed"]["it0000-slot00"]["state"]["difficulty"] == "hard"
