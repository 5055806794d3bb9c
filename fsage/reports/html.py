"""One self-contained HTML report: plotly.js inlined, figures as JSON, every string escaped.

Section API — how another component adds to the report::

    from fsage.reports import ReportData, Section, Table, register_section

    @register_section("lfs-segments", order=60)
    def lfs_segments(data: ReportData) -> Section | None:
        if "lfs" not in data.extra:
            return None                      # nothing to show: the section is left out
        return Section("LFS segment utilization", figures=[{...plotly figure dict...}],
                       tables=[Table(["segment", "live"], rows)], notes=["..."])

A builder gets the analyses (one dict per snapshot, as ``fsage analyze --format json``), the
trends, and ``extra`` (anything a caller put there). Figures are plain plotly dicts
(``{"data": [...], "layout": {...}}``); tables and notes are plain text. The renderer escapes
all of it: figure JSON is embedded with ``<``, ``>`` and ``&`` as \\u escapes, table cells and
notes go through ``html.escape``, and text that ends up inside plotly figures (trace names,
axis labels, hover text) is HTML-escaped too, since plotly interprets a few tags.
"""

from __future__ import annotations

import html
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsage import __version__
from fsage.errors import FsageError
from fsage.private import output_target, write_private_text
from fsage.text import decimal


@dataclass
class Table:
    headers: list[str]
    rows: list[list[Any]]
    caption: str = ""


@dataclass
class Section:
    title: str
    figures: list[dict[str, Any]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    id: str = ""


@dataclass
class ReportData:
    analyses: list[dict[str, Any]]
    trends: dict[str, dict[str, Any]]
    title: str = "fsage layout report"
    extra: dict[str, Any] = field(default_factory=dict)

    def latest(self) -> list[dict[str, Any]]:
        """The newest analysis of each file system."""
        out: dict[str, dict[str, Any]] = {}
        for a in sorted(self.analyses, key=lambda a: (a.get("taken_at") or "", a["id"])):
            out[str(a.get("fs"))] = a
        return list(out.values())


SectionBuilder = Callable[[ReportData], "Section | None"]
_BUILDERS: list[tuple[int, str, SectionBuilder]] = []


def register_section(name: str, order: int = 100) -> Callable[[SectionBuilder], SectionBuilder]:
    """Add a section builder; sections render by ``order`` then name. Re-registering a name
    replaces the earlier builder."""

    def deco(fn: SectionBuilder) -> SectionBuilder:
        _BUILDERS[:] = [b for b in _BUILDERS if b[1] != name]
        _BUILDERS.append((order, name, fn))
        _BUILDERS.sort(key=lambda b: (b[0], b[1]))
        return fn

    return deco


def section_names() -> list[str]:
    return [name for _, name, _ in _BUILDERS]


def build_sections(data: ReportData) -> list[Section]:
    out = []
    for _, name, fn in _BUILDERS:
        sec = fn(data)
        if sec is not None:
            if not sec.id:
                sec.id = name
            out.append(sec)
    return out


def _finite(obj: Any) -> Any:
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _json_script(obj: Any) -> str:
    text = json.dumps(_finite(obj), separators=(",", ":"), default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def cell_text(v: Any) -> str:
    """A table cell as the reports show it: "-" for none, floats to 3 decimals."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return decimal(v, 3)
    return str(v)


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell_text(c))}</td>" for c in row) + "</tr>"
        for row in t.rows
    )
    cap = f"<caption>{html.escape(t.caption)}</caption>" if t.caption else ""
    # In a box of the page's width that scrolls sideways: a wide table stays in the column.
    return (
        f'<div class="table"><table>{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1250px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em}
.table{overflow-x:auto}table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}td{white-space:nowrap}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.plot{width:100%;min-height:420px}.note{color:#555;font-size:.9em}
#fsage-errors{color:#b00;white-space:pre-wrap}
"""

_BOOT = """
(function(){
  var errs = document.getElementById('fsage-errors');
  function fail(msg){ errs.textContent += msg + '\\n'; document.body.setAttribute('data-errors',
    String((+document.body.getAttribute('data-errors')||0) + 1)); }
  window.addEventListener('error', function(e){ fail('error: ' + e.message); });
  window.addEventListener('unhandledrejection', function(e){ fail('rejection: ' + e.reason); });
  // Text that a reader must be able to read: titles, axis titles and tick labels, legend
  // entries, buttons, colour-bar titles. Two boxes of different kinds must not intersect.
  var KINDS = [['title', '.g-gtitle text'], ['xtitle', '.g-xtitle text'],
               ['ytitle', '.g-ytitle text'], ['xtick', '.xtick text'], ['ytick', '.ytick text'],
               ['legend', '.legend .traces'], ['menu', '.updatemenu-button'],
               ['colorbar', '.cbtitle text']];
  function overlaps(div) {
    var boxes = [], out = [];
    KINDS.forEach(function(k){
      div.querySelectorAll(k[1]).forEach(function(el){
        var r = el.getBoundingClientRect();
        if (r.width > 0 && r.height > 0 && (el.textContent || k[0] === 'legend' ||
            k[0] === 'menu')) boxes.push([k[0], r, (el.textContent || '').slice(0, 30)]);
      });
    });
    for (var i = 0; i < boxes.length; i++) for (var j = i + 1; j < boxes.length; j++) {
      var a = boxes[i], b = boxes[j];
      if (a[0] === b[0]) continue;
      if (a[0].slice(1) === 'tick' && b[0].slice(1) === 'tick') continue;  // the corner
      var w = Math.min(a[1].right, b[1].right) - Math.max(a[1].left, b[1].left);
      var h = Math.min(a[1].bottom, b[1].bottom) - Math.max(a[1].top, b[1].top);
      if (w > 1 && h > 1) out.push(a[0] + ':' + a[2] + '~' + b[0] + ':' + b[2]);
    }
    return out.map(function(s){ return s.replace(/\\s+/g, '_'); });
  }
  var divs = document.querySelectorAll('div.plot'), pending = [];
  for (var i = 0; i < divs.length; i++) {
    (function(div){
      try {
        var fig = JSON.parse(document.getElementById(div.id + '-json').textContent);
        var p = Plotly.newPlot(div, fig.data, fig.layout, {responsive: true, displaylogo: false})
          .then(function(){
                  if (div.querySelector('svg.main-svg')) div.setAttribute('data-drawn', '1');
                  else fail('no svg in ' + div.id);
                  div.setAttribute('data-overlaps', overlaps(div).join(' '));
                  // a figure taller than its box would be drawn over what follows it
                  var svg = div.querySelector('svg.main-svg');
                  div.setAttribute('data-overflow', String(svg && svg.getBoundingClientRect()
                    .bottom > div.getBoundingClientRect().bottom + 1 ? 1 : 0)); },
                function(err){ fail(div.id + ': ' + err); });
        pending.push(p);
      } catch (e) { fail(div.id + ': ' + e); }
    })(divs[i]);
  }
  Promise.all(pending).then(function(){
    var drawn = document.querySelectorAll('div.plot[data-drawn="1"]').length;
    document.body.setAttribute('data-plots', String(divs.length));
    document.body.setAttribute('data-plots-drawn', String(drawn));
    document.body.setAttribute('data-done', '1');
  });
})();
"""


def render(data: ReportData, sections: Sequence[Section] | None = None) -> str:
    """The report as one HTML string (plotly.js included)."""
    from plotly.offline import get_plotlyjs

    secs = list(sections) if sections is not None else build_sections(data)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(data.title)}</title><style>{_STYLE}</style>",
        f"<script>{get_plotlyjs()}</script></head><body>",
        f"<h1>{html.escape(data.title)}</h1>",
        f"<p class='note'>fsage {html.escape(__version__)}; "
        f"{len(data.analyses)} snapshot(s) of {len({a.get('fs') for a in data.analyses})} "
        "file system(s).</p><div id='fsage-errors'></div>",
    ]
    n = 0
    for sec in secs:
        sid = html.escape(sec.id, quote=True)
        parts.append(f"<section id='s-{sid}'><h2>{html.escape(sec.title)}</h2>")
        for note in sec.notes:
            parts.append(f"<p class='note'>{html.escape(note)}</p>")
        for fig in sec.figures:
            n += 1
            parts.append(f"<div class='plot' id='plot{n}'></div>")
            parts.append(
                f"<script type='application/json' id='plot{n}-json'>{_json_script(fig)}</script>"
            )
        for t in sec.tables:
            parts.append(_table_html(t))
        parts.append("</section>")
    parts.append(f"<script>{_BOOT}</script></body></html>")
    return "".join(parts)


