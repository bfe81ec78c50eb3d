"""No training hint gives an instance's answer away (issue 32).

A hint leaks when some action it carries wins the instance blind. The checker
(`winning_candidates`) takes every candidate the hint text offers: its literal actions
(``\\boxed{..}``, ``<answer>..</answer>``, tool calls), quoted strings, words, numbers and
the hint's numbers joined as a list, each also written as the env's answer forms; and it
plays each as one fixed answer, the same every turn, through the env's own reset/step (as
admission's blind stage plays its fixed answers, `admission.probes.blind_script`). None may
win. The checker is not vacuous: it catches a hint that names the answer as a bare word,
and mode `solution` (the diagnostic upper bound) leaks on nearly every instance.

Coverage: the 17 seed-library programs at their written knobs and at each declared
difficulty, 4 seeds each; the tiny bootstrap's renderings (`bootstrap.data.render_programs`,
its 6 seed families x 3 difficulties) at their own knobs and each declared difficulty, 3
seeds each. Modes: `strategy` (the hints themselves) and `self` (its prompt is built from
the program text alone, so it holds no solution the program text does not).
"""

from __future__ import annotations

import itertools
import random
import re
import types

import pytest

from spade_jax.agent import hints
from spade_jax.agent.rollout import HINT_SEPARATOR, solution_hint
from spade_jax.agent.strategy import MATCH_THRESHOLD, STRATEGY_HINTS, nearest_seed, program_words, strategy_hint
from spade_jax.bootstrap import data
from spade_jax.bootstrap.build import BootstrapConfig
from spade_jax.envs import library
from spade_jax.envs.contract import is_success

LIBRARY_SEEDS = range(4)
RENDERING_SEEDS = range(3)
_LITERAL = re.compile(r"\\boxed\{[^{}]*\}|<answer>.*?</answer>|<tool_call>.*?</tool_call>", re.DOTALL)
_QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")
_TOKEN = re.compile(r"-?\d+|[A-Za-z]+")


def candidate_actions(hint: str) -> list[str]:
    """Every action ``hint`` offers (see module docstring), deduplicated, in order."""
    literals = _LITERAL.findall(hint)
    values = [a or b for a, b in _QUOTED.findall(hint)]
    values += [m[len("\\boxed{"):-1] for m in literals if m.startswith("\\boxed{")]
    values += [m[len("<answer>"):-len("</answer>")] for m in literals if m.startswith("<answer>")]
    tokens = _TOKEN.findall(hint)
    values += tokens
    numbers = [t for t in tokens if t.lstrip("-").isdigit()]
    values += [",".join(numbers), " ".join(numbers)] if len(numbers) > 1 else []
    actions = literals + [form % v for v in values if v.strip() for form in ("\\boxed{%s}", "<answer>%s</answer>")]
    return list(dict.fromkeys(actions))


def load_env_class(source: str):
    """The ``*Env`` class of ``source``, executed in a fresh namespace (module constants per load)."""
    namespace = {"__name__": "leak_env"}
    exec(compile(source, "leak_env", "exec"), namespace)
    (cls,) = [v for k, v in namespace.items() if k.endswith("Env") and isinstance(v, type)
              and v.__module__ == "leak_env"]
    return cls


def instance_levels(source: str) -> list[str | None]:
    """None (the program's written knobs) then each difficulty it declares."""
    return [None, *getattr(load_env_class(source), "DIFFICULTY_LEVELS", ())]


def _make(source: str, level: str | None, seed: int):
    env = load_env_class(source)(**({"difficulty": level} if level else {}))
    env.reset(seed=seed)
    return env


def wins_blind(source: str, level: str | None, seed: int, action: str) -> bool:
    """Whether playing ``action`` every turn wins this instance."""
    env = _make(source, level, seed)
    for _ in range(getattr(env, "max_turns", 10) + 1):
        _, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return bool(terminated and is_success(reward))
    return False


def winning_candidates(source: str, hint: str, levels, seeds) -> list[tuple]:
    """The (level, seed, action) triples where an action of ``hint`` wins blind."""
    actions = candidate_actions(hint)
    return [(level, seed, a) for level in levels for seed in seeds for a in actions
            if wins_blind(source, level, seed, a)]


def _library_sources():
    return [(env.name, library.load_source(env.name)) for env in library.SEED_ENVS]


@pytest.fixture(scope="module")
def renderings():
    cfg = BootstrapConfig()
    keys = [(name, level) for name in cfg.envs for level in ("easy", "medium", "hard")]
    return data.render_programs(keys, len(keys), random.Random(0), cfg.rewrite_p, cfg.max_similarity)


def test_the_checker_reads_every_kind_of_candidate():
    actions = candidate_actions("Try 'Oslo' or \\boxed{up}; the point 3, -2 is near B.")
    for expected in ("\\boxed{up}", "<answer>Oslo</answer>", "\\boxed{Oslo}", "\\boxed{3,-2}", "\\boxed{3 -2}",
                     "<answer>B</answer>", "\\boxed{near}"):
        assert expected in actions
    assert len(actions) == len(set(actions))


