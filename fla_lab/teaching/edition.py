"""The learner's edition: the notebooks a learner opens, generated from the tracked ones.

The tracked notebooks in `notebooks/` are the reference: saved outputs (nbval compares them), solutions, answers.
A learner opens generated copies in `learner/` (ignored by git) with every output cleared and every cell tagged
`solution` removed, so no answer is on screen before its question and a learner's edits never touch the files
nbval compares. Built with nbconvert's own preprocessors (`TagRemovePreprocessor`, `ClearOutputPreprocessor`).

A copy is written on first use and refreshed when its notebook changes, but never overwritten once the learner
has edited it (a manifest records the hash of what was written); `reset` regenerates one on request, keeping the
edited copy beside it as `<name>.ipynb.bak`.

    python -m fla_lab edition            # build or refresh learner/ (edited copies are kept)
    python -m fla_lab edition --reset 03a  # regenerate one notebook (prefix or file name)

A kernel serving the learner's edition is a learner's session (`learner_session()`): there the bug catalogue keeps an
exercise's fixed line sealed until its check says PASS or its last hint tier is printed (`fla_lab.teaching.bugs`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from fla_lab.teaching.exercises import REVEAL_TAG, SOLUTION_TAG, lock

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LEARNER = ROOT / "learner"
MANIFEST = ".edition.json"
BANNER_TAG = "learner-banner"
SESSION_ENV = "FLA_LAB_EDITION"  # "learner": `workbook.py lab` sets it for the learner's lab; "reference" turns it off


_SESSION: bool | None = None  # the first answer of `learner_session()` in this process, held from then on


def learner_session() -> bool:
    """Whether this process serves the learner's edition: FLA_LAB_EDITION=learner (the environment `workbook.py lab`
    starts JupyterLab and its kernels with), or, when FLA_LAB_EDITION is unset, a working directory that holds the
    edition's manifest (a kernel started on a notebook of `learner/`, whatever started it).

    The first answer in a process holds (latched): setting `os.environ["FLA_LAB_EDITION"] = "reference"` or changing
    directory inside a learner's kernel later does not unseal the catalogue. `reset_session()` forgets it (tests
    switching modes; a facilitator restarts the kernel instead)."""
    global _SESSION
    if _SESSION is None:
        _SESSION = _session_now()
    return _SESSION


def reset_session() -> None:
    """Forget the latched answer of `learner_session()`: the next call reads the environment and directory again."""
    global _SESSION
    _SESSION = None


def _session_now() -> bool:
    value = os.environ.get(SESSION_ENV, "").strip().lower()
    if value:
        return value == "learner"
    try:
        return (Path.cwd() / MANIFEST).is_file()
    except OSError:  # the working directory is gone
        return False


def sources(folder: Path = NOTEBOOKS) -> list[Path]:
    """The tracked notebooks."""
    return sorted(folder.glob("[0-9][0-9]*_*.ipynb"))


GOING_FURTHER = re.compile(r"^## Going further", re.M)
# An image a notebook's markdown shows from the repository's figures/ (`../figures/atlas_gpu.png`). JupyterLab is
# rooted at the learner's edition (`workbook.py lab`), where `../` leads out of the server's reach: the learner's copy
# links `figures/NAME` instead, and `build` copies the image into the edition's figures/.
REPO_FIGURE = re.compile(r"\.\./figures/([\w.-]+\.(?:png|svg|jpe?g|gif))")
COMMENT = re.compile(r"<!--.*?-->", re.S)


def markdown_words(path: Path) -> tuple[int, int]:
    """Words a reader reads in the markdown of notebook `path`: before its `## Going further` heading (the main path,
    what the agendas time) and after it (the heading's own words not counted). HTML comments, which render as
    nothing (the prose checker's constants lists), are not words."""
    main = further = 0
    after = False
    for cell in json.loads(Path(path).read_text())["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        parts = GOING_FURTHER.split(COMMENT.sub(" ", "".join(cell["source"])), maxsplit=1)
        if after:
            further += len(parts[0].split())
            continue
        main += len(parts[0].split())
        if len(parts) > 1:
            after = True
            further += len(parts[1].split())
    return main, further


def banner(name: str) -> str:
    return (f"*Your copy of `{name}`: edit and run it freely. No outputs are saved here and the solutions are not in "
            f"it; every check tells you PASS or NOT YET, and `verdict.hint()` gives hints in tiers. "
            f"`python3 workbook.py reset {name.split('_')[0]}` restores the original (your version is kept as "
            f"`.bak`).*")


def _exporter():
    from nbconvert.exporters import NotebookExporter
    from traitlets.config import Config

    c = Config()
    # NotebookExporter runs these only when enabled explicitly (nbconvert #764): without it they do nothing
    c.TagRemovePreprocessor.enabled = True
    c.TagRemovePreprocessor.remove_cell_tags = {SOLUTION_TAG}
    c.ClearOutputPreprocessor.enabled = True
    c.NotebookExporter.preprocessors = ["nbconvert.preprocessors.TagRemovePreprocessor",
                                        "nbconvert.preprocessors.ClearOutputPreprocessor"]
    return NotebookExporter(config=c)


def learner_copy(path: Path) -> str:
    """The learner's edition of one notebook, as notebook JSON text."""
    import nbformat

    body, _ = _exporter().from_filename(str(path))
    nb = nbformat.reads(body, as_version=4)
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("jupyter", None)  # nothing left to hide: solutions are gone, not collapsed
        cell.metadata.pop("collapsed", None)
        if cell.cell_type == "markdown":
            cell.source = REPO_FIGURE.sub(r"figures/\1", cell.source)
        if REVEAL_TAG in cell.metadata.get("tags", []):
            nb.cells[i] = behind_the_gate(cell)
    head = nbformat.v4.new_markdown_cell(banner(path.name), metadata={"tags": [BANNER_TAG]})
    head.id = BANNER_TAG
    nb.cells.insert(0, head)
    nb.metadata.pop("widgets", None)  # saved widget state of the reference run
    return nbformat.writes(nb) + "\n"


def behind_the_gate(cell):
    """A cell tagged `reveal` shows the fix after an exercise's check. Its code starts with `verdict.reveal()`,
    which raises until the check passed or the hints ran out, so Run All stops there; its markdown (the fix in
    words) becomes such a gate too, the text locked (`exercises.lock`: not plain base64, which one decode would open)
    and displayed once the gate opens. `raises-exception`
    lets a headless run (nbclient, the edition's test) go on past it."""
    import nbformat

    tags = [*cell.metadata["tags"], "raises-exception"]
    if cell.cell_type == "markdown":
        source = (f'verdict.reveal(explain="{lock(cell.source)}")  # the fix in words: shown once your check says '
                  "PASS, or after verdict.hint()'s last tier")
        gate = nbformat.v4.new_code_cell(source, metadata={**cell.metadata, "tags": tags})
        gate.id = cell.id
        return gate
    cell.metadata["tags"] = tags
    return cell


def repo_figures(path: Path) -> list[Path]:
    """The images of the repository's figures/ that notebook `path`'s markdown shows (`../figures/NAME`), as files
    beside its folder; `build` copies them into the learner's edition, whose copies link them as `figures/NAME`."""
    folder = Path(path).resolve().parent.parent / "figures"
    names = {name for cell in json.loads(Path(path).read_text())["cells"] if cell["cell_type"] == "markdown"
             for name in REPO_FIGURE.findall("".join(cell["source"]))}
    return [folder / name for name in sorted(names)]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Outcome:
    name: str
    action: str  # "written", "refreshed", "unchanged", "kept (edited)", "reset"


def _load_manifest(dest: Path) -> dict:
    path = dest / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def build(dest: Path = LEARNER, notebooks: list[Path] | None = None, reset: list[str] = ()) -> list[Outcome]:
    """Write (or refresh) the learner's edition into `dest`. A copy whose hash differs from the one written last is
    the learner's work and is kept, unless its name is in `reset`."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "figures").mkdir(exist_ok=True)  # the learner's figures land here, never in the tracked figures/
    manifest = _load_manifest(dest)
    outcomes = []
    for src in notebooks or sources():
        for figure in repo_figures(src):  # what the copy's markdown shows, inside the edition (lab's root)
            if figure.is_file():
                shutil.copyfile(figure, dest / "figures" / figure.name)
        target = dest / src.name
        text = learner_copy(src)
        if target.exists():
            current = _digest(target.read_text())
            edited = current != manifest.get(src.name)
            if src.name in reset:
                if edited:
                    target.with_name(target.name + ".bak").write_text(target.read_text())
                action = "reset"
            elif edited:
                outcomes.append(Outcome(src.name, "kept (edited)"))
                continue
            else:
                action = "unchanged" if current == _digest(text) else "refreshed"
        else:
            action = "written"
        if action != "unchanged":
            target.write_text(text)
        manifest[src.name] = _digest(text)
        outcomes.append(Outcome(src.name, action))
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return outcomes


POLL_SLICE = 0.25  # seconds: the longest single wait on a kernel socket (see short_polls)


def short_polls(client) -> None:
    """Wait on the kernel's shell and iopub sockets in slices of POLL_SLICE seconds instead of one long poll.

    Seen on a GPU machine (Python 3.12, pyzmq 27.3, jupyter_client 8.10, nbclient 0.11) and once on a loaded
    2-core CPU machine: after a widget cell, the kernel's `execute_reply` sat in the shell socket while the client's
    single `poll(timeout)` never woke up, so it was read only when the cell's timeout ran out. Each short poll asks
    the socket again, so a missed wake-up costs at most one slice.
    """
    import time
    from queue import Empty

    for channel in (client.kc.shell_channel, client.kc.iopub_channel):
        original = channel.get_msg

        async def get_msg(timeout=None, _original=original):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = POLL_SLICE if deadline is None else min(POLL_SLICE, deadline - time.monotonic())
                try:
                    return await _original(timeout=max(left, 0))
                except Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise

        channel.get_msg = get_msg


def execute(nb, cwd: Path, timeout: int = 600):
    """Run a notebook (an nbformat node) top to bottom in a fresh kernel with nbclient and `short_polls`, cells
    tagged raises-exception allowed to raise; returns it with its outputs, its kernel's language_info and the
    widgets' state in its metadata (as `jupyter nbconvert --execute` saves them, without its stall)."""
    import nbclient

    class Client(nbclient.NotebookClient):
        async def async_start_new_kernel_client(self):
            kc = await super().async_start_new_kernel_client()
            short_polls(self)
            return kc

    return Client(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()


def execute_file(path: Path, timeout: int = 600) -> None:
    """Re-execute the notebook file `path` in place (`workbook.py execute`)."""
    import nbformat

    path = Path(path)
    nbformat.write(execute(nbformat.read(path, as_version=4), path.parent, timeout), path)


def resolve(prefix: str, notebooks: list[Path] | None = None) -> str:
    """The notebook file name that `prefix` names ("03a", "03a_nan_under_strong_decay", or the file name)."""
    names = [p.name for p in notebooks or sources()]
    hits = [n for n in names if n == prefix or n.startswith(prefix.removesuffix(".ipynb"))]
    if len(hits) != 1:
        raise SystemExit(f"reset: {prefix!r} names {len(hits)} notebooks; pick one of: {', '.join(names)}")
    return hits[0]


def main(argv: list[str]) -> int:
    reset = []
    if argv[:1] == ["--reset"]:
        if len(argv) < 2:
            raise SystemExit("usage: python -m fla_lab edition [--reset NOTEBOOK ...]")
        reset = [resolve(p) for p in argv[1:]]
    for outcome in build(reset=reset):
        if outcome.action != "unchanged":
            print(f"learner/{outcome.name}: {outcome.action}")
    print(f"the learner's edition is in {LEARNER.relative_to(ROOT)}/ (reset one: python3 workbook.py reset NAME)")
    return 0
