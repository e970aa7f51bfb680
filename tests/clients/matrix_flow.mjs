// The official TypeScript MCP SDK through every scenario of tests/clients/scenarios.json,
// against a running `snakebox serve --http` (streamable HTTP, the API key in a header).
// Prints one JSON object: per scenario, per step, what the SDK handed back (a tool result,
// a resource read, or the error it threw). It judges nothing itself: the test does, the same
// way for every client (tests/e2e/test_client_matrix.py).
//
//   node matrix_flow.mjs SCENARIOS.json URL KEY

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [scenariosPath, base, key] = process.argv.slice(2);
const { scenarios } = JSON.parse(readFileSync(scenariosPath, "utf-8"));

const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: "snakebox-matrix", version: "1.0.0" });
await client.connect(transport);

// `{name}` in any string of `value` replaced by what an earlier step saved.
const fill = (value, saved) => {
  if (typeof value === "string") return value.replace(/\{(\w+)\}/g, (whole, name) => saved[name] ?? whole);
  if (Array.isArray(value)) return value.map((item) => fill(item, saved));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v, saved)]));
  }
  return value;
};
const dig = (value, path) => path.split(".").reduce((at, part) => (at == null ? undefined : at[part]), value);

const runStep = async (step, saved) => {
  const outcome = { isError: null, structured: null, text: "", images: [], links: [], progress: [], protocolError: null, contents: null };
  try {
    if (step.read !== undefined) {
      const read = await client.readResource({ uri: fill(step.read, saved) });
      outcome.contents = read.contents.map((c) => ({ uri: c.uri, mimeType: c.mimeType ?? null, text: c.text ?? null }));
      return outcome;
    }
    const result = await client.callTool(
      { name: step.tool, arguments: fill(step.args, saved) },
      undefined,
      { onprogress: (p) => outcome.progress.push(p.message ?? ""), timeout: 300_000 },
    );
    outcome.isError = result.isError ?? false;
    outcome.structured = result.structuredContent ?? null;
    outcome.text = result.content.filter((c) => c.type === "text").map((c) => c.text).join("");
    outcome.images = result.content.filter((c) => c.type === "image").map((c) => c.mimeType);
    outcome.links = result.content.filter((c) => c.type === "resource_link").map((c) => c.uri);
  } catch (error) {
    outcome.protocolError = { code: error.code ?? null, message: String(error.message ?? error) };
  }
  return outcome;
};

const report = {};
for (const scenario of scenarios) {
  const saved = {};
  const steps = [];
  for (const step of scenario.steps) {
    const outcome = await runStep(step, saved);
    for (const [name, path] of Object.entries(step.save ?? {})) saved[name] = dig(outcome, path);
    steps.push(outcome);
  }
  report[scenario.name] = { saved, steps };
}

await client.close();
process.stdout.write(`${JSON.stringify(report)}\n`);
