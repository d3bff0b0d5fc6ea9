// The run page: draws the run's timeline from the app's Server-Sent Events stream.
// Plain EventSource (it resends Last-Event-ID when it reconnects); no framework, no build step.
(function () {
  "use strict";

  const root = document.getElementById("run");
  const runId = root.dataset.runId;
  const timeline = document.getElementById("timeline");
  const statusBadge = document.getElementById("run-status");
  const connection = document.getElementById("connection");
  const approvals = document.getElementById("approvals");
  const approvalList = document.getElementById("approval-list");
  const calls = new Map();     // tool call id -> its <li>
  const children = new Map();  // agent-tool run id -> {card, bar, label, milestones, log, status}

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function add(node) {
    timeline.appendChild(node);
    return node;
  }

  function argsText(args) {
    if (typeof args === "string") return args;
    try { return JSON.stringify(args); } catch (e) { return String(args); }
  }

  // -- calls and messages ----------------------------------------------------------------------

  function callItem(id, name) {
    let item = calls.get(id);
    if (!item) {
      item = add(el("li", "entry call"));
      item.dataset.callId = id;
      item.appendChild(el("span", "who", "Tool"));
      item.appendChild(el("code", "call-name", name));
      item.appendChild(el("code", "call-args", ""));
      item.appendChild(el("span", "badge call-status", "started"));
      item.appendChild(el("div", "call-result text"));
      calls.set(id, item);
    }
    return item;
  }

  function onMessage(p) {
    if (p.role === "user") {
      const item = add(el("li", "entry user"));
      item.appendChild(el("span", "who", "You"));
      item.appendChild(el("div", "text", p.text));
    } else if (p.role === "assistant") {
      if (p.text) {
        const item = el("li", "entry assistant");
        item.appendChild(el("span", "who", "Agent"));
        item.appendChild(el("div", "text", p.text));
        // Streaming announces a call (tool_call_started) before the reply that makes it is
        // committed: keep the reply's text above its calls.
        const first = (p.tool_calls || []).map((c) => calls.get(c.id)).find(Boolean);
        if (first) timeline.insertBefore(item, first); else add(item);
      }
      for (const call of p.tool_calls || []) {
        const item = callItem(call.id, call.name);
        item.querySelector(".call-args").textContent = argsText(call.args);
        item.dataset.effectKey = call.effect_key;
    item.dataset.status = call.status;
      }
    } else if (p.role === "tool" && p.tool_result) {
      const r = p.tool_result;
      const item = callItem(r.call_id, r.name);
      item.querySelector(".call-result").textContent = r.content;
      const badge = item.querySelector(".call-status");
      badge.textContent = r.is_error ? "error" : "done";
      badge.className = "badge call-status " + (r.is_error ? "status-error" : "status-completed");
    }
  }

  // -- child agent-tool runs -------------------------------------------------------------------

  // The call that started a child: agent-tool run ids derive from the call's effect key.
  function parentCall(childId) {
    let best = null;
    for (const item of calls.values()) {
      const key = item.dataset.effectKey;
      if (key && childId.startsWith("agent-tool:" + key) && (!best || key.length > best.dataset.effectKey.length)) best = item;
    }
    return best;
  }

  function child(id, p) {
    let c = children.get(id);
    if (!c) {
      const parent = parentCall(id);
      const card = el(parent ? "div" : "li", "entry child");
      if (parent) parent.appendChild(card); else add(card);
      card.dataset.childRunId = id;
      const head = el("div", "child-head");
      head.appendChild(el("span", "who", "Child run"));
      head.appendChild(el("strong", "child-name", (p && (p.display || p.agent_type)) || id));
      const status = head.appendChild(el("span", "badge child-status status-running", "running"));
      card.appendChild(head);
      if (p && p.input_preview) card.appendChild(el("div", "muted", p.input_preview));
      const bar = el("progress", "child-progress");
      bar.max = 1;
      bar.removeAttribute("value"); // indeterminate until the first report
      card.appendChild(bar);
      const label = card.appendChild(el("span", "child-progress-label muted", ""));
      const milestones = card.appendChild(el("ul", "milestones"));
      const log = card.appendChild(el("ol", "child-log"));
      const summary = card.appendChild(el("div", "child-summary text"));
      c = { card, bar, label, milestones, log, status, summary };
      children.set(id, c);
    }
    return c;
  }

  function setChildStatus(c, status, cls) {
    c.status.textContent = status;
    c.status.className = "badge child-status status-" + cls;
  }

  function onChildProgress(p) {
    const c = child(p.run_id);
    if (typeof p.fraction === "number") {
      c.bar.value = Math.max(0, Math.min(1, p.fraction));
      c.card.dataset.fraction = String(c.bar.value);
    }
    const parts = [];
    if (typeof p.fraction === "number") parts.push(Math.round(p.fraction * 100) + "%");
    if (p.phase) parts.push(p.phase);
    if (p.message) parts.push(p.message);
    c.label.textContent = parts.join(" · ");
  }

  function onChildMilestone(p) {
    const c = child(p.run_id);
    const item = c.milestones.appendChild(el("li", "milestone", "◆ " + p.name));
    item.dataset.name = p.name;
    if (p.data !== undefined && p.data !== null) item.appendChild(el("code", "muted", " " + argsText(p.data)));
  }

  function onChildChunk(p) {
    const c = child(p.run_id);
    const body = p.body || {};
    let line = body.text || "";
    if (body.role === "tool") {
      line = (body.is_error ? "✗ " : "← ") + (body.name || "tool") + ": " + line;
    } else if (body.tool_calls && body.tool_calls.length) {
      const names = body.tool_calls.map((t) => (typeof t === "string" ? t : t.name));
      line += (line ? " " : "") + "→ " + names.join(", ");
    }
    if (line) c.log.appendChild(el("li", "", line));
  }

  function onChildEnd(type, p) {
    const c = child(p.run_id);
    if (type === "agent_tool.finished") {
      setChildStatus(c, "completed", "completed");
      c.bar.value = 1;
      c.card.dataset.fraction = "1";
      c.summary.textContent = p.summary || "";
    } else {
      const status = type.split(".")[1];
      setChildStatus(c, status, "error");
      c.summary.textContent = p.error || p.reason || status;
      if (p.reason) c.summary.textContent += " (" + p.reason + ")";
    }
  }

  // -- the run ---------------------------------------------------------------------------------

  function onRun(p) {
    if (!p.status) return;
    statusBadge.textContent = p.status;
    statusBadge.className = "badge status-" + p.status;
    if (p.status === "completed") {
      document.getElementById("final").hidden = false;
      document.getElementById("final-answer").textContent = p.output || "";
    } else if (["error", "aborted", "interrupted"].includes(p.status)) {
      document.getElementById("failure").hidden = false;
      document.getElementById("failure-text").textContent = p.error || p.status;
    }
    refreshPending();
    refreshUsage();
  }

  async function refreshUsage() {
    try {
      const response = await fetch("/runs/" + encodeURIComponent(runId) + "/usage");
      if (response.ok) document.getElementById("run-usage").textContent = (await response.json()).text;
    } catch (e) { /* the next status change tries again */ }
  }

  let pendingTimer = null;
  function refreshPending() {
    // Debounced: a replay brings many status changes at once.
    clearTimeout(pendingTimer);
    pendingTimer = setTimeout(loadPending, 50);
  }

  async function loadPending() {
    const response = await fetch("/runs/" + encodeURIComponent(runId) + "/pending", { headers: { Accept: "application/json" } });
    if (!response.ok) return;
    const pending = await response.json();
    // Keyed by call: an entry whose call and status are unchanged is kept as it is, so a reload
    // never swaps a button out from under a person about to press it.
    const kept = new Map();
    for (const item of approvalList.children) kept.set(item.dataset.effectKey + " " + item.dataset.status, item);
    const items = pending.map((call) => kept.get(call.effect_key + " " + call.status) || pendingItem(call));
    const wanted = new Set(items);
    for (const item of [...approvalList.children]) if (!wanted.has(item)) item.remove();
    items.forEach((item, index) => {
      if (approvalList.children[index] !== item) approvalList.insertBefore(item, approvalList.children[index] || null);
    });
    approvals.hidden = pending.length === 0;
  }

  function pendingItem(call) {
    const item = el("div", "pending");
    item.dataset.effectKey = call.effect_key;
    item.dataset.status = call.status;
    item.appendChild(el("code", "call-name", call.tool));
    item.appendChild(el("code", "call-args", " " + call.args));
    if (call.kind === "child") item.appendChild(el("div", "muted", "in child run of " + (call.agent || "a child agent")));
    item.appendChild(el("div", "muted", call.reason));
    if (call.status !== "awaiting_approval") return item; // parked: resolve it with the CLI or the API
    const key = encodeURIComponent(call.effect_key);
    item.appendChild(decisionForm("/calls/" + key + "/approve", "Approve", "approve"));
    const always = decisionForm("/calls/" + key + "/approve", "Always allow " + call.tool + " here", "always");
    const remember = el("input");
    remember.type = "hidden";
    remember.name = "remember";
    remember.value = "1";
    always.appendChild(remember);
    item.appendChild(always);
    item.appendChild(decisionForm("/calls/" + key + "/deny", "Deny", "deny"));
    return item;
  }

  function decisionForm(action, label, cls) {
    const form = el("form", "decision");
    form.method = "post";
    form.action = action;
    const hidden = el("input");
    hidden.type = "hidden";
    hidden.name = "run_id";
    hidden.value = runId;
    form.appendChild(hidden);
    const button = el("button", "button-" + cls, label);
    button.type = "submit";
    form.appendChild(button);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      button.disabled = true;
      const response = await fetch(action, {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams(new FormData(form)),
      });
      if (!response.ok) button.disabled = false;
      loadPending();
    });
    return form;
  }

  // -- the stream ------------------------------------------------------------------------------

  const handlers = {
    "run": onRun,
    "message": onMessage,
    "tool_call_started": (p) => { callItem(p.call_id, p.name).dataset.effectKey = p.effect_key; },
    "agent_tool.started": (p) => child(p.run_id, p),
    "agent_tool.progress": onChildProgress,
    "agent_tool.milestone": onChildMilestone,
    "agent_tool.chunk": onChildChunk,
    "agent_tool.finished": (p) => onChildEnd("agent_tool.finished", p),
    "agent_tool.error": (p) => onChildEnd("agent_tool.error", p),
    "agent_tool.aborted": (p) => onChildEnd("agent_tool.aborted", p),
    "agent_tool.interrupted": (p) => onChildEnd("agent_tool.interrupted", p),
    // A child run's call waits for a person (or was answered): reload the pending list.
    "pending.child": refreshPending,
    "pending.answered": refreshPending,
  };

  const source = new EventSource("/runs/" + encodeURIComponent(runId) + "/events");
  source.onopen = () => { connection.textContent = "live"; };
  source.onerror = () => { connection.textContent = "reconnecting…"; };
  for (const [type, handle] of Object.entries(handlers)) {
    source.addEventListener(type, (event) => {
      const data = JSON.parse(event.data);
      root.dataset.lastSeq = String(data.seq);
      handle(data.payload || {});
    });
  }
  refreshPending();
})();
