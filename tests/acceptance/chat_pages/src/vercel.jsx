// A chat page built on the AI SDK's useChat, unchanged, against /v1/chat/vercel-ai/{agent}.
// ?token=...&agent=...&chat=... ; the chat's history is loaded first; window.chatLog records what
// each render showed, for the test.
import React, { useState } from "react";
import { createRoot } from "react-dom/client";
import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from "ai";

const params = new URLSearchParams(location.search);
const token = params.get("token");
const agent = params.get("agent");
const chatId = params.get("chat");
const log = (window.chatLog = { renders: 0, texts: [], toolStates: {}, errors: [] });

function record(messages) {
  log.renders += 1;
  for (const message of messages) {
    if (message.role !== "assistant") continue;
    const text = message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
    if (text && log.texts[log.texts.length - 1] !== text) log.texts.push(text);
    for (const part of message.parts) {
      if (!part.type.startsWith("tool-")) continue;
      const states = (log.toolStates[part.toolCallId] ||= []);
      if (states[states.length - 1] !== part.state) states.push(part.state);
    }
  }
}

function ToolPart({ part, answer }) {
  const name = part.type.slice("tool-".length);
  return (
    <div className="tool" data-tool={name} data-state={part.state} data-call={part.toolCallId}>
      {name}: {part.state}
      {part.state === "approval-requested" && (
        <>
          <button className="approve" onClick={() => answer({ id: part.approval.id, approved: true })}>Approve</button>
          <button className="deny" onClick={() => answer({ id: part.approval.id, approved: false, reason: "no" })}>Deny</button>
        </>
      )}
      {part.state === "output-available" && <span className="output">{String(part.output)}</span>}
    </div>
  );
}

function Chat({ history }) {
  const [input, setInput] = useState("");
  const { messages, sendMessage, regenerate, addToolApprovalResponse, status, error } = useChat({
    id: chatId,
    messages: history,
    resume: true,
    transport: new DefaultChatTransport({
      api: `/v1/chat/vercel-ai/${agent}`,
      headers: { Authorization: `Bearer ${token}` },
    }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (e) => log.errors.push(String(e)),
  });
  record(messages);
  return (
    <div>
      <div id="status">{status}</div>
      {error && <div id="error">{String(error)}</div>}
      <ul id="messages">
        {messages.map((m) => (
          <li key={m.id} className={`message ${m.role}`} data-id={m.id}>
            {m.role === "user" && (
              <button className="edit" onClick={() => { sendMessage({ text: input, messageId: m.id }); setInput(""); }}>
                Edit
              </button>
            )}
            {m.parts.map((part, i) =>
              part.type === "text" ? (
                <span key={i} className="text">{part.text}</span>
              ) : part.type.startsWith("tool-") ? (
                <ToolPart key={i} part={part} answer={addToolApprovalResponse} />
              ) : null,
            )}
          </li>
        ))}
      </ul>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          sendMessage({ text: input });
          setInput("");
        }}
      >
        <input id="input" value={input} onChange={(e) => setInput(e.target.value)} />
        <button id="send" type="submit">Send</button>
      </form>
      <button id="regenerate" onClick={() => regenerate()}>Regenerate</button>
    </div>
  );
}

// The chat's history first (a reload shows the conversation), then useChat resumes the reply in progress.
fetch(`/v1/chat/vercel-ai/${agent}/${chatId}/messages`, { headers: { Authorization: `Bearer ${token}` } })
  .then((response) => response.json())
  .then((history) => createRoot(document.getElementById("root")).render(<Chat history={history} />));
