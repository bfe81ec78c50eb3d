"""Run reporting: metrics.jsonl + TensorBoard (with resume), the summary line and phase
bars, the env log (typed entries) and the HTML gallery (parsed with html.parser; hostile
model text must stay escaped)."""

import html.parser
import io
import json
import math
import pathlib
import struct

import numpy as np
import pytest

from spade_jax import progress
from spade_jax.selfplay import console, gallery, runlog
from spade_jax.selfplay.runlog import EnvLog, EnvLogEntry, ExistingRunError, MetricsWriter

HOSTILE = '</pre><script>alert("x")</script><img src=x onerror=alert(1)>'


# ---------------------------------------------------------------- helpers


def _lines(path):
    return pathlib.Path(path).read_text().splitlines()


def _read_tf_events(path):
    """Minimal TFRecord reader: [len u64][crc u32][data][crc u32] -> Event protos."""
    from tensorboardX.proto.event_pb2 import Event

    data = pathlib.Path(path).read_bytes()
    events, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        event = Event()
        event.ParseFromString(data[pos + 12:pos + 12 + length])
        events.append(event)
        pos += 12 + length + 4
    assert pos == len(data)
    return events


def _scalars(events):
    return {(v.tag, e.step): v.simple_value for e in events for v in e.summary.value}


class _Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find_all(self, tag, **attrs):
        out = []
        for child in self.children:
            if isinstance(child, _Node):
                if child.tag == tag and all(child.attrs.get(k) == v for k, v in attrs.items()):
                    out.append(child)
                out.extend(child.find_all(tag, **attrs))
        return out


