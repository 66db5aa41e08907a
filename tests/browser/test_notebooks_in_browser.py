"""Every notebook runs top to bottom in JupyterLab in a real browser, and its widgets render.

nbval checks outputs without a browser; this test checks what a reader sees: Run All in JupyterLab (headless
Chromium driven by Playwright) must finish without an error output, except in cells tagged
`raises-exception`, and every widget view in the outputs must be rendered in the page. A full-page
screenshot per notebook goes to artifacts/browser/<notebook>.png.

Then the explorers are driven like a reader would: in every `interact`/`interactive` explorer on the page (found
by its rendered view, `.widget-interact`, not by cell index), one control is moved in the browser (a dtype
dropdown gets another option, else a decay/magnitude slider moves one step with the keyboard, else the first
dropdown or slider), the explorer's own button is clicked when it has one (`interact_manual`), and the explorer's
output (figure image or text) must change, with no error. A screenshot of each explorer after the change goes to
artifacts/browser/<notebook>-widget.png (-widget-2.png, ... for further explorers).

Last, the learner's lab, started as `python3 workbook.py lab` starts it (workbook.py's root, arguments and
environment; conftest.py's `learner_lab`): the page the server hands the learner's browser opens 00, and the file
browser, like the contents API behind it, lists the learner's copies and nothing of the reference notebooks/ or the
facilitator's docs/ (the answer keys), which lie beside the edition in the checkout; then a learner notebook (no
outputs, no solutions) is opened, the cells up to its first exercise check run with the stub in place, and the check
must say NOT YET, and `verdict.hint()` must print the first hint tier.

Set FLA_LAB_BROWSER_NOTEBOOKS to run it on another folder of notebooks, FLA_LAB_BROWSER_TIMEOUT (seconds, per
notebook) to change the execution time limit, FLA_LAB_BROWSER_WIDGET_TIMEOUT (seconds, per explorer) the time an
explorer may take to redraw.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest


REPO = Path(__file__).resolve().parents[2]
EXECUTION_TIMEOUT_S = float(os.environ.get("FLA_LAB_BROWSER_TIMEOUT", 600))
OPEN_TIMEOUT_MS = 180_000  # page load + kernel start on a busy 2-core machine
WIDGET_RENDER_TIMEOUT_MS = 30_000
# An explorer's redraw runs kernels under the Triton interpreter on a busy 2-core machine.
EXPLORER_TIMEOUT_S = float(os.environ.get("FLA_LAB_BROWSER_WIDGET_TIMEOUT", 300))
EXPLORER_SETTLED_S = 2.0  # the changed output must hold this long with the kernel idle
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ARTIFACTS = REPO / "artifacts" / "browser"
MAX_SCREENSHOT_HEIGHT = 16_000  # Chromium's largest capture

# Page-side helpers, defined once per page. `panel(path)` is the open notebook for that path.
JS_HELPERS = """
window.__fla = {
  panel(path) {
    const app = window.jupyterapp;
    if (!app || !app.shell) return null;
    for (const w of app.shell.widgets('main')) {
      if (w.context && w.context.path === path && w.content && w.sessionContext) return w;
    }
    return null;
  },
  kernel(path) {
    const p = this.panel(path);
    return p && p.sessionContext.session ? p.sessionContext.session.kernel : null;
  },
  pendingCells(path) {
    const pending = [];
    this.panel(path).content.widgets.forEach((cell, i) => {
      if (cell.model.type !== 'code') return;
      const prompt = cell.node.querySelector('.jp-InputPrompt');
      if (cell.model.executionState === 'running' || (prompt && prompt.textContent.includes('*')))
        pending.push(i);
    });
    return pending;
  },
};
"""

JS_KERNEL_READY = """(path) => {
  const p = window.__fla.panel(path), k = window.__fla.kernel(path);
  return !!(p && p.context.isReady && k && k.connectionStatus === 'connected' && k.status === 'idle');
}"""

JS_RUN_ALL = """async (path) => {
  const app = window.jupyterapp, p = window.__fla.panel(path);
  app.shell.activateById(p.id);
  app.shell.collapseLeft();
  window.__flaRun = {done: false};
  window.__flaKernelTrouble = null;  // a kernel death is followed by an auto-restart: remember it
  p.sessionContext.statusChanged.connect((_, status) => {
    if (['dead', 'autorestarting', 'restarting'].includes(status)) window.__flaKernelTrouble = status;
  });
  // Widgets the kernel closed on purpose (tqdm bars with leave=False, w.close()) leave an empty output.
  window.__flaClosedWidgets = new Set();
  p.sessionContext.iopubMessage.connect((_, msg) => {
    if (msg.header.msg_type === 'comm_close') window.__flaClosedWidgets.add(msg.content.comm_id);
  });
  // The command's promise settles when the last queued cell has finished (or the queue was cleared).
  app.commands.execute('notebook:run-all-cells').then(
    ok => { window.__flaRun = {done: true, ok}; },
    err => { window.__flaRun = {done: true, ok: false, error: String(err)}; });
}"""

JS_PROGRESS = """(path) => {
  const k = window.__fla.kernel(path);
  return {run: window.__flaRun, trouble: window.__flaKernelTrouble, kernel: k ? k.status : 'none',
          connection: k ? k.connectionStatus : 'none', pending: window.__fla.pendingCells(path)};
}"""

JS_MODEL = "(path) => window.__fla.panel(path).context.model.toJSON()"

# For one cell: each output holding a widget view, whether a widget view was attached to its node, whether
# the kernel closed that widget, and its text (a failed render leaves only a text such as "Error displaying
# widget: model not found"). Output area children map one to one onto the model's outputs; nested output
# areas (interact's Output) are not counted.
JS_WIDGET_OUTPUTS = """([path, index, mime]) => {
  const cell = window.__fla.panel(path).content.widgets[index];
  const found = [];
  cell.outputArea.widgets.forEach((child, j) => {
    const output = j < cell.model.outputs.length ? cell.model.outputs.get(j) : null;
    if (!output || !(mime in (output.data || {}))) return;
    const node = child.node;
    found.push({
      output: j,
      closed: window.__flaClosedWidgets.has(output.data[mime].model_id),
      rendered: !!node.querySelector('.jupyter-widgets[class*="widget-"]')
                && !node.textContent.includes('Error displaying widget'),
      text: node.textContent.trim().slice(0, 200)});
  });
  return found;
}"""

# Growing the viewport by the notebook's hidden scroll height lets a full-page screenshot show every cell
# (JupyterLab scrolls inside its own panel, so full_page alone captures one screen).
JS_CONTENT_HEIGHT = """(path) => {
  const scroller = window.__fla.panel(path).content.node.querySelector('.jp-WindowedPanel-outer');
  return Math.ceil(window.innerHeight + scroller.scrollHeight - scroller.clientHeight + 20);
}"""


# Explorers: every rendered `interactive` view (ipywidgets gives its VBox the class widget-interact) that is not
# nested in another one. Each gets a data-fla-explorer index so Playwright can address it. For explorer i, the
# control to move is chosen and marked data-fla-control: a dtype dropdown, else a slider whose label names a
# decay or magnitude, else another dropdown naming one, else the first dropdown, else the first slider.
JS_EXPLORERS = """(path) => {
  const root = window.__fla.panel(path).content.node;
  const found = Array.from(root.querySelectorAll('.widget-interact'))
    .filter(node => !node.parentElement.closest('.widget-interact'));
  return found.map((node, i) => {
    node.setAttribute('data-fla-explorer', String(i));
    const cell = node.closest('.jp-CodeCell');
    const cells = Array.from(root.querySelectorAll('.jp-Cell'));
    return {index: i, cell: cells.indexOf(cell)};
  });
}"""

JS_PICK_CONTROL = """(i) => {
  const node = document.querySelector(`[data-fla-explorer="${i}"]`);
  const kids = Array.from(node.children);
  const label = el => { const l = el.querySelector('.widget-label'); return l ? l.textContent.trim() : ''; };
  const drops = kids.filter(c => c.classList.contains('widget-dropdown') && c.querySelector('select'));
  const sliders = kids.filter(c => c.classList.contains('widget-hslider') && c.querySelector('.noUi-handle'));
  const dtype = /dtype/i, decay = /decay|magnitude|\\|w\\|/i;
  const control = drops.find(c => dtype.test(label(c))) || sliders.find(c => decay.test(label(c)))
    || drops.find(c => decay.test(label(c))) || drops[0] || sliders[0];
  const button = kids.find(c => c.matches('button.widget-button, .widget-button'));
  document.querySelectorAll('[data-fla-control]').forEach(c => c.removeAttribute('data-fla-control'));
  if (!control) return {kind: 'none', labels: kids.map(label), button: !!button};
  control.setAttribute('data-fla-control', String(i));
  if (control.classList.contains('widget-dropdown')) {
    const select = control.querySelector('select');
    return {kind: 'dropdown', label: label(control), index: select.selectedIndex,
            options: Array.from(select.options).map(o => o.textContent.replace(/\u00a0/g, ' ')), button: !!button};
  }
  const handle = control.querySelector('.noUi-handle');
  const readout = control.querySelector('.widget-readout');
  return {kind: 'slider', label: label(control), readout: readout ? readout.textContent.trim() : '',
          now: parseFloat(handle.getAttribute('aria-valuenow')), max: parseFloat(handle.getAttribute('aria-valuemax')),
          button: !!button};
}"""

# What the explorer shows: its Output widget's text and a hash of each image's src, plus whether its button
# (interact_manual) is enabled again, i.e. the callback returned.
JS_EXPLORER_OUTPUT = """(i) => {
  const node = document.querySelector(`[data-fla-explorer="${i}"]`);
  const out = Array.from(node.children).find(c => c.classList.contains('widget-output'));
  const hash = s => { let h = 5381; for (let k = 0; k < s.length; k++) h = (h * 33 + s.charCodeAt(k)) | 0;
                      return (h >>> 0).toString(16) + ':' + s.length; };
  const images = out ? Array.from(out.querySelectorAll('img')).map(img => hash(img.getAttribute('src') || '')) : [];
  const text = out ? out.textContent.trim() : '';
  const button = Array.from(node.children).find(c => c.matches('button.widget-button, .widget-button'));
  return {images, text: text.slice(0, 2000), busy: !!(button && button.disabled),
          signature: images.join(',') + '|' + text};
}"""

JS_CONTROL_VALUE = """(i) => {
  const c = document.querySelector(`[data-fla-control="${i}"]`);
  if (!c) return '';
  const select = c.querySelector('select'), readout = c.querySelector('.widget-readout');
  const option = select ? select.options[select.selectedIndex] : null;
  const text = select ? (option ? option.textContent : '') : (readout ? readout.textContent : '');
  return text.replace(/\u00a0/g, ' ').trim();
}"""

def _cell_tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def error_outputs(notebook: dict) -> list[str]:
    """'cell i: Ename: evalue' for each error output outside cells tagged raises-exception."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code" or "raises-exception" in _cell_tags(cell):
            continue
        for out in cell.get("outputs", []):
            if out["output_type"] == "error":
                found.append(f"cell {index}: {out['ename']}: {out['evalue']}")
    return found


