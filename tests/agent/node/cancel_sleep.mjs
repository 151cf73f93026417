// Cancels a `sleep 15` run_command with an AbortSignal (the official TypeScript SDK sends
// notifications/cancelled), then checks from a second call that the sleep is gone.
// Usage: node cancel_sleep.mjs <url> ; prints one JSON line.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2]);
const client = new Client({ name: "abx-cancel-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(url);
await client.connect(transport);
const run = (command, options) =>
  client.callTool({ name: "run_command", arguments: { command } }, undefined, options);

const pidFile = "/workspace/sleep.pid";
const ac = new AbortController();
const started = Date.now();
const slow = run(`echo $$ > ${pidFile}; exec sleep 15`, { signal: ac.signal, timeout: 60000 });
let pid = "";
for (let i = 0; i < 100 && !pid; i++) {
  const r = await run(`cat ${pidFile} 2>/dev/null || true`);
  pid = r.structuredContent.stdout.trim();
  if (!pid) await new Promise((ok) => setTimeout(ok, 50));
}
ac.abort("user pressed stop");
let aborted = false;
try { await slow; } catch (e) { aborted = true; }
const abortedAfter = Date.now() - started;
// Gone inside the sandbox within 5 s of the abort (the command would run 15 s).
const check = await run(
  `for i in $(seq 100); do kill -0 ${pid} 2>/dev/null || { echo gone; exit 0; }; sleep 0.05; done; echo running`);
console.log(JSON.stringify({ pid, aborted, abortedAfter, inside: check.structuredContent.stdout.trim(),
                             checkedAfter: Date.now() - started }));
await transport.terminateSession();
await client.close();