class _Dom(html.parser.HTMLParser):
    """A tiny DOM: enough to find elements and their (unescaped) text."""

    VOID = {"meta", "img", "input", "br", "hr", "link"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = _Node("#root", {}, None)
        self.cur = self.root
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = _Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        if tag not in self.VOID:
            self.cur = node

    def handle_endtag(self, tag):
        node = self.cur
        while node is not self.root and node.tag != tag:
            node = node.parent
        assert node is not self.root, f"unmatched </{tag}>"
        self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def _dom(path):
    return _Dom(pathlib.Path(path).read_text(encoding="utf-8")).root


def _transcript(tag):
    return [
        {"role": "system", "content": "You play games."},
        {"role": "user", "content": f"Guess a number. {tag}"},
        {"role": "assistant", "content": f"\\boxed{{7}} {HOSTILE}"},
    ]


def _record(iteration, slot, env_id, *, admitted=True, win=0.25, hinted=0.75, **kw):
    played = admitted and win is not None
    fields = dict(
        env_id=env_id, iteration=iteration, slot=slot, skill="logical deduction",
        difficulty="medium", doc_id=f"doc-{slot}", doc_excerpt=f"Document excerpt {slot} {HOSTILE}",
        code=f"class GuessEnv:\n    pass  # {env_id} {HOSTILE}\n", admitted=admitted,
        stage="done" if admitted else "reset", reason="passed" if admitted else f"reset raised {HOSTILE}",
        timings={"syntax": 0.004, "reset": 1.5},
        win_rate=win if played else None, hinted_win_rate=hinted if played else None,
        mean_plain=2 * win - 1 if played else None, mean_hinted=2 * hinted - 1 if played else None,
        regret=max(0.0, hinted - win) if played else None, designer_reward=0.5 if played else None,
        transcript=_transcript(f"plain-{env_id}-{iteration}") if admitted else None,
        hinted_transcript=_transcript(f"hinted-{env_id}-{iteration}") if admitted else None,
        hint=f"Try the middle first {HOSTILE}" if admitted else None, is_seed=False,
    )
    fields.update(kw)
    return EnvLogEntry(**fields)


FULL = {
    "designer/proposed": 8, "designer/admitted": 5, "designer/admission_rate": 0.625,
    "designer/reward_mean": 0.314, "env/regret_mean": 0.123, "agent/plain_win_rate": 0.4,
    "agent/hinted_win_rate": 0.65, "train/loss": 1.5, "train/tokens_per_s": 8040.0,
    "sampler/tokens_per_s": 1234.0, "time/design_s": 40.2, "time/admission_s": 3.04,
    "time/hints_s": 0.5, "time/episodes_s": 61, "time/update_s": 20, "time/iteration_s": 125,
    "memory/size": 13,
}


# ---------------------------------------------------------------- metrics


def test_metrics_jsonl_values(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write(0, {"b": 2, "a": np.float32(0.5), "nan": math.nan, "none": None, "inf": np.inf})
        w.write(1, {"a": 1.25})
    rows = [json.loads(line) for line in _lines(tmp_path / "metrics.jsonl")]
    assert rows == [
        {"iteration": 0, "a": 0.5, "b": 2.0, "inf": None, "nan": None, "none": None},
        {"iteration": 1, "a": 1.25},
    ]
    assert isinstance(rows[0]["b"], float)
    assert runlog.read_metrics(tmp_path) == rows


def test_metrics_reject_bad_values(tmp_path):
    with MetricsWriter(tmp_path) as w:
        with pytest.raises(ValueError, match="'loss' must be a number"):
            w.write(0, {"loss": "high"})
        with pytest.raises(ValueError, match="reserved"):
            w.write(0, {"iteration": 3})


def test_fresh_writer_refuses_a_previous_run(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write(0, {"a": 1.0})
    with pytest.raises(ExistingRunError, match="resume that run"):
        MetricsWriter(tmp_path)


def _run(workdir, iterations, resume_from=None):
    with MetricsWriter(workdir, resume_from_iteration=resume_from) as w:
        for it in iterations:
            w.write(it, {"x": it * 0.5, "y": math.nan if it == 2 else it})


def test_resume_drops_later_history_and_matches_uninterrupted(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run(straight, range(5))
    _run(resumed, range(4))
    with open(resumed / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 4, "x": 2.')  # killed mid-write
    _run(resumed, range(2, 5), resume_from=1)
    assert (resumed / "metrics.jsonl").read_bytes() == (straight / "metrics.jsonl").read_bytes()
    assert [r["iteration"] for r in runlog.read_metrics(resumed)] == [0, 1, 2, 3, 4]


def test_tensorboard_tags_replace_the_characters_tensorboard_refuses(tmp_path, caplog):
    caplog.set_level("INFO")  # tensorboardX logs each tag it has to change at INFO
    with runlog.MetricsWriter(tmp_path) as writer:
        writer.write(0, {"eval/suite/pass@1": 0.5, "eval/suite-sampled/score": 0.25})
    (events,) = [_read_tf_events(f) for f in (tmp_path / "tensorboard").glob("events.out.tfevents.*")]
    assert _scalars(events) == {("eval/suite/pass_1", 0): 0.5, ("eval/suite-sampled/score", 0): 0.25}
    assert "illegal" not in caplog.text
    assert runlog.read_metrics(tmp_path)[0]["eval/suite/pass@1"] == 0.5  # metrics.jsonl keeps the key


def test_tensorboard_scalars_and_purge_on_resume(tmp_path):
    _run(tmp_path, range(3))
    _run(tmp_path, range(2, 4), resume_from=1)
    files = sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 2
    # the resumed writer's file is the one holding the purge marker
    second, first = sorted((_read_tf_events(f) for f in files),
                           key=lambda events: not any(e.HasField("session_log") for e in events))
    assert _scalars(first) == {("x", 0): 0.0, ("y", 0): 0.0, ("x", 1): 0.5, ("y", 1): 1.0, ("x", 2): 1.0}
    assert _scalars(second) == {("x", 2): 1.0, ("x", 3): 1.5, ("y", 3): 3.0}
    purges = [e.step for e in second if e.HasField("session_log")]
    assert purges == [2]  # TensorBoard hides the first run's steps >= 2


# ---------------------------------------------------------------- summary line and bars


def test_summary_line_full():
    assert console.summary_line(3, FULL) == (
        "it 3 | envs 5/8 | regret 0.12 | dR 0.31 | win plain 0.40 hint 0.65 | "
        "tok/s sample 1.2k train 8.0k | design 40s adm 3.0s hints 500ms play 61s update 20s "
        "= 2m05s | mem 13"
    )


def test_summary_line_shows_the_attempts_and_the_designs_with_a_signal():
    line = console.summary_line(3, {**FULL, "designer/attempts": 13, "designer/trained": 7,
                                    "designer/nonzero_advantage": 4})
    assert line.startswith("it 3 | envs 5/8 in 13 | regret 0.12 | dR 0.31 adv 4/7 | win plain 0.40")


def test_summary_line_missing_and_nan():
    line = console.summary_line(0, {"designer/proposed": 8, "env/regret_mean": math.nan,
                                   "agent/plain_win_rate": None, "time/design_s": np.float64(4.25)})
    assert line == (
        "it 0 | envs -/8 | regret - | dR - | win plain - hint - | tok/s sample - train - | "
        "design 4.2s adm - hints - play - update - = - | mem -"
    )


@pytest.mark.parametrize("seconds,text", [
    (0.0123, "12ms"), (2.44, "2.4s"), (59.6, "60s"), (185, "3m05s"), (3725, "1h02m"),
    (math.nan, "-"), (None, "-"), ("x", "-"),
])
def test_format_duration(seconds, text):
    assert console.format_duration(seconds) == text


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_phase_bar_on_a_terminal_is_a_bar():
    out = _Terminal()
    with console.phase_bar("episodes", 4, file=out) as bar:
        bar.update(3)
        bar.update(1)
        assert bar.n == 4
    assert "episodes" in out.getvalue() and "0/4" in out.getvalue()


def test_phase_bar_in_a_log_writes_plain_lines(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    out = io.StringIO()  # not a terminal: a log file or a pipe
    with console.phase_bar("episodes", 4, file=out) as bar:
        bar.update(1)  # a short phase writes nothing
        assert out.getvalue() == ""
        clock[0] += progress.INTERVAL_S + 1
        bar.update(2)  # then at most one line per interval
        bar.update(1)
        assert bar.n == 4
    # no tqdm frames; leave=False drops the closing line (the summary line follows)
    assert out.getvalue() == "episodes: 3/4 it (75%) 31s\n"


def test_phase_bar_can_be_silenced():
    for quiet in (io.StringIO(), _Terminal()):
        with console.phase_bar("episodes", 4, enabled=False, file=quiet) as bar:
            bar.update(4)
            assert bar.n == 4
        assert quiet.getvalue() == ""


# ---------------------------------------------------------------- env log


def test_env_log_append_read_truncate(tmp_path):
    log = EnvLog(tmp_path)
    log.append([_record(0, 0, "a", win=np.float32(0.5), regret=math.nan),
                _record(1, 0, None, admitted=False)])
    log.append([_record(2, 0, "a"), _record(3, 1, "b")])
    rows = log.read()
    assert all(isinstance(r, EnvLogEntry) for r in rows)
    assert [(r.iteration, r.env_id) for r in rows] == [(0, "a"), (1, None), (2, "a"), (3, "b")]
    assert rows[0].win_rate == 0.5 and type(rows[0].win_rate) is float and rows[0].regret is None
    with open(log.path, "a") as f:
        f.write('{"iteration": 4, "env_')  # killed mid-write
        f.write('\n{"env_id": "c"}\n')  # no iteration: not an entry
    assert [r.iteration for r in log.read()] == [0, 1, 2, 3]
    log.truncate_after(1)
    assert [r.iteration for r in log.read()] == [0, 1]
    assert log.path.read_text().endswith("\n")


def test_env_log_entry_json_round_trip():
    entry = _record(3, 1, "guess", win=np.float32(0.5), regret=math.nan, replay=True)
    row = entry.to_json()
    assert json.loads(json.dumps(row, allow_nan=False)) == row  # plain JSON values
    assert row["win_rate"] == 0.5 and "regret" not in row  # NaN is null, and nulls are left out
    assert EnvLogEntry.from_json(row) == EnvLogEntry(**{**vars(entry), "win_rate": 0.5, "regret": None})
    bare = EnvLogEntry(iteration=0, env_id=None)
    assert bare.to_json() == {"iteration": 0, "admitted": False, "is_seed": False, "replay": False}
    assert EnvLogEntry.from_json(bare.to_json()) == bare


def test_env_log_reads_entries_of_an_older_version(tmp_path):
    log = EnvLog(tmp_path)
    log.path.parent.mkdir(parents=True)
    old = {"iteration": 2, "env_id": "old", "skill": "counting", "admitted": True, "win_rate": 0.5,
           "hinted_win_rate": None, "retired_field": [1, 2]}  # an unknown key, most fields missing
    log.path.write_text(json.dumps(old) + "\n" + json.dumps({"iteration": "2", "env_id": "x"}) + "\n")
    assert log.read() == [EnvLogEntry(iteration=2, env_id="old", skill="counting", admitted=True,
                                      win_rate=0.5)]
    assert EnvLogEntry.from_json({"iteration": 5}) == EnvLogEntry(iteration=5, env_id=None)
    assert EnvLogEntry.from_json({"iteration": True, "env_id": "b"}) is None
    assert EnvLogEntry.from_json({"env_id": "c"}) is None


# ---------------------------------------------------------------- gallery


def _check_png(path):
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 3000, f"{path} is suspiciously small"


def _check_page_safe(root, scripts_allowed):
    """Hostile text never became markup: no extra script/img tags, and it shows as text."""
    assert len(root.find_all("script")) == scripts_allowed
    for img in root.find_all("img"):
        assert "onerror" not in img.attrs and img.attrs["src"].startswith("plots/")


def test_gallery_on_an_empty_workdir(tmp_path):
    index = gallery.write_gallery(tmp_path)  # the loop's entry point
    assert index == tmp_path / "gallery" / "index.html"
    root = _dom(index)
    imgs = root.find_all("img")
    assert len(imgs) == len(gallery.plots.PLOTS)
    for img in imgs:
        _check_png(index.parent / img.attrs["src"])
    assert "No environments designed yet" in root.text()
    assert root.find_all("tr", **{"data-verdict": "admitted"}) == []


def test_gallery_with_null_metrics_only(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write(0, {k: math.nan for k in FULL})
        w.write(1, {"train/loss": 2.0})
    index = gallery.write_gallery(tmp_path)
    for img in _dom(index).find_all("img"):
        _check_png(index.parent / img.attrs["src"])


def _populate(workdir):
    seed = _record(0, 0, "seed-guess", is_seed=True, win=None, doc_id=None, doc_excerpt=None,
                   transcript=None, hinted_transcript=None, hint=None, skill="mathematical reasoning")
    records = [
        [seed],
        [_record(1, 0, "it1-a"), _record(1, 1, None, admitted=False),
         _record(1, 2, "it1-c", code="", skill="spatial reasoning", win=0.0, hinted=1.0)],
        [_record(2, 0, "it2-a", code=HOSTILE + "\ud800"), _record(2, 1, None, admitted=False),
         _record(1 + 1, 0, "it1-a", win=0.5, hinted=0.5)],  # replay of it1-a
    ]
    log = EnvLog(workdir)
    with MetricsWriter(workdir) as w:
        for it, batch in enumerate(records):
            log.append(batch)
            w.write(it, dict(FULL, **{"train/loss": math.nan if it == 1 else 1.0 / (it + 1)}))
    return records


def test_gallery_lists_every_environment_escaped(tmp_path):
    _populate(tmp_path)
    index = gallery.write_gallery(tmp_path)
    root = _dom(index)
    _check_page_safe(root, scripts_allowed=1)
    rows = {row.find_all("a")[0].text(): row for row in root.find_all("tbody")[-1].find_all("tr")}
    assert set(rows) == {"seed-guess", "it1-a", "it1-c", "it2-a",
                         "(rejected) it 1 slot 1", "(rejected) it 2 slot 1"}

    def cells(name):
        return [td.text() for td in rows[name].find_all("td")]

    # iter, environment, skill, difficulty, verdict, reason, win plain, win hinted, regret, dR, history
    assert cells("it1-a") == ["1", "it1-a", "logical deduction", "medium", "admitted", "passed",
                              "0.50", "0.50", "0.00", "0.50", "2"]  # latest stats, two plays
    assert cells("it1-c")[6:10] == ["0.00", "1.00", "1.00", "0.50"]
    assert cells("(rejected) it 2 slot 1")[4:7] == ["rejected at reset", f"reset raised {HOSTILE}", "\u2013"]
    assert cells("seed-guess")[4] == "seed"
    assert rows["it1-a"].attrs["data-verdict"] == "admitted"
    assert rows["(rejected) it 1 slot 1"].attrs["data-verdict"] == "rejected"
    assert {o.text() for o in root.find_all("select", id="f-skill")[0].find_all("option")} == {
        "all", "logical deduction", "spatial reasoning", "mathematical reasoning"}
    assert "it 2 | envs 5/8 | regret 0.12" in root.text()
    for img in root.find_all("img"):
        _check_png(index.parent / img.attrs["src"])
    assert {pathlib.Path(i.attrs["src"]).stem for i in root.find_all("img")} == {p.name for p in gallery.plots.PLOTS}

    pages = {name: index.parent / row.find_all("a")[0].attrs["href"] for name, row in rows.items()}
    assert len(set(pages.values())) == len(pages)
    for name, page in pages.items():
        page_root = _dom(page)
        _check_page_safe(page_root, scripts_allowed=0)
        assert page_root.find_all("h1")[0].text().startswith(name if "rejected" not in name else "rejected")

    a = _dom(pages["it1-a"])
    text = a.text()
    assert f"pass  # it1-a {HOSTILE}" in a.find_all("pre", **{"class": "code"})[0].text()
    assert f"Document excerpt 0 {HOSTILE}" in text and "doc-0" in text
    assert "plain-it1-a-2" in text and "hinted-it1-a-2" in text  # transcripts of the latest play
    assert f"\\boxed{{7}} {HOSTILE}" in text and f"Try the middle first {HOSTILE}" in text
    assert "syntax 4ms, reset 1.5s" in text
    history = [[td.text() for td in tr.find_all("td")] for tr in a.find_all("tbody")[0].find_all("tr")]
    assert history == [["1", "0.25", "0.75", "-0.50", "0.50", "0.50", "0.50"],
                       ["2", "0.50", "0.50", "0.00", "0.00", "0.00", "0.50"]]

    rejected = _dom(pages["(rejected) it 1 slot 1"]).text()
    assert "rejected at reset" in rejected and f"reset raised {HOSTILE}" in rejected
    assert "Not played" in rejected and "No plain episode recorded" in rejected
    assert "The designer wrote no code" in _dom(pages["it1-c"]).text()
    code = _dom(pages["it2-a"]).find_all("pre", **{"class": "code"})[0].text()
    assert code == HOSTILE + "\ufffd"  # a lone surrogate from the model does not stop the page


def test_gallery_after_resume_drops_truncated_envs(tmp_path):
    _populate(tmp_path)
    gallery.write_gallery(tmp_path)
    pages = tmp_path / "gallery" / "envs"
    assert len(list(pages.glob("*.html"))) == 6
    EnvLog(tmp_path).truncate_after(1)
    MetricsWriter(tmp_path, resume_from_iteration=1).close()
    root = _dom(gallery.write_gallery(tmp_path))
    names = {row.find_all("a")[0].text() for row in root.find_all("tbody")[-1].find_all("tr")}
    assert names == {"seed-guess", "it1-a", "it1-c", "(rejected) it 1 slot 1"}
    assert len(list(pages.glob("*.html"))) == 4
    page = next(p for p in pages.glob("*.html") if "it1-a" in p.name)
    assert "plain-it1-a-1" in _dom(page).text()  # rewritten without the truncated replay


def test_gallery_reads_a_log_of_an_older_version(tmp_path):
    log = EnvLog(tmp_path)
    log.path.parent.mkdir(parents=True)
    rows = [  # explicit nulls, unknown keys, missing fields, odd types, a row without iteration
        {"iteration": 0, "env_id": "old-a", "slot": 0, "skill": None, "admitted": True, "stage": None,
         "win_rate": 0.5, "hinted_win_rate": None, "timings": "n/a", "transcript": "text", "legacy": 1},
        {"iteration": 0, "env_id": None, "slot": "7", "admitted": False, "reason": None},
        {"iteration": 1, "env_id": "old-a", "regret": 0.25},
        {"env_id": "no-iteration", "admitted": True},
    ]
    log.path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    root = _dom(gallery.write_gallery(tmp_path))
    _check_page_safe(root, scripts_allowed=1)
    table = {row.find_all("a")[0].text(): [td.text() for td in row.find_all("td")]
             for row in root.find_all("tbody")[-1].find_all("tr")}
    assert table == {
        "old-a": ["0", "old-a", "unknown", "", "admitted", "", "\u2013", "\u2013", "0.25", "\u2013", "2"],
        "(rejected) it 0 slot 7": ["0", "(rejected) it 0 slot 7", "unknown", "", "rejected", "",
                                   "\u2013", "\u2013", "\u2013", "\u2013", "1"],
    }
    pages = sorted((tmp_path / "gallery" / "envs").glob("*.html"))
    assert [p.name for p in pages] == ["env-old-a.html", "it00000-slotx.html"]
    page = _dom(pages[0]).text()
    assert "No transcript recorded" in page and "logged in iterations0, 1" in page
