// The web UI in a real browser: Debian's Chromium, headless, driven by playwright-core.
// Driven by tests/e2e/test_ui.py, which starts the server, makes the keys and the runs and the
// session over MCP, and passes what to look for as one JSON argument. Prints one JSON report
// (last line of stdout) that the test asserts on; screenshots go where it says.
import { chromium } from "playwright-core";
import { readFile } from "node:fs/promises";
import path from "node:path";

const args = JSON.parse(process.argv[2]);
const { url, keyA, keyB, runId, figureRunId, errorRunId, sessionId, sessionName, marker, shots, downloads } = args;

const report = { console: [], csp: [], pageErrors: [], checks: {} };
const check = (name, value) => { report.checks[name] = value; };

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"],
});

async function newPage() {
  const context = await browser.newContext({ acceptDownloads: true, viewport: { width: 1280, height: 860 } });
  // Report every CSP violation as a console error, so none goes unseen.
  await context.addInitScript(() => {
    document.addEventListener("securitypolicyviolation", (e) => {
      console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI}`);
    });
  });
  const page = await context.newPage();
  page.on("console", (message) => {
    if (message.type() === "error" || message.type() === "warning") {
      const text = message.text();
      (text.includes("Content Security Policy") || text.startsWith("CSP violation") ? report.csp : report.console)
        .push(`${page.url()}: ${text}`);
    }
  });
  page.on("pageerror", (error) => report.pageErrors.push(`${page.url()}: ${error.message}`));
  return { context, page };
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });
}

async function logIn(page, key) {
  await page.goto(`${url}/ui/`);
  check(`loginRedirect:${key === keyA ? "a" : "b"}`, new URL(page.url()).pathname);
  await page.fill("#key", key);
  await Promise.all([page.waitForURL(`${url}/ui/runs`), page.click("#login")]);
}

// Tenant B sees none of A's runs, sessions or artifacts (checked while A's session exists).
async function checkTenantB() {
  const b = await newPage();
  await logIn(b.page, keyB);
  check("bRunsPage", await b.page.content().then((html) => ({ hasRun: html.includes(runId), hasMarker: html.includes(marker) })));
  await b.page.goto(`${url}/ui/sessions`);
  check("bSessions", (await b.page.content()).includes(sessionName));
  const statuses = {};
  for (const target of [`/ui/runs/${runId}`, `/ui/runs/${runId}/download/data.bin`, `/ui/runs/${runId}/image/dot.png`,
                        `/ui/sessions/${sessionId}`]) {
    // The context's request API carries B's cookie, without a page logging the 404.
    statuses[target] = (await b.context.request.get(`${url}${target}`, { maxRedirects: 0 })).status();
  }
  check("bStatuses", statuses);
  await b.context.close();
}

try {
  // --- Tenant A ------------------------------------------------------------------------
  const { context, page } = await newPage();
  await page.goto(`${url}/ui/runs`);
  check("unauthenticatedGoesToLogin", new URL(page.url()).pathname);
  await shot(page, "login");
  // A wrong key is refused, on the login page.
  await page.fill("#key", "sbx_not_a_key");
  await page.click("#login");
  check("wrongKeyMessage", (await page.textContent("#login-problem"))?.trim() ?? "");
  report.console = report.console.filter((line) => !line.includes("status of 401"));
  await logIn(page, keyA);
  const cookies = await context.cookies();
  const cookie = cookies.find((c) => c.name === "snakebox_ui");
  check("cookie", cookie && { httpOnly: cookie.httpOnly, sameSite: cookie.sameSite, path: cookie.path });

  // A long run started over MCP: found running, cancelled from its page, seen to end.
  let runningHref = null;
  for (let i = 0; i < 120 && !runningHref; i++) {
    await page.goto(`${url}/ui/runs`);
    runningHref = await page.$eval("#runs", (table) => {
      const row = [...table.querySelectorAll("tbody tr")].find((tr) => tr.querySelector(".status.running"));
      return row ? row.querySelector("a").getAttribute("href") : null;
    }).catch(() => null);
    if (!runningHref) await page.waitForTimeout(500);
  }
  check("runningFound", Boolean(runningHref));
  await page.goto(`${url}${runningHref}`);
  check("runningStatus", (await page.textContent("#run-status")).trim());
  // Its output streams into the page while it runs.
  await page.locator("#live-stdout", { hasText: "long run started" }).waitFor({ timeout: 30000 });
  check("liveStdout", await page.textContent("#live-stdout"));
  await shot(page, "run-running");
  await page.click("#cancel");
  // The stream ends with the run, and the page reloads to show how it ended.
  await page.locator("#run-status:not(.running)").waitFor({ timeout: 30000 });
  const ended = (await page.locator("#run-status").textContent()).trim();
  check("cancelledStatus", ended);
  check("cancelledStdout", await page.locator("#stdout").textContent());
  check("cancelledId", runningHref.split("/").pop());

  // The runs list, newest first, with the run made over MCP.
  await page.goto(`${url}/ui/runs`);
  const runLinks = await page.$$eval("#runs tbody tr td:first-child a", (as) => as.map((a) => a.getAttribute("href")));
  check("runsListed", runLinks);
  await shot(page, "runs");

  // The run's page: stdout, the PNG inline, downloads.
  await page.click(`a[href="/ui/runs/${runId}"] >> nth=0`);
  await page.waitForURL(`${url}/ui/runs/${runId}`);
  check("stdout", await page.textContent("#stdout"));
  check("status", (await page.textContent("#run-status")).trim());
  check("usage", await page.locator("#usage").textContent().catch(() => null));
  const image = await page.$eval("img.artifact", (img) => ({ src: img.getAttribute("src"), width: img.naturalWidth, height: img.naturalHeight }));
  check("image", image);
  check("inlineImages", await page.$$eval("img.artifact", (imgs) => imgs.map((i) => i.getAttribute("src"))));
  await shot(page, "run");
  // A matplotlib figure, shown inline and decoded by the browser.
  await page.goto(`${url}/ui/runs/${figureRunId}`);
  await page.waitForFunction(() => [...document.querySelectorAll("img.artifact")].every((img) => img.complete));
  check("figure", await page.$$eval("img.artifact", (imgs) => imgs.map((img) => ({
    src: img.getAttribute("src"), width: img.naturalWidth, height: img.naturalHeight }))));
  await shot(page, "run-figure");
  await page.goto(`${url}/ui/runs/${runId}`);
  for (const name of ["data.bin", "dot.png", "page.svg"]) {
    const [download] = await Promise.all([
      page.waitForEvent("download"),
      page.click(`#artifacts a[href$="/download/${name}"]`),
    ]);
    const saved = path.join(downloads, name);
    await download.saveAs(saved);
    check(`download:${name}`, { suggested: download.suggestedFilename(), hex: (await readFile(saved)).toString("hex") });
  }

  // A run that raised: its exception and traceback.
  await page.goto(`${url}/ui/runs/${errorRunId}`);
  check("traceback", await page.textContent("#traceback"));
  await shot(page, "run-error");

  // Sessions: listed, its page with its files, deleted after confirmation.
  await page.goto(`${url}/ui/sessions`);
  check("sessionListed", (await page.textContent("#sessions")).includes(sessionName));
  await shot(page, "sessions");
  await page.click(`a[href="/ui/sessions/${sessionId}"]`);
  await page.waitForURL(`${url}/ui/sessions/${sessionId}`);
  // Upload a file from the browser into the session's workspace.
  await page.setInputFiles("#upload-file", { name: "upload.txt", mimeType: "text/plain", buffer: Buffer.from(`uploaded ${marker}`) });
  await Promise.all([page.waitForURL(`${url}/ui/sessions/${sessionId}`), page.click("#upload")]);
  check("sessionFiles", await page.$$eval("#files tbody tr td:first-child", (tds) => tds.map((td) => td.textContent.trim())));
  check("sessionCells", await page.$$eval("#cells tbody tr", (rows) => rows.length));
  await shot(page, "session");
  await checkTenantB();
  const [fileDownload] = await Promise.all([
    page.waitForEvent("download"),
    page.click(`#files a[href$="/download/notes.txt"]`),
  ]);
  const notes = path.join(downloads, "notes.txt");
  await fileDownload.saveAs(notes);
  check("sessionFile", await readFile(notes, "utf8"));
  await page.click("#delete");
  await page.waitForURL(`${url}/ui/sessions/${sessionId}/delete`);
  await shot(page, "session-delete");
  await Promise.all([page.waitForURL(`${url}/ui/sessions`), page.click("#confirm-delete")]);
  check("sessionGone", !(await page.content()).includes(sessionName));

  // Environment and client configurations.
  await page.goto(`${url}/ui/environment`);
  check("environmentReady", (await page.textContent("#ready")).trim());
  check("limits", await page.$$eval("#limits tbody tr", (rows) => rows.length));
  await shot(page, "environment");
  await page.goto(`${url}/ui/clients`);
  check("endpoint", (await page.textContent("#endpoint")).trim());
  check("claude", (await page.textContent("#client-1")).trim());
  await shot(page, "clients");

  // Log out: the cookie no longer opens pages.
  await page.goto(`${url}/ui/runs`);
  await Promise.all([page.waitForURL(`${url}/ui/login`), page.click("button.link")]);
  await page.goto(`${url}/ui/runs`);
  check("afterLogout", new URL(page.url()).pathname);
  await context.close();

} catch (error) {
  report.error = `${error.stack ?? error}`;
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
