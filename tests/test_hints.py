"""Hint modes decide which episodes measure an environment's regret (agent/hints.py)."""

import pytest

from spade_jax.agent import matched_requests
from spade_jax.agent.hints import clean_hint


def test_each_hint_mode_gives_matched_plain_and_hinted_requests():
    plain_only = matched_requests(3, "code", [7, 8], "none", hint="ignored")
    assert [(r.env_key, r.seed, r.hinted) for r in plain_only] == [(3, 7, False), (3, 8, False)]

    own = matched_requests(0, "code", [7, 8], "self", hint="Try 4.")
    assert [(r.seed, r.hinted, r.hint, r.hint_from_solution) for r in own] == [
        (7, False, None, False), (8, False, None, False), (7, True, "Try 4.", False), (8, True, "Try 4.", False)]

    solution = matched_requests(0, "code", [7], "solution", hint="ignored")
    assert [(r.hinted, r.hint, r.hint_from_solution) for r in solution] == [(False, None, False), (True, None, True)]

    with pytest.raises(ValueError, match="hint mode"):
        matched_requests(0, "code", [7], "placebo")


def test_clean_hint_keeps_sentences_on_one_line():
    assert clean_hint("HINT: Add them.\nThen box it! Extra one. Too many.", 2) == "Add them. Then box it!"
    assert clean_hint("  \n ") is None
