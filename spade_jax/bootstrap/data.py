"""Training data for the tiny preset's bootstrap: designer and agent examples from the seed library.

Designer examples are the prompts the self-play designer builds at iteration 0 (skill,
difficulty, a document excerpt, exemplars drawn from a memory seeded with the library,
rendered by `designer.prompts`) answered with a structural variant of one of that skill's
seed programs (`bootstrap.variants`), its knobs drawn from the difficulty's third of
their ranges. Agent examples are solution transcripts: a conversation, token for token as
`agent.conversation.Conversation` builds it, whose assistant turns are the environment's
own `solution()` actions and whose observations come from really playing it in the
sandbox; hinted transcripts carry a hint in the first observation, as the rollout shows
it, and are played on seeds disjoint from the plain ones: by default (`HINT_MODES`
"strategy") the program's strategy hint (`agent.strategy`: how to approach the game and
the answer's form, never the instance's answer), as self-play shows it in hint mode
`strategy`; with "solution" the `solution` hint (the whole plan), so the actions of a
hinted transcript are learnable from its hint and not from a plain transcript of the same
instance. Hint drills (`hint_drill`) relabel a hinted
transcript's values at random in its actions and its plan alike, so that only the plan
predicts them: the examples that teach the policy to read a hint. Only the assistant's
tokens (and its end-of-turn token) are trained.

JAX-free: numpy, the designer and agent helpers and the sandbox client.
"""

from __future__ import annotations

import dataclasses
import random
import re
import string
from typing import Sequence

import numpy as np

from spade_jax.admission.similarity import fingerprint, jaccard
from spade_jax.agent.conversation import Conversation
from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT, HINT_SEPARATOR, solution_hint
from spade_jax.agent.strategy import strategy_hint
from spade_jax.designer.corpus import Document
from spade_jax.designer.memory import SEED_ID_PREFIX, EnvironmentMemory
from spade_jax.designer.prompts import DIFFICULTIES, PromptConfig, designer_answer, designer_messages, slot_exemplars
from spade_jax.envs import library
from spade_jax.envs.contract import is_success
from spade_jax.rl.batch import TrainSequence
from spade_jax.sandbox import EpisodeSpec, SandboxPool
from spade_jax.bootstrap.variants import vary


def seeded_memory(capacity: int = 200) -> EnvironmentMemory:
    """The environment memory at iteration 0: every seed program, unmeasured."""
    memory = EnvironmentMemory(capacity)
    for env in library.SEED_ENVS:
        memory.add_seed(library.load_source(env.name), env.skill, name=env.name)
    return memory


