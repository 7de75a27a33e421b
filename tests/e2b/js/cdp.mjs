// Playwright's connectOverCDP to a desktop sandbox's Chromium through airlockd's data plane:
// discovery by /json/version (whose ws URL the daemon rewrites to its own origin), then a page
// inside the sandbox is opened, clicked and captured.
//   node cdp.mjs ENDPOINT HEADERS_JSON PAGE_URL   → one JSON line
import { chromium } from "playwright-core";

const [endpoint, headers, url] = process.argv.slice(2);
const browser = await chromium.connectOverCDP(endpoint, {
  headers: JSON.parse(headers),
  timeout: 60_000,
});
const context = browser.contexts()[0] ?? (await browser.newContext());
const page = await context.newPage();
await page.goto(url, { timeout: 60_000 });
const before = await page.title();
await page.click("#button");
await page.waitForFunction(() => document.title.startsWith("clicks 1"), null, { timeout: 60_000 });
const clicks = await page.evaluate(() => document.title);
const shot = await page.screenshot();
console.log(JSON.stringify({
  version: browser.version(),
  before,
  clicks,
  screenshotBytes: shot.length,
  screenshotMagic: shot.subarray(0, 8).toString("hex"),
}));
// Leave the page and the sandbox's browser open: only this client goes.
process.exit(0);