def unexecuted_cells(notebook: dict) -> list[int]:
    """Non-empty code cells without an execution count (Run All stopped before them)."""
    return [i for i, cell in enumerate(notebook["cells"])
            if cell["cell_type"] == "code" and "".join(cell["source"]).strip()
            and cell.get("execution_count") is None]


def widget_cells(notebook: dict) -> dict[int, int]:
    """Cell index -> number of widget-view outputs it holds."""
    counts = {}
    for index, cell in enumerate(notebook["cells"]):
        n = sum(WIDGET_MIME in out.get("data", {}) for out in cell.get("outputs", []))
        if n:
            counts[index] = n
    return counts


def describe_cells(notebook: dict, indices: list[int]) -> str:
    heads = ("".join(notebook["cells"][i]["source"]).strip().splitlines()[0][:80] for i in indices)
    return "; ".join(f"cell {i} ({head})" for i, head in zip(indices, heads)) or "none"


def open_notebook(page, lab_server, name: str) -> None:
    page.goto(lab_server.url(f"/lab/tree/{quote(name)}"))
    page.wait_for_function("() => !!(window.jupyterapp && window.jupyterapp.shell)", timeout=OPEN_TIMEOUT_MS)
    page.evaluate(JS_HELPERS)
    # Run All sent before the kernel exists is lost: wait for a connected, idle kernel first.
    page.wait_for_function(JS_KERNEL_READY, arg=name, timeout=OPEN_TIMEOUT_MS, polling=500)


