"""The HTML report's template, stylesheet and script: one self-contained page.

Kept in Python (not package data) so that every install has them. The page fetches
nothing: its Content-Security-Policy allows no source at all but its own inline style
and, by hash, this one script — so even an escaping slip could not run anything.
"""

from __future__ import annotations

import base64
import hashlib

SCRIPT = """
(function () {
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var body = table.tBodies[0];
    table.querySelectorAll("thead th").forEach(function (th, col) {
      var button = th.querySelector("button");
      if (!button) { return; }
      button.addEventListener("click", function () {
        var dir = th.getAttribute("aria-sort") === "descending" ? "ascending" : "descending";
        table.querySelectorAll("thead th").forEach(function (h) {
          h.removeAttribute("aria-sort");
        });
        th.setAttribute("aria-sort", dir);
        var numeric = button.getAttribute("data-type") === "number";
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col].getAttribute("data-sort");
          var y = b.cells[col].getAttribute("data-sort");
          var d = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
          return dir === "ascending" ? d : -d;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  });
})();
"""

SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
"""The script's hash, the only script the page's policy lets run."""

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; "
    f"script-src '{SCRIPT_HASH}'; img-src data:; base-uri 'none'; form-action 'none'"
)

CSS = """
:root { color-scheme: light; --ink: #1a1a1a; --muted: #4a4a4a; --line: #c8c8c8;
        --over: #fbe3d6; --accent: #005a8c; --bad: #a33a00; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--ink); background: #fff; margin: 0 auto; padding: 1.5rem; max-width: 84rem; }
h1 { font-size: 1.6rem; margin: 0 0 .3rem; }
h2 { font-size: 1.25rem; margin: 2rem 0 .6rem; border-bottom: 2px solid var(--line); }
h3 { font-size: 1.05rem; margin: 1rem 0 .4rem; }
.plots h3 { margin-top: 0; }
a { color: var(--accent); }
.provenance, .note { color: var(--muted); margin: .2rem 0; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(11rem, 1fr));
           gap: .6rem; margin: 0; }
.figures div { border: 1px solid var(--line); border-radius: 6px; padding: .5rem .7rem; }
.figures dt { color: var(--muted); font-size: .85rem; }
.figures dd { margin: 0; font-size: 1.35rem; font-weight: 600; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: .85rem; }
caption { text-align: left; color: var(--muted); padding: .3rem 0; }
th, td { border-bottom: 1px solid var(--line); padding: .3rem .35rem; text-align: left;
         vertical-align: top; }
td.k { white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
thead th { background: #f1f1f1; position: sticky; top: 0; }
th button { all: unset; cursor: pointer; font-weight: 600; }
th button:focus-visible { outline: 2px solid var(--accent); }
th[aria-sort="descending"] button::after { content: " \\25BE"; }
th[aria-sort="ascending"] button::after { content: " \\25B4"; }
tr.over td { background: var(--over); }
.bad { color: var(--bad); font-weight: 600; }
details summary { cursor: pointer; color: var(--accent); white-space: nowrap; }
details ul { margin: .3rem 0 .3rem 1.1rem; padding: 0; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(30rem, 1fr));
         gap: 1.2rem; }
.plots section { border: 1px solid var(--line); border-radius: 6px; padding: .8rem; }
figure { margin: .4rem 0; }
figcaption { color: var(--muted); font-size: .85rem; }
svg.plot { width: 100%; height: auto; display: block; }
svg.plot * { stroke-linejoin: round; stroke-linecap: butt; }
footer { color: var(--muted); margin-top: 2rem; font-size: .85rem; }
@media print {
  body { padding: 0; max-width: none; font-size: 10pt; }
  thead th { position: static; }
  .plots { display: block; }
  .plots section, figure, tr { break-inside: avoid; }
  a { color: inherit; text-decoration: none; }
  th button::after { content: "" !important; }
}
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<title>{{ title }}</title>
<style>{{ css }}</style>
</head>
<body>
<header>
<h1>{{ title }}</h1>
<p class="provenance">{{ provenance | join(" · ") }}</p>
{% for note in notes %}<p class="note">note: {{ note }}</p>
{% endfor %}
</header>
<main>
<section aria-labelledby="summary">
<h2 id="summary">Summary</h2>
<dl class="figures">
{% for label, value in figures %}<div><dt>{{ label }}</dt><dd>{{ value }}</dd></div>
{% endfor %}</dl>
{% if worst %}<h3>Worst offenders</h3>
<ol>
{% for o in worst %}<li><a href="#{{ o.anchor }}">{{ o.key }} · {{ o.container }}</a>:
<span class="bad">{{ o.now }}</span> of periods throttled{{ o.after }}</li>
{% endfor %}</ol>{% endif %}
{% if truncated %}<p class="note">{{ truncated }}</p>{% endif %}
</section>
{% if rows %}<section aria-labelledby="recommendations">
<h2 id="recommendations">Recommendations</h2>
<p class="note">One row per container, most harmful first; select a column header to sort.
Throttled: share of periods today, and expected under the recommendation. Demand: CPU wanted
per 100 ms window. A limit with a range, such as 1640m (580m–1640m), was made from throttled
data: it is an upper bound, what the demand itself asks for lies in the range, and it
is refined from the unthrottled evidence once applied. On a shared node the expected share
is a range too, such as 99.7 % (0.0–99.7 %): beside the same neighbours, and if the node
goes quiet, the end the limit is sized to.</p>
<div class="table-wrap">
<table class="sortable" id="containers">
<caption>{{ rows | length }} containers of {{ noun }}s with evidence</caption>
<thead><tr>
{% for name, kind, align in columns %}<th scope="col" class="{{ align }}"
{%- if loop.first %} aria-sort="ascending"{% endif %}>
<button type="button" data-type="{{ kind }}">{{ name }}</button></th>
{% endfor %}</tr></thead>
<tbody>
{% for r in rows %}<tr{% if r.over %} class="over"{% endif %}>
{% for cell in r.cells %}<td class="{{ 'n' if cell.numeric else 'k' }}" data-sort="{{ cell.sort }}">
{%- if cell.anchor %}<a href="#{{ cell.anchor }}">{{ cell.text }}</a>
{%- else %}{{ cell.text }}{% endif %}</td>
{% endfor %}<td data-sort="{{ r.reasons | length }}">{% if r.reasons %}<details>
<summary>{{ r.reasons | length }} steps</summary><ul>
{% for reason in r.reasons %}<li>{{ reason }}</li>
{% endfor %}</ul></details>{% endif %}</td>
</tr>
{% endfor %}</tbody>
</table>
</div>
</section>{% endif %}
{% if plots %}<section aria-labelledby="plots">
<h2 id="plots">Containers over target</h2>
<p class="note">{{ plots_note }}</p>
<div class="plots">
{% for p in plots %}<section id="{{ p.anchor }}" aria-labelledby="{{ p.anchor }}-h">
<h3 id="{{ p.anchor }}-h">{{ p.key }} · {{ p.container }}</h3>
<p>{{ p.figures }}</p>
{% for plot in p.plots %}<figure>{{ plot.svg }}<figcaption>{{ plot.title }}</figcaption></figure>
{% endfor %}{% if not p.plots %}<p class="note">No per-window demand in this report.</p>{% endif %}
</section>
{% endfor %}</div>
</section>{% endif %}
{% if applied %}<section aria-labelledby="applied">
<h2 id="applied">What Apply changed</h2>
<p class="note">{{ applied_note }}</p>
<div class="table-wrap"><table id="applied-table">
<thead><tr>{% for name in applied_columns %}<th scope="col">{{ name }}</th>{% endfor %}</tr></thead>
<tbody>
{% for a in applied %}<tr>{% for cell in a.cells %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</tbody>
</table></div>
<div class="plots">
{% for a in applied %}{% if a.plot %}<section>
<h3>{{ a.cells[0] }} · {{ a.cells[1] }}</h3>
<figure>{{ a.plot.svg }}<figcaption>{{ a.plot.title }}</figcaption></figure>
</section>{% endif %}
{% endfor %}</div>
</section>{% endif %}
{% if without %}<section aria-labelledby="without">
<h2 id="without">Without evidence</h2>
<div class="table-wrap"><table>
<thead><tr><th scope="col">{{ noun }}</th><th scope="col">containers</th>
<th scope="col">why</th></tr></thead>
<tbody>
{% for w in without %}<tr><td>{{ w.key }}</td><td>{{ w.containers }}</td><td>{{ w.why }}</td></tr>
{% endfor %}</tbody>
</table></div>
</section>{% endif %}
</main>
<footer>Generated by unthrottle {{ version }}. This page loads nothing from the network.</footer>
<script>{{ script }}</script>
</body>
</html>
"""
