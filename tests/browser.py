"""Headless Chromium for the browser tests: Debian's ``chromium`` driven by Playwright from PyPI.

Both come from the package registries, installed here when missing: ``apt-get install -y chromium``
(only when running as root) and ``pip install playwright`` into the running interpreter. Playwright's
own browser download (``playwright install``) is never used. When they cannot be had, CI fails with
the reason; elsewhere the test is skipped with it.

Example::

    with open_app(comfy_server.url) as page:
        page.evaluate("() => window.app.graph !== undefined")
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL_TIMEOUT_S = 900
APP_LOAD_TIMEOUT_MS = 90_000


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"browser test set-up: {reason}", pytrace=False)
    pytest.skip(f"no headless browser: {reason}")


def _install(command: list[str]) -> str | None:
    """Run an installer; ``None`` when it worked, else the tail of its output."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{' '.join(command)}: {exc}"
    if result.returncode == 0:
        return None
    return f"{' '.join(command)} exited {result.returncode}: {(result.stdout + result.stderr)[-600:]}"


def ensure_chromium() -> str:
    """The path of Debian's chromium, installed with apt when missing and running as root."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        _unavailable("chromium is not installed and this is not root; run `apt-get install -y chromium`")
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        problem = _install(command)
        if problem:
            _unavailable(problem)
    found = shutil.which("chromium")
    if not found:
        _unavailable("apt-get installed chromium but it is not on PATH")
    return found


def ensure_playwright() -> None:
    """Playwright's Python package, installed from PyPI into this interpreter when missing."""
    if importlib.util.find_spec("playwright") is not None:
        return
    problem = _install([sys.executable, "-m", "pip", "install", "-q", "playwright"])
    if problem:
        _unavailable(problem)
    importlib.invalidate_caches()
    if importlib.util.find_spec("playwright") is None:
        _unavailable("pip installed playwright but it cannot be imported")


@contextmanager
def open_app(url: str) -> Iterator[Any]:
    """A Playwright page on the ComfyUI frontend at ``url``, once ``window.app`` has its graph.

    The tests drive ``window.app`` directly, so the first-load templates dialog and the missing-model
    report are left alone: neither blocks the app object.
    """
    chromium = ensure_chromium()
    ensure_playwright()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function("() => window.app && window.app.graph", timeout=APP_LOAD_TIMEOUT_MS)
            yield page
        finally:
            browser.close()
