// Tool errors through the official TypeScript SDK: a wrong argument, a refused network, a
// killed sandbox, a busy server, a write conflict and a locked file. The SDK validates every structuredContent it gets against
// the tool's outputSchema (error results too, in 1.x): what the model would be shown is
// either the result or the exception the SDK threw instead.
// Usage: node tool_errors.mjs <url> ; prints one JSON line.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2]);
const client = new Client({ name: "abx-tool-errors-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(url);
await client.connect(transport);
await client.listTools(); // the SDK validates results only for tools it has listed

const call = async (name, args) => {
  try {
    const r = await client.callTool({ name, arguments: args });
    return { isError: r.isError === true, text: r.content?.[0]?.text ?? "",
             structured: r.structuredContent ?? null };
  } catch (e) {
    return { threw: String(e?.message ?? e) };
  }
};
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

const seen = {};
seen.wrong_argument = await call("create_sandbox", { memory_mb: -5 });
seen.refused_network = await call("create_sandbox", { network: "full" });
const made = await call("run_command", { command: "true" });
const sid = made.structured?.sandbox_id;
// A file someone else edits: a stale if_match is a conflict, another's lock is locked.
await call("write_file", { path: "edited.txt", content: "1" });
const read = await call("read_file", { path: "edited.txt" });
await call("write_file", { path: "edited.txt", content: "2" });
seen.conflict = await call("write_file", { path: "edited.txt", content: "3",
                                           if_match: read.structured?.version });
const lock = await call("lock_file", { path: "edited.txt", ttl: 60 });
seen.locked = await call("write_file", { path: "edited.txt", content: "4", lock_wait: 0 });
seen.lock_write = await call("write_file", { path: "edited.txt", content: "5",
                                             lock_token: lock.structured?.token });
seen.kill = await call("kill_sandbox", { sandbox_id: sid });
seen.killed_sandbox = await call("run_command", { sandbox_id: sid, command: "true" });
// One call at a time on this server (ABX_MCP_MAX_CONCURRENCY=1): a call while a slow one
// runs is refused at once.
const slow = call("run_command", { command: "sleep 3" });
await sleep(500);
for (let i = 0; i < 20; i++) {
  const r = await call("list_sandboxes", {});
  if (r.isError || r.threw) { seen.busy = r; break; }
  await sleep(100);
}
seen.slow = await slow;
console.log(JSON.stringify(seen));
await transport.terminateSession();
await client.close();
