"""The real app in a real browser, shared by the browser tests: ``streamlit run app.py`` on a
free port (one server for the whole test run) and headless Debian Chromium through Playwright
(docs/guide.md: what the tests check); helpers that drive the sidebar."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specviz.served.server import popen_tied

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/_stcore/health"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.read().decode().strip() == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"streamlit did not answer {url} within {timeout:.0f} s")


@pytest.fixture(scope="session")
def server():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Debian chromium is not installed at {CHROMIUM} "
                    "(install it with: apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    port = _free_port()
    log = open(ARTIFACTS / "streamlit-server.log", "w")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = popen_tied(   # its own process group, ended with this test run even if killed
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_health(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def max_round_js() -> str:
    return ("n => { const el = document.querySelectorAll('.specviz-tokens [data-round]');"
            " let m = -1; el.forEach(e => { m = Math.max(m, +e.dataset.round); });"
            " return m + 1 >= n; }")


def pick(page, key: str, option: str) -> None:
    """Choose ``option`` in the selectbox / multiselect with widget key ``key`` (a react-aria
    combobox; the rendered copy is the visible one)."""
    page.locator(f".st-key-{key} input[role='combobox'] >> visible=true").first.click()
    page.get_by_role("option", name=option, exact=True).click(timeout=60_000)
    page.wait_for_selector(IDLE, timeout=120_000)
    page.keyboard.press("Escape")


def open_page(page, server: str, link: str) -> None:
    """Open the app at its main page, then go to the page ``link`` through the navigation (a
    deep link to a page's url shows Streamlit's "page not found" dialog before it routes)."""
    page.goto(server + "/", wait_until="domcontentloaded")
    page.get_by_role("button", name="Next round").wait_for(timeout=120_000)
    page.wait_for_selector(IDLE, timeout=120_000)
    if link:
        page.get_by_role("link", name=link).click()
        page.wait_for_timeout(500)
        page.wait_for_selector(IDLE, timeout=120_000)


