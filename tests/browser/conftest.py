"""Fixtures for the browser test: JupyterLab servers and one headless Chromium per session (the test command runs
two pytest-xdist workers: each starts its own, and `learner_lab` only where a learner test runs).

Two servers, each on a temporary copy (so neither autosave nor the notebooks' own writes touch the repository), with
private settings, workspaces and Jupyter directories, each always stopped by its PID:
- `lab_server` serves a copy of the reference notebooks (notebooks/), which the test runs top to bottom;
- `learner_lab` is the lab as `python3 workbook.py lab` opens it for a learner: a copy of the checkout's layout
  (notebooks/, docs/, the learner's edition built by fla_lab.teaching.edition) served with workbook.py's own `lab_root`,
  `lab_arguments` and `lab_env`, so it is rooted where the learner's lab is.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = Path(os.environ.get("FLA_LAB_BROWSER_NOTEBOOKS", REPO / "notebooks")).resolve()
CHROMIUM = Path(os.environ.get("FLA_LAB_CHROMIUM", "/usr/bin/chromium"))
SETUP_HINT = "`python3 workbook.py test` installs it (apt-get install chromium)"
SERVER_START_TIMEOUT_S = 90

# JupyterLab user settings: no news/update toasts (CI has no network, and a toast covers the page), no
# autosave, every cell attached to the DOM (windowing leaves off-screen outputs unrendered), the kernel
# started without a dialog, and no blank space after the last cell (it would pad the full-page screenshot).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {
        "windowingMode": "none", "autoStartDefaultKernel": True, "scrollPastEnd": False},
}


@dataclass
class LabServer:
    base_url: str
    token: str
    root_dir: Path
    log_path: Path
    runtime_dir: Path | None = None  # the server's JUPYTER_RUNTIME_DIR (its browser-open files)

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}?token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def opened_url(self) -> str:
        """The URL the server hands the learner's web browser (`workbook.py lab` without --no-browser opens it):
        read from the browser-open file it writes for the notebook it was started with."""
        pages = sorted(self.runtime_dir.glob("jpserver-file-to-run-*-open.html"))
        assert pages, f"no browser-open file for a notebook in {self.runtime_dir}:\n{self.log_tail()}"
        found = re.search(r'url=([^"]+)"', pages[-1].read_text())
        assert found, pages[-1].read_text()
        return html.unescape(found.group(1))


def workbook():
    """workbook.py as a module: the learner's lab is started with its functions, not a copy of them."""
    spec = importlib.util.spec_from_file_location("fla_lab_workbook_browser", REPO / "workbook.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def missing_piece() -> str | None:
    """What the browser test lacks here, if anything: Chromium, Playwright or JupyterLab."""
    import importlib.util

    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: the browser test needs Debian's Chromium; {SETUP_HINT}"
    for module, name in (("playwright", "Playwright for Python"), ("jupyterlab", "JupyterLab")):
        if importlib.util.find_spec(module) is None:
            return f"{name} is missing from the venv; `python3 workbook.py setup` installs it"
    return None


def pytest_collection_modifyitems(config, items):
    """Skip the browser test when a piece is missing, unless tests/browser was named on the command line: the test
    command's browser phase (`pytest tests/browser`) must fail then, a plain `python -m pytest` (the `test` extra,
    without JupyterLab or Chromium) skips it."""
    here = Path(__file__).resolve().parent
    problem = missing_piece()
    named = any(here == p or here in p.parents for p in (Path(a.split("::")[0]).resolve() for a in config.args))
    if problem is None or named:
        return
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=f"{problem} (tests/browser not named: skipped)"))


