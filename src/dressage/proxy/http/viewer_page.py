"""The session viewer: one self-contained HTML page (inline CSS and script, no external assets).

Served live by the Proxy at ``GET /admin/viewer`` (it polls ``/admin/sessions`` and
``/admin/sessions/{id}``), and written as a file with the data embedded by ``dressage export --html``
and by ``dressage run``. Both read the documents of :func:`dressage.trajectory.view.session_document`.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

__all__ = ["render_viewer", "TRAINED_RGB", "UNTRAINED_RGB", "PROMPT_RGB"]

# Token colours by loss mask; tests look for them in a screenshot, so they are named once here.
TRAINED_RGB = (46, 160, 67)
UNTRAINED_RGB = (230, 120, 30)
PROMPT_RGB = (200, 200, 200)


def _rgb(c: tuple[int, int, int]) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;display:flex;height:100vh;color:#222}
#side{width:280px;overflow:auto;border-right:1px solid #ccc;padding:8px;box-sizing:border-box}
#main{flex:1;overflow:auto;padding:8px 16px}
.session{padding:3px 6px;cursor:pointer;border-radius:3px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.session:hover,.session.sel{background:#e8eefc}
.state{display:inline-block;min-width:62px;font-size:11px;padding:0 4px;border-radius:3px;margin-right:6px;color:#fff}
.state-active{background:#1f6feb}.state-finalized{background:#2ea043}.state-aborted{background:#cf222e}
ul.tree{list-style:none;padding-left:18px;margin:2px 0}
.step{font-family:ui-monospace,monospace;font-size:12px}
.reason{font-size:11px;background:#fff3cd;border:1px solid #e0c060;border-radius:3px;padding:0 3px;margin-left:4px}
.segment{border:1px solid #ddd;border-radius:4px;margin:10px 0;padding:6px}
.tokens{font-family:ui-monospace,monospace;font-size:11px;line-height:20px;word-break:break-all}
.tok{display:inline-block;min-width:14px;padding:0 2px;margin:1px;border-radius:2px;text-align:center}
.m1{background:__TRAINED__;color:#fff}.m0{background:__UNTRAINED__;color:#fff}.mp{background:__PROMPT__;color:#333}
.msg{margin:2px 0;padding:2px 4px;background:#f6f8fa;border-radius:3px;white-space:pre-wrap}
.role{font-weight:bold;margin-right:6px}
.tool{color:#8250df}
figure{margin:8px 0}figure img{max-width:100%}
table.kv td{padding:1px 8px 1px 0}
</style></head>
<body><div id="side"><div id="summary"></div><div id="sessions"></div></div><div id="main"><div id="detail"></div>
<div id="figures"></div></div>
<script id="viewer-data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("viewer-data").textContent);
const LIVE = DATA === null;
let docs = {}, order = [], selected = null, colourBy = "mask";
// The admin token rides in the URL fragment (#token=...), which the browser never sends to a server;
// it is kept for this tab only and sent as a bearer token to the admin endpoints the page polls.
const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
if (hashToken) { sessionStorage.setItem("dressage-admin-token", hashToken); history.replaceState(null, "", location.pathname); }
const TOKEN = sessionStorage.getItem("dressage-admin-token");
const AUTH = TOKEN ? {headers: {"Authorization": "Bearer " + TOKEN}} : {};
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}
function versionColour(v) {
  if (v < 0) return "rgb(150,150,150)";
  const hue = (v * 67) % 360;
  return "hsl(" + hue + ",60%,45%)";
}
function summary() {
  const list = order.map(id => docs[id]).filter(Boolean);
  const segs = list.reduce((n, d) => n + (d.segments ? d.segments.length : 0), 0);
  const trained = list.reduce((n, d) => n + (d.trained_tokens || 0), 0);
  const s = document.getElementById("summary");
  s.replaceChildren(el("div", {text: order.length + " sessions, " + segs + " segments, " + trained + " trained tokens"}));
  s.dataset.sessions = order.length; s.dataset.segments = segs; s.dataset.trainedTokens = trained;
  const toggle = el("label", {}, el("input", {type: "checkbox", id: "by-version"}), " colour by policy version");
  toggle.firstChild.checked = colourBy === "version";
  toggle.firstChild.onchange = e => { colourBy = e.target.checked ? "version" : "mask"; show(selected); };
  s.append(toggle);
}
function sideList(states) {
  const box = document.getElementById("sessions");
  box.replaceChildren(...order.map(id => {
    const st = states[id] || "?";
    const row = el("div", {class: "session" + (id === selected ? " sel" : ""), "data-id": id, "data-state": st},
                   el("span", {class: "state state-" + st, text: st}), id);
    row.onclick = () => select(id);
    return row;
  }));
}
function stepTree(doc) {
  const kids = {};
  for (const s of doc.steps) (kids[s.parent_id === null ? "root" : s.parent_id] ||= []).push(s);
  const item = s => {
    const tags = [];
    if (s.boundary) tags.push(el("span", {class: "reason", text: s.boundary.reason}));
    if (s.branch_from !== null) tags.push(el("span", {class: "reason", text: "branch from " + s.branch_from}));
    if (s.retry_orphan) tags.push(el("span", {class: "reason", text: "retried"}));
    const li = el("li", {class: "step", "data-step": s.step_id},
                  "step " + s.step_id + ": " + s.prompt_length + " prompt + " + s.response_length + " response tokens, versions " +
                  JSON.stringify(s.versions), ...tags);
    if (kids[s.step_id]) li.append(el("ul", {class: "tree"}, ...kids[s.step_id].map(item)));
    return li;
  };
  return el("ul", {class: "tree", id: "step-tree"}, ...(kids.root || []).map(item));
}
function messages(step) {
  if (!step || (!Array.isArray(step.messages) && !step.assistant_message))
    return el("div", {class: "msg", text: "(messages not kept for this step)"});
  const box = el("div", {class: "messages"});
  for (const m of (step.messages || []).concat(step.assistant_message ? [step.assistant_message] : [])) {
    const content = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
    const row = el("div", {class: "msg"}, el("span", {class: "role", text: m.role || "?"}), content || "");
    for (const c of (m.tool_calls || [])) {
      const f = c.function || {};
      row.append(el("div", {class: "tool", text: "tool call " + (f.name || c.name || "?") + "(" + (f.arguments || "") + ")"}));
    }
    box.append(row);
  }
  if (Array.isArray(step.tools) && step.tools.length)
    box.append(el("div", {class: "tool", text: "tools: " + step.tools.map(t => (t.function || t).name).join(", ")}));
  return box;
}
function segmentView(doc, seg) {
  const steps = Object.fromEntries(doc.steps.map(s => [s.step_id, s]));
  const toks = el("div", {class: "tokens"});
  const p = seg.prompt_length;
  const shown = t => JSON.stringify(t).slice(1, -1).replace(/ /g, "\u00b7");  // whitespace made visible
  seg.tokens.forEach((t, i) => {
    const r = i - p;
    const text = seg.token_text && seg.token_text[i] !== null ? seg.token_text[i] : null;
    let cls = "tok mp", title = "token " + t + (text !== null ? " " + JSON.stringify(text) : "") + " (prompt)";
    if (r >= 0) {
      const m = seg.loss_mask[r], v = seg.token_versions[r];
      cls = "tok " + (m ? "m1" : "m0");
      title = "token " + t + (text !== null ? " " + JSON.stringify(text) : "") + ", mask " + m + ", version " + v +
              (seg.logprobs ? ", logprob " + (seg.logprobs[r] === null ? "-inf" : seg.logprobs[r].toFixed(4)) : "");
    }
    const span = el("span", {class: cls, title: title, text: text !== null && text !== "" ? shown(text) : String(t)});
    if (r >= 0 && colourBy === "version") span.style.background = versionColour(seg.token_versions[r]);
    toks.append(span);
  });
  const last = steps[seg.step_ids[seg.step_ids.length - 1]];
  return el("div", {class: "segment", "data-index": seg.index, "data-reason": seg.boundary_reason,
                    "data-trained": seg.trained_tokens},
            el("div", {text: "Segment " + seg.index + " (steps " + seg.step_ids.join(", ") + "): " + seg.prompt_length +
                             " prompt + " + seg.response_length + " response tokens, " + seg.trained_tokens + " trained"},
               el("span", {class: "reason", text: seg.boundary_reason}),
               seg.branch_from !== null ? el("span", {class: "reason", text: "branch from " + seg.branch_from}) : null),
            toks, messages(last));
}
function show(id) {
  const d = document.getElementById("detail");
  const doc = docs[id];
  if (!doc) { d.replaceChildren(el("p", {text: "Select a session."})); return; }
  d.replaceChildren(el("h2", {text: doc.session_id}),
                    el("div", {text: "state " + doc.state + ", reward " + doc.reward + ", " + doc.steps.length + " steps, " +
                                     doc.segments.length + " segments, " + doc.trained_tokens + " trained tokens"}),
                    el("h3", {text: "Steps"}), stepTree(doc), el("h3", {text: "Segments"}),
                    ...doc.segments.map(s => segmentView(doc, s)));
  for (const row of document.querySelectorAll(".session")) row.classList.toggle("sel", row.dataset.id === id);
}
function select(id) { selected = id; if (LIVE) refresh(); else show(id); }
function memoryTimeline(points) {
  const NS = "http://www.w3.org/2000/svg", W = 600, H = 160, pad = 30;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("id", "memory-timeline");
  const top = Math.max(...points.map(p => p.bytes), 1);
  const xy = points.map((p, i) => [pad + (W - 2 * pad) * (points.length > 1 ? i / (points.length - 1) : 0.5),
                                   H - pad - (H - 2 * pad) * p.bytes / top]);
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("points", xy.map(q => q.join(",")).join(" "));
  line.setAttribute("fill", "none"); line.setAttribute("stroke", "#1f6feb"); line.setAttribute("stroke-width", "2");
  svg.append(line);
  xy.forEach((q, i) => {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", q[0]); t.setAttribute("y", q[1] - 6); t.setAttribute("font-size", "10");
    t.setAttribute("text-anchor", "middle");
    t.textContent = points[i].label + ": " + (points[i].bytes / 1048576).toFixed(1) + " MiB";
    svg.append(t);
  });
  return svg;
}
function figures(figs, capacity, timeline) {
  const box = document.getElementById("figures");
  const kids = [];
  if (timeline && timeline.length) kids.push(el("h3", {text: "Memory timeline (process PSS)"}), memoryTimeline(timeline));
  if (figs && figs.length) kids.push(el("h3", {text: "Run figures"}),
    ...figs.map(f => el("figure", {}, el("img", {src: "data:image/png;base64," + f.png_base64, alt: f.name}),
                         el("figcaption", {text: f.name}))));
  if (capacity && Object.keys(capacity).length) kids.push(el("h3", {text: "Capacity"}),
    el("table", {class: "kv"}, ...Object.entries(capacity).map(([k, v]) =>
      el("tr", {}, el("td", {text: k}), el("td", {text: typeof v === "object" ? JSON.stringify(v) : String(v)})))));
  box.replaceChildren(...kids);
}
async function refresh() {
  try {
    const answer = await fetch("sessions", AUTH);
    if (!answer.ok) throw new Error("HTTP " + answer.status + " (open the page as /admin/viewer#token=ADMIN_TOKEN)");
    const list = await answer.json();
    const states = {};
    order = list.sessions.map(s => s.session_id);
    for (const s of list.sessions) states[s.session_id] = s.state;
    if (selected === null && order.length) selected = order[0];
    for (const s of list.sessions) {
      const known = docs[s.session_id];
      if (!known || known.state !== s.state || known.steps.length !== s.steps || s.session_id === selected)
        docs[s.session_id] = await (await fetch("sessions/" + encodeURIComponent(s.session_id), AUTH)).json();
    }
    for (const id of Object.keys(docs)) if (!states[id]) delete docs[id];
    sideList(states); summary(); show(selected);
  } catch (e) { document.getElementById("detail").textContent = "cannot read the Proxy: " + e; }
}
if (LIVE) { refresh(); setInterval(refresh, 2000); }
else {
  for (const d of DATA.sessions) { docs[d.session_id] = d; order.push(d.session_id); }
  selected = order.length ? order[0] : null;
  sideList(Object.fromEntries(DATA.sessions.map(d => [d.session_id, d.state])));
  summary(); show(selected); figures(DATA.figures, DATA.capacity, DATA.timeline);
}
</script></body></html>
"""


