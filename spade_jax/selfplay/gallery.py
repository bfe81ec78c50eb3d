"""The environment gallery: a static HTML report of every designed environment.

``write_gallery(workdir)`` reads ``metrics.jsonl`` and ``gallery/envs.jsonl`` (see
``runlog.py``) and writes, under ``workdir/gallery/``:

- ``index.html``: run overview, the curves as PNGs (``plots/*.png``), a per-skill table,
  procedure memory's graphs (from ``procedures.json`` when the run keeps one) and one row
  per environment (latest stats, number of plays) with filters;
- ``envs/<name>.html``: one page per environment with its document, code, admission
  verdict, reason and timings, the calibrated level with each level's agent and solution
  solve rates and gap, its retirement (when, why), stats history and one sample plain and
  hinted episode.

Everything is self-contained (inline CSS and a small inline script, no network) and
opens from the file system. All model- and environment-written text goes through ``_esc``:
cleaned first (``spade_jax.text.clean_text``: lone surrogates and control characters become
U+FFFD, so every page is valid UTF-8 and valid HTML text), then HTML-escaped.

The log's entries are ``runlog.EnvLogEntry`` objects (their fields are documented there).
Any field but ``iteration`` may be None, and an entry logged by an older version may hold
a value of an unexpected type, so every field is checked before use. Entries sharing an
``env_id`` are one environment played in several iterations; its first entry holds the
design (code, verdict), its last one the latest stats.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import html
import json
import math
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

from spade_jax.selfplay import console, plots, runlog
from spade_jax.selfplay.components.procedures import PROCEDURES_FILE
from spade_jax.selfplay.runlog import EnvLogEntry
from spade_jax.text import clean_text

ENV_PAGES_DIR = "envs"
PLOTS_DIR = "plots"
_MANIFEST = "pages.sha1.json"  # content hashes of the env pages: rewrite only those that changed
_REASON_CHARS = 140


def _esc(value: Any) -> str:
    return html.escape(clean_text("" if value is None else str(value)), quote=True)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _num(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if _finite(value) else "\u2013"


def _sort_value(value: Any) -> str:
    return repr(float(value)) if _finite(value) else ""


@dataclasses.dataclass
class _Env:
    """All entries of one designed environment, in log order, and its page's file stem."""

    stem: str
    records: list[EnvLogEntry]

    @property
    def first(self) -> EnvLogEntry:
        return self.records[0]

    @property
    def latest(self) -> EnvLogEntry:
        return self.records[-1]

    @property
    def verdict(self) -> str:
        if self.first.is_seed:
            return "seed"
        return "admitted" if self.first.admitted else "rejected"

    @property
    def skill(self) -> str:
        skill = self.first.skill
        return "unknown" if skill is None else str(skill)

    def latest_with(self, field: str) -> EnvLogEntry | None:
        for record in reversed(self.records):
            if getattr(record, field):
                return record
        return None


def _env_id(record: EnvLogEntry) -> str | None:
    env_id = record.env_id
    return None if env_id is None or env_id == "" else str(env_id)


def _stem(record: EnvLogEntry, used: set[str]) -> str:
    env_id = _env_id(record)
    if env_id:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", env_id)[:60]
        if safe != env_id:
            safe += "-" + hashlib.sha1(env_id.encode("utf-8", "replace")).hexdigest()[:8]
        stem = f"env-{safe}"
    else:
        slot = record.slot
        slot = slot if isinstance(slot, int) and not isinstance(slot, bool) else "x"
        stem = f"it{record.iteration:05d}-slot{slot}"
    unique, n = stem, 1
    while unique in used:
        n += 1
        unique = f"{stem}-{n}"
    used.add(unique)
    return unique


def _group(records: Sequence[EnvLogEntry]) -> list[_Env]:
    by_id: dict[str, _Env] = {}
    envs: list[_Env] = []
    used: set[str] = set()
    for record in records:
        env_id = _env_id(record)
        if env_id and env_id in by_id:
            by_id[env_id].records.append(record)
            continue
        env = _Env(_stem(record, used), [record])
        envs.append(env)
        if env_id:
            by_id[env_id] = env
    return envs