class ReportError(FsageError):
    """The report cannot be written where it was asked for."""


def check_output(path: Path | str) -> None:
    """Raise ReportError if a page cannot go to ``path`` ('-' is standard output)."""
    if str(path) == "-":
        return
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"{path} is a directory (give a file name: -o {path}/report.html)")
    parent = path.parent
    if not parent.is_dir():
        raise ReportError(f"{parent}: no such directory (the report would go to {path})")
    if not os.access(parent, os.W_OK):
        raise ReportError(f"{parent}: not writable (the report would go to {path})")


def write_html(path: Path | str, text: str) -> None:
    """Write an HTML page atomically and private (it names files), or to standard output
    when ``path`` is '-'. A directory that does not exist, or one that cannot be written,
    is one clear error, raised before anything is written.

    A symlink's target is written, a device or a FIFO written into
    (``fsage.private.output_target``)."""
    if str(path) == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as exc:
            raise ReportError(f"cannot write to standard output: {exc.strerror or exc}") from None
        return
    path = Path(path)
    check_output(path)
    path, into = output_target(Path(path))
    if into:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_private_text(tmp, text)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        # the page is written beside its name first: say so when that is what failed
        where = (
            f" (it is written to {tmp.name} in {path.parent} first, then renamed)"
            if exc.filename is not None and Path(exc.filename) == tmp
            else ""
        )
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}{where}") from None


def write_report(path: Path | str, data: ReportData) -> int:
    """Write the report atomically ('-': standard output); returns the number of figures."""
    secs = build_sections(data)
    write_html(path, render(data, secs))
    return sum(len(s.figures) for s in secs)
