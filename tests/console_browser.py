"""Loads a page in headless Chromium through the DevTools protocol, waits in real time while
its script runs, then prints the page's DOM and saves a screenshot.

Usage: console_browser.py CHROMIUM URL SCREENSHOT SECONDS

Chromium's own `--dump-dom` either dumps at once or runs the page in virtual time, in which
two refreshes of the console can be milliseconds apart; this waits for real.
"""

import base64
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket


def main():
    chromium, url, screenshot, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    profile = tempfile.mkdtemp(prefix="console-browser-")
    browser = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1280,1400",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        endpoint = None
        for line in browser.stderr:
            found = re.search(r"DevTools listening on ws://([^/]+)/", line)
            if found:
                endpoint = found.group(1)
                break
        if endpoint is None:
            sys.exit("chromium did not open its DevTools endpoint")
        targets = json.load(urllib.request.urlopen(f"http://{endpoint}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        ids = iter(range(1, 1_000_000))

        def call(method, **params):
            call_id = next(ids)
            ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
            while True:
                reply = json.loads(ws.recv())
                if reply.get("id") == call_id:
                    if "error" in reply:
                        sys.exit(f"{method}: {reply['error']}")
                    return reply["result"]

        call("Page.enable")
        call("Page.navigate", url=url)
        time.sleep(seconds)
        html = call("Runtime.evaluate", expression="document.documentElement.outerHTML",
                    returnByValue=True)["result"]["value"]
        png = call("Page.captureScreenshot", format="png")["data"]
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(png))
        ws.close()
        print(html)
    finally:
        browser.terminate()
        browser.wait(timeout=10)


if __name__ == "__main__":
    main()
