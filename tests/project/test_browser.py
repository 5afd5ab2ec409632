"""End to end in a real browser: JupyterLab runs notebook 06, and moving its slider redraws the
physical block map.

Starts a headless JupyterLab on a copy of ``notebooks/`` and drives Debian's Chromium with
Playwright (Playwright cannot download its own browser here).  Skipped when ``/usr/bin/chromium``
or the ``playwright`` package is missing; otherwise it must pass.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOK = "06_block_lifetime.ipynb"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SERVER_START_S = 90
RUN_ALL_S = 300            # the notebook loads SmolLM2 and runs ~50 engine steps on the CPU
REDRAW_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer within {SERVER_START_S} s:\n"
                       f"{log.read_text()[-3000:]}")


def _clear_outputs(path: Path) -> None:
    """Strip stored outputs and saved widget state, so that everything the test waits for
    comes from this run (JupyterLab would otherwise render the saved ones on opening)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


@pytest.fixture
def jupyter_lab(tmp_path):
    """A headless JupyterLab serving a temporary copy of notebooks/; yields its base URL and
    stops the server and its kernels (its whole process group) afterwards."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    root = tmp_path / "notebooks"
    shutil.copytree(REPO / "notebooks", root)
    _clear_outputs(root / NOTEBOOK)
    settings = tmp_path / "lab-settings"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
           f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={settings}",
           f"--LabApp.workspaces_dir={settings}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")                    # CI containers run as root
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env=env, start_new_session=True)
    try:
        _wait_until_up(url, proc, log)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)     # the server and the kernels it started
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_slider_redraws_block_map(jupyter_lab, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                _run_notebook_and_move_slider(page, jupyter_lab)
            except Exception:
                page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
                raise
        finally:
            browser.close()


def _readout(locator) -> str:
    """The slider's readout text (ipywidgets renders it as an editable element)."""
    text = locator.evaluate("e => (e.value !== undefined ? e.value : e.textContent)")
    return text.strip().replace("\u2212", "-")            # a typographic minus for negatives


def _wait_for_idle_kernel(page, timeout_s: float = 90) -> None:
    """Wait until the notebook's kernel indicator has said "idle" for 2 s in a row (it also
    reads idle for a moment before the kernel is connected)."""
    indicator = page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator").first
    deadline, idle_since = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        status = indicator.get_attribute("data-status") if indicator.count() else None
        if status == "idle":
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= 2:
                return
        else:
            idle_since = None
        time.sleep(0.25)
    raise AssertionError(f"the kernel was not idle within {timeout_s} s (status {status!r})")


def _run_notebook_and_move_slider(page, url: str) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{url}/lab/tree/{NOTEBOOK}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    _wait_for_idle_kernel(page)

    # Run > Run All Cells
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-content").get_by_text("Run All Cells", exact=True).click()
    # if the session still had no kernel, JupyterLab asks for one: take the notebook's own
    dialog = page.locator(".jp-Dialog")
    try:
        dialog.wait_for(timeout=3000)
        dialog.get_by_role("button", name="Select").click()
    except PlaywrightTimeout:
        pass

    # the last cell's output appears only when every cell before it ran without error
    page.wait_for_selector("text=✘ not solved yet [06.peak_blocks]", timeout=RUN_ALL_S * 1000)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                          has_text="Traceback")
    assert errors.count() == 0, "a cell raised an error"

    widget = page.locator(".pt-lifetime")
    image = widget.locator(".jp-OutputArea-output img")
    image.wait_for(timeout=REDRAW_S * 1000)
    widget.scroll_into_view_if_needed()
    readout = widget.locator(".widget-readout")
    before_src = image.get_attribute("src")
    before_value = _readout(readout)
    before_shot = image.screenshot()
    assert before_src.startswith("data:image/png;base64,")

    # move the slider with the keyboard: focus its handle, press the right arrow three times
    handle = widget.locator(".noUi-handle")
    handle.click()
    for _ in range(3):
        handle.press("ArrowRight")

    page.wait_for_function(
        """([sel, old]) => {
            const img = document.querySelector(sel);
            return img !== null && img.getAttribute('src') !== old;
        }""",
        arg=[".pt-lifetime .jp-OutputArea-output img", before_src], timeout=REDRAW_S * 1000)
    after_value = _readout(readout)
    after_shot = image.screenshot()
    assert int(after_value) > int(before_value), (before_value, after_value)
    assert image.get_attribute("src") != before_src
    assert after_shot != before_shot, "the redrawn figure looks the same as before"
