// The clawcage web chat: one WebSocket to the gateway (protocol in docs/gateway-protocol.md).
// It shows a session's history, streams the assistant's text, shows each tool call as a card
// with its verdict, and after a reload or a dropped connection resumes from the last event it
// saw (sessions.subscribe with since), so no text is lost or repeated. The page is an operator:
// exec approval requests and channel senders waiting to be paired are shown in the sidebar with
// their buttons.
"use strict";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"), sessions: $("sessions"), messages: $("messages"), input: $("input"),
  send: $("send"), stop: $("stop"), key: $("session-key"), note: $("session-note"),
  model: $("model"), composer: $("composer"), tokenPrompt: $("token-prompt"),
  operator: $("operator"), approvals: $("approvals"), pairings: $("pairings"),
};

function randomId(bytes) {
  const data = new Uint8Array(bytes);
  crypto.getRandomValues(data);
  return Array.from(data, (b) => b.toString(16).padStart(2, "0")).join("");
}

function tokenFromHash() {
  const match = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : "";
}

const clientId = localStorage.getItem("clawcage.client") || randomId(6);
localStorage.setItem("clawcage.client", clientId);

const state = {
  token: tokenFromHash() || sessionStorage.getItem("clawcage.token") || "",
  ws: null,
  connected: false,
  nextId: 1,
  pending: new Map(),
  session: localStorage.getItem("clawcage.session") || `agent:main:webchat:${clientId}`,
  lastSeq: 0,        // the newest event of the open session already shown
  loaded: false,     // whether the open session's view is built (then a reconnect resumes it)
  skipRuns: new Set(),
  runs: new Map(),   // runId -> {bubble, text}
  tools: new Map(),  // toolCallId -> card
  busyRun: null,
  retry: 500,
};
if (state.token) sessionStorage.setItem("clawcage.token", state.token);

function setStatus(text, kind) {
  ui.status.textContent = text;
  ui.status.className = `status ${kind}`;
}

function request(method, params) {
  return new Promise((resolve, reject) => {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) {
      reject(new Error("not connected"));
      return;
    }
    const id = String(state.nextId++);
    state.pending.set(id, { resolve, reject });
    state.ws.send(JSON.stringify({ type: "req", id, method, params }));
  });
}

