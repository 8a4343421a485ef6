"""A self-contained HTML audit report (``agentcache audit --html FILE``).

One file, no network: the data is embedded as JSON and drawn as inline SVG by a small script, so
it opens offline in any browser. Sections: totals per arm (stacked cache-read / cache-write /
uncached tokens, cost), a per-turn chart for the chosen session with one panel per arm, that
session's breaks and misses, the provider's own miss reasons beside agentcache's causes (when recorded), and
the TTL policy's choices with their reasons.
"""

from __future__ import annotations

import html
import json
from typing import Any

from ._report import AuditReport


def report_data(report: AuditReport) -> dict[str, Any]:
    """The JSON embedded in the page: the audit document plus per-turn usage and TTL reasons."""
    data = report.to_dict()
    turns: dict[str, list[dict[str, Any]]] = {}
    for t in report.turns:
        ttl = getattr(t.prepared, "ttl", None)
        turns.setdefault(t.session, []).append(
            {
                "request": t.request,
                "at": t.at,
                "arms": {
                    a: [u.cache_read_tokens, u.cache_write_tokens, u.uncached_tokens, round(u.cost_usd, 6)]
                    for a, u in t.arms.items()
                },
                "markers": list(t.markers),
                "repairs": list(t.repairs),
                "ttl": ttl.ttl if ttl is not None else None,
                "ttl_reason": ttl.reason if ttl is not None else None,
            }
        )
    data["turns"] = turns
    return data


