// The official TypeScript MCP SDK against a running `snakebox serve --http`: one tenant's
// whole flow, over streamable HTTP (the API key in a header) or legacy SSE (the key in the
// GET /sse URL, as seed 002's clients do). Prints one JSON object for the test to judge;
// it judges nothing itself.
//
//   node ts_sdk_flow.mjs http URL KEY MARKER
//   node ts_sdk_flow.mjs sse  URL KEY MARKER

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { SSEClientTransport } from "@modelcontextprotocol/sdk/client/sse.js";

const [transportName, base, key, marker] = process.argv.slice(2);
const headers = key ? { Authorization: `Bearer ${key}` } : {};

const transport =
  transportName === "sse"
    ? new SSEClientTransport(new URL(`${base}/sse${key ? `?api_key=${key}` : ""}`))
    : new StreamableHTTPClientTransport(new URL(`${base}/mcp`), { requestInit: { headers } });

const client = new Client({ name: "snakebox-ts-test", version: "1.0.0" });
await client.connect(transport);
const report = { server: client.getServerVersion(), transport: transportName };

const tools = await client.listTools();
report.tools = tools.tools.map((tool) => tool.name);

const progress = [];
const run = await client.callTool(
  {
    name: "execute_python",
    arguments: {
      script: `import time\nfor i in range(3):\n    print('${marker}', i, flush=True)\n    time.sleep(0.3)\nopen('ts.txt', 'w').write('from ts')`,
    },
  },
  undefined,
  { onprogress: (p) => progress.push(p.message ?? ""), timeout: 300_000 },
);
report.run = run.structuredContent;
report.runText = run.content.filter((c) => c.type === "text").map((c) => c.text);
report.runLinks = run.content.filter((c) => c.type === "resource_link").map((c) => c.uri);
report.progress = progress;

if (report.runLinks.length > 0) {
  const read = await client.readResource({ uri: report.runLinks[0] });
  report.artifactText = read.contents[0].text;
}

const session = await client.callTool({ name: "create_session", arguments: { name: "ts" } });
const sid = session.structuredContent.session_id;
await client.callTool({ name: "execute_python", arguments: { session_id: sid, script: "x = 20" } });
const cell = await client.callTool({
  name: "execute_python",
  arguments: { session_id: sid, script: "x * 2 + 2" },
});
report.cell = cell.structuredContent;
await client.callTool({ name: "delete_session", arguments: { session_id: sid } });

// An error path: the session is gone. The SDK must hand back the result (not throw a schema
// error), with snakebox's message and hint in the text a model is shown.
const gone = await client.callTool({ name: "list_packages", arguments: { session_id: sid } });
report.errorResult = {
  isError: gone.isError,
  text: gone.content.filter((c) => c.type === "text").map((c) => c.text).join(""),
};

// Every tool called the way a model bound by the published schemas calls it (OpenAI strict,
// Gemini): every argument present, those it does not mean to give as `null`. The SDK checks
// each structured result against the tool's output schema (Ajv) and throws on a mismatch.
const nulls = (name, given) => {
  const schema = tools.tools.find((tool) => tool.name === name).inputSchema;
  const args = Object.fromEntries(Object.keys(schema.properties ?? {}).map((key) => [key, null]));
  return { ...args, ...given };
};
const strict = {};
const strictCall = async (name, given) => {
  const result = await client.callTool({ name, arguments: nulls(name, given) });
  strict[name] = {
    isError: result.isError ?? false,
    structured: result.structuredContent ?? null,
    text: result.content.filter((c) => c.type === "text").map((c) => c.text).join(""),
  };
  return result;
};
const created = await strictCall("create_session", {});
const strictSid = created.structuredContent.session_id;
await strictCall("execute_python", { script: "print('strict')" });
await strictCall("validate_script", { script: "1 + 1" });
await strictCall("check_environment", {});
await strictCall("list_sessions", {});
await strictCall("write_file", { session_id: strictSid, path: "in.txt", content: "abc" });
await strictCall("read_file", { session_id: strictSid, path: "in.txt" });
await strictCall("list_files", { session_id: strictSid });
await strictCall("run_command", { session_id: strictSid, command: "cat in.txt" });
await strictCall("list_packages", { session_id: strictSid });
await strictCall("reset_session", { session_id: strictSid });
await strictCall("delete_session", { session_id: strictSid });
report.strict = strict;
report.listedTools = report.tools;

await client.close();
process.stdout.write(`${JSON.stringify(report)}\n`);