_CSS = """
:root{--fg:#1d2125;--muted:#5f6b76;--line:#d9dee3;--bg2:#f5f7f9;--ok:#1e7b34;--okbg:#e3f4e7;
--bad:#a72a2a;--badbg:#fbe6e6;--seed:#5b4a9e;--seedbg:#ece8f8;--accent:#2b5fb4}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
margin:0 auto;padding:16px 24px 48px;max-width:1400px}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
a{color:var(--accent)}.muted{color:var(--muted)}
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--bg2);border:1px solid var(--line);border-radius:6px;padding:10px;margin:6px 0;overflow:auto;max-height:42em}
pre.wrap{white-space:pre-wrap;overflow-wrap:anywhere}
.summary{background:var(--bg2);border:1px solid var(--line);border-radius:6px;padding:6px 10px;overflow-x:auto;white-space:nowrap}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid var(--line);border-radius:8px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:20px}.card span{color:var(--muted);font-size:12px}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(400px,1fr));gap:12px}
.plots img{width:100%;border:1px solid var(--line);border-radius:6px}
table{border-collapse:collapse;width:100%}table.auto{width:auto}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--bg2);position:sticky;top:0;font-weight:600;white-space:nowrap}
th[data-sort]{cursor:pointer}th[data-sort]:after{content:" \\2195";color:var(--muted)}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tbody tr:hover{background:#f0f4fa}
.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;font-weight:600;white-space:nowrap}
.admitted{color:var(--ok);background:var(--okbg)}.rejected{color:var(--bad);background:var(--badbg)}
.seed{color:var(--seed);background:var(--seedbg)}
.filters{display:flex;gap:12px;align-items:center;flex-wrap:wrap;margin:8px 0}
.filters select,.filters input{font:inherit;padding:2px 6px}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:8px 0}
dl.meta dt{color:var(--muted)}dl.meta dd{margin:0}
blockquote{margin:6px 0;padding:6px 12px;border-left:4px solid var(--line);background:var(--bg2);white-space:pre-wrap}
.msg{margin:8px 0}.msg .role{font-size:12px;font-weight:600;text-transform:uppercase;color:var(--muted)}
.msg.assistant pre{background:#eef3fc;border-color:#c9d8f2}
.hint{background:#fff7e0;border:1px solid #edd89a;border-radius:6px;padding:6px 10px}
pre.code{max-height:none;counter-reset:l}pre.code .l{counter-increment:l}
pre.code .l:before{content:counter(l);display:inline-block;width:3em;margin-right:1em;text-align:right;color:#9aa5b1}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px}
"""

_SCRIPT = """
(function(){
var v=document.getElementById('f-verdict'),s=document.getElementById('f-skill'),
q=document.getElementById('f-text'),n=document.getElementById('f-count'),
body=document.querySelector('#env-table tbody'),rows=Array.prototype.slice.call(body.rows);
function apply(){var c=0,t=q.value.toLowerCase();rows.forEach(function(r){
var ok=(!v.value||r.dataset.verdict===v.value)&&(!s.value||r.dataset.skill===s.value)&&
(!t||r.textContent.toLowerCase().indexOf(t)>=0);r.hidden=!ok;if(ok)c++;});n.textContent=c;}
[v,s,q].forEach(function(e){e.addEventListener('input',apply);});
document.querySelectorAll('#env-table th[data-sort]').forEach(function(th,i){
var dir=-1;th.addEventListener('click',function(){dir=-dir;var k=th.cellIndex,num=th.dataset.sort==='num';
rows.sort(function(a,b){var x=a.cells[k].dataset.v,y=b.cells[k].dataset.v;
if(x===undefined)x=a.cells[k].textContent;if(y===undefined)y=b.cells[k].textContent;
if(num){if(x==='')return 1;if(y==='')return -1;return dir*(parseFloat(x)-parseFloat(y));}
return dir*x.localeCompare(y);});rows.forEach(function(r){body.appendChild(r);});});});
apply();})();
"""