def test_every_seed_family_has_a_strategy_hint_and_its_own_programs_find_it(renderings):
    assert set(STRATEGY_HINTS) == {env.name for env in library.SEED_ENVS}
    for name, source in _library_sources():
        assert nearest_seed(source) == (name, 1.0)
    for program in renderings:  # the bootstrap's structural variants keep their family's words
        name, score = nearest_seed(program.code)
        assert name == program.name and score > 0.9 and strategy_hint(program.code) == STRATEGY_HINTS[name]
    words = {name: program_words(source) for name, source in _library_sources()}
    closest = max(len(words[a] & words[b]) / len(words[a] | words[b]) for a, b in itertools.combinations(words, 2))
    assert closest < MATCH_THRESHOLD  # two different families never share a hint
    assert strategy_hint("class MazeEnv:\n    def reset(self, seed=None):\n        return 'Find the exit.', {}\n") is None


def test_strategy_hints_follow_the_hint_rules():
    for name, hint in STRATEGY_HINTS.items():
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", hint) if s]
        assert 1 <= len(sentences) <= 3 and len(hint.split()) < 100, name
        assert "\\boxed{}" in hint or "<answer></answer>" in hint, name  # the answer format, never a value
        assert not re.search(r"\d", hint), name


@pytest.mark.parametrize("name", [env.name for env in library.SEED_ENVS])
def test_no_strategy_hint_wins_a_library_instance(name):
    source = library.load_source(name)
    hint = strategy_hint(source)
    assert hint and winning_candidates(source, hint, instance_levels(source), LIBRARY_SEEDS) == []


def test_no_strategy_hint_wins_a_bootstrap_rendering(renderings):
    for program in renderings:
        hint = strategy_hint(program.code)
        leaks = winning_candidates(program.code, hint, instance_levels(program.code), RENDERING_SEEDS)
        assert hint and leaks == [], (program.name, program.difficulty, leaks[:3])


def test_the_self_prompt_holds_the_program_text_and_no_instance_data(renderings, monkeypatch):
    """Mode `self` asks with the program text only: one chat per program, the same for every
    seed and level, so no solution line appears in it that the program text lacks."""
    calls = []

    def fake_complete(policy, chats, **kwargs):
        calls.extend(chats)
        return [types.SimpleNamespace(text="") for _ in chats]

    sources = [source for _, source in _library_sources()] + [p.code for p in renderings]
    monkeypatch.setattr(hints, "complete_chats", fake_complete)
    monkeypatch.setattr(hints, "prompt_text", lambda tokenizer, text: text)  # no special tokens to escape
    out = hints.write_hints(types.SimpleNamespace(tokenizer=None), sources, hints.HintConfig())
    assert out == [None] * len(sources) and len(calls) == 3 * len(sources)  # empty hints: 2 retries
    for source, chat in zip(sources, calls):
        assert chat == [{"role": "system", "content": hints.system_prompt(source)},
                        {"role": "user", "content": f"Environment code:\n```python\n{source}\n```"}]
        prompt = chat[0]["content"] + chat[1]["content"]
        for level, seed in itertools.product(instance_levels(source), RENDERING_SEEDS):
            lines = [a for a in _make(source, level, seed).solution().splitlines() if a.strip()]
            assert all(line in source for line in lines if line in prompt)


def test_the_checker_catches_a_hint_that_names_the_answer():
    for name in ("knapsack", "nearest_city", "sequence", "plant_experiment"):
        source = library.load_source(name)
        last = _make(source, "medium", 1).solution().splitlines()[-1]
        value = re.sub(r"^\\boxed\{|\}$|^<answer>|</answer>$", "", last)
        leaky = STRATEGY_HINTS[name] + f" Between us: {value}."
        assert (("medium", 1, f"\\boxed{{{value}}}") in winning_candidates(source, leaky, ["medium"], [1])
                or ("medium", 1, f"<answer>{value}</answer>") in winning_candidates(source, leaky, ["medium"], [1]))


def test_solution_hints_leak_on_nearly_every_instance():
    """Mode `solution` reveals the plan: its hint wins blind wherever the plan's final answer
    alone wins (every one-answer game and tool-use program), not for a route or a schedule."""
    leaked, total = {}, {}
    for name, source in _library_sources():
        for level, seed in itertools.product(instance_levels(source)[1:], range(2)):
            hint = solution_hint(_make(source, level, seed).solution())
            total[name] = total.get(name, 0) + 1
            leaked[name] = leaked.get(name, 0) + bool(winning_candidates(source, hint, [level], [seed]))
    never_blind = {"grid_walk", "job_order"}  # a fixed move or job repeated cannot finish these
    assert all(leaked[name] == total[name] for name in total if name not in never_blind), leaked
    assert sum(leaked.values()) >= 0.85 * sum(total.values())


def test_bootstrap_hinted_transcripts_show_the_strategy_hint(renderings, small_tokenizer):
    """`data.play_solutions` in its default hint mode: the hinted transcript carries the
    family's strategy hint, rendered after the first observation, and no plan."""
    from spade_jax.sandbox import SandboxConfig, SandboxPool

    program = next(p for p in renderings if p.name == "tallest")
    with SandboxPool(SandboxConfig(num_workers=1)) as pool:
        plain, hinted = data.play_solutions(pool, [program.code], [0], [1], max_turns=8)
    assert (plain.hint, hinted.hint) == (None, STRATEGY_HINTS["tallest"])
    sequence = data.agent_sequence(small_tokenizer, hinted)
    text = small_tokenizer.decode(sequence.tokens.tolist())
    assert hinted.observations[0] + HINT_SEPARATOR + STRATEGY_HINTS["tallest"] in data.chat_texts([], [hinted])
    assert STRATEGY_HINTS["tallest"][:40] in text and "Winning actions" not in text
    assert hinted.actions[-1] not in hinted.hint
