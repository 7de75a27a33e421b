// Opens a desktop sandbox's stream URL, as the e2b-desktop SDK returns it, in headless Chromium
// (Debian's, driven by playwright-core) and reports whether noVNC's WebSocket connected.
// The caller's HOME holds an NSS database that trusts airlockd's local CA, as a user's would.
//   node stream.mjs URL   → one JSON line: {status, websocket, framesReceived, connected, message}
import { chromium } from "playwright-core";

const [url] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  // Root on the test host; the sandbox's own Chromium has the same flag for the same reason.
  args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage();
  let websocket = null;
  let framesReceived = 0;
  page.on("websocket", (ws) => {
    websocket = ws.url();
    ws.on("framereceived", () => { framesReceived += 1; });
  });
  const response = await page.goto(url, { timeout: 60_000 });
  // noVNC marks the document once the RFB session is up, or shows an error status.
  await page.waitForFunction(() => {
    const root = document.documentElement.classList;
    const status = document.getElementById("noVNC_status");
    return root.contains("noVNC_connected")
      || (status && status.classList.contains("noVNC_status_error"));
  }, null, { timeout: 60_000 }).catch(() => {});
  const state = await page.evaluate(() => ({
    connected: document.documentElement.classList.contains("noVNC_connected"),
    message: document.getElementById("noVNC_status")?.textContent ?? "",
  }));
  console.log(JSON.stringify({ status: response.status(), websocket, framesReceived, ...state }));
} finally {
  await browser.close();
}
