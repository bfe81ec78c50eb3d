"""experiments/bootstrap/action_validity.py: accepted actions counted from hand-written evaluation rows."""

import json

from experiments.bootstrap import action_validity as validity


def _row(group, end, solved, *turns):
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "start"}]
    for action, answer in turns:
        chat.append({"role": "assistant", "content": action})
        if answer is not None:
            chat.append({"role": "user", "content": answer})
    return {"group": group, "solved": solved, "details": {"end": end}, "output": chat}


def test_rejections_count_against_a_family_and_an_unanswered_last_action_is_not_judged(tmp_path):
    rows = [
        _row("walk", "truncated", False, ("\\boxed{A}", "Invalid action. Reply with up."),
             ("\\boxed{up}", "You moved."), ("\\boxed{up}", None)),
        _row("walk", "terminated", True, ("\\boxed{up}", None)),
        _row("lookup", "terminated", False, ("<tool_call>{}", "Error: unknown tool 'x'."),
             ("<answer>3</answer>", None)),
    ]
    counts = validity.family_counts(rows)
    assert counts == {"lookup": (2, 1, 1, 0), "walk": (3, 2, 2, 1)}
    path = tmp_path / "envs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert "accepted 3/5 actions (0.600), solved 1/3 episodes" in validity.report(path)