def render_html(report: AuditReport) -> str:
    """The whole HTML document for ``report``."""
    payload = json.dumps(report_data(report), separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(f"agentcache audit: {report.provider}, {report.model}")
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", payload)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
.panel{display:inline-block;vertical-align:top;margin:0 16px 16px 0}.panel h3{font-size:13px;margin:4px 0}
select{font-size:14px}.muted{color:#777}
</style></head>
<body>
<h1 id="title">__TITLE__</h1>
<p class="legend"><span><i class="sw" style="background:#2e7d32"></i>cache read</span>
<span><i class="sw" style="background:#f9a825"></i>cache write</span>
<span><i class="sw" style="background:#c62828"></i>uncached</span></p>
<h2>Totals</h2><div id="totals"></div><svg id="totals-chart" class="chart" width="720" height="10"></svg>
<h2>Per turn</h2>
<p>Session <select id="session"></select> <span id="session-info" class="muted"></span></p>
<div id="turn-charts"></div>
<h2>Breaks in this session</h2><div id="breaks"></div>
<h2>Misses in this session</h2><div id="misses"></div>
<h2>Provider-reported misses in this session</h2><p id="provider-agreement" class="muted"></p><div id="provider"></div>
<h2>TTL choices in this session</h2><div id="ttl"></div>
<script id="audit-data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("audit-data").textContent);
const COLORS = ["#2e7d32", "#f9a825", "#c62828"];
const NS = "http://www.w3.org/2000/svg";
const fmt = n => n.toLocaleString("en-US");
function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function table(rows, head) {
  if (!rows.length) return "<p class='muted'>none</p>";
  const esc = s => String(s).replace(/[&<>]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[c]));
  return "<table><tr>" + head.map(h => "<th>" + esc(h) + "</th>").join("") + "</tr>" +
    rows.map(r => "<tr>" + r.map(c => "<td>" + esc(c) + "</td>").join("") + "</tr>").join("") + "</table>";
}
function stacked(svg, bars, width, barH) {
  // bars: [{label, parts:[read, write, uncached]}]; one horizontal stacked bar per row.
  const max = Math.max(1, ...bars.map(b => b.parts.reduce((a, c) => a + c, 0)));
  svg.setAttribute("height", bars.length * (barH + 6) + 4);
  bars.forEach((b, i) => {
    let x = 120;
    const y = 2 + i * (barH + 6);
    svg.appendChild(el("text", {x: 0, y: y + barH - 3, "font-size": 12}, b.label));
    b.parts.forEach((v, k) => {
      const w = (width - 130) * v / max;
      if (w > 0) svg.appendChild(el("rect", {x: x, y: y, width: w, height: barH, fill: COLORS[k], "data-tokens": v}));
      x += w;
    });
  });
}
const arms = Object.keys(D.totals);
document.getElementById("totals").innerHTML = table(arms.map(a => {
  const m = D.totals[a];
  return [a, fmt(m.prompt_tokens), fmt(m.cache_read_tokens), fmt(m.cache_write_tokens), fmt(m.uncached_tokens),
          (m.hit_rate * 100).toFixed(1) + "%", m.cost_usd.toFixed(4)];
}), ["arm", "prompt", "cache read", "cache write", "uncached", "hit rate", "cost (USD)"]);
stacked(document.getElementById("totals-chart"), arms.map(a => ({label: a,
  parts: [D.totals[a].cache_read_tokens, D.totals[a].cache_write_tokens, D.totals[a].uncached_tokens]})), 720, 18);
const sel = document.getElementById("session");
const saving = s => s.arms.as_sent.cost_usd - s.arms.agentcache.cost_usd;
[...D.sessions].sort((a, b) => saving(b) - saving(a)).forEach(s => {
  const o = document.createElement("option");
  o.value = s.session; o.textContent = s.session + " (" + s.requests + " requests)";
  sel.appendChild(o);
});
function show(name) {
  const turns = D.turns[name] || [];
  const s = D.sessions.find(x => x.session === name);
  document.getElementById("session-info").textContent = s ? "as_sent " + s.arms.as_sent.cost_usd.toFixed(4) +
    " USD, agentcache " + s.arms.agentcache.cost_usd.toFixed(4) + " USD" : "";
  const host = document.getElementById("turn-charts");
  host.innerHTML = "";
  arms.forEach(a => {
    const div = document.createElement("div");
    div.className = "panel";
    div.innerHTML = "<h3>" + a + "</h3>";
    const svg = el("svg", {width: 340, height: 10, class: "chart", "data-arm": a});
    stacked(svg, turns.map(t => ({label: "turn " + t.request, parts: t.arms[a].slice(0, 3)})), 340, 10);
    div.appendChild(svg);
    host.appendChild(div);
  });
  document.getElementById("breaks").innerHTML = table(D.breaks.filter(b => b.session === name).map(b =>
    [b.request, b.first_divergent || "", b.cause, fmt(b.tokens_lost), b.repaired ? "yes" : "no"]),
    ["request", "first divergent", "cause", "tokens lost", "repaired"]);
  document.getElementById("misses").innerHTML = table(D.misses.filter(m => m.session === name).map(m =>
    [m.request, m.arm, m.cause, fmt(m.tokens_lost), m.rejected ? "yes" : "no", m.where || ""]),
    ["request", "arm", "cause", "tokens lost", "rejected", "where"]);
  const pd = D.provider_diagnostics;
  document.getElementById("provider-agreement").textContent = pd.compared ? "agreement " +
    (100 * pd.agreement).toFixed(1) + "% (" + pd.agree + " of " + pd.compared + " compared)" : "none recorded";
  document.getElementById("provider").innerHTML = table(pd.misses.filter(m => m.session === name).map(m =>
    [m.request, m.provider + ": " + m.reason, m.ours || "(none)",
     m.agrees === null ? "unknown" : (m.agrees ? "yes" : "no")]),
    ["request", "provider reason", "agentcache cause", "agrees"]);
  document.getElementById("ttl").innerHTML = table(turns.filter(t => t.ttl).map(t =>
    [t.request, t.ttl, t.ttl_reason]), ["request", "ttl", "reason"]);
}
sel.addEventListener("change", () => show(sel.value));
if (sel.options.length) show(sel.options[0].value);
document.body.setAttribute("data-rendered", "yes");
</script>
</body></html>
"""