def knobs_for(env: library.SeedEnv, difficulty: str, rng: random.Random) -> dict[str, int]:
    """Knob values from the difficulty's third of each range (easy: lowest third)."""
    level = DIFFICULTIES.index(difficulty)
    knobs = {}
    for knob, values in env.knobs.items():
        n = len(values)
        low = level * n // len(DIFFICULTIES)
        high = max((level + 1) * n // len(DIFFICULTIES), low + 1)
        knobs[knob] = values[rng.randrange(low, high)]
    return knobs


@dataclasses.dataclass(frozen=True)
class Slot:
    """One designer training example before its program is chosen: the prompt and the seed to rewrite."""

    skill: str
    difficulty: str
    messages: list
    env: str  # the seed program the answer is a variant of


def designer_slots(n: int, memory: EnvironmentMemory, documents: Sequence[Document], prompt: PromptConfig,
                   envs: Sequence[str], rng: np.random.Generator) -> list[Slot]:
    """``n`` iteration-0 designer prompts cycling through every (skill, difficulty) pair.

    The messages are those the self-play designer builds (`designer.prompts.slot_exemplars`
    and `designer_messages`). Each is answered with a variant of one of the seed programs
    named in ``envs`` that trains the prompt's skill, drawn uniformly among those the
    prompt does not show as an exemplar (so the model learns to write a program unlike the
    ones in its memory, not to copy them); only when every program of the skill is shown
    does it draw among all of them. Every skill needs at least one program.
    """
    by_skill = {skill: [name for name in envs if library.get(name).skill == skill] for skill in library.SKILLS}
    uncovered = [skill for skill, names in by_skill.items() if not names]
    if uncovered:
        raise ValueError(f"the seed programs {list(envs)} leave skill(s) {uncovered} without a program")
    slots = []
    for i in range(n):
        skill = library.SKILLS[i % len(library.SKILLS)]
        difficulty = DIFFICULTIES[(i + i // len(library.SKILLS)) % len(DIFFICULTIES)]
        document = documents[int(rng.integers(len(documents)))]
        exemplars = slot_exemplars(memory, rng, prompt)
        messages = designer_messages(skill, difficulty, document.as_reference(), exemplars)
        shown = {e.env_id.removeprefix(SEED_ID_PREFIX) for e in exemplars}
        choices = [name for name in by_skill[skill] if name not in shown] or by_skill[skill]
        env = choices[int(rng.integers(len(choices)))]
        slots.append(Slot(skill, difficulty, messages, env))
    return slots


@dataclasses.dataclass(frozen=True)
class Program:
    """One rendered training program: which seed, its difficulty and knobs, and its text."""

    name: str
    difficulty: str
    knobs: dict
    code: str


def render_programs(keys: Sequence[tuple[str, str]], n: int, rng: random.Random, rewrite_p: float,
                    max_similarity: float = 1.0, attempts: int = 50) -> list[Program]:
    """``n`` structural variants cycling through the (seed name, difficulty) ``keys``.

    A variant whose shingle similarity (admission's novelty measure) to any seed program
    reaches ``max_similarity`` is drawn again, up to ``attempts`` times.
    """
    archive = [fingerprint(library.load_source(env.name)) for env in library.SEED_ENVS]
    programs = []
    for i in range(n):
        name, difficulty = keys[i % len(keys)]
        for _ in range(attempts):
            knobs = knobs_for(library.get(name), difficulty, rng)
            code = vary(library.render(name, knobs), rng, rewrite_p)
            if max(jaccard(fingerprint(code), seed) for seed in archive) < max_similarity:
                break
        else:
            raise ValueError(f"no variant of {name} in {attempts} attempts is below similarity {max_similarity}")
        programs.append(Program(name, difficulty, knobs, code))
    return programs


HINT_MODES = ("strategy", "solution")  # what a hinted transcript is shown (module docstring)


@dataclasses.dataclass(frozen=True)
class Transcript:
    """A won play of a program following its solution: observations and actions alternate."""

    program: str
    seed: int
    observations: tuple[str, ...]  # the first observation and the one after each action but the last
    actions: tuple[str, ...]
    hint: str | None


def play_solutions(pool: SandboxPool, programs: Sequence[str], plain_seeds: Sequence[int],
                   hinted_seeds: Sequence[int], max_turns: int, hint_mode: str = "strategy") -> list[Transcript]:
    """Plays every program by its own solution() in the sandbox on ``plain_seeds`` and
    ``hinted_seeds``; keeps the won plays.

    A won play on a plain seed yields a plain transcript; one on a hinted seed a hinted
    transcript: the hint of ``hint_mode`` (see `HINT_MODES`) appended to the first
    observation exactly as the rollout appends it (no hint, so a plain transcript, for a
    program with no strategy family). The two seed sets must be disjoint.
    """
    if hint_mode not in HINT_MODES:
        raise ValueError(f"hint_mode must be one of {HINT_MODES}, got {hint_mode!r}")
    hinted_set = set(hinted_seeds)
    if hinted_set.intersection(plain_seeds):
        raise ValueError(f"plain seeds {list(plain_seeds)} and hinted seeds {list(hinted_seeds)} overlap")
    specs = [EpisodeSpec(program=p, seed=s, max_turns=max_turns)
             for p in programs for s in [*plain_seeds, *hinted_seeds]]
    if not specs:
        return []
    starts = pool.start(specs)
    ids = [r.episode_id for r in starts]
    live = [i for i, r in enumerate(starts) if r.ok]
    solutions = dict(zip(live, pool.solution([ids[i] for i in live])))
    actions = {i: [a.strip() for a in (solutions[i] or "").splitlines() if a.strip()] for i in live}
    observations = {i: [starts[i].observation] for i in live}
    won: dict[int, bool] = {}
    turn = 0
    while True:
        active = [i for i in live if i not in won and turn < len(actions[i])]
        if not active:
            break
        results = pool.step([ids[i] for i in active], [actions[i][turn] for i in active])
        for i, result in zip(active, results):
            if not result.ok:
                won[i] = False
            elif result.done:
                won[i] = result.terminated and is_success(result.raw_reward) and turn + 1 == len(actions[i])
            else:
                observations[i].append(result.observation)
        turn += 1
    pool.close(ids)
    hints = {program: strategy_hint(program) for program in programs} if hint_mode == "strategy" else {}

    def hint(i: int) -> str | None:
        if specs[i].seed not in hinted_set:
            return None
        return hints[specs[i].program] if hint_mode == "strategy" else solution_hint(solutions[i])

    return [Transcript(specs[i].program, specs[i].seed, tuple(observations[i]), tuple(actions[i]), hint(i))
            for i in live if won.get(i)]


# The values an action carries: JSON argument values (strings or integers, not the tool's
# name), an <answer> and a \boxed{} answer. Everything else in an action is its form.
_ACTION_VALUE = re.compile(r'(?<!"name": )(?<=": )"[^"]*"|(?<=": )-?\d+|(?<=<answer>).*?(?=</answer>)'
                           r'|(?<=\\boxed\{)[^}]*(?=\})')
_WORD = re.compile(r"[A-Za-z]+|\d+")


def action_words(transcripts: Sequence[Transcript]) -> list[str]:
    """The distinct words inside the values of ``transcripts``' actions (letters only, not a run
    of up to four capitals, which `hint_drill` relabels letter by letter)."""
    words = {word for t in transcripts for action in t.actions for value in _ACTION_VALUE.findall(action)
             for word in _WORD.findall(value) if word.isalpha() and not (word.isupper() and len(word) <= 4)}
    return sorted(words)


def hint_drill(transcript: Transcript, words: Sequence[str], rng: random.Random) -> Transcript:
    """A hinted transcript whose action values are relabelled at random, the plan with them
    (its hint becomes the `solution` hint of the relabelled actions, whatever it was).

    Every letter-or-digit run inside an action's values (`_ACTION_VALUE`) is replaced, the
    same run the same way throughout the transcript: a number by a random number of as many
    digits, a run of capitals of up to four letters letter by letter, a word by one of
    ``words``. The observations stay as played, so they no longer determine the actions:
    the hint's plan is the only thing that predicts them, and training on drills rewards
    copying action k of the plan at turn k, whatever the plan says.
    """
    if transcript.hint is None:
        raise ValueError("hint_drill needs a hinted transcript")
    mapping: dict[str, str] = {}

    def relabel(word: str) -> str:
        if word not in mapping:
            if word.isdigit():
                mapping[word] = str(rng.randrange(10 ** (len(word) - 1) if len(word) > 1 else 0, 10 ** len(word)))
            elif word.isupper() and len(word) <= 4:
                mapping[word] = "".join(relabel(letter) if len(word) > 1 else rng.choice(string.ascii_uppercase)
                                        for letter in word)
            else:
                unused = [w for w in words if w not in mapping.values()]
                mapping[word] = rng.choice(unused) if unused else word
        return mapping[word]

    def relabel_value(match: re.Match) -> str:
        return _WORD.sub(lambda word: relabel(word.group()), match.group())

    actions = tuple(_ACTION_VALUE.sub(relabel_value, action) for action in transcript.actions)
    return dataclasses.replace(transcript, actions=actions, hint=solution_hint("\n".join(actions)))


def designer_sequence(tokenizer, messages: list[dict], code: str) -> TrainSequence:
    """Prompt ids (not trained) then the answer and its end-of-turn token (trained)."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    answer = tokenizer.encode(designer_answer(code)) + [tokenizer.eos_token_ids[0]]
    tokens = np.asarray(prompt + answer, np.int32)
    mask = np.r_[np.zeros(len(prompt), bool), np.ones(len(answer), bool)]
    return TrainSequence(tokens, mask, np.zeros(len(tokens), np.float32), advantage=0.0, role="designer")


def agent_sequence(tokenizer, transcript: Transcript, system_prompt: str = AGENT_SYSTEM_PROMPT) -> TrainSequence:
    """The conversation the rollout would build if the policy had played these actions."""
    first = transcript.observations[0]
    if transcript.hint:
        first = first + HINT_SEPARATOR + transcript.hint
    conversation = Conversation.start(tokenizer, system_prompt, first)
    stop = tokenizer.eos_token_ids[0]
    for turn, action in enumerate(transcript.actions):
        ids = tokenizer.encode(action) + [stop]
        conversation.add_response(ids, [0.0] * len(ids), action)
        if turn + 1 < len(transcript.actions):
            conversation.add_observation(tokenizer, transcript.observations[turn + 1], response_finished=True)
    tokens, generated, _ = conversation.arrays()
    return TrainSequence(tokens, generated, np.zeros(len(tokens), np.float32), advantage=0.0, role="agent")


def chat_texts(designer: Sequence[tuple[list[dict], str]], transcripts: Sequence[Transcript],
               system_prompt: str = AGENT_SYSTEM_PROMPT) -> list[str]:
    """Plain texts of all examples (tokenizer training material), in the proportions trained on."""
    texts = []
    for messages, code in designer:
        texts.extend(m["content"] for m in messages)
        texts.append(designer_answer(code))
    for t in transcripts:
        texts.append(system_prompt)
        texts.append(t.observations[0] + (HINT_SEPARATOR + t.hint if t.hint else ""))
        texts.extend(t.observations[1:])
        texts.extend(t.actions)
    return texts
