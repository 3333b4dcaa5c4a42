// Drives `clawcage acp` with the official ACP TypeScript SDK's client role, as an editor would,
// and prints a JSON report for the Rust test to assert on.
//
//   node acp_client.mjs CLAWCAGE_BINARY WORKSPACE OUTSIDE_DIR -- CLAWCAGE_ARGS...
//
// It initializes, opens a session in WORKSPACE, sends one prompt and records every update and
// the stop reason, then asks for a session in OUTSIDE_DIR (which must be refused).
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const [binary, workspace, outside, separator, ...args] = process.argv.slice(2);
if (separator !== "--") throw new Error("usage: acp_client.mjs BINARY WORKSPACE OUTSIDE -- ARGS...");

const child = spawn(binary, ["acp", ...args], { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
const updates = [];
const report = {};

await acp
  .client({ name: "acp-test-client" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    updates.push(params);
  })
  .connectWith(stream, async (agent) => {
    const init = await agent.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    });
    report.initialize = init;
    const session = await agent.request(acp.methods.agent.session.new, { cwd: workspace, mcpServers: [] });
    report.sessionId = session.sessionId;
    const response = await agent.request(acp.methods.agent.session.prompt, {
      sessionId: session.sessionId,
      prompt: [{ type: "text", text: "read hello.txt please" }],
    });
    report.stopReason = response.stopReason;
    try {
      await agent.request(acp.methods.agent.session.new, { cwd: outside, mcpServers: [] });
      report.outside = { refused: false };
    } catch (error) {
      report.outside = { refused: true, code: error.code, message: error.data?.message ?? error.message };
    }
  });
report.updates = updates;
child.stdin.end();
const code = await new Promise((resolve) => child.on("exit", (status) => resolve(status)));
report.exitCode = code;
process.stdout.write(JSON.stringify(report) + "\n");
