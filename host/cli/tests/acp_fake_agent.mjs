// A scripted external ACP agent for the tests, on the official TypeScript SDK's agent role. Its
// prompt is a script, one command a line; it carries each out through the client (clawcage) and
// streams one result line per command as agent text:
//
//   write PATH TEXT        fs/write_text_file
//   read PATH              fs/read_text_file
//   lines PATH LINE LIMIT  fs/read_text_file of LIMIT lines from LINE
//   copy FROM TO           fs/read_text_file of FROM, then fs/write_text_file of that text to TO
//   permission KIND TITLE  session/request_permission (allow once / reject once)
//   terminal CMD ARGS...   terminal/create, wait_for_exit, output, release
//   env NAME               whether NAME is in its environment
//   hang                   writes its pid to $FAKE_ACP_PID_FILE and never answers, nor exits when
//                          its stdin closes; a session/cancel is appended to $FAKE_ACP_LOG_FILE
//                          and ignored
import { Readable, Writable } from "node:stream";
import { appendFileSync, writeFileSync } from "node:fs";
import * as acp from "@agentclientprotocol/sdk";

const log = (line) => {
  if (process.env.FAKE_ACP_LOG_FILE) appendFileSync(process.env.FAKE_ACP_LOG_FILE, line + "\n");
};

const say = (client, sessionId, text) =>
  client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
  });

const failure = (error) => `error ${error?.data?.message ?? error?.message ?? String(error)}`;

async function run(client, sessionId, line) {
  const [command, ...rest] = line.trim().split(/\s+/);
  switch (command) {
    case "write": {
      const [path, ...words] = rest;
      try {
        await client.request(acp.methods.client.fs.writeTextFile, { sessionId, path, content: words.join(" ") });
        return "ok";
      } catch (error) {
        return failure(error);
      }
    }
    case "read": {
      try {
        const { content } = await client.request(acp.methods.client.fs.readTextFile, { sessionId, path: rest[0] });
        return `ok ${JSON.stringify(content)}`;
      } catch (error) {
        return failure(error);
      }
    }
    case "lines": {
      const [path, line, limit] = rest;
      try {
        const { content } = await client.request(acp.methods.client.fs.readTextFile, {
          sessionId,
          path,
          line: Number(line),
          limit: Number(limit),
        });
        return `ok ${JSON.stringify(content)}`;
      } catch (error) {
        return failure(error);
      }
    }
    case "copy": {
      const [from, to] = rest;
      try {
        const { content } = await client.request(acp.methods.client.fs.readTextFile, { sessionId, path: from });
        await client.request(acp.methods.client.fs.writeTextFile, { sessionId, path: to, content });
        return `ok ${content.length} characters`;
      } catch (error) {
        return failure(error);
      }
    }
    case "permission": {
      const [kind, ...title] = rest;
      const response = await client.request(acp.methods.client.session.requestPermission, {
        sessionId,
        toolCall: { toolCallId: `perm-${Date.now()}`, kind, title: title.join(" ") || kind, status: "pending" },
        options: [
          { optionId: "yes", name: "Allow once", kind: "allow_once" },
          { optionId: "no", name: "Reject", kind: "reject_once" },
        ],
      });
      const outcome = response.outcome;
      return outcome.outcome === "selected" ? `selected ${outcome.optionId}` : outcome.outcome;
    }
    case "terminal": {
      const [program, ...args] = rest;
      try {
        const terminal = await client.createTerminal({ sessionId, command: program, args });
        const exit = await terminal.waitForExit();
        const output = await terminal.currentOutput();
        await terminal.release();
        return `exit ${exit.exitCode} output ${JSON.stringify(output.output)}`;
      } catch (error) {
        return failure(error);
      }
    }
    case "env":
      return process.env[rest[0]] === undefined ? "unset" : "set";
    case "hang":
      if (process.env.FAKE_ACP_PID_FILE) writeFileSync(process.env.FAKE_ACP_PID_FILE, String(process.pid));
      // Alive even after its stdin closes: only a kill ends it.
      setInterval(() => {}, 1000);
      await new Promise(() => {});
      return "unreachable";
    default:
      return `unknown command ${command}`;
  }
}

const app = acp
  .agent({ name: "fake-acp-agent" })
  .onRequest(acp.methods.agent.initialize, ({ params }) => ({
    protocolVersion: params.protocolVersion,
    agentCapabilities: { loadSession: false },
  }))
  .onRequest(acp.methods.agent.session.new, () => ({ sessionId: "fake-session" }))
  .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
    const script = params.prompt
      .filter((block) => block.type === "text")
      .map((block) => block.text)
      .join("\n");
    for (const line of script.split("\n").filter((line) => line.trim())) {
      const result = await run(client, params.sessionId, line);
      await say(client, params.sessionId, `${line.trim()} => ${result}\n`);
    }
    return { stopReason: "end_turn" };
  })
  .onNotification(acp.methods.agent.session.cancel, () => log("cancelled"));

const stream = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const connection = app.connect(stream);
await connection.closed;