def _page(title: str, body: str, *, script: str = "") -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "img-src 'self' file:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>\n{body}\n"
        + (f"<script>{script}</script>" if script else "")
        + "</body></html>\n"
    )


def _badge(env: _Env) -> str:
    verdict = env.verdict
    if verdict == "rejected":
        stage = env.first.stage
        label = f"rejected at {stage}" if stage else "rejected"
    else:
        label = verdict
    return f'<span class="badge {verdict}">{_esc(label)}</span>'


def _clip(text: Any, limit: int) -> str:
    text = "" if text is None else " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


_STAT_COLUMNS = (
    ("win_rate", "win plain"),
    ("hinted_win_rate", "win hinted"),
    ("regret", "regret"),
    ("designer_reward", "designer reward"),
)


def _env_row(env: _Env) -> str:
    first, latest = env.first, env.latest
    name = _env_id(first) or f"(rejected) it {first.iteration} slot {first.slot}"
    cells = [
        f'<td class="n" data-v="{first.iteration}">{first.iteration}</td>',
        f'<td><a href="{ENV_PAGES_DIR}/{env.stem}.html">{_esc(name)}</a></td>',
        f"<td>{_esc(env.skill)}</td>",
        f"<td>{_esc(first.difficulty)}{_level_note(env)}</td>",
        f'<td data-v="{env.verdict}">{_badge(env)}</td>',
        f'<td title="{_esc(_clip(first.reason, 1000))}">'
        f'{_esc(_clip(first.reason, _REASON_CHARS))}</td>',
    ]
    for field, _ in _STAT_COLUMNS:
        value = getattr(latest, field)
        cells.append(f'<td class="n" data-v="{_sort_value(value)}">{_num(value)}</td>')
    cells.append(f'<td class="n" data-v="{len(env.records)}">{len(env.records)}</td>')
    return (
        f'<tr data-verdict="{env.verdict}" data-skill="{_esc(env.skill)}">'
        + "".join(cells) + "</tr>"
    )


def _mean(values: list[Any]) -> float | None:
    ok = [float(v) for v in values if _finite(v)]
    return sum(ok) / len(ok) if ok else None


def _skill_table(envs: list[_Env]) -> str:
    skills = sorted({env.skill for env in envs})
    rows = []
    for skill in skills:
        mine = [env for env in envs if env.skill == skill]
        designed = [env for env in mine if env.verdict != "seed"]
        admitted = [env for env in designed if env.verdict == "admitted"]
        live = [env for env in mine if env.verdict != "rejected"]
        rate = len(admitted) / len(designed) if designed else None
        rows.append(
            f"<tr><td>{_esc(skill)}</td><td class=n>{len(designed)}</td><td class=n>{len(admitted)}</td>"
            f"<td class=n>{_num(rate)}</td><td class=n>{len(mine) - len(designed)}</td>"
            f"<td class=n>{_num(_mean([e.latest.win_rate for e in live]))}</td>"
            f"<td class=n>{_num(_mean([e.latest.hinted_win_rate for e in live]))}</td>"
            f"<td class=n>{_num(_mean([e.latest.regret for e in live]))}</td></tr>"
        )
    return (
        "<table><thead><tr><th>skill</th><th class=n>designed</th><th class=n>admitted</th>"
        "<th class=n>admission rate</th><th class=n>seeds</th><th class=n>win plain</th>"
        "<th class=n>win hinted</th><th class=n>regret</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table>"
        "<p class=muted>win rates and regret: mean of the latest stats of admitted and seed "
        "environments.</p>"
    )


