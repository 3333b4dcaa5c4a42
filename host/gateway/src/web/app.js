// The clawcage web chat: one WebSocket to the gateway (protocol in docs/gateway-protocol.md).
// It shows a session's history, streams the assistant's reply rendered from Markdown (by the
// vendored markdown-it, raw HTML off, then DOMPurify with a short allow-list: a reply is
// untrusted text), shows each tool call as a card with its verdict and, when the call waits for
// a person, the approval question with its buttons on that card; the model's reasoning is
// folded apart from its answer. After a reload or a dropped connection it resumes from the last
// event it saw (sessions.subscribe with since), so no text is lost or repeated. The page is an operator: other sessions' approval requests and channel
// senders waiting to be paired are listed in the sidebar. Below 720 px the sidebar is a drawer.
"use strict";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"), sessions: $("sessions"), messages: $("messages"), input: $("input"),
  send: $("send"), stop: $("stop"), title: $("session-title"), key: $("session-key"),
  note: $("session-note"), rename: $("rename"), model: $("model"), composer: $("composer"),
  tokenPrompt: $("token-prompt"), tokenInput: $("token-input"), tokenError: $("token-error"),
  operator: $("operator"), approvals: $("approvals"), pairings: $("pairings"),
  menu: $("menu"), backdrop: $("backdrop"), jump: $("jump"),
};

function randomId(bytes) {
  const data = new Uint8Array(bytes);
  crypto.getRandomValues(data);
  return Array.from(data, (b) => b.toString(16).padStart(2, "0")).join("");
}

// The token comes in the address's fragment (never sent to the server); it is kept for this tab
// only (sessionStorage) and taken out of the address bar at once, so it is not left on screen,
// in a bookmark or in a screenshot.
function tokenFromHash() {
  const match = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (!match) return "";
  history.replaceState(null, "", location.pathname + location.search);
  try { return decodeURIComponent(match[1]); } catch { return ""; }
}

function readJson(storage, name, fallback) {
  try { return JSON.parse(storage.getItem(name)) ?? fallback; } catch { return fallback; }
}

const clientId = localStorage.getItem("clawcage.client") || randomId(6);
localStorage.setItem("clawcage.client", clientId);

const state = {
  token: tokenFromHash() || sessionStorage.getItem("clawcage.token") || "",
  ws: null,
  connected: false,
  nextId: 1,
  pending: new Map(),
  methods: new Set(), // what this gateway serves (hello-ok features)
  session: localStorage.getItem("clawcage.session") || newSessionKey(),
  // A session this page made up and sent nothing to yet: it exists only here, the gateway
  // hears of it with its first message.
  draft: false,
  listed: [],        // sessions.list, as last read
  titles: readJson(localStorage, "clawcage.titles", {}), // key -> first message seen here
  lastSeq: 0,        // the newest event of the open session already shown
  loaded: false,     // whether the open session's view is built (then a reconnect resumes it)
  skipRuns: new Set(),
  runs: new Map(),   // runId -> {bubble, text, timer}
  tools: new Map(),  // toolCallId -> card
  approvals: new Map(), // approval id -> the request, while it waits
  busyRun: null,
  follow: true,      // new output keeps the view at the bottom unless the person scrolled up
  thinking: null,    // {element, since, timer, label} while the model works before its output
  retry: 500,
};
if (state.token) sessionStorage.setItem("clawcage.token", state.token);
localStorage.setItem("clawcage.session", state.session);

function newSessionKey() {
  return `agent:main:webchat:${clientId}-${randomId(3)}`;
}

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

function askForToken(error) {
  ui.tokenPrompt.hidden = false;
  ui.tokenError.hidden = !error;
  ui.tokenError.textContent = error || "";
  ui.tokenInput.focus();
}

