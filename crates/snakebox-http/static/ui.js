// snakebox web UI: the only script (copy buttons, a running run's live output). Served from
// the binary; no inline scripts.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-copy]")) {
    button.addEventListener("click", async () => {
      const source = document.getElementById(button.dataset.copy);
      if (!source) return;
      try {
        await navigator.clipboard.writeText(source.textContent);
        button.textContent = "Copied";
      } catch {
        const range = document.createRange();
        range.selectNodeContents(source);
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        button.textContent = "Selected: press Ctrl+C";
      }
      setTimeout(() => { button.textContent = "Copy"; }, 2000);
    });
  }
  const live = document.querySelector("[data-live]");
  if (live) follow(live);
});

// A running run's output, as the server streams it (Server-Sent Events); once the run has
// ended the page reloads to show its result.
function follow(live) {
  const stdout = document.getElementById("live-stdout");
  const stderr = document.getElementById("live-stderr");
  const source = new EventSource(live.dataset.live);
  source.addEventListener("output", (event) => {
    const data = JSON.parse(event.data);
    stdout.textContent += data.stdout;
    if (data.stderr) {
      stderr.textContent += data.stderr;
      document.getElementById("live-stderr-block").hidden = false;
    }
    if (data.truncated) document.getElementById("live-truncated").hidden = false;
  });
  // Ended: its record is written right after; reload shortly to show it.
  source.addEventListener("end", () => {
    source.close();
    setTimeout(() => window.location.reload(), 300);
  });
  // Not running in this server (another server's, or an interrupted run): look again later.
  const later = () => {
    source.close();
    setTimeout(() => window.location.reload(), 3000);
  };
  source.addEventListener("gone", later);
  source.onerror = later;
}