def render_viewer(sessions: Sequence[Mapping[str, Any]] | None = None, *, title: str = "Dressage sessions",
                  figures: Sequence[Mapping[str, str]] = (), capacity: Mapping[str, Any] | None = None,
                  timeline: Sequence[Mapping[str, Any]] = ()) -> str:
    """The viewer page. ``sessions`` (session documents) embeds the data: a file that needs no server;
    ``None``: the live page, which polls the Proxy's admin endpoints beside it. ``figures`` are
    ``{"name", "png_base64"}`` pictures of the run, ``capacity`` its capacity figures, ``timeline`` its
    memory samples (``{"label", "bytes"}``, drawn as a line)."""
    data = None if sessions is None else {"sessions": list(sessions), "figures": list(figures),
                                          "capacity": dict(capacity or {}), "timeline": list(timeline)}
    # Inside the script element "</script" would end it early and "<!--<script" would keep it from ending at
    # all (the parser's double-escaped state): no "<" at all, as JSON's "\u003c" (valid in any JSON string).
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    esc = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (_PAGE.replace("__TITLE__", esc).replace("__TRAINED__", _rgb(TRAINED_RGB))
            .replace("__UNTRAINED__", _rgb(UNTRAINED_RGB)).replace("__PROMPT__", _rgb(PROMPT_RGB))
            .replace("__DATA__", payload))
