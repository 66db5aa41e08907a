#!/usr/bin/env python3
"""fla_lab's one entry point: set-up, JupyterLab, tests, notebook re-execution.

    python3 workbook.py lab       # set up if needed, then JupyterLab on the learner's edition (learner/00_start_here)
    python3 workbook.py reset NOTEBOOK   # restore one learner notebook (e.g. 03a); your edited copy is kept as .bak
    python3 workbook.py test      # set up if needed, then unit tests, every notebook under nbval, browser test
                                  # (with an NVIDIA GPU also: the unit tests on CUDA, every notebook run on it)
    python3 workbook.py test --phase unit-cuda [--phase ...]   # only the named phases (see `phases`)
    python3 workbook.py phases [--gpu|--cpu]   # print the test phases this machine (or a GPU/CPU one) runs
    python3 workbook.py setup     # only the set-up (virtual environment, pinned packages, Jupyter kernel)
    python3 workbook.py execute [NOTEBOOK ...]   # re-execute and save notebooks in the CPU environment
    python3 workbook.py bench     # GPU benchmark beside flash-linear-attention (needs CUDA + fla installed)

Needs only Python >= 3.10 with its venv module (Debian: python3-venv). Idempotent: a stamp in .venv records what
was installed, so a second run skips straight to the work. Without an NVIDIA GPU the CPU build of torch is
installed (no CUDA downloads).
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".fla_lab_setup"
TORCH = "torch==2.13.0"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
KERNEL_NAME = "fla-lab"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
PROSE_TEST = "tests/test_notebook_prose.py"  # the notebooks' markdown against their saved outputs (notebooks phase)
ARTIFACTS = ROOT / "artifacts"
GPU_NOTEBOOKS = ARTIFACTS / "notebooks-gpu"  # notebooks executed on the GPU (outputs not compared, not saved back)
GPU_CELL_TIMEOUT = 300  # seconds a notebook cell may take in the GPU phase (each notebook takes about a minute)
GPU_SANITIZE = ARTIFACTS / "nbval_sanitize_gpu.cfg"  # SANITIZE + the torch build rule, written on a GPU machine
# A GPU machine has torch's CUDA build: its CPU environment prints `torch 2.13.0+cu130` where the saved outputs
# (CPU build) say `torch 2.13.0+cpu`, or, with a preinstalled torch (`setup` without network), another version
# altogether. The saved outputs are compared without torch's and triton's versions there (CI compares them exactly).
TORCH_BUILD_RULE = """
[torch and triton versions (CUDA build or preinstalled torch in the CPU environment of a GPU machine; added by workbook.py)]
regex: torch \\d+\\.\\d+\\.\\d+(\\+[0-9A-Za-z.]+)?
replace: torch VERSION

