"""The documentation's relative links resolve (file and heading), and README stays a short ladder."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("experiments/**/README.md"),
               REPO / "experiments" / "README.md", REPO / "bench" / "RESULTS.md",
               *REPO.glob("spade_jax/**/README.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_slug_matches_githubs_anchors():
    assert slug("Studies: does it learn?") == "studies-does-it-learn"
    assert slug("Presets (`configs/`)") == "presets-configs"
    assert slug("Rung 2b: a known frontier") == "rung-2b-a-known-frontier"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


def test_readme_is_a_short_ladder():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings[0].startswith("The ladder")
    assert text.splitlines()[3:5] == ["bash launch/run_local.sh     # set up .venv on first use, then self-play on the CPU default (preset tiny)",
                                      "bash tests/run.sh            # install the test extras and run the whole suite"]