SETTLED_FOR_S = 5.0  # Run All's promise can settle early (a reply with status 'error' from a cell tagged
# raises-exception) while later cells still wait in the kernel's queue and the kernel looks idle between two
# cells: the finished state must hold this long before it counts.


def run_all_and_wait(page, name: str) -> dict:
    """Run All, then wait until it settled, the kernel is idle and no cell is queued or running, for a while."""
    page.evaluate(JS_RUN_ALL, name)
    deadline = time.monotonic() + EXECUTION_TIMEOUT_S
    settled_since = None
    while True:
        state = page.evaluate(JS_PROGRESS, name)
        if state["trouble"] or state["connection"] == "disconnected":
            model = page.evaluate(JS_MODEL, name)
            pytest.fail(f"{name}: the kernel died or restarted during Run All (status {state['trouble']}, "
                        f"connection {state['connection']}); cells left without a result: "
                        + describe_cells(model, unexecuted_cells(model)))
        if state["run"]["done"] and state["kernel"] == "idle" and not state["pending"]:
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since >= SETTLED_FOR_S:
                return state
        else:
            settled_since = None
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: not finished after {EXECUTION_TIMEOUT_S:.0f} s; "
                        f"running/queued cells {state['pending']}, kernel {state['kernel']}")
        time.sleep(1)


