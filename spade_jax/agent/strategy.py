"""Hint mode `strategy`: hand-written strategy hints for the seed library's game families.

Each seed program of `spade_jax.envs.library` has one hint that says how to approach the game
and what form the answer takes, in the spirit of the reference's hint rules
(spade-rl/spade core/hint_generator.py:24-45: 1-3 sentences, strategy and answer format,
never the exact answer). The hints name no instance value: no number, no letter, name or
word that could be an answer of some seed (checked by tests/agent/test_hint_leaks.py, which plays
every word and number of every hint as a fixed answer on every library program and the
bootstrap's renderings). The article "a" is avoided on purpose: a letter is an answer in
several games.

A program gets the hint of its nearest seed program (`nearest_seed`): the Jaccard index of
the sets of words a program uses (identifiers and the words of its string literals,
lower-cased, three letters or more, Python's keywords and builtins left out). Renamed or
restructured copies of a seed (the bootstrap's `variants`) keep their words and score near
above 0.9; two distinct seeds share at most 0.53 (arithmetic and sequence; both measured by
`tests/agent/test_hint_leaks.py`). Below
`MATCH_THRESHOLD` a program is no known family and gets no hint (None): its hinted plays are
then not run (`hints.matched_requests`).

This mode is rule-derived, not the reference's self-written hints: it needs no sampler, so
the tiny preset's bootstrap model, which cannot write hints, still measures a regret whose
hint leaves the instance to the agent (unlike mode `solution`, which hands over the plan).
"""

from __future__ import annotations

import builtins
import functools
import io
import keyword
import re
import tokenize

from spade_jax.envs import library

MATCH_THRESHOLD = 0.7

STRATEGY_HINTS: dict[str, str] = {
    "arithmetic": (
        "Work out every multiplication first, then do the additions and subtractions from left to right. "
        "Reply with the single integer result inside \\boxed{}."
    ),
    "shopping": (
        "Call the price tool once for each item on the list, multiply each unit price by its quantity "
        "and add those products up. Reply with the total as one integer inside <answer></answer>."
    ),
    "number_guess": (
        "Use binary search: always guess the middle of the range that is still possible, then discard "
        "the half that the too-high or too-low reply rules out. Send one whole number per turn inside \\boxed{}."
    ),
    "knights_knaves": (
        "Suppose each possible set of knights in turn and keep the only one where every knight's "
        "statement is true and every knave's statement is false. Reply with the knights' letters "
        "in alphabetical order inside \\boxed{}."
    ),
    "tallest": (
        "Keep one current leader: compare the leader with each other person once and let the taller "
        "one become the leader. After everyone has been compared, reply with the leader's name inside "
        "<answer></answer>."
    ),
    "grid_walk": (
        "Find the shortest route from P to G that never steps onto the '#' walls, for example by "
        "searching outward from P cell by cell. Send one direction word per turn inside \\boxed{}, "
        "using the four words the task lists."
    ),
    "compass_walk": (
        "Track the position move by move, keeping the current heading if turns are involved: "
        "east adds to x, west subtracts from x, north adds to y, south subtracts from y. Reply with the "
        "final coordinates as x,y inside \\boxed{}."
    ),
    "nearest_city": (
        "Call the locate tool for every candidate city, compute |dx| + |dy| from your home to each, and "
        "pick the smallest distance. Reply with that city's name inside <answer></answer>."
    ),
    "sequence": (
        "Compare consecutive terms: check for constant differences, constant ratios, differences that "
        "grow steadily, or each term being the sum of the two before it, then apply that rule once more. "
        "Reply with the next term as one integer inside \\boxed{}."
    ),
    "repeat_pattern": (
        "Find the shortest block of letters that repeats from the start, then continue the sequence "
        "from where it stops. Reply with exactly as many letters as asked, separated by spaces, inside \\boxed{}."
    ),
    "hidden_rule": (
        "Call the apply tool on small inputs such as zero and the next few values, solve for the rule's "
        "secret coefficients from the outputs, then evaluate the rule at the asked input. Reply with "
        "the output as one integer inside <answer></answer>."
    ),
    "knapsack": (
        "Consider every combination of items whose total weight fits the limit and keep the one with "
        "the greatest total worth; the best item by itself is not always part of it. Reply with the "
        "chosen items' letters inside \\boxed{}."
    ),
    "job_order": (
        "To minimise the sum of finish times, run shorter jobs first; when jobs have weights, order them "
        "by duration divided by weight, smallest first. Send one job letter per turn inside \\boxed{}."
    ),
    "shortest_path": (
        "Call the roads tool for each town you reach, exploring the cheapest known town first like "
        "Dijkstra's algorithm, until the cost to the destination is final. Reply with that total cost "
        "as one integer inside <answer></answer>."
    ),
    "switch_lights": (
        "Flip one switch per turn and note which light changes; the switch left over controls the light "
        "left over. Then reply with the word answer followed by the light of each switch in switch order, "
        "inside \\boxed{}."
    ),
    "causal_chain": (
        "Start from the event that is started from outside and repeatedly apply every rule whose conditions "
        "all hold until nothing new happens. Reply with the letters of all events that happen, including "
        "the starting one, in alphabetical order inside \\boxed{}."
    ),
    "plant_experiment": (
        "Run the experiment tool with all factors but one left out each time: the plant stops growing "
        "exactly when the left-out factor is required. Reply with the required factors' names in "
        "alphabetical order, separated by commas, inside <answer></answer>."
    ),
}

_STRING_WORD = re.compile(r"[A-Za-z_]{3,}")
_IGNORED = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self"}


def program_words(code: str) -> frozenset[str]:
    """The words ``code`` uses: identifiers and the words inside its string literals, lower-cased,
    three characters or more, keywords, builtins and ``self`` left out (any text if it does not tokenize)."""
    words: set[str] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in (tokenize.NAME, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                words.update(_STRING_WORD.findall(tok.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        words.update(_STRING_WORD.findall(code))
    return frozenset(w.lower() for w in words if w not in _IGNORED and w.lower() not in _IGNORED)


@functools.cache
def _seed_words() -> dict[str, frozenset[str]]:
    return {env.name: program_words(library.load_source(env.name)) for env in library.SEED_ENVS}


def nearest_seed(code: str) -> tuple[str, float]:
    """The seed program whose words are nearest ``code``'s, and their Jaccard index."""
    words = program_words(code)
    scores = {name: len(words & seed) / max(1, len(words | seed)) for name, seed in _seed_words().items()}
    name = max(scores, key=scores.get)
    return name, scores[name]


def strategy_hint(code: str, threshold: float = MATCH_THRESHOLD) -> str | None:
    """The strategy hint of the seed family ``code`` belongs to; None when no seed reaches ``threshold``."""
    name, score = nearest_seed(code)
    return STRATEGY_HINTS[name] if score >= threshold else None