function connect() {
  if (!state.token) {
    askForToken("");
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
    hideThinking();
    const reason = closed.reason || "connection lost";
    setStatus("disconnected", "disconnected");
    ui.note.textContent = reason;
    if (/unauthorized/i.test(reason)) {
      sessionStorage.removeItem("clawcage.token");
      askForToken(/wrong token/i.test(reason)
        ? "Wrong token: the gateway refused it. Paste the token it printed."
        : reason);
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
      state.approvals.set(payload.id, payload);
      placeApprovals();
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
  state.methods = new Set(hello?.features?.methods || []);
  ui.tokenPrompt.hidden = true;
  ui.tokenError.hidden = true;
  sessionStorage.setItem("clawcage.token", state.token);
  ui.note.textContent = "";
  request("status", {}).then((status) => { ui.model.textContent = status.model; }, () => {});
  await refreshSessions();
  if (!state.loaded && !state.listed.some((session) => session.key === state.session)) {
    // Nothing of it on the gateway: show an empty chat and make nothing until a message is sent.
    state.draft = true;
  }
  showSessionHeader();
  drawSessions();
  setStatus("connected", "connected");
  if (!state.draft) await openSession(state.session, { resume: state.loaded });
  await refreshOperator();
  return hello;
}

// ---- Markdown --------------------------------------------------------------------------------

// markdown-it with raw HTML off (it is shown as text) and its link check (no javascript:,
// vbscript:, file: or data: links); images off (a reply must not make the browser fetch). Its
// HTML then passes DOMPurify, which keeps only the tags and attributes below and links to
// http(s) and mailto: whatever a future markdown-it lets through, the page gets no script, no
// event handler, no style and no other URL.
const markdown = window.markdownit({ html: false, linkify: true, breaks: true, typographer: false });
markdown.disable(["image"]);
// Only addresses with a scheme become links: file names such as main.rs or setup.py stay text.
markdown.linkify.set({ fuzzyLink: false, fuzzyEmail: false });
const MARKDOWN_TAGS = [
  "p", "br", "strong", "em", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li",
  "h1", "h2", "h3", "h4", "h5", "h6", "hr", "table", "thead", "tbody", "tr", "th", "td", "a",
];
const MARKDOWN_ATTRIBUTES = ["href", "title", "class", "start"];
DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  // A class only names a code block's language (for its label).
  if (data.attrName === "class" && !(node.nodeName === "CODE" && /^language-[\w+#.-]{1,40}$/.test(data.attrValue))) {
    data.keepAttr = false;
  }
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

function renderMarkdown(text) {
  return sanitizeHtml(markdown.render(text));
}

// HTML made from a reply, as nodes the page may show: only the allowed tags and attributes,
// links to http(s) and mailto only; code blocks and tables wrapped to scroll sideways.
function sanitizeHtml(html) {
  const fragment = DOMPurify.sanitize(html, {
    ALLOWED_TAGS: MARKDOWN_TAGS,
    ALLOWED_ATTR: MARKDOWN_ATTRIBUTES,
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  });
  for (const pre of fragment.querySelectorAll("pre")) decorateCodeBlock(pre);
  for (const table of fragment.querySelectorAll("table")) {
    const scroller = document.createElement("div");
    scroller.className = "table-scroll";
    table.replaceWith(scroller);
    scroller.append(table);
  }
  return fragment;
}

// A code block: monospace, scrolls sideways, with its language and a copy button above it.
function decorateCodeBlock(pre) {
  const code = pre.querySelector("code");
  const block = document.createElement("div");
  block.className = "code-block";
  const bar = document.createElement("div");
  bar.className = "code-bar";
  const language = document.createElement("span");
  language.className = "language";
  const named = code && /^language-(.+)$/.exec(code.className);
  language.textContent = named ? named[1] : "";
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "Copy";
  copy.onclick = () => copyText((code || pre).textContent.replace(/\n$/, ""), copy);
  bar.append(language, copy);
  pre.replaceWith(block);
  block.append(bar, pre);
}

async function copyText(text, button) {
  let copied = false;
  try {
    await navigator.clipboard.writeText(text);
    copied = true;
  } catch {
    // No clipboard permission (an insecure origin, a headless browser): copy through a selection.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    try { copied = document.execCommand("copy"); } catch { copied = false; }
    area.remove();
  }
  button.textContent = copied ? "Copied" : "Select and copy";
  button.dataset.copied = copied ? "yes" : "no";
  setTimeout(() => { button.textContent = "Copy"; }, 2000);
}

// ---- what waits for the operator: exec approvals (events) and channel pairings (polled) ----

function updateOperatorPanel() {
  const waiting = ui.approvals.children.length + ui.pairings.children.length;
  ui.operator.hidden = waiting === 0;
  ui.menu.classList.toggle("attention", waiting > 0);
  ui.menu.dataset.waiting = waiting ? String(waiting) : "";
}

function approvalHeadline(ask) {
  return ask.tool === "network" ? "A web request to:"
    : ask.tool === "write" ? "A change in the read-only workspace:"
    : `${ask.tool} wants to run:`;
}

function decisionButtons(ask) {
  return [["Allow once", "allow-once"], ["Always", "allow-always"], ["Deny", "deny"]].map(([label, decision]) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.dataset.decision = decision;
    button.className = `decide ${decision}`;
    button.onclick = () => {
      for (const other of button.parentElement.querySelectorAll("button")) other.disabled = true;
      request("exec.approval.resolve", { id: ask.id, decision })
        .then(() => dropApproval(ask.id), (error) => { addNote(error.message); dropApproval(ask.id); });
    };
    return button;
  });
}

// The tool card a request belongs to: the running one of its toolCallId, or (when the gateway
// does not say) the newest running card of its session that fits the kind of request. A request
// may arrive before its call's start event (they travel apart): it waits in the sidebar until
// the card is there, never on a finished card of an earlier call with the same id.
function cardForApproval(ask) {
  if (ask.sessionKey !== state.session) return null;
  if (ask.toolCallId) {
    const card = state.tools.get(ask.toolCallId);
    const running = card && (card.dataset.verdict === "running" || card.dataset.verdict === "waiting");
    return running ? card : null;
  }
  const free = [...state.tools.values()].reverse()
    .filter((card) => card.dataset.verdict === "running" && !card.querySelector(".approval"));
  const fits = (name) => ask.tool === "exec" ? name === "exec"
    : ask.tool === "network" ? /^web_/.test(name)
    : ask.tool === "write" ? /write|edit/.test(name)
    : false;
  return free.find((card) => fits(card.dataset.tool)) || free[0] || null;
}

function placeApprovals() {
  for (const ask of state.approvals.values()) {
    const shown = document.querySelector(`[data-approval="${CSS.escape(ask.id)}"]`);
    if (shown && shown.closest(".tool-card")) continue;
    const card = cardForApproval(ask);
    if (card) {
      shown?.remove();
      showApprovalOnCard(card, ask);
    } else if (!shown) {
      showApprovalInSidebar(ask);
    }
  }
  updateOperatorPanel();
}

function showApprovalOnCard(card, ask) {
  const box = document.createElement("div");
  box.className = "approval";
  box.dataset.approval = ask.id;
  const question = document.createElement("div");
  question.className = "question";
  question.textContent = "Waiting for your approval";
  const what = document.createElement("div");
  what.textContent = approvalHeadline(ask);
  const plan = document.createElement("pre");
  plan.textContent = ask.summary || ask.plan.command;
  const buttons = document.createElement("div");
  buttons.className = "decisions";
  buttons.append(...decisionButtons(ask));
  box.append(question, what, plan);
  if (ask.reasons && ask.reasons.length) {
    const reasons = document.createElement("div");
    reasons.className = "reasons";
    reasons.textContent = ask.reasons.join("\n");
    box.append(reasons);
  }
  box.append(buttons);
  card.dataset.verdict = "waiting";
  const badge = card.querySelector(".verdict");
  badge.className = "verdict waiting";
  badge.textContent = "waiting for you";
  card.querySelector(".head").after(box);
  hideThinking();
  followOutput();
}

function showApprovalInSidebar(ask) {
  const item = document.createElement("li");
  item.dataset.approval = ask.id;
  const what = document.createElement("div");
  what.textContent = approvalHeadline(ask);
  const plan = document.createElement("pre");
  plan.textContent = ask.summary || ask.plan.command;
  const where = document.createElement("button");
  where.type = "button";
  where.className = "where";
  where.textContent = sessionTitle(ask.sessionKey || "");
  where.title = ask.sessionKey || "";
  if (ask.sessionKey) where.onclick = () => switchSession(ask.sessionKey);
  item.append(what, plan, where, ...decisionButtons(ask));
  ui.approvals.append(item);
  // A session this page has not listed yet: list again for its title.
  if (ask.sessionKey && !state.listed.some((session) => session.key === ask.sessionKey)) refreshSessions();
}

function dropApproval(id) {
  state.approvals.delete(id);
  for (const shown of document.querySelectorAll(`[data-approval="${CSS.escape(id)}"]`)) {
    const card = shown.closest(".tool-card");
    shown.remove();
    if (card && card.dataset.verdict === "waiting") {
      card.dataset.verdict = "running";
      const badge = card.querySelector(".verdict");
      badge.className = "verdict running";
      badge.textContent = "running";
    }
  }
  updateOperatorPanel();
}

async function refreshOperator() {
  try {
    const waiting = await request("exec.approval.list", {});
    for (const pending of waiting.pending) state.approvals.set(pending.id, pending);
    placeApprovals();
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

// ---- sessions --------------------------------------------------------------------------------

function rememberTitle(key, text) {
  if (state.titles[key] || !text) return;
  state.titles[key] = firstLine(text);
  const keys = Object.keys(state.titles);
  // Kept for the newest 200 sessions only.
  for (const old of keys.slice(0, Math.max(0, keys.length - 200))) delete state.titles[old];
  localStorage.setItem("clawcage.titles", JSON.stringify(state.titles));
}

function firstLine(text) {
  const line = text.trim().split("\n")[0].trim();
  return line.length > 80 ? `${line.slice(0, 79)}…` : line;
}

// What a person reads for a session: the name given to it, its first message, or its key's
// readable part.
function sessionTitle(key) {
  const listed = state.listed.find((session) => session.key === key);
  if (listed && listed.title) return listed.title;
  if (state.titles[key]) return state.titles[key];
  if (key === state.session && state.draft) return "New chat";
  const parts = key.split(":");
  if (parts.length >= 4 && parts[0] === "agent") {
    const channel = parts[2];
    const peer = parts.slice(3).join(":");
    return channel === "webchat" ? "Untitled chat" : `${channel} · ${peer}`;
  }
  // `clawcage run` names its sessions run-<ms>-<pid>; `clawcage chat` takes a name.
  if (/^run-\d+-\d+$/.test(key)) return "clawcage run";
  return key;
}

function ago(ms) {
  if (!ms) return "";
  const seconds = Math.max(0, (Date.now() - ms) / 1000);
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  if (seconds < 2 * 86400) return "yesterday";
  return new Date(ms).toLocaleDateString();
}

async function refreshSessions() {
  let listed;
  try { listed = await request("sessions.list", { limit: 100 }); } catch { return; }
  // A session with nothing in it (the gateway says how many messages it has) is not listed.
  state.listed = listed.sessions.filter((session) =>
    session.messages !== 0 || session.running || session.queued || session.key === state.session);
  drawSessions();
}

function drawSessions() {
  const shown = state.listed.slice();
  if (!shown.some((session) => session.key === state.session)) {
    shown.unshift({ key: state.session, writable: true, draft: state.draft });
  }
  ui.sessions.replaceChildren(...shown.map((session) => {
    const item = document.createElement("li");
    item.title = session.key;
    item.dataset.key = session.key;
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = sessionTitle(session.key);
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.textContent = session.draft ? "not sent yet" : ago(session.lastActivityMs || session.updatedAt);
    if (session.running) {
      const dot = document.createElement("span");
      dot.className = "running";
      dot.textContent = " ● working";
      meta.append(dot);
    }
    item.append(title, meta);
    if (session.key === state.session) item.classList.add("active");
    item.onclick = () => { switchSession(session.key); closeDrawer(); };
    return item;
  }));
  for (const where of ui.approvals.querySelectorAll("button.where")) where.textContent = sessionTitle(where.title);
  showSessionHeader();
}

function showSessionHeader() {
  ui.title.textContent = sessionTitle(state.session);
  ui.key.textContent = state.session;
  ui.rename.hidden = !state.methods.has("sessions.rename") || state.draft;
  document.title = state.draft ? "clawcage" : `${sessionTitle(state.session)} · clawcage`;
}

function markSessionActive(key) {
  const item = ui.sessions.querySelector(`li[data-key="${CSS.escape(key)}"]`);
  if (!item || !item.querySelector(".running")) refreshSessions();
}

function switchSession(key, { draft = false } = {}) {
  if (key === state.session && !draft) return;
  if (!state.draft) request("sessions.unsubscribe", { sessionKey: state.session }).catch(() => {});
  state.session = key;
  state.draft = draft;
  localStorage.setItem("clawcage.session", key);
  state.loaded = false;
  state.lastSeq = 0;
  clearView();
  drawSessions();
  if (!draft) openSession(key, { resume: false });
  ui.input.focus();
}

function clearView() {
  ui.messages.replaceChildren();
  state.runs.clear();
  state.tools.clear();
  state.skipRuns.clear();
  hideThinking();
  setBusy(null);
  state.follow = true;
  ui.jump.hidden = true;
}

async function openSession(key, { resume }) {
  showSessionHeader();
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
    renderHistory(history);
    state.skipRuns = new Set(history.skipRuns);
    state.lastSeq = history.cursor;
    if (history.running && !state.skipRuns.has(history.running)) {
      setBusy(history.running);
      showThinking("working");
    }
    state.loaded = true;
    placeApprovals();
    scrollToBottom();
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

ui.rename.addEventListener("click", async () => {
  const field = document.createElement("input");
  field.className = "rename-field";
  field.value = ui.title.textContent;
  field.maxLength = 200;
  ui.title.replaceChildren(field);
  field.focus();
  field.select();
  const done = async (save) => {
    field.onblur = null;
    if (save) {
      try {
        const renamed = await request("sessions.rename", { sessionKey: state.session, title: field.value.trim() });
        const listed = state.listed.find((session) => session.key === state.session);
        if (listed) listed.title = renamed.title;
      } catch (error) { addNote(`not renamed: ${error.message}`); }
    }
    drawSessions();
  };
  field.onkeydown = (key) => {
    if (key.key === "Enter") { key.preventDefault(); done(true); }
    if (key.key === "Escape") done(false);
  };
  field.onblur = () => done(true);
});

// ---- rendering -------------------------------------------------------------------------------

function atBottom() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 60;
}

function scrollToBottom() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
  state.follow = true;
  ui.jump.hidden = true;
}

// After new output: stay at the bottom when following, else offer a way down.
function followOutput() {
  if (state.follow) ui.messages.scrollTop = ui.messages.scrollHeight;
  else ui.jump.hidden = false;
}

// Only a scroll the person makes changes whether the view follows: content growing under a
// view at the bottom fires no scroll event, and the page's own scrolls land at the bottom.
ui.messages.addEventListener("scroll", () => {
  state.follow = atBottom();
  if (state.follow) ui.jump.hidden = true;
});
ui.jump.addEventListener("click", scrollToBottom);

function append(element) {
  // The thinking indicator stays last.
  const thinking = state.thinking && state.thinking.element;
  if (thinking && thinking.parentElement === ui.messages) ui.messages.insertBefore(element, thinking);
  else ui.messages.append(element);
  followOutput();
  return element;
}

function addBubble(role, text) {
  const bubble = document.createElement("div");
  bubble.className = `msg ${role}`;
  if (role.startsWith("assistant")) {
    const body = document.createElement("div");
    body.className = "body";
    body.append(renderMarkdown(text));
    bubble.append(body);
  } else {
    bubble.textContent = text;
  }
  return append(bubble);
}

function addNote(text) {
  return addBubble("note", text);
}

function addUsage(bubble, answeredBy, usage) {
  if (!usage) return;
  const line = document.createElement("span");
  line.className = "usage";
  line.textContent = `${answeredBy || "model"} · ${usage.inputTokens} in / ${usage.outputTokens} out`;
  (bubble || ui.messages.lastElementChild)?.append(line);
}

// The model's reasoning: plain text, folded, dimmed, apart from its answer.
function addReasoning(text) {
  const box = document.createElement("details");
  box.className = "reasoning";
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const body = document.createElement("div");
  body.className = "reasoning-text";
  body.textContent = text;
  box.append(summary, body);
  return append(box);
}

// ---- the thinking indicator: the model works and nothing shows yet ----

function showThinking(label = "thinking") {
  if (!state.busyRun) return;
  if (!state.thinking) {
    const element = document.createElement("div");
    element.className = "thinking";
    element.setAttribute("role", "status");
    const dots = document.createElement("span");
    dots.className = "dots";
    dots.append(document.createElement("i"), document.createElement("i"), document.createElement("i"));
    const text = document.createElement("span");
    text.className = "label";
    element.append(dots, text);
    state.thinking = { element, since: Date.now(), label, timer: setInterval(drawThinking, 1000) };
  }
  state.thinking.label = label;
  ui.messages.append(state.thinking.element);
  drawThinking();
  followOutput();
}

function drawThinking() {
  if (!state.thinking) return;
  const seconds = Math.floor((Date.now() - state.thinking.since) / 1000);
  state.thinking.element.dataset.seconds = String(seconds);
  state.thinking.element.querySelector(".label").textContent =
    seconds > 0 ? `${state.thinking.label}… ${seconds} s` : `${state.thinking.label}…`;
}

function hideThinking() {
  if (!state.thinking) return;
  clearInterval(state.thinking.timer);
  state.thinking.element.remove();
  state.thinking = null;
}

// ---- tool cards ----

function toolCard(id, name, args) {
  let card = state.tools.get(id);
  // A finished card with the same id is an earlier call (ids are only unique per turn).
  if (card && (card.dataset.verdict === "running" || card.dataset.verdict === "waiting")) return card;
  card = document.createElement("div");
  card.className = "tool-card";
  card.dataset.verdict = "running";
  card.dataset.tool = name;
  card.dataset.id = id;
  const head = document.createElement("div");
  head.className = "head";
  const nameEl = document.createElement("span");
  nameEl.className = "name";
  nameEl.textContent = name;
  const argsEl = document.createElement("span");
  argsEl.className = "args";
  argsEl.textContent = args === undefined ? "" : JSON.stringify(args);
  argsEl.title = args === undefined ? "" : JSON.stringify(args, null, 2);
  const verdict = document.createElement("span");
  verdict.className = "verdict running";
  verdict.textContent = "running";
  head.append(nameEl, argsEl, verdict);
  card.append(head);
  state.tools.set(id, card);
  return append(card);
}

function finishTool(id, { verdict, label, output, chars, name, args }) {
  const known = state.tools.get(id);
  const running = known && (known.dataset.verdict === "running" || known.dataset.verdict === "waiting");
  // A call the loop did not run has no start event: its card is drawn from the end event.
  const card = running ? known : toolCard(id, name || "tool", args);
  card.dataset.verdict = verdict;
  card.dataset.label = label || verdict;
  card.querySelector(".approval")?.remove();
  const badge = card.querySelector(".verdict");
  badge.className = `verdict ${verdict}`;
  badge.textContent = verdict === "error" && label ? label.replace("_", " ") : verdict;
  card.querySelector("details")?.remove();
  const text = typeof output === "string" ? output : JSON.stringify(output ?? "");
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = `output (${chars ?? text.length} characters)`;
  const pre = document.createElement("pre");
  pre.className = "output";
  pre.textContent = text;
  details.append(summary, pre);
  card.append(details);
}

// A result the gateway gave no verdict for: a call the loop did not run says so in its text.
function resultVerdict(block) {
  const text = typeof block.content === "string" ? block.content : "";
  if (block.verdict) return { verdict: block.verdict, label: block.label };
  if (/^not run:/.test(text)) return { verdict: "error", label: "not_run" };
  return { verdict: block.is_error ? "error" : "ok", label: block.is_error ? "error" : "ok" };
}

function renderMessage(message) {
  for (const block of message.content) {
    if (block.type === "reasoning" && block.text) {
      addReasoning(block.text);
    } else if (block.type === "text" && block.text) {
      if (message.role === "user") rememberTitle(state.session, block.text);
      addBubble(message.role === "user" ? "user" : "assistant", block.text);
    } else if (block.type === "tool_use") {
      toolCard(block.id, block.name, block.input);
    } else if (block.type === "tool_result") {
      finishTool(block.tool_use_id, { ...resultVerdict(block), output: block.content });
    }
  }
}

// The history, with each turn's end where the gateway gives it (`turns`): the usage line under
// its reply, "stopped" or the error after it.
function renderHistory(history) {
  const ends = new Map();
  for (const turn of history.turns || []) {
    if (!ends.has(turn.afterMessage)) ends.set(turn.afterMessage, []);
    ends.get(turn.afterMessage).push(turn);
  }
  const turnEnd = (count) => {
    for (const turn of ends.get(count) || []) {
      if (turn.aborted) addNote("stopped");
      else if (turn.error) addNote(`error: ${turn.error}`);
      else {
        const replies = ui.messages.querySelectorAll(".msg.assistant");
        addUsage(replies[replies.length - 1], turn.answeredBy, turn.usage);
      }
    }
  };
  turnEnd(0);
  history.messages.forEach((message, index) => {
    renderMessage(message);
    turnEnd(index + 1);
  });
}

function runBubble(runId) {
  let run = state.runs.get(runId);
  if (!run) {
    run = { bubble: null, text: "", timer: 0, reasoning: null };
    state.runs.set(runId, run);
  }
  if (!run.bubble) {
    run.bubble = addBubble("assistant streaming", "");
  }
  return run;
}

// Streaming: the whole text so far is rendered again, at most every 50 ms; an unclosed code
// fence renders as a code block to the end, a table as a paragraph until its second row.
function paintRun(run) {
  if (!run.bubble) return;
  run.bubble.querySelector(".body").replaceChildren(renderMarkdown(run.text));
  followOutput();
}

function schedulePaint(run) {
  if (run.timer) return;
  run.timer = setTimeout(() => { run.timer = 0; paintRun(run); }, 50);
}

function flushPaint(run) {
  if (run.timer) { clearTimeout(run.timer); run.timer = 0; }
  paintRun(run);
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
      if (data.kind !== "notification") rememberTitle(state.session, data.message);
      addBubble("user", data.kind === "notification" ? `[${data.sender}] ${data.message}` : data.message);
      setBusy(event.runId);
      showThinking();
    } else if (data.phase === "end" || data.phase === "error") {
      state.skipRuns.delete(event.runId);
      if (state.busyRun === event.runId) { setBusy(null); hideThinking(); }
      if (skip) return;
      const run = state.runs.get(event.runId);
      if (run) flushPaint(run);
      if (data.phase === "end") {
        const target = run && run.bubble ? run : null;
        let bubble = null;
        if (target) {
          target.bubble.classList.remove("streaming");
          // A model that did not stream still gets its answer shown.
          if (!target.text && data.text) {
            target.bubble.querySelector(".body").replaceChildren(renderMarkdown(data.text));
          }
          bubble = target.bubble;
        } else if (data.text) {
          bubble = addBubble("assistant", data.text);
        }
        addUsage(bubble, data.answeredBy, data.usage);
      } else {
        if (run && run.bubble) run.bubble.classList.remove("streaming");
        addNote(data.aborted ? "stopped" : `error: ${data.message}`);
      }
      state.runs.delete(event.runId);
      followOutput();
      refreshSessions();
    } else if (data.phase === "resumed" && !skip) {
      // The gateway was restarted during this turn and takes it up again: the text the model was
      // streaming when it stopped is asked for again, so its partial bubble goes.
      const run = state.runs.get(event.runId);
      if (run && run.bubble) {
        if (run.timer) { clearTimeout(run.timer); run.timer = 0; }
        run.bubble.remove();
        run.bubble = null;
        run.text = "";
      }
      addNote("resumed after a restart");
      setBusy(event.runId);
      showThinking();
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
    hideThinking();
    const run = runBubble(event.runId);
    run.reasoning = null;
    run.text += data.delta;
    schedulePaint(run);
  } else if (event.stream === "reasoning") {
    let run = state.runs.get(event.runId);
    if (!run) {
      run = { bubble: null, text: "", timer: 0 };
      state.runs.set(event.runId, run);
    }
    if (run.bubble) {
      // Reasoning after text is a new step: the text so far is done.
      flushPaint(run);
      run.bubble.classList.remove("streaming");
      run.bubble = null;
      run.text = "";
    }
    if (!run.reasoning) run.reasoning = addReasoning("");
    run.reasoning.querySelector(".reasoning-text").textContent += data.delta || "";
    showThinking("reasoning");
  } else if (event.stream === "tool") {
    // Text after a tool call goes into a new bubble below the card.
    const run = state.runs.get(event.runId);
    if (run) run.reasoning = null;
    if (run && run.bubble) {
      flushPaint(run);
      run.bubble.classList.remove("streaming");
      run.bubble = null;
      run.text = "";
    }
    if (data.phase === "start") {
      hideThinking();
      toolCard(data.toolCallId, data.name, data.args);
      placeApprovals();
    } else {
      finishTool(data.toolCallId, {
        verdict: data.verdict, label: data.label, output: data.output,
        chars: data.outputChars, name: data.name, args: data.args,
      });
      // The model is asked again once no call of the turn still runs.
      if (!ui.messages.querySelector('.tool-card[data-verdict="running"], .tool-card[data-verdict="waiting"]')) {
        showThinking();
      }
    }
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
  scrollToBottom();
  const wasDraft = state.draft;
  try {
    const answer = await request("chat.send", {
      sessionKey: state.session, message: text, idempotencyKey: randomId(12),
    });
    if (answer.status === "command") { addNote(answer.text); return; }
    if (wasDraft) {
      // The gateway now has the session, and this connection follows it.
      state.draft = false;
      state.loaded = true;
      rememberTitle(state.session, text);
      refreshSessions();
    }
    if (!state.busyRun) setBusy(answer.runId);
  } catch (error) {
    ui.input.value = text;
    addNote(`not sent: ${error.message}`);
  }
});

ui.input.addEventListener("keydown", (key) => {
  if (key.key === "Enter" && !key.shiftKey && !key.isComposing) {
    key.preventDefault();
    ui.composer.requestSubmit();
  }
});

ui.stop.addEventListener("click", () => {
  request("chat.abort", { sessionKey: state.session }).catch((error) => addNote(error.message));
});

$("new-chat").addEventListener("click", () => {
  if (state.draft && !ui.messages.children.length) { closeDrawer(); ui.input.focus(); return; }
  switchSession(newSessionKey(), { draft: true });
  closeDrawer();
});

function saveToken() {
  state.token = ui.tokenInput.value.trim();
  if (!state.token) return;
  ui.tokenPrompt.hidden = true;
  ui.tokenError.hidden = true;
  connect();
}
ui.tokenPrompt.addEventListener("submit", (submitted) => {
  submitted.preventDefault();
  saveToken();
});

// ---- the drawer (narrow windows) ----

function closeDrawer() { document.body.classList.remove("drawer-open"); }
ui.menu.addEventListener("click", () => document.body.classList.toggle("drawer-open"));
ui.backdrop.addEventListener("click", closeDrawer);

setInterval(() => { if (state.connected) drawSessions(); }, 60000);
connect();
