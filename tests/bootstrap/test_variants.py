"""Structural variants of the seed programs: same behaviour, different shape.

Every rewrite is checked on its own (probability 1 at every site) and all together: the
variant must parse, and for several seeds give the seed program's observations,
rewards, termination and solution, under the solution's actions and under malformed
ones. Programs are trusted (our own seeds), so they run in-process here.
"""

import ast
import random
import statistics

import pytest

from spade_jax.admission.similarity import code_similarity, fingerprint, jaccard
from spade_jax.envs import library
from spade_jax.bootstrap import variants

PROBES = ["", "junk", "\\boxed{1}", "\\boxed{A}", "\\boxed{up}", "\\boxed{flip 1}", "\\boxed{answer 1 2}",
          "<answer>1</answer>", '<tool_call>{"name": "roads", "arguments": {"town": "A"}}</tool_call>']


def _load(source):
    namespace = {"__name__": "variant"}
    exec(compile(source, "variant", "exec"), namespace)
    (cls,) = [v for k, v in namespace.items()
              if k.endswith("Env") and isinstance(v, type) and v.__module__ == "variant"]
    return cls


def _trace(cls, seed):
    env = cls()
    out = [env.reset(seed)[0], env.solution()]
    for actions in (out[1].splitlines(), PROBES * 2):
        env.reset(seed)
        for action in actions:
            observation, reward, terminated, truncated, _ = env.step(action)
            out.append((observation, reward, terminated, truncated))
            if terminated or truncated:
                break
    return out


def _assert_same_behaviour(original, variant, seeds=range(3)):
    reference, candidate = _load(original), _load(variant)
    for seed in seeds:
        assert _trace(reference, seed) == _trace(candidate, seed), (seed, variant)


@pytest.mark.parametrize("rewrite", variants.REWRITES, ids=lambda r: r.__name__)
def test_each_rewrite_alone_keeps_behaviour(rewrite):
    changed = 0
    for env in library.SEED_ENVS:
        source = library.load_source(env.name)
        tree = ast.parse(source)
        rewrite(tree, random.Random(0))
        variant = variants.format_program(tree, source)
        _assert_same_behaviour(source, variant, seeds=range(2))
        changed += variant != variants.format_program(ast.parse(source), source)
    assert changed >= 1, f"{rewrite.__name__} found no site in the whole library"


def test_format_program_keeps_the_seed_shape_and_knob_comments():
    for env in library.SEED_ENVS:
        source = library.load_source(env.name)
        printed = variants.format_program(ast.parse(source), source)
        _assert_same_behaviour(source, printed, seeds=range(2))
        for knob in env.knobs:
            line = next(line for line in source.splitlines() if line.startswith(f"{knob} = "))
            assert line in printed.splitlines()
        assert code_similarity(source, printed) > 0.8, env.name  # printing alone is not novelty
        assert '"""' in printed and "\n\n\nclass " in printed


def test_random_variants_keep_behaviour_and_leave_the_seeds_behind():
    rng = random.Random(1)
    archive = [fingerprint(library.load_source(env.name)) for env in library.SEED_ENVS]
    similarities = []
    for env in library.SEED_ENVS:
        for _ in range(3):
            knobs = {knob: rng.choice(values) for knob, values in env.knobs.items()}
            source = library.render(env.name, knobs)
            variant = variants.vary(source, rng, 0.7)
            _assert_same_behaviour(source, variant, seeds=range(2))
            similarities.append(max(jaccard(fingerprint(variant), seed) for seed in archive))
    # the admission default novelty threshold is 0.85; measured mean about 0.53 (a few percent reach 0.8)
    assert statistics.mean(similarities) < 0.6 and statistics.median(similarities) < 0.6


def test_vary_is_deterministic_and_p_zero_only_reprints():
    source = library.load_source("knapsack")
    assert variants.vary(source, random.Random(5), 0.5) == variants.vary(source, random.Random(5), 0.5)
    assert variants.vary(source, random.Random(5), 0.0) == variants.format_program(ast.parse(source), source)
    with pytest.raises(ValueError, match="probability"):
        variants.vary(source, random.Random(0), 1.5)
