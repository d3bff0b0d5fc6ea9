// A chat page built on @ag-ui/client's HttpAgent against /v1/chat/ag-ui/{agent}.
// ?token=...&agent=...&thread=...[&attach=1] ; window.chatLog records what each render showed.
import { HttpAgent, randomUUID } from "@ag-ui/client";

const params = new URLSearchParams(location.search);
const log = (window.chatLog = { renders: 0, texts: [], toolStates: {}, toolStarts: [], outcomes: [], errors: [] });
const agent = new HttpAgent({
  url: `/v1/chat/ag-ui/${params.get("agent")}`,
  headers: { Authorization: `Bearer ${params.get("token")}` },
  threadId: params.get("thread"),
});
const list = document.getElementById("messages");
const approvals = document.getElementById("approvals");

function render(messages) {
  log.renders += 1;
  const results = new Set(messages.filter((m) => m.role === "tool").map((m) => m.toolCallId));
  const text = messages.filter((m) => m.role === "assistant").map((m) => m.content || "").join("");
  if (text && log.texts[log.texts.length - 1] !== text) log.texts.push(text);
  list.replaceChildren(
    ...messages.map((m) => {
      const li = document.createElement("li");
      li.className = `message ${m.role}`;
      if (m.content) {
        const span = document.createElement("span");
        span.className = "text";
        span.textContent = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
        li.append(span);
      }
      for (const call of m.toolCalls || []) {
        const state = results.has(call.id) ? "result" : "started";
        const states = (log.toolStates[call.id] ||= []);
        if (states[states.length - 1] !== state) states.push(state);
        const div = document.createElement("div");
        div.className = "tool";
        div.dataset.tool = call.function.name;
        div.dataset.state = state;
        div.textContent = `${call.function.name}: ${state}`;
        li.append(div);
      }
      return li;
    }),
  );
}

function showInterrupts() {
  approvals.replaceChildren(
    ...agent.pendingInterrupts.map((interrupt) => {
      const button = document.createElement("button");
      button.className = "approve";
      button.textContent = `Approve ${interrupt.message}`;
      button.onclick = () => {
        approvals.replaceChildren();
        const payload = { approved: true };
        run({ resume: [{ interruptId: interrupt.id, status: "resolved", payload }] });
      };
      return button;
    }),
  );
}

agent.subscribe({
  onMessagesChanged: ({ messages }) => render(messages),
  onToolCallStartEvent: ({ event }) => {
    log.toolStarts.push(event.toolCallName);
  },
  onRunFinishedEvent: ({ outcome }) => {
    log.outcomes.push(outcome);
  },
});

async function run(options) {
  document.getElementById("status").textContent = "running";
  try {
    await agent.runAgent(options);
  } catch (e) {
    log.errors.push(String(e));
  }
  showInterrupts();
  document.getElementById("status").textContent = "ready";
}

document.getElementById("form").onsubmit = (e) => {
  e.preventDefault();
  const input = document.getElementById("input");
  agent.addMessage({ id: randomUUID(), role: "user", content: input.value });
  input.value = "";
  run();
};

render(agent.messages);

// After a reload: attach to the thread's run in progress (a request with no new message).
if (params.get("attach")) run();