function connect() {
  if (!state.token) {
    ui.tokenPrompt.hidden = false;
    setStatus("no token", "disconnected");
    return;
  }
  setStatus("connecting…", "connecting");
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/ws`);
  state.ws = ws;
  ws.onmessage = (message) => {
    let frame;
    try { frame = JSON.parse(message.data); } catch { return; }
    if (frame.type === "res") {
      const waiter = state.pending.get(String(frame.id));
      if (!waiter) return;
      // `agent` answers twice; chat.send once: a request ends with its first answer here.
      state.pending.delete(String(frame.id));
      if (frame.ok) waiter.resolve(frame.payload);
      else waiter.reject(Object.assign(new Error(frame.error.message), { code: frame.error.code }));
    } else if (frame.type === "event") {
      onEvent(frame.event, frame.payload);
    }
  };
  ws.onclose = (closed) => {
    state.connected = false;
    for (const waiter of state.pending.values()) waiter.reject(new Error("disconnected"));
    state.pending.clear();
    const reason = closed.reason || "connection lost";
    setStatus("disconnected", "disconnected");
    ui.note.textContent = reason;
    if (/unauthorized/i.test(reason)) {
      ui.tokenPrompt.hidden = false;
      return;
    }
    setTimeout(connect, state.retry);
    state.retry = Math.min(state.retry * 2, 8000);
  };
}

function onEvent(name, payload) {
  switch (name) {
    case "connect.challenge":
      request("connect", {
        minProtocol: 1, maxProtocol: 1,
        client: { id: `webchat-${clientId}`, version: "1", mode: "webchat" },
        auth: { token: state.token },
        // The person at this page is an operator: exec approvals come here too.
        scopes: ["operator.approvals"],
      }).then(onHello, () => {});
      break;
    case "exec.approval.requested":
      showApproval(payload);
      break;
    case "exec.approval.resolved":
      dropApproval(payload.id);
      break;
    case "agent":
      if (payload.sessionKey === state.session) onAgentEvent(payload);
      else markSessionActive(payload.sessionKey);
      break;
    case "gap":
      if (payload.sessionKey === state.session) {
        addNote(`${payload.to - payload.from + 1} older events are no longer kept`);
        state.lastSeq = Math.max(state.lastSeq, payload.to);
      }
      break;
    case "session.deleted":
      if (payload.sessionKey === state.session) {
        clearView();
        addNote("this session was deleted");
      }
      refreshSessions();
      break;
    case "shutdown":
      ui.note.textContent = payload.reason;
      break;
    default:
      break;
  }
}

async function onHello(hello) {
  state.connected = true;
  state.retry = 500;
  ui.tokenPrompt.hidden = true;
  setStatus("connected", "connected");
  ui.note.textContent = "";
  request("status", {}).then((status) => { ui.model.textContent = status.model; }, () => {});
  refreshSessions();
  refreshOperator();
  await openSession(state.session, { resume: state.loaded });
  return hello;
}

// ---- what waits for the operator: exec approvals (events) and channel pairings (polled) ----

function updateOperatorPanel() {
  ui.operator.hidden = ui.approvals.children.length === 0 && ui.pairings.children.length === 0;
}

function showApproval(ask) {
  if (ui.approvals.querySelector(`[data-id="${CSS.escape(ask.id)}"]`)) return;
  const item = document.createElement("li");
  item.dataset.id = ask.id;
  const what = document.createElement("div");
  what.textContent =
    ask.tool === "network" ? "A web request to:"
    : ask.tool === "write" ? "A change in the read-only workspace:"
    : `${ask.tool} wants to run:`;
  const plan = document.createElement("pre");
  plan.textContent = ask.summary || ask.plan.command;
  const where = document.createElement("div");
  where.className = "where";
  where.textContent = ask.sessionKey || "";
  item.append(what, plan, where);
  for (const [label, decision] of [["Allow once", "allow-once"], ["Always", "allow-always"], ["Deny", "deny"]]) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.dataset.decision = decision;
    button.onclick = () => {
      request("exec.approval.resolve", { id: ask.id, decision })
        .then(() => dropApproval(ask.id), (error) => { addNote(error.message); dropApproval(ask.id); });
    };
    item.append(button);
  }
  ui.approvals.append(item);
  updateOperatorPanel();
}

function dropApproval(id) {
  const item = ui.approvals.querySelector(`[data-id="${CSS.escape(id)}"]`);
  if (item) item.remove();
  updateOperatorPanel();
}

async function refreshOperator() {
  try {
    const waiting = await request("exec.approval.list", {});
    for (const pending of waiting.pending) showApproval(pending);
  } catch { /* approvals are off on this gateway */ }
  await refreshPairings();
}

async function refreshPairings() {
  let listed;
  try { listed = await request("pairing.list", {}); } catch { return; }
  ui.pairings.replaceChildren(...listed.pending.map((pending) => {
    const item = document.createElement("li");
    item.dataset.code = pending.code;
    const who = document.createElement("div");
    who.textContent = `${pending.name || pending.peer} wants to talk (code ${pending.code})`;
    const where = document.createElement("div");
    where.className = "where";
    where.textContent = `${pending.channel}:${pending.peer}`;
    const approve = document.createElement("button");
    approve.type = "button";
    approve.textContent = "Approve";
    approve.onclick = () => {
      request("pairing.approve", { code: pending.code })
        .then(() => { item.remove(); updateOperatorPanel(); }, (error) => addNote(error.message));
    };
    item.append(who, where, approve);
    return item;
  }));
  updateOperatorPanel();
}

// Pairings have no event: look again every few seconds while connected.
setInterval(() => { if (state.connected) refreshPairings(); }, 3000);

async function refreshSessions() {
  let listed;
  try { listed = await request("sessions.list", { limit: 100 }); } catch { return; }
  const keys = listed.sessions.map((s) => s);
  if (!keys.some((s) => s.key === state.session)) keys.unshift({ key: state.session, writable: true });
  ui.sessions.replaceChildren(...keys.map((session) => {
    const item = document.createElement("li");
    item.textContent = session.key.replace(/^agent:main:/, "");
    item.title = session.key;
    item.dataset.key = session.key;
    if (session.key === state.session) item.classList.add("active");
    if (session.running) {
      const dot = document.createElement("span");
      dot.className = "running";
      dot.textContent = "●";
      item.append(dot);
    }
    item.onclick = () => switchSession(session.key);
    return item;
  }));
}

function markSessionActive(key) {
  const item = ui.sessions.querySelector(`li[data-key="${CSS.escape(key)}"]`);
  if (item && !item.querySelector(".running")) refreshSessions();
}

function switchSession(key) {
  if (key === state.session) return;
  request("sessions.unsubscribe", { sessionKey: state.session }).catch(() => {});
  state.session = key;
  localStorage.setItem("clawcage.session", key);
  state.loaded = false;
  openSession(key, { resume: false });
  refreshSessions();
}

function clearView() {
  ui.messages.replaceChildren();
  state.runs.clear();
  state.tools.clear();
  state.skipRuns.clear();
  setBusy(null);
}

async function openSession(key, { resume }) {
  ui.key.textContent = key;
  const writable = /^agent:[a-z0-9_-]+:[a-z0-9_-]+:[A-Za-z0-9_@+.-]+$/.test(key);
  ui.send.disabled = !writable;
  ui.input.disabled = !writable;
  if (!resume) {
    clearView();
    let history;
    try {
      history = await request("chat.history", { sessionKey: key, limit: 200 });
    } catch (error) {
      addNote(`cannot load the history: ${error.message}`);
      return;
    }
    if (key !== state.session) return;
    for (const message of history.messages) renderMessage(message);
    state.skipRuns = new Set(history.skipRuns);
    state.lastSeq = history.cursor;
    if (history.running && !state.skipRuns.has(history.running)) setBusy(history.running);
    state.loaded = true;
  }
  await subscribe(key, state.lastSeq);
}

async function subscribe(key, since) {
  let answer;
  try {
    answer = await request("sessions.subscribe", { sessionKey: key, since });
  } catch (error) {
    if (error.code === "INVALID_PARAMS" && /since/.test(error.message)) {
      state.loaded = false;
      return openSession(key, { resume: false });
    }
    addNote(`cannot follow the session: ${error.message}`);
    return undefined;
  }
  // The replayed events follow this answer; ask for the next page while they arrive.
  if (answer.more) return subscribe(key, answer.nextSince);
  return answer;
}

// ---- rendering -------------------------------------------------------------------------------

function atBottom() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function append(element) {
  const stick = atBottom();
  ui.messages.append(element);
  if (stick) ui.messages.scrollTop = ui.messages.scrollHeight;
  return element;
}

function addBubble(role, text) {
  const bubble = document.createElement("div");
  bubble.className = `msg ${role}`;
  bubble.textContent = text;
  return append(bubble);
}

function addNote(text) {
  return addBubble("note", text);
}

function toolCard(id, name, args) {
  let card = state.tools.get(id);
  if (card) return card;
  card = document.createElement("div");
  card.className = "tool-card";
  card.dataset.verdict = "running";
  card.dataset.tool = name;
  const head = document.createElement("div");
  head.className = "head";
  const nameEl = document.createElement("span");
  nameEl.className = "name";
  nameEl.textContent = name;
  const argsEl = document.createElement("span");
  argsEl.className = "args";
  argsEl.textContent = JSON.stringify(args);
  argsEl.title = JSON.stringify(args, null, 2);
  const verdict = document.createElement("span");
  verdict.className = "verdict running";
  verdict.textContent = "running";
  head.append(nameEl, argsEl, verdict);
  card.append(head);
  state.tools.set(id, card);
  return append(card);
}

function finishTool(id, verdict, label, output, chars) {
  const card = state.tools.get(id) || toolCard(id, "tool", {});
  card.dataset.verdict = verdict;
  const badge = card.querySelector(".verdict");
  badge.className = `verdict ${verdict}`;
  badge.textContent = verdict === "error" && label ? label.replace("_", " ") : verdict;
  card.querySelector("details")?.remove();
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = `output (${chars ?? output.length} characters)`;
  const pre = document.createElement("pre");
  pre.textContent = output;
  details.append(summary, pre);
  card.append(details);
}

function renderMessage(message) {
  for (const block of message.content) {
    if (block.type === "text" && block.text) {
      addBubble(message.role === "user" ? "user" : "assistant", block.text);
    } else if (block.type === "tool_use") {
      toolCard(block.id, block.name, block.input);
    } else if (block.type === "tool_result") {
      const verdict = block.verdict || (block.is_error ? "error" : "ok");
      finishTool(block.tool_use_id, verdict, block.label, block.content);
    }
  }
}

function runBubble(runId) {
  let run = state.runs.get(runId);
  if (!run) {
    run = { bubble: null, text: "" };
    state.runs.set(runId, run);
  }
  if (!run.bubble) {
    run.bubble = addBubble("assistant streaming", "");
  }
  return run;
}

function onAgentEvent(event) {
  if (event.seq <= state.lastSeq) return;
  state.lastSeq = event.seq;
  const data = event.data || {};
  const skip = state.skipRuns.has(event.runId);
  if (event.stream === "lifecycle") {
    if (data.phase === "reset") { clearView(); addNote("history cleared"); return; }
    if (data.phase === "start") {
      if (skip) return;
      addBubble("user", data.kind === "notification" ? `[${data.sender}] ${data.message}` : data.message);
      setBusy(event.runId);
    } else if (data.phase === "end" || data.phase === "error") {
      state.skipRuns.delete(event.runId);
      if (state.busyRun === event.runId) setBusy(null);
      if (skip) return;
      const run = state.runs.get(event.runId);
      if (data.phase === "end") {
        const target = run && run.bubble ? run : null;
        if (target) {
          target.bubble.classList.remove("streaming");
          // A model that did not stream still gets its answer shown.
          if (!target.text) target.bubble.textContent = data.text;
        } else if (data.text) {
          addBubble("assistant", data.text);
        }
        const usage = document.createElement("span");
        usage.className = "usage";
        usage.textContent = `${data.answeredBy} · ${data.usage.inputTokens} in / ${data.usage.outputTokens} out`;
        (target ? target.bubble : ui.messages.lastElementChild)?.append(usage);
      } else {
        if (run && run.bubble) run.bubble.classList.remove("streaming");
        addNote(data.aborted ? "stopped" : `error: ${data.message}`);
      }
      state.runs.delete(event.runId);
      refreshSessions();
    } else if (data.phase === "note" && !skip) {
      addNote(data.text);
    } else if (data.phase === "queue" && !skip) {
      // A message sent while the agent was busy: joined the running turn, or dropped.
      if (data.status === "joined") addBubble("user", data.message);
      else if (data.status === "dropped") addNote(`dropped: ${data.reason}`);
    }
  } else if (skip) {
    // Already in the history that was loaded.
  } else if (event.stream === "assistant") {
    if (data.kind === "message") { addNote(`message: ${data.content}`); return; }
    const run = runBubble(event.runId);
    run.text += data.delta;
    run.bubble.textContent = run.text;
    if (atBottom()) ui.messages.scrollTop = ui.messages.scrollHeight;
  } else if (event.stream === "tool") {
    // Text after a tool call goes into a new bubble below the card.
    const run = state.runs.get(event.runId);
    if (run && run.bubble) { run.bubble.classList.remove("streaming"); run.bubble = null; run.text = ""; }
    if (data.phase === "start") toolCard(data.toolCallId, data.name, data.args);
    else finishTool(data.toolCallId, data.verdict, data.label, data.output, data.outputChars);
  } else if (event.stream === "compaction") {
    addNote(`history compacted: ${data.summarisedMessages} older messages summarised, ${data.keptMessages} kept`);
  } else if (event.stream === "error") {
    addNote(data.kind === "retrying" ? `retrying: ${data.message}` : `failing over to ${data.to}`);
  }
}

function setBusy(runId) {
  state.busyRun = runId;
  ui.stop.disabled = !runId;
}

// ---- input -----------------------------------------------------------------------------------

ui.composer.addEventListener("submit", async (submitted) => {
  submitted.preventDefault();
  const text = ui.input.value.trim();
  if (!text || !state.connected) return;
  ui.input.value = "";
  try {
    const answer = await request("chat.send", {
      sessionKey: state.session, message: text, idempotencyKey: randomId(12),
    });
    if (answer.status === "command") addNote(answer.text);
    else if (!state.busyRun) setBusy(answer.runId);
  } catch (error) {
    ui.input.value = text;
    addNote(`not sent: ${error.message}`);
  }
});

ui.input.addEventListener("keydown", (key) => {
  if (key.key === "Enter" && !key.shiftKey) {
    key.preventDefault();
    ui.composer.requestSubmit();
  }
});

ui.stop.addEventListener("click", () => {
  request("chat.abort", { sessionKey: state.session }).catch((error) => addNote(error.message));
});

$("new-chat").addEventListener("click", () => {
  switchSession(`agent:main:webchat:${clientId}-${randomId(3)}`);
});

$("token-save").addEventListener("click", () => {
  state.token = $("token-input").value.trim();
  sessionStorage.setItem("clawcage.token", state.token);
  ui.tokenPrompt.hidden = true;
  connect();
});

connect();