def unrendered_widgets(page, name: str, expected: dict[int, int]) -> list[str]:
    """Wait (bounded) for every widget view to render; describe those that did not."""
    def missing() -> list[str]:
        problems = []
        for index, count in expected.items():
            nodes = page.evaluate(JS_WIDGET_OUTPUTS, [name, index, WIDGET_MIME])
            bad = [f"output {n['output']}: {n['text'] or '<empty>'!r}" for n in nodes
                   if not (n["rendered"] or n["closed"])]
            if len(nodes) != count or bad:
                problems.append(f"cell {index}: {count} widget view(s) in the model, {len(nodes)} in the "
                                f"page; not rendered: {bad}")
        return problems

    deadline = time.monotonic() + WIDGET_RENDER_TIMEOUT_MS / 1000
    while (problems := missing()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return problems


def save_screenshot(page, name: str) -> Path:
    height = min(page.evaluate(JS_CONTENT_HEIGHT, name), MAX_SCREENSHOT_HEIGHT)
    page.set_viewport_size({"width": 1280, "height": max(height, 800)})
    page.wait_for_timeout(500)  # let Lumino re-lay out after the resize
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{Path(name).stem}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def save_screenshot_quietly(page, name: str) -> None:
    """Best-effort screenshot of a failed run: the failure itself is what gets reported."""
    try:
        save_screenshot(page, name)
    except Exception:
        pass


def shutdown_kernel_and_close(page, name: str) -> None:
    """Free the kernel's CPU and memory before the next notebook (the server would stop it at the end)."""
    try:
        page.evaluate("(path) => { const p = window.__fla.panel(path); "
                      "return p ? p.sessionContext.shutdown() : null; }", name)
    except Exception:
        pass
    page.close()


def _explorer_shot_path(name: str, index: int) -> Path:
    suffix = "" if index == 0 else f"-{index + 1}"
    return ARTIFACTS / f"{Path(name).stem}-widget{suffix}.png"


def _move_control(page, index: int, control: dict) -> str:
    """Move the marked control of explorer `index` through the page, as a reader would; say what was done."""
    marked = f'[data-fla-control="{index}"]'
    if control["kind"] == "dropdown":
        target = (control["index"] + 1) % len(control["options"])
        page.locator(f"{marked} select").select_option(index=target)
        return f"selected {control['options'][target]!r}"
    key = "ArrowRight" if control["now"] < control["max"] else "ArrowLeft"
    page.locator(f"{marked} .noUi-handle").press(key)  # focuses the handle, then one keyboard step
    return f"pressed {key} on the slider"


def _wait_for_new_output(page, name: str, index: int, before: dict) -> tuple[dict | None, dict]:
    """Poll until the explorer's output differs from `before`, its callback returned and the kernel stayed idle."""
    deadline = time.monotonic() + EXPLORER_TIMEOUT_S
    settled_since = None
    while True:
        now = page.evaluate(JS_EXPLORER_OUTPUT, index)
        state = page.evaluate(JS_PROGRESS, name)
        if state["trouble"] or state["connection"] == "disconnected":
            return None, {**now, "trouble": f"kernel {state['trouble'] or state['connection']}"}
        fresh = now["signature"] != before["signature"] and (now["images"] or now["text"])
        if fresh and not now["busy"] and state["kernel"] == "idle":
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since >= EXPLORER_SETTLED_S:
                return now, now
        else:
            settled_since = None
        if time.monotonic() > deadline:
            return None, now
        time.sleep(0.5)


def drive_explorers(page, name: str) -> list[dict]:
    """In every explorer on the page, move one control in the browser and wait for the output to change.

    Returns one record per explorer: the control, the values before and after, the output before and after
    (image hashes, text), the seconds the redraw took, the screenshot, and `problem` when it went wrong.
    """
    records = []
    for explorer in page.evaluate(JS_EXPLORERS, name):
        index = explorer["index"]
        record = {"explorer": index, "cell": explorer["cell"]}
        records.append(record)
        control = page.evaluate(JS_PICK_CONTROL, index)
        record["control"] = f"{control['kind']} {control.get('label', '')!r}"
        if control["kind"] == "none":
            record["problem"] = f"no dropdown or slider to move; labels {control['labels']}"
            continue
        before = page.evaluate(JS_EXPLORER_OUTPUT, index)
        record["before"] = page.evaluate(JS_CONTROL_VALUE, index)
        started = time.monotonic()
        record["action"] = _move_control(page, index, control)
        if control["button"]:  # interact_manual: nothing runs until its button is clicked
            page.locator(f'[data-fla-explorer="{index}"] > .widget-button').click()
            record["action"] += ", clicked the explorer's button"
        after, last = _wait_for_new_output(page, name, index, before)
        record["seconds"] = round(time.monotonic() - started, 1)
        record["after"] = page.evaluate(JS_CONTROL_VALUE, index)
        record["output"] = f"images {before['images']} -> {last['images']}"
        if not before["images"] and not last["images"]:
            record["output"] = f"text {before['text'][:60]!r} -> {last['text'][:60]!r}"
        shot = _explorer_shot_path(name, index)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.locator(f'[data-fla-explorer="{index}"]').screenshot(path=str(shot))
        record["screenshot"] = str(shot.relative_to(REPO))
        if after is None:
            record["problem"] = (f"output unchanged after {record['seconds']} s ({last.get('trouble', 'timeout')}; "
                                 f"{record['before']!r} -> {record['after']!r})")
        elif "Traceback (most recent call last)" in after["text"]:
            record["problem"] = "the redraw raised: " + after["text"][-300:]
        elif record["after"] == record["before"]:
            record["problem"] = f"the control still reads {record['after']!r}"
    return records


def describe_explorer(record: dict) -> str:
    return (f"explorer {record['explorer']} (cell {record['cell']}): {record['control']} "
            f"{record.get('before')!r} -> {record.get('after')!r} ({record.get('action')}); "
            f"{record.get('output')} in {record.get('seconds')} s; {record.get('screenshot')}")

def test_notebook_runs_in_jupyterlab(notebook: Path, browser, lab_server, record_property):
    """`notebook` is parametrised in conftest.py: one test per notebook, sorted. The test command runs them on two
    workers (pytest-xdist), each with its own server and browser (conftest.py's session fixtures)."""
    name = notebook.name
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page_errors = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    started = time.monotonic()
    try:
        open_notebook(page, lab_server, name)
        run_all_and_wait(page, name)
        model = page.evaluate(JS_MODEL, name)
        widgets = unrendered_widgets(page, name, widget_cells(model))
        shot = save_screenshot(page, name)
        explorers = [] if widgets else drive_explorers(page, name)
        model = page.evaluate(JS_MODEL, name)  # an explorer's callback error would show in its cell
    except BaseException:  # pytest.fail raises an OutcomeException
        save_screenshot_quietly(page, name)
        raise
    finally:
        shutdown_kernel_and_close(page, name)
    elapsed = time.monotonic() - started

    errors = error_outputs(model)
    assert not errors, f"{name}: error outputs (screenshot {shot}):\n" + "\n".join(errors)
    skipped = unexecuted_cells(model)
    assert not skipped, f"{name}: cells never executed: {describe_cells(model, skipped)}"
    assert not widgets, f"{name}: widgets not rendered (screenshot {shot}; page errors {page_errors}):\n" + \
        "\n".join(widgets)
    for record in explorers:
        print(f"{name}: {describe_explorer(record)}")
        # kept in the junit report (artifacts/junit-browser.xml) on the notebook's test case, which pytest-xdist's
        # workers report back (a test-suite property would be lost there)
        record_property(f"{notebook.stem}-explorer-{record['explorer']}", describe_explorer(record))
    bad = [f"{describe_explorer(r)}: {r['problem']}" for r in explorers if "problem" in r]
    assert not bad, f"{name}: an explorer did not respond in the browser:\n" + "\n".join(bad)
    print(f"{name}: ran in JupyterLab in {elapsed:.0f} s; screenshot {shot.relative_to(REPO)}")


LEARNER_NOTEBOOK = os.environ.get("FLA_LAB_BROWSER_LEARNER", "04_backward_fails_with_initial_state.ipynb")

# Runs the cells above `index`, then `index` itself, then a new cell below it with `extra` (the learner asking for
# a hint), as a learner would: Shift+Enter down to the check.
JS_RUN_TO_CHECK = """async ([path, index, extra]) => {
  const app = window.jupyterapp, p = window.__fla.panel(path);
  app.shell.activateById(p.id);
  window.__flaRun = {done: false};
  window.__flaKernelTrouble = null;
  try {
    p.content.activeCellIndex = index;
    await app.commands.execute('notebook:run-all-above');
    p.content.activeCellIndex = index;
    await app.commands.execute('notebook:run-cell');
    p.content.activeCellIndex = index;
    await app.commands.execute('notebook:insert-cell-below');
    p.content.activeCell.model.sharedModel.setSource(extra);
    await app.commands.execute('notebook:run-cell');
    window.__flaRun = {done: true, ok: true};
  } catch (err) { window.__flaRun = {done: true, ok: false, error: String(err)}; }
}"""


def cell_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        text = out.get("text", out.get("data", {}).get("text/plain", ""))
        parts.append("".join(text) if isinstance(text, list) else text)
        if out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "".join(parts)


def first_check_cell(notebook: dict) -> int:
    for index, cell in enumerate(notebook["cells"]):
        if "check" in _cell_tags(cell):
            return index
    pytest.fail("the learner notebook has no cell tagged `check`")


# The learner's file browser: the names it lists once its listing has loaded, and the folder it shows ('' = the root).
JS_FILE_BROWSER = """async () => {
  const app = window.jupyterapp;
  await app.commands.execute('filebrowser:activate');
  const listing = document.querySelector('#filebrowser .jp-DirListing-content');
  const names = listing ? Array.from(listing.querySelectorAll('.jp-DirListing-item .jp-DirListing-itemText'))
    .map(n => n.textContent.trim()) : [];
  const crumbs = document.querySelector('#filebrowser .jp-BreadCrumbs');
  return {names, crumbs: crumbs ? crumbs.textContent.trim() : null};
}"""


def api_get(server, path: str) -> tuple[int, dict | None]:
    """(HTTP status, JSON body or None) of GET `path` on `server`'s REST API."""
    try:
        with urllib.request.urlopen(server.url(path), timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, None


@pytest.mark.xdist_group("learner_lab")  # one worker starts the learner's lab, for both learner tests
def test_learner_file_browser_shows_the_learner_copies_only(browser, learner_lab):
    """The learner's lab lists the learner's copies, and neither the reference notebooks nor the guide: notebooks/
    and docs/ exist beside the edition in the checkout, and neither the file browser nor the contents API reaches
    them."""
    from fla_lab.teaching import edition

    checkout = learner_lab.root_dir.parent
    assert (checkout / "notebooks").is_dir() and (checkout / "docs" / "onboarding.md").is_file()  # beside it
    copies = {p.name for p in edition.sources(checkout / "notebooks")}  # one learner copy per reference notebook
    status, root = api_get(learner_lab, "/api/contents")
    assert status == 200, status
    served = {item["name"] for item in root["content"]}
    assert copies <= served, f"learner copies missing from the lab's root: {sorted(copies - served)}"
    assert not served & {"notebooks", "docs", "README.md", "workbook.py", "learner"}, sorted(served)
    assert {n for n in served if not n.startswith(".")} <= copies | {"figures"}, sorted(served)
    for outside in ("notebooks", "docs/onboarding.md", "../notebooks", "../docs/onboarding.md",
                    "%2E%2E/docs/onboarding.md", f"../notebooks/{LEARNER_NOTEBOOK}"):
        status, body = api_get(learner_lab, f"/api/contents/{outside}")
        assert status != 200, f"/api/contents/{outside} answered {status}: {str(body)[:200]}"
    for figure in {f.name for p in edition.sources(checkout / "notebooks") for f in edition.repo_figures(p)}:
        status, _ = api_get(learner_lab, f"/api/contents/figures/{figure}")  # a copy's image link
        assert status == 200, f"figures/{figure}, which a learner copy shows, is not in the lab ({status})"

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    start = learner_lab.opened_url()  # the page `workbook.py lab` opens in the learner's browser
    opened = start.split("?")[0].split("/lab/tree/", 1)[-1]
    try:
        assert opened == "00_start_here.ipynb", start
        page.goto(start)
        page.wait_for_function("() => !!(window.jupyterapp && window.jupyterapp.shell)", timeout=OPEN_TIMEOUT_MS)
        page.evaluate(JS_HELPERS)
        page.wait_for_function("(path) => { const p = window.__fla.panel(path); return !!(p && p.context.isReady); }",
                               arg=opened, timeout=OPEN_TIMEOUT_MS)
        deadline = time.monotonic() + OPEN_TIMEOUT_MS / 1000
        while not copies <= set((listing := page.evaluate(JS_FILE_BROWSER))["names"]):
            assert time.monotonic() < deadline, f"the file browser lists {listing}, not the learner's copies"
            time.sleep(0.5)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "learner-file-browser.png"))
    finally:
        shutdown_kernel_and_close(page, opened)
    names = set(listing["names"])
    assert not names & {"notebooks", "docs", "onboarding.md", "README.md", "learner"}, sorted(names)
    assert names <= copies | {"figures"}, sorted(names - copies)
    print(f"learner's file browser ({learner_lab.root_dir}): {sorted(names)}")


