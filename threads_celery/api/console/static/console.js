// The console without this file is whole: every page renders on the server and every action is a
// form. This only makes pages live: the status counts refresh, and a run's page follows its
// thread's event stream (EventSource, authorized by the session cookie) and re-renders the part
// that changes. Model text streamed while it is written (text_delta events) is shown as text,
// never as markup.
(function () {
  "use strict";

  // Re-render a region from its URL, keeping which <details> were open; a session that ended
  // sends the browser back to sign in.
  function refresh(region, url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (response.redirected && /\/sign-in$/.test(new URL(response.url).pathname)) {
          window.location.assign(response.url);
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html === null) return;
        var open = {};
        region.querySelectorAll("details[open][data-key]").forEach(function (d) { open[d.dataset.key] = true; });
        region.innerHTML = html;
        region.querySelectorAll("details[data-key]").forEach(function (d) { if (open[d.dataset.key]) d.open = true; });
      })
      .catch(function () { /* the next event or tick tries again */ });
  }

  // A person typing in the region, or a form there they have filled in and not sent yet (the
  // answers to a waiting call): do not replace what they are editing.
  function changed(field) {
    if (field.type === "hidden") return false;
    if (field.type === "checkbox" || field.type === "radio") return field.checked !== field.defaultChecked;
    return field.value !== field.defaultValue;
  }
  function editing(region) {
    var active = document.activeElement;
    if (active && region.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return true;
    return Array.prototype.some.call(region.querySelectorAll("input, textarea"), changed);
  }

  var counts = document.querySelector("[data-refresh]");
  if (counts) {
    window.setInterval(function () { refresh(counts, counts.dataset.refresh); }, 5000);
  }

  var live = document.getElementById("live");
  if (!live || !window.EventSource) return;

  // A run that has ended changes no more: its page opens no stream.
  var ended = live.querySelector("[data-terminal]");
  if (ended && ended.dataset.terminal === "1") return;

  var runId = live.dataset.run;
  var textSection = document.getElementById("live-text-section");
  var textBox = document.getElementById("live-text");
  var parts = {}; // "step:attempt:part" -> text, for the step being written

  function showParts() {
    var keys = Object.keys(parts).sort();
    textBox.textContent = keys.map(function (k) { return parts[k]; }).join("");
    textSection.hidden = keys.length === 0;
  }
  function dropParts() { parts = {}; showParts(); }

  var timer = null;
  function schedule() {
    if (timer !== null) return;
    timer = window.setTimeout(function () {
      timer = null;
      if (editing(live)) { schedule(); return; }
      refresh(live, live.dataset.live).then(function () {
        var summary = live.querySelector("[data-terminal]");
        if (summary && summary.dataset.terminal === "1") source.close();
      });
    }, 250);
  }

  var source = new EventSource(live.dataset.events);
  // Committed events: re-render the page's live part.
  ["run", "message", "tool_call_started", "tool_call_cancelled", "pending.child", "pending.answered", "env",
   "agent_tool.started", "agent_tool.progress", "agent_tool.milestone", "agent_tool.error", "agent_tool.chunk",
   "agent_tool.completed", "agent_tool.interrupted", "model_retry", "usage.allowed", "permission.revoked"]
    .forEach(function (type) {
      source.addEventListener(type, function (e) {
        var data = JSON.parse(e.data);
        if ((type === "message" || type === "run") && data.run_id === runId) dropParts();
        schedule();
      });
    });
  source.onmessage = schedule;
  // Live deltas (the model's text while it is written): shown as text, dropped when superseded.
  source.addEventListener("text_delta", function (e) {
    var d = JSON.parse(e.data);
    if (d.run_id !== runId) return;
    var key = [d.step, d.attempt, d.part].join(":");
    parts[key] = (parts[key] || "") + d.text;
    showParts();
  });
  source.addEventListener("step_void", function (e) {
    var d = JSON.parse(e.data);
    if (d.run_id === runId) dropParts();
  });
  source.addEventListener("resync", dropParts);
})();