def _procedures(workdir: pathlib.Path) -> str:
    """Procedure memory (``procedures.json``, written by the loop when it is on): per key, the
    preplayed path and every transition with its counts and reliability; "" without the file."""
    try:
        graphs = json.loads((workdir / PROCEDURES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if not isinstance(graphs, dict):
        return ""
    parts = ['<h2 id="procedures">Procedure memory</h2>']
    for key, graph in sorted(graphs.items()):
        if not isinstance(graph, dict):
            continue
        preplay = graph.get("preplay")
        text = preplay.get("text") if isinstance(preplay, dict) else None
        rows = "".join(
            f"<tr><td><code>{_esc(t.get('from'))}</code></td><td><code>{_esc(t.get('to'))}</code></td>"
            f"<td class=n>{_esc(t.get('success'))}</td><td class=n>{_esc(t.get('count'))}</td>"
            f"<td class=n>{_num(t.get('reliability'))}</td></tr>"
            for t in graph.get("transitions", []) if isinstance(t, dict)
        )
        parts.append(
            f"<h3>{_esc(key)}</h3><p>preplay: {_esc(text) if text else '<span class=muted>no won path yet</span>'}</p>"
            '<table class="auto"><thead><tr><th>from</th><th>to</th><th class=n>won</th><th class=n>plays</th>'
            f"<th class=n>reliability</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    return "\n".join(parts)


def _index(workdir: pathlib.Path, metrics: list[dict], envs: list[_Env], plot_files) -> str:
    designed = [env for env in envs if env.verdict != "seed"]
    admitted = sum(env.verdict == "admitted" for env in designed)
    seeds = len(envs) - len(designed)
    rate = admitted / len(designed) if designed else None
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    parts = [
        "<h1>SPADE environment gallery</h1>",
        f"<p class=muted>workdir <code>{_esc(workdir.resolve())}</code> \u00b7 updated {now}</p>",
    ]
    if metrics:
        last = metrics[-1]
        line = console.summary_line(last["iteration"], last)
        parts.append(f'<div class="summary"><code>{_esc(line)}</code></div>')
    cards = [
        (str(len(metrics)), "iterations logged"),
        (str(len(designed)), "environments designed"),
        (f"{admitted} ({_num(rate)})", "admitted (rate)"),
        (str(seeds), "seed environments"),
        (str(sum(len(env.records) for env in envs)), "env records"),
    ]
    parts.append('<div class="cards">' + "".join(
        f'<div class="card"><b>{_esc(v)}</b><span>{_esc(k)}</span></div>' for v, k in cards
    ) + "</div>")
    parts.append('<h2 id="curves">Curves</h2><div class="plots">' + "".join(
        f'<figure style="margin:0"><img src="{PLOTS_DIR}/{name}" alt="{_esc(plot.title)}" '
        f'loading="lazy"></figure>' for plot, name in plot_files
    ) + "</div>")
    parts.append(
        f"<p class=muted>All scalars: <code>tensorboard --logdir "
        f"{_esc(workdir.resolve() / runlog.TENSORBOARD_DIR)}</code></p>"
    )
    if envs:
        parts.append('<h2 id="skills">By skill</h2>' + _skill_table(envs))
    parts.append(_procedures(workdir))
    skills = sorted({env.skill for env in envs})
    options = "".join(f'<option value="{_esc(s)}">{_esc(s)}</option>' for s in skills)
    headers = [("iter", "num", "n"), ("environment", "text", ""), ("skill", "text", ""),
               ("difficulty", "text", ""), ("verdict", "text", ""), ("reason", "text", "")]
    headers += [(label, "num", "n") for _, label in _STAT_COLUMNS] + [("history", "num", "n")]
    head = "".join(
        f'<th data-sort="{kind}"' + (f' class="{cls}"' if cls else "") + f">{_esc(label)}</th>"
        for label, kind, cls in headers
    )
    order = sorted(envs, key=lambda e: (-e.first.iteration, str(e.first.slot), e.stem))
    parts.append(
        '<h2 id="envs">Environments</h2>'
        '<div class="filters"><label>verdict <select id="f-verdict"><option value="">all</option>'
        '<option value="admitted">admitted</option><option value="rejected">rejected</option>'
        '<option value="seed">seed</option></select></label>'
        f'<label>skill <select id="f-skill"><option value="">all</option>{options}</select></label>'
        '<label>search <input id="f-text" type="search" placeholder="id, reason, ..."></label>'
        f'<span class="muted"><span id="f-count">{len(envs)}</span> shown \u00b7 stats are the '
        "latest play; history = iterations it was logged in \u00b7 click a header to sort</span></div>"
        f'<table id="env-table"><thead><tr>{head}</tr></thead><tbody>'
        + "\n".join(_env_row(env) for env in order)
        + "</tbody></table>"
    )
    if not envs:
        parts.append("<p class=muted>No environments designed yet.</p>")
    return _page(f"SPADE gallery \u00b7 {workdir.name}", "\n".join(parts), script=_SCRIPT)


def _transcript(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        return "<p class=muted>No transcript recorded.</p>"
    out = []
    for message in messages:
        if not isinstance(message, dict):
            message = {"role": "?", "content": message}
        role = str(message.get("role", "?"))
        content = message.get("content")
        block = f'<pre class="wrap">{_esc(content)}</pre>'
        if role == "system":
            block = f"<details><summary>system prompt ({len(str(content))} chars)</summary>{block}</details>"
        cls = re.sub(r"[^a-z]", "", role.lower())
        out.append(f'<div class="msg {cls}"><div class="role">{_esc(role)}</div>{block}</div>')
    return "".join(out)


def _code(code: str) -> str:
    """Source in a <pre> with CSS line numbers (not copied with the text)."""
    lines = _esc(code).split("\n")
    return '<pre class="code">' + "\n".join(f'<span class="l">{line}</span>' for line in lines) + "</pre>"


def _level_note(env: _Env) -> str:
    """The calibrated level and a retirement mark for the index row ("" when neither)."""
    level = (env.latest_with("level") or env.first).level
    note = f" \u00b7 level {_esc(level)}" if level else ""
    if env.latest_with("retired") is not None:
        note += ' <span class="badge rejected">retired</span>'
    return note


def _calibration(calibration: Any) -> str:
    """Per level: the agent's and the solution's solve rates and their gap, the chosen level in bold."""
    if not isinstance(calibration, dict) or not isinstance(calibration.get("levels"), list):
        return "\u2013"
    columns = [calibration.get(k) if isinstance(calibration.get(k), list) else [] for k in ("agent", "solution", "gap")]
    rows = []
    for i, level in enumerate(calibration["levels"]):
        name = _esc(level if level is not None else "default")
        name = f"<b>{name}</b>" if calibration.get("admitted") and level == calibration.get("level") else name
        cells = "".join(f"<td class=n>{_num(col[i] if i < len(col) else None)}</td>" for col in columns)
        rows.append(f"<tr><td>{name}</td>{cells}</tr>")
    return ('<table class="auto"><thead><tr><th>level</th><th class=n>agent</th><th class=n>solution</th>'
            f'<th class=n>gap</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f'<span class=muted>{_esc(calibration.get("episodes"))} episodes, '
            f'{_esc(console.format_duration(calibration.get("seconds") or 0.0))}</span>')


def _retirement(env: _Env) -> str:
    record = env.latest_with("retired")
    return f"iteration {_esc(record.iteration)}: {_esc(record.retired)}" if record is not None else "\u2013"


def _timings(timings: Any) -> str:
    if not isinstance(timings, dict) or not timings:
        return "\u2013"
    return ", ".join(f"{_esc(k)} {_esc(console.format_duration(v))}" for k, v in timings.items())


def _history(env: _Env) -> str:
    fields = [("win_rate", "win plain"), ("hinted_win_rate", "win hinted"),
              ("mean_plain", "mean R plain"), ("mean_hinted", "mean R hinted"),
              ("regret", "regret"), ("designer_reward", "designer reward")]
    head = "<th class=n>iteration</th>" + "".join(f"<th class=n>{label}</th>" for _, label in fields)
    rows = "".join(
        f"<tr><td class=n>{_esc(r.iteration)}</td>"
        + "".join(f"<td class=n>{_num(getattr(r, f))}</td>" for f, _ in fields) + "</tr>"
        for r in env.records
    )
    return f'<table class="auto"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _env_page(env: _Env) -> str:
    first = env.first
    name = _env_id(first) or f"rejected design \u00b7 iteration {first.iteration} slot {first.slot}"
    code_rec = env.latest_with("code") or first
    plain_rec = env.latest_with("transcript")
    hinted_rec = env.latest_with("hinted_transcript")
    meta = [
        ("verdict", _badge(env)),
        ("reason", _esc(first.reason) or "\u2013"),
        ("skill", _esc(env.skill)),
        ("difficulty", _esc(first.difficulty)),
        ("level played", _esc((env.latest_with("level") or first).level) or "default"),
        ("calibration", _calibration(first.calibration)),
        ("retired", _retirement(env)),
        ("designed in", f"iteration {_esc(first.iteration)}, slot {_esc(first.slot)}"),
        ("logged in iterations", ", ".join(_esc(r.iteration) for r in env.records)),
        ("admission timings", _timings(first.timings)),
        ("document", f"<code>{_esc(first.doc_id)}</code>" if first.doc_id else "\u2013"),
    ]
    code = code_rec.code
    hinted = "<p class=muted>No hinted episode recorded.</p>"
    if hinted_rec is not None:
        hint = hinted_rec.hint
        hinted = (
            (f'<div class="hint"><b>HINT</b> {_esc(hint)}</div>' if hint else "")
            + f"<p class=muted>from iteration {_esc(hinted_rec.iteration)}</p>"
            + _transcript(hinted_rec.hinted_transcript)
        )
    plain = "<p class=muted>No plain episode recorded.</p>"
    if plain_rec is not None:
        plain = (f"<p class=muted>from iteration {_esc(plain_rec.iteration)}</p>"
                 + _transcript(plain_rec.transcript))
    body = [
        f'<p><a href="../index.html">\u2190 gallery</a></p><h1>{_esc(name)}</h1>',
        '<dl class="meta">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta) + "</dl>",
        "<h2>Stats by iteration</h2>" + (
            "<p class=muted>Not played: rejected at admission.</p>"
            if env.verdict == "rejected" and not any(r.win_rate is not None for r in env.records)
            else _history(env)
        ),
        f"<h2>Document excerpt</h2><blockquote>{_esc(first.doc_excerpt) or '&ndash;'}</blockquote>",
        "<h2>Code</h2>"
        + (_code(str(code)) if code else "<p class=muted>The designer wrote no code.</p>"),
        '<div class="cols"><div><h2>Sample episode \u00b7 plain</h2>' + plain
        + '</div><div><h2>Sample episode \u00b7 hinted</h2>' + hinted + "</div></div>",
    ]
    return _page(str(name), "\n".join(body))


def _write_text(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", errors="replace")
    os.replace(tmp, path)


def write_gallery(workdir: str | os.PathLike) -> pathlib.Path:
    """(Re)build the gallery under ``workdir/gallery`` and return the path of ``index.html``.

    Works on a fresh workdir (no metrics, no environments yet) and drops the pages of
    environments no longer in the log (after a resume truncated it).
    """
    workdir = pathlib.Path(workdir)
    gallery = workdir / runlog.GALLERY_DIR
    pages_dir = gallery / ENV_PAGES_DIR
    pages_dir.mkdir(parents=True, exist_ok=True)
    metrics = runlog.read_metrics(workdir)
    envs = _group(runlog.EnvLog(workdir).read())  # only entries with an int iteration
    plot_files = plots.write_plots(metrics, gallery / PLOTS_DIR)
    manifest_path = gallery / _MANIFEST
    try:
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    manifest = {}
    for env in envs:
        name = f"{env.stem}.html"
        text = _env_page(env)
        manifest[name] = hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()
        if old.get(name) != manifest[name] or not (pages_dir / name).exists():
            _write_text(pages_dir / name, text)
    for stale in pages_dir.glob("*.html"):
        if stale.name not in manifest:
            stale.unlink()
    _write_text(manifest_path, json.dumps(manifest, sort_keys=True))
    index = gallery / "index.html"
    _write_text(index, _index(workdir, metrics, envs, plot_files))
    return index
