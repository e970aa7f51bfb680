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

await client.close();
process.stdout.write(`${JSON.stringify(report)}\n`);