def notebook_paths() -> list[Path]:
    """The notebooks under test, sorted."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def pytest_generate_tests(metafunc):
    if "notebook" in metafunc.fixturenames:
        metafunc.parametrize("notebook", notebook_paths(), ids=lambda path: path.stem)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(settings_dir: Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2))


def _prepare_tree(top: Path) -> Path:
    """Copy notebooks/ into `top`; a figures/ sibling keeps `../figures` writes in the copy."""
    root = top / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, root, symlinks=True, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (top / "figures").mkdir()
    return root


def _prepare_checkout(top: Path, wb) -> Path:
    """The checkout's layout under `top/checkout`, as a learner's clone has it when `workbook.py lab` starts: the
    reference notebooks/, the facilitator's docs/ (the guide with its answer keys) and the learner's edition built
    from those notebooks as `python -m fla_lab edition` builds it. Returns the folder the lab serves,
    `workbook.lab_root` of that checkout."""
    from fla_lab.teaching import edition

    checkout = top / "checkout"
    shutil.copytree(NOTEBOOK_DIR, checkout / "notebooks", symlinks=True,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(REPO / "docs", checkout / "docs")
    (checkout / "figures").mkdir()
    root = wb.lab_root(checkout)
    edition.build(root, notebooks=edition.sources(NOTEBOOK_DIR))  # its figures from the repository's figures/
    return root


def _server_env(top: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        path = top / name.lower()
        path.mkdir()
        env[name] = str(path)
    env.pop("JUPYTER_PATH", None)  # kernels and lab extensions come from the venv (sys.prefix)
    env["FLA_LAB_FIGURES_DIR"] = str(top / "figures")  # fla_lab.tools.viz.save: keep the repo's figures/ as is
    return env


def _server_command(port: int, token: str, root_args: list[str], top: Path) -> list[str]:
    """JupyterLab on `port`; `root_args` say where it listens (127.0.0.1) and what it serves (`--ServerApp.root_dir`,
    or workbook.py's `lab_arguments`: the learner's edition as root and the first notebook)."""
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        *root_args,
        f"--LabApp.workspaces_dir={top / 'workspaces'}",
        f"--LabApp.user_settings_dir={top / 'settings'}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",  # no PyPI queries from the extension manager
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: read the notebook model from the page
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def _status_ok(server: LabServer) -> bool:
    try:
        with urllib.request.urlopen(server.url("/api/status"), timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_up(proc: subprocess.Popen, server: LabServer) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{server.log_tail()}")
        if _status_ok(server):
            return
        time.sleep(0.5)
    pytest.fail(f"JupyterLab not up after {SERVER_START_TIMEOUT_S} s:\n{server.log_tail()}")


def _stop(proc: subprocess.Popen, server: LabServer) -> None:
    """Ask the server to shut down (it stops its kernels), then SIGTERM, then SIGKILL, all by its PID."""
    if proc.poll() is None:
        request = urllib.request.Request(server.url("/api/shutdown"), method="POST")
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except (urllib.error.URLError, OSError):
            pass
    for escalate in (lambda: None, proc.terminate, proc.kill):
        if proc.poll() is None:
            escalate()
        try:
            proc.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            continue


def _serve(top: Path, root: Path, root_args: list[str], env: dict[str, str], cwd: Path) -> Iterator[LabServer]:
    _write_settings(top / "settings")
    (top / "workspaces").mkdir()
    port, token = _free_port(), secrets.token_hex(24)
    server = LabServer(f"http://127.0.0.1:{port}", token, root, top / "server.log", Path(env["JUPYTER_RUNTIME_DIR"]))
    with server.log_path.open("wb") as log:
        proc = subprocess.Popen(_server_command(port, token, root_args, top), cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_until_up(proc, server)
        yield server
    finally:
        _stop(proc, server)


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory) -> Iterator[LabServer]:
    """The reference notebooks' server (a copy of notebooks/ as its root)."""
    top = tmp_path_factory.mktemp("jupyterlab")
    root = _prepare_tree(top)
    yield from _serve(top, root, ["--ip=127.0.0.1", f"--ServerApp.root_dir={root}"], _server_env(top), cwd=top)


@pytest.fixture(scope="session")
def learner_lab(tmp_path_factory) -> Iterator[LabServer]:
    """The learner's lab: rooted, opened and set up by workbook.py's `lab_root`, `lab_arguments` and `lab_env` (the
    learner's figures in the edition's figures/), on a copy of the checkout's layout."""
    wb = workbook()
    top = tmp_path_factory.mktemp("learner-lab")
    root = _prepare_checkout(top, wb)
    env = wb.lab_env(_server_env(top), root=root)
    yield from _serve(top, root, wb.lab_arguments(root), env, cwd=root.parent)


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's Chromium; {SETUP_HINT}.")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing from the venv; `python3 workbook.py setup` installs it.")
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        playwright.stop()
