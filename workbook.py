#!/usr/bin/env python3
"""fla_lab's one entry point: set-up, JupyterLab, tests, notebook re-execution.

    python3 workbook.py lab       # set up if needed, then open JupyterLab at notebooks/00_start_here.ipynb
    python3 workbook.py test      # set up if needed, then unit tests, every notebook under nbval, browser test
    python3 workbook.py setup     # only the set-up (virtual environment, pinned packages, Jupyter kernel)
    python3 workbook.py execute [NOTEBOOK ...]   # re-execute and save notebooks in the CPU environment
    python3 workbook.py bench     # GPU benchmark beside flash-linear-attention (needs CUDA + fla installed)

Needs only Python >= 3.10 and pip. Idempotent: a stamp in .venv records what was installed, so a second run
skips straight to the work. Without an NVIDIA GPU the CPU build of torch is installed (no CUDA downloads).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".fla_lab_setup"
TORCH = "torch==2.13.0"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
KERNEL_NAME = "fla-lab"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
ARTIFACTS = ROOT / "artifacts"


def say(msg: str) -> None:
    print(f"[workbook] {msg}", flush=True)


def run(cmd, check=True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=check, cwd=kw.pop("cwd", ROOT), **kw)


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def wanted_stamp(gpu: bool) -> str:
    digest = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml", "workbook.py"):
        digest.update((ROOT / name).read_bytes())
    digest.update(b"gpu" if gpu else b"cpu")
    return digest.hexdigest()


def pip(*args, check=True) -> subprocess.CompletedProcess:
    # pip configs on some machines list extra indexes that do not exist; their warnings are noise here
    return run([PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args], check=check,
               env={**os.environ, "PIP_NO_WARN_SCRIPT_LOCATION": "1"})


def install_torch(gpu: bool) -> None:
    if gpu:
        say(f"NVIDIA GPU found: installing the CUDA build of {TORCH} from PyPI")
        pip(TORCH)
        return
    say(f"no NVIDIA GPU: installing the CPU build of {TORCH} (no CUDA packages)")
    if pip("--no-deps", "--no-index", TORCH, check=False).returncode == 0:  # a local CPU wheel (find-links)
        return
    pip("--no-deps", TORCH, "--index-url", CPU_TORCH_INDEX)


def setup() -> None:
    if sys.version_info < (3, 10):
        sys.exit(f"fla_lab needs Python >= 3.10, this is {sys.version.split()[0]}")
    gpu = has_nvidia_gpu()
    if not PY.exists():
        say(f"creating the virtual environment {VENV.relative_to(ROOT)}/")
        run([sys.executable, "-m", "venv", VENV])
    if STAMP.exists() and STAMP.read_text() == wanted_stamp(gpu):
        return
    install_torch(gpu)
    say("installing the pinned packages (requirements.txt)")
    pip("-r", ROOT / "requirements.txt")  # torch is already satisfied: only its small dependencies come in
    pip("--no-deps", "-e", ROOT)
    say(f"registering the Jupyter kernel '{KERNEL_NAME}'")
    run([PY, "-m", "ipykernel", "install", "--user", "--name", KERNEL_NAME, "--display-name", "Python (fla_lab)"],
        stdout=subprocess.DEVNULL)
    STAMP.write_text(wanted_stamp(gpu))
    say("set-up done")


def ensure_chromium() -> str:
    """The browser test drives Debian's Chromium; install it when missing (root or sudo)."""
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if Path(path).exists():
        return path
    apt = ["apt-get", "install", "-y", "-q", "chromium"]
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None or not shutil.which("apt-get"):
        sys.exit("the browser test needs Chromium at /usr/bin/chromium: install Debian's `chromium` package "
                 "(apt-get install chromium) and run again")
    say("installing Debian's chromium for the browser test")
    run(prefix + ["apt-get", "update", "-q"], stdout=subprocess.DEVNULL)
    run(prefix + apt, stdout=subprocess.DEVNULL)
    return "/usr/bin/chromium"


def notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def test_env() -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    env.pop("TRITON_INTERPRET", None)  # let fla_lab decide (interpreter without CUDA)
    return env


def pytest_phase(name: str, args: list) -> tuple[int, dict]:
    ARTIFACTS.mkdir(exist_ok=True)
    report = ARTIFACTS / f"junit-{name}.xml"
    say(f"--- {name} ---")
    code = run([PY, "-m", "pytest", *args, f"--junitxml={report}"], check=False, env=test_env()).returncode
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        for suite in ET.parse(report).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    return code, counts


def test(extra: list[str]) -> int:
    setup()
    ensure_chromium()
    n_workers = "2" if (os.cpu_count() or 1) >= 2 else "1"
    phases = [
        ("unit", ["tests", "--ignore=tests/browser", "-n", n_workers, "-q", *extra]),
        ("notebooks", ["--nbval", "--nbval-current-env", f"--nbval-sanitize-with={SANITIZE}",
                       "-n", n_workers, "--dist", "loadscope", "-q", *map(str, notebooks())]),
        ("browser", ["tests/browser", "-q"]),
    ]
    total = {"passed": 0, "failed": 0, "skipped": 0}
    worst = 0
    for name, args in phases:
        code, c = pytest_phase(name, args)
        if code not in (0, 5) or (code == 5 and name != "browser"):
            worst = worst or code or 1
        failed = c["failures"] + c["errors"]
        total["failed"] += failed
        total["skipped"] += c["skipped"]
        total["passed"] += c["tests"] - failed - c["skipped"]
    print(f"workbook: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return worst


def execute(paths: list[str]) -> int:
    """Re-run notebooks top to bottom in the CPU environment CI uses and save their outputs."""
    setup()
    targets = [Path(p).resolve() for p in paths] or notebooks()
    env = test_env()
    env["CUDA_VISIBLE_DEVICES"] = ""  # saved outputs must be the CPU interpreter's, as CI compares them
    for nb in targets:
        say(f"executing {nb.relative_to(ROOT)}")
        run([PY, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
             "--ExecutePreprocessor.timeout=600", "--ExecutePreprocessor.kernel_name=python3", nb], env=env,
            cwd=nb.parent)
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


def lab(extra: list[str]) -> int:
    setup()
    args = [PY, "-m", "jupyter", "lab", "--ip=127.0.0.1", "notebooks/00_start_here.ipynb", *extra]
    if os.geteuid() == 0:
        args.append("--allow-root")
    say("starting JupyterLab on 127.0.0.1 (Ctrl-C stops it)")
    return subprocess.call([str(a) for a in args], cwd=ROOT)


def bench(extra: list[str]) -> int:
    setup()
    return run([PY, "benchmarks/bench.py", *extra], check=False).returncode


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command == "setup":
        setup()
        return 0
    handlers = {"test": test, "execute": execute, "lab": lab, "bench": bench}
    if command not in handlers:
        print(__doc__)
        return 0 if command in ("help", "-h", "--help") else 2
    return handlers[command](rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