[triton version on a GPU machine (added by workbook.py)]
regex: triton \\d+\\.\\d+\\.\\d+
replace: triton VERSION
"""
# With a torch or triton other than requirements.txt's pins (a preinstalled torch on a machine without network),
# the interpreter's arithmetic differs in the last printed digits (seen on the H200 with torch 2.11 / triton 3.6:
# 4.6e-07 against 4.7e-07). There the saved outputs are compared with every number masked: the words, booleans,
# PASS / NOT YET, dtypes and shapes' layout still have to match, and each cell's own asserts still run.
NUMBERS_RULE = """
[numbers (torch or triton other than the pins, whose last digits differ; added by workbook.py)]
regex: (?<![\\w.])[-+]?\\d+(\\.\\d+)?([eE][-+]?\\d+)?(?!\\w)
replace: N
"""


def say(msg: str) -> None:
    print(f"[workbook] {msg}", flush=True)


def run(cmd, check=True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=check, cwd=kw.pop("cwd", ROOT), **kw)


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def wanted_stamp(mode) -> str:
    """What the set-up installed: the pins, this file, and the mode ("cpu", "gpu", "gpu+preinstalled torch ...";
    True/False stand for "gpu"/"cpu")."""
    digest = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml", "workbook.py"):
        digest.update((ROOT / name).read_bytes())
    mode = {True: "gpu", False: "cpu"}.get(mode, mode)
    digest.update(mode.encode())
    return digest.hexdigest()


def pip(*args, check=True) -> subprocess.CompletedProcess:
    # pip configs on some machines list extra indexes that do not exist; their warnings are noise here
    return run([PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args], check=check,
               env={**os.environ, "PIP_NO_WARN_SCRIPT_LOCATION": "1"})


def install_torch(gpu: bool, offline: list | tuple = ()) -> None:
    if gpu:
        say(f"NVIDIA GPU found: installing the CUDA build of {TORCH} from PyPI")
        pip(*offline, TORCH)
        return
    say(f"no NVIDIA GPU: installing the CPU build of {TORCH} (no CUDA packages)")
    if pip("--no-deps", "--no-index", TORCH, check=False).returncode == 0 or offline:  # a local CPU wheel (find-links)
        return
    pip("--no-deps", TORCH, "--index-url", CPU_TORCH_INDEX)


def venv_problem(python: str = sys.executable) -> str | None:
    """Why `python -m venv` cannot make a virtual environment with pip here, or None.

    Debian and Ubuntu ship `venv` without `ensurepip` (it is in python3-venv / python3.X-venv); `python -m venv`
    then fails half-way and leaves a directory with bin/python but no pip. Ask before creating anything.
    """
    probe = subprocess.run([python, "-c", "import sys, venv, ensurepip; ensurepip.version(); "
                            "print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
    if probe.returncode == 0:
        return None
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip() or "3"
    detail = (probe.stderr.strip().splitlines() or ["no detail"])[-1]
    return (f"cannot create the virtual environment: {python} (Python {version}) has no working venv/ensurepip "
            f"({detail}). On Debian/Ubuntu install it with `sudo apt install python3-venv` (or "
            f"`sudo apt install python{version}-venv`), then run this command again.")


def venv_complete(venv: Path = VENV) -> bool:
    """A finished virtual environment: its python and pip are there (a failed `python -m venv` leaves no pip),
    or the set-up finished in it once (its stamp)."""
    if not ((venv / "pyvenv.cfg").exists() and (venv / "bin" / "python").exists()):
        return False
    return (venv / STAMP.name).exists() or any(venv.glob("lib/python*/site-packages/pip/__init__.py"))


def create_venv(venv: Path = VENV, python: str = sys.executable) -> None:
    """Create `venv` with pip, or exit with the reason; never leave a half-made one behind for the next run."""
    if venv.exists() and not venv_complete(venv):
        say(f"removing the incomplete virtual environment {venv} (left by a failed creation)")
        shutil.rmtree(venv)
    if venv.exists():
        return
    problem = venv_problem(python)
    if problem:
        sys.exit(f"[workbook] {problem}")
    say(f"creating the virtual environment {venv}/")
    try:
        made = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True)
        ok = made.returncode == 0 and venv_complete(venv)
    except BaseException:  # Ctrl-C half-way: remove it too
        shutil.rmtree(venv, ignore_errors=True)
        raise
    if not ok:
        shutil.rmtree(venv, ignore_errors=True)
        output = (made.stdout + made.stderr).strip()
        sys.exit(f"[workbook] `{python} -m venv {venv}` failed (exit {made.returncode}); the half-made {venv} was "
                 f"removed. Its output:\n{output}\nOn Debian/Ubuntu, `sudo apt install python3-venv` is the usual fix.")


def index_reachable(timeout: float = 3.0) -> bool:
    """Whether pip's package index answers (PIP_INDEX_URL, PyPI by default): a TCP connection within `timeout`."""
    import socket
    import urllib.parse

    url = urllib.parse.urlparse(os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple")
    if url.scheme == "file":
        return Path(url.path).exists()
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
        return True
    except OSError:
        return False


PREINSTALLED_PTH = "_fla_lab_preinstalled.pth"  # in .venv's site-packages: the interpreter's own packages, then ROOT
PREINSTALLED_PROBE = """
import json, os, site, sys
import torch, triton
dirs = [os.path.dirname(os.path.dirname(torch.__file__)), *site.getsitepackages()]
print(json.dumps({"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                  "python": sys.executable, "dirs": list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))}))
"""


def preinstalled_torch(python: str = sys.executable) -> tuple[dict | None, str]:
    """(torch, triton and the folders they live in, None) when `python` already has a CUDA build of torch >= 2.11
    and a triton that fla_lab supports (fla_lab.runtime.SUPPORTED_TRITON); else (None, why not)."""
    import json

    done = subprocess.run([python, "-c", PREINSTALLED_PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"{python} has no torch and triton ({(done.stderr.strip().splitlines() or ['?'])[-1]})"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    torch_v = tuple(int(x) for x in found["torch"].split("+")[0].split(".")[:2])
    triton_v = tuple(int(x) for x in found["triton"].split(".")[:2])
    if torch_v < (2, 11) or not found["cuda"]:
        return None, f"its torch {found['torch']} is not a CUDA build >= 2.11"
    if not (3, 6) <= triton_v <= (3, 9):
        return None, f"its triton {found['triton']} is outside 3.6-3.9"
    return found, ""


def installed_names(python: Path = PY) -> dict[str, str]:
    """{normalised distribution name: version} of what `python` can import."""
    code = ("import importlib.metadata as m; "
            "print('\\n'.join(f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()))")
    out = run([python, "-c", code], capture_output=True, text=True).stdout
    pairs = (line.strip().split("==", 1) for line in out.splitlines() if "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


# A preinstalled package at or above one of these versions cannot serve fla_lab: the pin of requirements.txt goes
# into .venv instead. numpy 2.5 refuses float() of a 1-element array, which Triton 3.6's interpreter does (every
# kernel fails with CUDA hidden: "only 0-dimensional arrays can be converted to Python scalars").
PREINSTALLED_BELOW = {"numpy": (2, 5)}
# Triton 3.6's interpreter also turns a loop bound into int() of a 1-element array, which numpy 2.4 refuses (seen on
# the H200 with numpy 2.4.6); Triton 3.7 does not. With a preinstalled triton 3.6, .venv gets the last numpy before.
OLD_TRITON_NUMPY = ((3, 7), (2, 4), "numpy==2.3.5")  # (triton below, numpy from, pin instead)


def numpy_for_triton(todo: list[str], have_numpy: str | None, triton: str) -> list[str]:
    """`todo` with the numpy pin replaced by OLD_TRITON_NUMPY's when the preinstalled triton is older than 3.7."""
    below, numpy_from, pin = OLD_TRITON_NUMPY
    if tuple(int(x) for x in triton.split(".")[:2]) >= below:
        return todo
    rest = [t for t in todo if not t.lower().startswith("numpy==")]
    too_new = have_numpy is None or tuple(int(x) for x in have_numpy.split(".")[:2]) >= numpy_from
    return rest + [pin] if too_new else rest
BROWSER_ONLY = {"jupyterlab", "playwright"}  # only `lab` and the browser phase use them: optional without network


def missing_requirements(python: Path = PY) -> list[str]:
    """requirements.txt's pins that `python` lacks: not installed at all, or at a version PREINSTALLED_BELOW rules
    out (any other installed version counts as there: it is what that machine's torch was built with)."""
    have = installed_names(python)
    todo = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        pin = line.split("#")[0].strip()
        if not pin:
            continue
        name = pin.split("==")[0].strip().lower().replace("_", "-")
        limit = PREINSTALLED_BELOW.get(name)
        version = tuple(int(x) for x in have[name].split(".")[:2] if x.isdigit()) if name in have else None
        if version is None or (limit and version >= limit):
            todo.append(pin)
    return todo


def offline_message(what: str) -> str:
    return (f"no network (pip's index cannot be reached) and {what}. Bring the packages as wheels: on a machine "
            "with network and the same Python, `python3 -m pip download -d wheels -r requirements.txt` (for another "
            "Python: add --only-binary=:all: --python-version X.Y --platform manylinux2014_x86_64), copy the folder "
            "here and run `PIP_FIND_LINKS=$PWD/wheels python3 workbook.py test` (or `setup`).")


def setup() -> None:
    if sys.version_info < (3, 10):
        sys.exit(f"fla_lab needs Python >= 3.10, this is {sys.version.split()[0]}")
    gpu = has_nvidia_gpu()
    online = index_reachable()
    preinstalled, why_not = (None, "")
    if gpu and (not online or os.environ.get("FLA_LAB_PREINSTALLED_TORCH") == "1"):
        preinstalled, why_not = preinstalled_torch()
        if preinstalled is None and not online:
            sys.exit("[workbook] " + offline_message(f"{sys.executable} cannot serve: {why_not}"))
    create_venv(VENV)
    mode = "gpu" if gpu else "cpu"
    if preinstalled:
        mode += f"+preinstalled torch {preinstalled['torch']} triton {preinstalled['triton']}"
    if STAMP.exists() and STAMP.read_text() == wanted_stamp(mode):
        return
    offline = [] if online else ["--no-index"]  # pip still reads PIP_FIND_LINKS / its config's find-links
    if preinstalled:
        say(f"using the torch {preinstalled['torch']} and triton {preinstalled['triton']} of {sys.executable} "
            f"({'no network' if not online else 'FLA_LAB_PREINSTALLED_TORCH=1'}): .venv sees its packages")
        site_packages = Path(run([PY, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True).stdout.strip())
        (site_packages / PREINSTALLED_PTH).write_text("\n".join([*preinstalled["dirs"], str(ROOT)]) + "\n")
        todo = numpy_for_triton(missing_requirements(), installed_names().get("numpy"), preinstalled["triton"])
        needed = [t for t in todo if t.split("==")[0].lower() not in BROWSER_ONLY]
        if needed:
            say(f"installing what it lacks: {' '.join(needed)}")
            if pip(*offline, *needed, check=False).returncode != 0:
                sys.exit("[workbook] " + (offline_message(f"pip could not install {' '.join(needed)} from local wheels")
                                         if not online else "pip failed (its output is above)"))
        optional = [t for t in todo if t not in needed]
        if optional and pip(*offline, *optional, check=False).returncode != 0:
            say(f"not installed: {' '.join(optional)} (no wheels here): `workbook.py lab` and the browser test need "
                "them; the unit and notebook phases run without")
    else:
        if not online:
            say("no network: installing from local wheels only (PIP_FIND_LINKS, pip's find-links)")
        install_torch(gpu, offline)
        say("installing the pinned packages (requirements.txt)")
        if pip(*offline, "-r", ROOT / "requirements.txt", check=False).returncode != 0:
            sys.exit("[workbook] " + (offline_message("pip could not install requirements.txt from local wheels")
                                     if not online else "pip failed (its output is above)"))
        pip("--no-deps", *offline, *(["--no-build-isolation"] if offline else []), "-e", ROOT)
    say(f"registering the Jupyter kernel '{KERNEL_NAME}'")
    run([PY, "-m", "ipykernel", "install", "--user", "--name", KERNEL_NAME, "--display-name", "Python (fla_lab)"],
        stdout=subprocess.DEVNULL)
    STAMP.write_text(wanted_stamp(mode))
    say("set-up done")


def ensure_chromium() -> tuple[str | None, str | None]:
    """The browser test drives Debian's Chromium; install it when missing (root or sudo).

    Returns (path, None), or (None, reason) when it is missing and cannot be installed: the caller runs the
    other phases, skips the browser test and fails at the end with the reason.
    """
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if Path(path).exists():
        return path, None
    manual = "install Debian's `chromium` package (apt-get install chromium) and run again"
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None:
        return None, f"Chromium is missing at /usr/bin/chromium and this user is neither root nor has sudo: {manual}"
    if not shutil.which("apt-get"):
        return None, f"Chromium is missing at /usr/bin/chromium and there is no apt-get: {manual}"
    say("installing Debian's chromium for the browser test")
    for cmd in (prefix + ["apt-get", "update", "-q"], prefix + ["apt-get", "install", "-y", "-q", "chromium"]):
        done = run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            tail = " ".join((done.stderr or "").strip().splitlines()[-2:])
            return None, (f"Chromium is missing and `{' '.join(cmd)}` failed (exit {done.returncode}: "
                          f"{tail or 'no message'}): {manual}")
    if not Path("/usr/bin/chromium").exists():
        return None, f"apt-get installed no /usr/bin/chromium: {manual}"
    return "/usr/bin/chromium", None


def notebooks() -> list[Path]:
    """The tracked notebooks."""
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def same_numbers_on_every_cpu(env: dict) -> dict:
    """Pin numpy's OpenBLAS to one x86-64 kernel family. The Triton interpreter computes `tl.dot` with numpy, and
    OpenBLAS picks its kernels by CPU (AVX-512 on one machine, AVX2 on another), which sums in another order: the
    saved outputs' last digits would then depend on the machine that saved them. Haswell's kernels run on every
    x86-64 CPU with AVX2; a value the user set is kept, other architectures are left alone. OpenBLAS reads it when
    numpy loads, before any notebook code runs; torch's share of the rule (one thread, no oneDNN, MKL's AVX2 path)
    is set in-process by `import fla_lab` (fla_lab.runtime.same_digits_on_every_cpu)."""
    if platform.machine() in ("x86_64", "AMD64"):
        env.setdefault("OPENBLAS_CORETYPE", "Haswell")
    return env


def another_cpu(cores: int | None = None) -> dict:
    """What a machine unlike this one would present to the notebooks: the other thread count (1 where torch would
    take several, 2 on a one-core machine) and the AVX2 kernels of ATen, oneDNN and MKL even on an AVX-512 CPU.
    The `notebooks-other-cpu` phase compares the saved outputs under it: they must not change."""
    cores = os.cpu_count() if cores is None else cores
    return {"OMP_NUM_THREADS": "1" if (cores or 1) > 1 else "2", "ATEN_CPU_CAPABILITY": "avx2",
            "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_env() -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    env.pop("TRITON_INTERPRET", None)  # let fla_lab decide (interpreter without CUDA)
    return same_numbers_on_every_cpu(env)


@dataclass(frozen=True)
class Phase:
    """One step of the test command. `device` is "cpu" (CUDA hidden: the interpreter computes exactly as in CI,
    where the saved outputs come from) or "gpu" (CUDA visible: compiled kernels). `kind` is "pytest" (args are
    pytest's) or "execute" (args are the notebooks, run with nbconvert into `out`, outputs not compared)."""
    name: str
    kind: str
    device: str
    args: tuple = ()
    out: Path | None = None
    skip: str | None = None  # why it does not run (it then fails the command at the end)
    env: tuple = ()  # (name, value) pairs set on top of the phase's environment


def phase_env(phase: Phase, base: dict | None = None) -> dict:
    """The environment `phase` runs in: CPU phases hide CUDA, GPU phases see it (a user's own choice of GPU,
    CUDA_VISIBLE_DEVICES=1 say, is kept; an empty value, which hides every GPU, is dropped)."""
    env = dict(test_env() if base is None else base)
    env.pop("TRITON_INTERPRET", None)
    if phase.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif env.get("CUDA_VISIBLE_DEVICES", None) == "":
        del env["CUDA_VISIBLE_DEVICES"]
    if phase.kind == "execute" and phase.out is not None:
        env["FLA_LAB_FIGURES_DIR"] = str(phase.out / "figures")  # the repository's figures/ stay the CPU ones
    env.update(phase.env)
    return env


def plan_phases(gpu: bool, browser_problem: str | None = None, extra: list[str] | tuple = (),
                n_workers: str = "2", nbs: list[Path] | None = None) -> list[Phase]:
    """The test command's phases, in order. On a CPU machine (CI): unit tests, notebooks under nbval (then again
    as on another CPU: `another_cpu`), browser, all in the CPU environment. With an NVIDIA GPU two more: the same unit tests on CUDA, then every notebook
    executed top to bottom on the GPU (GPU-only cells included) into artifacts/notebooks-gpu/, not compared
    (its outputs differ from the CPU ones by design). `browser_problem` (Chromium missing) skips the browser."""
    nbs = notebooks() if nbs is None else nbs
    unit = ("tests", "--ignore=tests/browser", f"--ignore={PROSE_TEST}", "-n", n_workers, "-q", *extra)
    sanitize = GPU_SANITIZE if gpu else SANITIZE
    nbval = ("--nbval", "--nbval-current-env", f"--nbval-sanitize-with={sanitize}", "-n", n_workers, "--dist",
             "loadscope", "-q")
    phases = [
        Phase("unit", "pytest", "cpu", unit),
        # nbval compares the saved outputs; the prose test, the markdown against those outputs
        Phase("notebooks", "pytest", "cpu", (*nbval, PROSE_TEST, *map(str, nbs))),
        # the same outputs on a CPU unlike this one (another thread count, AVX2 kernels): the digits must not move
        Phase("notebooks-other-cpu", "pytest", "cpu", (*nbval, *map(str, nbs)), env=tuple(another_cpu().items())),
    ]
    if gpu:
        phases += [Phase("unit-cuda", "pytest", "gpu", unit),
                   Phase("notebooks-gpu", "execute", "gpu", tuple(map(str, nbs)), out=GPU_NOTEBOOKS)]
    # each notebook's Run All keeps one core busy with its kernel: two workers, each with its own server and browser
    # (the learner tests in one group: one worker starts the learner's lab)
    browser = ("tests/browser", "-n", n_workers, "--dist", "loadgroup", "-q")
    phases.append(Phase("browser", "pytest", "cpu", browser, skip=browser_problem))
    return phases


def describe_phase(phase: Phase) -> str:
    env = phase_env(phase, base={})
    where = ("CUDA hidden (CUDA_VISIBLE_DEVICES=''), Triton interpreter" if phase.device == "cpu"
             else "CUDA visible, compiled kernels")
    what = (f"pytest {' '.join(a for a in phase.args if not a.endswith('.ipynb'))}" if phase.kind == "pytest"
            else f"every notebook in a Jupyter kernel (python -m dev.notebook_times) into {phase.out}/ (outputs not "
                 "compared)")
    n_nb = sum(a.endswith(".ipynb") for a in phase.args)
    what += f" [{n_nb} notebooks]" if n_nb else ""
    what += f" with {' '.join(f'{k}={v}' for k, v in phase.env)}" if phase.env else ""
    skip = f"  SKIPPED: {phase.skip}" if phase.skip else ""
    figures = f"; figures to {env['FLA_LAB_FIGURES_DIR']}" if "FLA_LAB_FIGURES_DIR" in env else ""
    return f"{phase.name:14s} {where}: {what}{figures}{skip}"


def pytest_phase(name: str, args: list, env: dict | None = None) -> tuple[int, dict]:
    ARTIFACTS.mkdir(exist_ok=True)
    report = ARTIFACTS / f"junit-{name}.xml"
    say(f"--- {name} ---")
    code = run([PY, "-m", "pytest", *args, f"--junitxml={report}"], check=False,
               env=test_env() if env is None else env).returncode
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        for suite in ET.parse(report).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    return code, counts


def execute_phase(phase: Phase, env: dict) -> tuple[int, dict]:
    """Run each notebook top to bottom in a Jupyter kernel (nbclient) into phase.out (cells tagged raises-exception
    may raise; the exercises' checks must say NOT YET after the stub and PASS after the solution)."""
    say(f"--- {phase.name} ---")
    (phase.out / "figures").mkdir(parents=True, exist_ok=True)  # fla_lab saves figures only into an existing folder
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    import time

    for nb in map(Path, phase.args):
        counts["tests"] += 1
        target = phase.out / nb.name
        say(f"executing {nb.name} -> {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
        start = time.perf_counter()
        # dev/notebook_times.py: nbclient, as nbconvert, but it waits on the kernel's sockets in short polls
        # (a widget cell's reply is otherwise read only when the cell's timeout runs out) and prints per-cell times;
        # it runs from the repository root (its kernel starts in the notebook's folder)
        done = run([PY, "-m", "dev.notebook_times", "--timeout", GPU_CELL_TIMEOUT, "--out", phase.out, "--widgets",
                    "--cells", "3", nb], check=False, env=env)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            counts["failures"] += 1
            say(f"FAILED: {nb.name} did not run to the end on the GPU (nbconvert exit {done.returncode}, {seconds:.0f} s)")
        else:
            say(f"{nb.name}: ran to the end on the GPU in {seconds:.1f} s")
    return (1 if counts["failures"] else 0), counts


def split_phase_options(extra: list[str]) -> tuple[list[str], list[str]]:
    """`--phase NAME` (repeatable) picks phases; every other argument goes to pytest."""
    names, rest, it = [], [], iter(extra)
    for arg in it:
        if arg == "--phase":
            names.append(next(it, ""))
        elif arg.startswith("--phase="):
            names.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return names, rest


def test(extra: list[str]) -> int:
    only, extra = split_phase_options(extra)
    setup()
    gpu = has_nvidia_gpu()
    browser_problem = None
    if not only or "browser" in only:  # apt-get may be tried: only when the browser phase is wanted
        _, browser_problem = ensure_chromium()
        browser_problem = browser_problem or browser_packages_problem()
        if browser_problem:
            say(f"the browser test cannot run: {browser_problem}; running the other phases, failing at the end")
    cores = os.cpu_count() or 1
    n_workers = str(1 if cores < 2 else max(2, min(8, cores // 2)))  # 2 on 2 cores (CI), 8 on a 16-core GPU box
    phases = plan_phases(gpu, browser_problem, extra, n_workers)
    if only:
        unknown = sorted(set(only) - {p.name for p in phases})
        if unknown:
            say(f"no phase {', '.join(unknown)} on this machine; its phases: {', '.join(p.name for p in phases)}")
            return 2
        phases = [p for p in phases if p.name in only]
    if gpu:
        say("NVIDIA GPU found: saved outputs are compared in the CPU environment, then the unit tests run on CUDA "
            "and every notebook runs on the GPU")
        off_pin = off_pin_versions()
        if off_pin:
            say(f"{', '.join(off_pin)}: the saved outputs are compared with numbers masked (another version rounds "
                "the last digits differently); CI compares them exactly")
        write_gpu_sanitize(mask_numbers=bool(off_pin))
    total = {"passed": 0, "failed": 0, "skipped": 0}
    worst = 0
    for phase in phases:
        if phase.skip:
            say(f"--- {phase.name}: skipped ({phase.skip}) ---")
            worst = worst or 1
            continue
        env = phase_env(phase)
        if phase.kind == "execute":
            code, c = execute_phase(phase, env)
        else:
            code, c = pytest_phase(phase.name, list(phase.args), env)
        if code not in (0, 5) or (code == 5 and phase.name != "browser"):
            worst = worst or code or 1
        failed = c["failures"] + c["errors"]
        total["failed"] += failed
        total["skipped"] += c["skipped"]
        total["passed"] += c["tests"] - failed - c["skipped"]
    print(f"workbook: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    if browser_problem:
        print(f"workbook: FAILED: the browser test did not run: {browser_problem}")
    return worst


def write_gpu_sanitize(path: Path | None = None, mask_numbers: bool = False) -> Path:
    path = path or GPU_SANITIZE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SANITIZE.read_text().rstrip("\n") + "\n" + TORCH_BUILD_RULE + (NUMBERS_RULE if mask_numbers else ""))
    return path


def off_pin_versions(python: Path = PY) -> list[str]:
    """torch and triton where .venv's versions are not requirements.txt's pins (local build tags like +cu130 aside)."""
    have = installed_names(python)
    pins = dict(line.split("#")[0].strip().split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if line.split("#")[0].strip())
    return [f"{name} {have.get(name, 'missing')} (pin {pins[name]})" for name in ("torch", "triton")
            if have.get(name, "").split("+")[0] != pins[name]]


def browser_packages_problem() -> str | None:
    if run([PY, "-c", "import playwright, jupyterlab"], check=False, capture_output=True).returncode != 0:
        return "Playwright or JupyterLab is not installed in .venv (set-up without network or wheels)"
    return None


def phases_command(extra: list[str]) -> int:
    gpu = "--gpu" in extra or ("--cpu" not in extra and has_nvidia_gpu())
    print(f"test phases on a {'GPU' if gpu else 'CPU'} machine, in order:")
    for phase in plan_phases(gpu):
        print("  " + describe_phase(phase))
    return 0


def execute(paths: list[str]) -> int:
    """Re-run notebooks top to bottom in the CPU environment CI uses and save their outputs."""
    setup()
    targets = [Path(p).resolve() for p in paths] or notebooks()
    env = test_env()
    env["CUDA_VISIBLE_DEVICES"] = ""  # saved outputs must be the CPU interpreter's, as CI compares them
    for nb in targets:
        say(f"executing {nb.relative_to(ROOT)}")
        # nbclient with short socket polls (fla_lab.teaching.edition.execute): nbconvert's single long poll can miss the
        # reply after a widget cell and wait out the cell's timeout (jupyter/nbclient#312)
        run([PY, "-c", "import sys; from fla_lab.teaching.edition import execute_file; execute_file(sys.argv[1])", nb],
            env=env, cwd=nb.parent)
        clean_saved_outputs(nb)
    return 0


def clean_saved_outputs(nb: Path) -> None:
    """Make a saved notebook machine-independent and quiet in diffs.

    Tracebacks name files by absolute path (kept readable, made relative); nbconvert records per-cell
    execution timestamps, which would change every cell on every re-execution.
    """
    import json
    import re

    patterns = [(re.escape(str(ROOT)) + "/", ""), (r"/[^\s'\"]*?/site-packages/", "<site-packages>/"),
                (r"/tmp/ipykernel_\d+/\d+\.py", "<ipykernel-cell>")]
    data = json.loads(nb.read_text())
    for cell in data["cells"]:
        cell.get("metadata", {}).pop("execution", None)
        for output in cell.get("outputs", []):
            for key in ("traceback", "text"):
                if key in output:
                    lines = output[key] if isinstance(output[key], list) else [output[key]]
                    for pattern, repl in patterns:
                        lines = [re.sub(pattern, repl, line) for line in lines]
                    output[key] = lines if isinstance(output[key], list) else lines[0]
    nb.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


LEARNER = ROOT / "learner"  # the learner's edition (git ignores it): no outputs, no solutions
LAB_START = "00_start_here.ipynb"  # the notebook `lab` opens first


def lab_root(top: Path = ROOT) -> Path:
    """The folder JupyterLab serves for `lab`: the learner's edition of the checkout `top`, so the learner's file
    browser holds the learner's copies only. The reference notebooks (notebooks/: solutions, saved outputs) and the
    facilitator's guide (docs/onboarding.md: the answer keys) lie outside it, out of the file browser's reach."""
    return top / LEARNER.name


def lab_arguments(root: Path = LEARNER) -> list[str]:
    """JupyterLab's arguments for `lab` (the browser test starts its learner server with them too): the server
    rooted at `root` (the learner's edition) explicitly, since a user's Jupyter config (`ServerApp.root_dir`) would
    otherwise root it elsewhere, such as the checkout, and the first notebook opened. JupyterLab's terminals are off:
    a terminal starts a shell in the server's working directory, the checkout, one `ls` from the answer keys."""
    return [f"--ServerApp.root_dir={root}", "--ServerApp.terminals_enabled=False", "--ip=127.0.0.1",
            str(root / LAB_START)]


def lab_env(base: dict | None = None, root: Path = LEARNER) -> dict:
    """JupyterLab's environment: the learner's figures go to the edition's figures/ (`root`: learner/), never over
    the tracked figures/; its kernels are a learner's session (fla_lab.teaching.edition.learner_session: the bug catalogue
    seals an exercise's fixed line until the exercise is solved or revealed)."""
    env = same_numbers_on_every_cpu(dict(os.environ if base is None else base))
    env["FLA_LAB_FIGURES_DIR"] = str(root / "figures")
    env["FLA_LAB_EDITION"] = "learner"
    return env


def lab(extra: list[str]) -> int:
    setup()
    run([PY, "-m", "fla_lab", "edition"])  # creates learner/ on first use; never overwrites an edited notebook
    root = lab_root()
    args = [PY, "-m", "jupyter", "lab", *lab_arguments(root), *extra]
    if os.geteuid() == 0:
        args.append("--allow-root")
    say("starting JupyterLab on 127.0.0.1 with your copies of the notebooks (learner/; Ctrl-C stops it)")
    return subprocess.call([str(a) for a in args], cwd=ROOT, env=lab_env(root=root))


def reset(names: list[str]) -> int:
    if not names:
        print("usage: python3 workbook.py reset NOTEBOOK [...]   (e.g. 03a; your edited copy is kept as .bak)")
        return 2
    setup()
    return run([PY, "-m", "fla_lab", "edition", "--reset", *names], check=False).returncode


def bench(extra: list[str]) -> int:
    setup()
    return run([PY, "-m", "benchmarks.scaling", "--ref-only", "--bugs", *extra], check=False).returncode


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command == "setup":
        setup()
        return 0
    handlers = {"test": test, "execute": execute, "lab": lab, "reset": reset, "bench": bench,
                "phases": phases_command}
    if command not in handlers:
        print(__doc__)
        return 0 if command in ("help", "-h", "--help") else 2
    return handlers[command](rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