@pytest.mark.xdist_group("learner_lab")  # one worker starts the learner's lab, for both learner tests
def test_learner_edition_check_says_not_yet_with_the_stub(browser, learner_lab):
    name = LEARNER_NOTEBOOK
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        open_notebook(page, learner_lab, name)
        model = page.evaluate(JS_MODEL, name)
        assert not any(cell.get("outputs") for cell in model["cells"] if cell["cell_type"] == "code"), \
            f"{name}: the learner's edition opened with saved outputs"
        assert not any("solution" in _cell_tags(cell) for cell in model["cells"]), f"{name}: a solution cell"
        index = first_check_cell(model)
        page.evaluate(JS_RUN_TO_CHECK, [name, index, "verdict.hint()"])
        deadline = time.monotonic() + EXECUTION_TIMEOUT_S
        while not (page.evaluate(JS_PROGRESS, name)["run"]["done"]
                   and page.evaluate(JS_PROGRESS, name)["kernel"] == "idle"):
            assert time.monotonic() < deadline, f"{name}: the cells up to the check did not finish"
            time.sleep(1)
        model = page.evaluate(JS_MODEL, name)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "learner-check.png"))
    finally:
        shutdown_kernel_and_close(page, name)
    assert not error_outputs({"cells": model["cells"][:index + 2]}), error_outputs(model)
    verdict, hint = cell_text(model["cells"][index]), cell_text(model["cells"][index + 1])
    assert "NOT YET" in verdict and "PASS" not in verdict, f"{name}: the stub's check printed {verdict!r}"
    assert hint.startswith("hint 1 of "), f"{name}: verdict.hint() printed {hint!r}"
