// The embedded chat page (see chat_page.h).
#include "serve/chat_page.h"

namespace k3::serve {

namespace {
constexpr std::string_view kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>k3cpp chat</title>
<style>
  :root { color-scheme: light dark; --fg: #1d1d1f; --bg: #fafafa; --dim: #8a8a90; --card: #ffffff; --line: #dddde3; --accent: #3056d3; }
  @media (prefers-color-scheme: dark) { :root { --fg: #e8e8ec; --bg: #17171a; --dim: #8d8d96; --card: #222227; --line: #34343b; --accent: #7f9cff; } }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, sans-serif; color: var(--fg); background: var(--bg); display: flex; flex-direction: column; height: 100vh; }
  header { padding: 10px 16px; border-bottom: 1px solid var(--line); display: flex; gap: 12px; align-items: center; }
  header h1 { font-size: 16px; margin: 0; font-weight: 600; }
  header .model { color: var(--dim); font-size: 13px; }
  header label { font-size: 13px; color: var(--dim); }
  header label:first-of-type { margin-left: auto; }
  header select, header input { width: auto; }
  #log { flex: 1; overflow-y: auto; padding: 16px; display: flex; flex-direction: column; gap: 12px; }
  .msg { max-width: 780px; padding: 10px 14px; border-radius: 10px; background: var(--card); border: 1px solid var(--line); white-space: pre-wrap; word-wrap: break-word; }
  .msg.user { align-self: flex-end; background: var(--accent); color: #fff; border: none; }
  .msg.assistant { align-self: flex-start; }
  details.think { color: var(--dim); font-size: 13px; margin-bottom: 6px; }
  details.think summary { cursor: pointer; user-select: none; }
  .reasoning { color: var(--dim); font-style: italic; white-space: pre-wrap; }
  .tools { font-family: ui-monospace, monospace; font-size: 13px; }
  .status { color: var(--dim); font-size: 12px; margin-top: 4px; }
  .error { color: #d33; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid var(--line); }
  textarea { flex: 1; resize: none; height: 56px; padding: 8px; font: inherit; border-radius: 8px; border: 1px solid var(--line); background: var(--card); color: var(--fg); }
  button { padding: 0 18px; border-radius: 8px; border: none; background: var(--accent); color: #fff; font: inherit; cursor: pointer; }
  button:disabled { opacity: 0.5; cursor: default; }
</style>
</head>
<body>
<header><h1>k3cpp chat</h1><span class="model" id="model"></span>
  <label>effort <select id="effort"><option>max</option><option>high</option><option>low</option><option value="none">none (no thinking)</option></select></label>
  <label>max tokens <input id="max" type="number" value="256" min="1" style="width:5em"></label>
  <label>API key <input id="key" type="password" style="width:8em"></label>
</header>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Message (Enter sends, Shift+Enter is a new line)"></textarea><button id="send" type="submit">Send</button></form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];
const keyBox = $("key");
keyBox.value = localStorage.getItem("k3key") || "";
keyBox.addEventListener("change", () => localStorage.setItem("k3key", keyBox.value));
function headers() {
  const h = { "Content-Type": "application/json" };
  if (keyBox.value) h["Authorization"] = "Bearer " + keyBox.value;
  return h;
}
fetch("/v1/models", { headers: headers() }).then((r) => r.json()).then((j) => { if (j.data) $("model").textContent = j.data[0].id; }).catch(() => {});
function add(cls) {
  const d = document.createElement("div");
  d.className = "msg " + cls;
  $("log").appendChild(d);
  return d;
}
// SSE: events end with a blank line; data lines are joined with "\n".
async function* sse(body) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = ev.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}
async function send(text) {
  history.push({ role: "user", content: text });
  add("user").textContent = text;
  const box = add("assistant");
  const think = document.createElement("details");
  think.className = "think";
  think.open = true;
  think.innerHTML = "<summary>reasoning</summary>";
  const reasoning = document.createElement("div");
  reasoning.className = "reasoning";
  think.appendChild(reasoning);
  const answer = document.createElement("div");
  answer.className = "answer";
  const tools = document.createElement("div");
  tools.className = "tools";
  const status = document.createElement("div");
  status.className = "status";
  box.append(think, answer, tools, status);
  const calls = [];
  let content = "", reason = "";
  const body = { messages: history, stream: true, stream_options: { include_usage: true }, max_tokens: Number($("max").value) || 256 };
  const effort = $("effort").value;
  body.reasoning_effort = effort;
  if (effort === "none") think.style.display = "none";
  status.textContent = "…";
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || r.statusText);
    }
    let finish = "", usage = null;
    for await (const data of sse(r.body)) {
      if (data === "[DONE]") break;
      const j = JSON.parse(data);
      if (j.error) throw new Error(j.error.message);
      if (j.usage) usage = j.usage;
      for (const c of j.choices || []) {
        const d = c.delta || {};
        if (d.reasoning_content) { reason += d.reasoning_content; reasoning.textContent = reason; }
        if (d.content) {
          if (!content && reason) think.open = false;  // the answer started: fold the reasoning
          content += d.content; answer.textContent = content;
        }
        for (const t of d.tool_calls || []) {
          if (!calls[t.index]) calls[t.index] = { id: t.id, type: "function", function: { name: "", arguments: "" } };
          if (t.function && t.function.name) calls[t.index].function.name += t.function.name;
          if (t.function && t.function.arguments) calls[t.index].function.arguments += t.function.arguments;
          tools.textContent = calls.map((x) => x.function.name + "(" + x.function.arguments + ")").join("\n");
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      $("log").scrollTop = $("log").scrollHeight;
    }
    if (!reason) think.style.display = "none";
    const msg = { role: "assistant", content };
    if (reason) msg.reasoning_content = reason;
    if (calls.length) msg.tool_calls = calls;
    history.push(msg);
    status.textContent = "done · " + finish + (usage ? " · " + usage.completion_tokens + " tokens" : "");
    status.dataset.state = "done";
  } catch (e) {
    status.textContent = "error: " + e.message;
    status.classList.add("error");
    status.dataset.state = "error";
    history.pop();
  }
}
$("form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text) return;
  $("input").value = "";
  $("send").disabled = true;
  try { await send(text); } finally { $("send").disabled = false; $("input").focus(); }
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
</script>
</body>
</html>
)HTML";
}  // namespace

std::string_view chat_page_html() { return kPage; }

}  // namespace k3::serve
