"""workbook.py without a GPU, a fresh machine or a browser: the phase plan, the venv checks, a missing Chromium.

The GPU path is checked as a plan (which phases, in which environment, running what): the same functions the
test command runs on a GPU box. Nothing here touches the real .venv, the notebooks or the network.
"""
from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wb():
    spec = importlib.util.spec_from_file_location("fla_lab_workbook", ROOT / "workbook.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


NBS = [ROOT / "notebooks" / "00_x.ipynb", ROOT / "notebooks" / "05_y.ipynb"]


# ------------------------------------------------------------------ the phases, CPU and GPU

def test_cpu_plan_is_ci(wb):
    phases = wb.plan_phases(gpu=False, nbs=NBS)
    assert [p.name for p in phases] == ["unit", "notebooks", "notebooks-other-cpu", "browser"]
    assert all(p.device == "cpu" and p.kind == "pytest" and p.skip is None for p in phases)
    unit, nbval, other_cpu, browser = phases
    assert unit.args == ("tests", "--ignore=tests/browser", f"--ignore={wb.PROSE_TEST}", "-n", "2", "-q")
    assert "--nbval" in nbval.args and "--nbval-current-env" in nbval.args and "--dist" in nbval.args
    assert wb.PROSE_TEST in nbval.args and (ROOT / wb.PROSE_TEST).exists()  # the prose beside the outputs
    assert [a for a in nbval.args if a.endswith(".ipynb")] == list(map(str, NBS))
    assert browser.args == ("tests/browser", "-n", "2", "--dist", "loadgroup", "-q")


def test_gpu_plan_adds_cuda_unit_tests_and_gpu_notebook_run(wb):
    phases = wb.plan_phases(gpu=True, extra=["-k", "gla"], nbs=NBS)
    names = [p.name for p in phases]
    assert names == ["unit", "notebooks", "notebooks-other-cpu", "unit-cuda", "notebooks-gpu", "browser"]
    by = {p.name: p for p in phases}
    # saved outputs are compared in the CPU environment only
    assert by["notebooks"].device == "cpu" and "--nbval" in by["notebooks"].args
    assert by["unit"].device == "cpu" and by["browser"].device == "cpu"
    # the same unit tests (and the user's extra args) on CUDA
    assert by["unit-cuda"].device == "gpu" and by["unit-cuda"].args == by["unit"].args
    assert by["unit"].args[-2:] == ("-k", "gla")
    # every notebook executed on the GPU into artifacts/, not compared
    run = by["notebooks-gpu"]
    assert run.kind == "execute" and run.device == "gpu" and run.args == tuple(map(str, NBS))
    assert run.out == wb.ARTIFACTS / "notebooks-gpu"
    assert not any("nbval" in a for a in run.args)


def test_gpu_nbval_ignores_only_torch_and_triton_versions(wb, tmp_path):
    from nbval.plugin import get_sanitize_patterns

    assert f"--nbval-sanitize-with={wb.SANITIZE}" in wb.plan_phases(gpu=False, nbs=NBS)[1].args
    assert f"--nbval-sanitize-with={wb.GPU_SANITIZE}" in wb.plan_phases(gpu=True, nbs=NBS)[1].args
    path = wb.write_gpu_sanitize(tmp_path / "gpu.cfg")
    rules = get_sanitize_patterns(path.read_text())
    base = get_sanitize_patterns(wb.SANITIZE.read_text())
    assert rules[:len(base)] == base and len(rules) == len(base) + 2

    def clean(text):
        for regex, replace in rules:
            text = __import__("re").sub(regex, replace, text)
        return text

    saved = "fla_lab: Triton interpreter on the CPU | torch 2.13.0+cpu | triton 3.7.1\n"
    gpu_box = "fla_lab: Triton interpreter on the CPU | torch 2.11.0+cu130 | triton 3.6.0\n"  # preinstalled torch
    assert clean(saved) == clean(saved.replace("+cpu", "+cu130")) == clean(gpu_box)
    assert clean(saved) != clean(saved.replace("interpreter on the CPU", "compiled on the GPU"))  # the rest still shows


def test_off_pin_torch_masks_numbers_but_not_words(wb, tmp_path):
    """A preinstalled torch/triton of other versions rounds the last digits differently (H200: torch 2.11, triton
    3.6 printed 4.7e-07 where CI saved 4.6e-07): numbers are masked there, and only there."""
    from nbval.plugin import get_sanitize_patterns

    def clean(path, text):
        for regex, replace in get_sanitize_patterns(path.read_text()):
            text = __import__("re").sub(regex, replace, text)
        return text

    masked = wb.write_gpu_sanitize(tmp_path / "masked.cfg", mask_numbers=True)
    exact = wb.write_gpu_sanitize(tmp_path / "exact.cfg")
    saved, other = "PASS: error 4.6e-07 <= 2.0e-05 at t=164 (fp16)\n", "PASS: error 4.7e-07 <= 2.0e-05 at t=164 (fp16)\n"
    assert clean(masked, saved) == clean(masked, other) and clean(exact, saved) != clean(exact, other)
    assert clean(masked, saved) != clean(masked, other.replace("PASS", "NOT YET"))
    assert clean(masked, saved) != clean(masked, saved.replace("fp16", "bf16"))


def test_off_pin_versions_reads_the_pins(wb, monkeypatch):
    monkeypatch.setattr(wb, "installed_names", lambda python=None: {"torch": "2.13.0+cu130", "triton": "3.7.1"})
    assert wb.off_pin_versions() == []
    monkeypatch.setattr(wb, "installed_names", lambda python=None: {"torch": "2.11.0+cu130", "triton": "3.6.0"})
    assert wb.off_pin_versions() == ["torch 2.11.0+cu130 (pin 2.13.0)", "triton 3.6.0 (pin 3.7.1)"]


def test_phase_environments(wb):
    base = {"PATH": "/bin", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    by = {p.name: p for p in wb.plan_phases(gpu=True, nbs=NBS)}
    for name in ("unit", "notebooks", "browser"):
        env = wb.phase_env(by[name], base)
        assert env["CUDA_VISIBLE_DEVICES"] == "" and "TRITON_INTERPRET" not in env, name
        assert "FLA_LAB_FIGURES_DIR" not in env
    for name in ("unit-cuda", "notebooks-gpu"):
        env = wb.phase_env(by[name], base)
        assert "CUDA_VISIBLE_DEVICES" not in env and "TRITON_INTERPRET" not in env, name
    # a user's choice of GPU stays; CPU phases still hide every GPU
    assert wb.phase_env(by["unit-cuda"], {"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"] == "1"
    assert wb.phase_env(by["unit"], {"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"] == ""
    # GPU figures go to the artifacts, the repository's figures/ keep the CPU ones
    figures = wb.phase_env(by["notebooks-gpu"], base)["FLA_LAB_FIGURES_DIR"]
    assert Path(figures) == wb.ARTIFACTS / "notebooks-gpu" / "figures"
    assert base == {"PATH": "/bin", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}  # not modified


def test_execute_phase_runs_each_notebook_in_a_kernel_without_comparing(wb, monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, check=True, **kw):
        calls.append(([str(c) for c in cmd], kw))
        return type("Done", (), {"returncode": 1 if "05_y" in str(cmd[-1]) else 0})()

    monkeypatch.setattr(wb, "run", fake_run)
    phase = wb.Phase("notebooks-gpu", "execute", "gpu", tuple(map(str, NBS)), out=tmp_path / "gpu")
    code, counts = wb.execute_phase(phase, {"X": "1"})
    assert code == 1 and counts == {"tests": 2, "failures": 1, "errors": 0, "skipped": 0}
    cmd, kw = calls[0]
    assert cmd[1:3] == ["-m", "dev.notebook_times"] and cmd[-1] == str(NBS[0])
    assert "--inplace" not in cmd and cmd[cmd.index("--out") + 1] == str(tmp_path / "gpu")
    assert cmd[cmd.index("--timeout") + 1] == str(wb.GPU_CELL_TIMEOUT)
    assert kw["env"] == {"X": "1"} and "cwd" not in kw  # the repository root: `python -m dev.notebook_times`
    assert (tmp_path / "gpu" / "figures").is_dir()  # where phase_env points FLA_LAB_FIGURES_DIR


def test_phases_command_prints_the_gpu_plan(wb, capsys):
    assert wb.main(["phases", "--gpu"]) == 0
    out = capsys.readouterr().out
    assert "unit-cuda" in out and "notebooks-gpu" in out and "CUDA hidden" in out and "CUDA visible" in out


# ------------------------------------------------------------------ the test command with a missing browser

def test_missing_browser_runs_other_phases_then_fails(wb, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(wb, "setup", lambda: None)
    monkeypatch.setattr(wb, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(wb, "ensure_chromium", lambda: (None, "apt-get failed: no network"))

    def fake_pytest(name, args, env=None):
        ran.append((name, env.get("CUDA_VISIBLE_DEVICES")))
        return 0, {"tests": 3, "failures": 0, "errors": 0, "skipped": 0}

    monkeypatch.setattr(wb, "pytest_phase", fake_pytest)
    assert wb.test([]) == 1
    assert ran == [("unit", ""), ("notebooks", ""), ("notebooks-other-cpu", "")]
    out = capsys.readouterr().out
    assert "9 passed, 0 failed" in out and "browser test did not run: apt-get failed: no network" in out


def test_gpu_test_command_runs_six_phases(wb, monkeypatch):
    ran = []
    monkeypatch.setattr(wb, "setup", lambda: None)
    monkeypatch.setattr(wb, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(wb, "ensure_chromium", lambda: ("/usr/bin/chromium", None))
    monkeypatch.setattr(wb, "browser_packages_problem", lambda: None)
    monkeypatch.setattr(wb, "off_pin_versions", lambda: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    counts = {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}
    monkeypatch.setattr(wb, "pytest_phase", lambda name, args, env=None: (
        ran.append((name, env.get("CUDA_VISIBLE_DEVICES", "<unset>"))) or (0, counts)))
    monkeypatch.setattr(wb, "execute_phase", lambda phase, env: (
        ran.append((phase.name, env.get("CUDA_VISIBLE_DEVICES", "<unset>"))) or (0, counts)))
    assert wb.test([]) == 0
    assert ran == [("unit", ""), ("notebooks", ""), ("notebooks-other-cpu", ""), ("unit-cuda", "<unset>"),
                   ("notebooks-gpu", "<unset>"), ("browser", "")]


def test_phase_option_runs_only_the_named_phases_and_passes_the_rest_to_pytest(wb, monkeypatch):
    ran = []
    monkeypatch.setattr(wb, "setup", lambda: None)
    monkeypatch.setattr(wb, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(wb, "ensure_chromium", lambda: pytest.fail("the browser phase was not asked for"))
    monkeypatch.setattr(wb, "off_pin_versions", lambda: [])
    counts = {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}
    monkeypatch.setattr(wb, "pytest_phase", lambda name, args, env=None: ran.append((name, args)) or (0, counts))
    monkeypatch.setattr(wb, "execute_phase", lambda phase, env: ran.append((phase.name, ())) or (0, counts))
    assert wb.test(["--phase", "unit-cuda", "--phase=notebooks-gpu", "-k", "chunk"]) == 0
    assert [name for name, _ in ran] == ["unit-cuda", "notebooks-gpu"]
    assert ran[0][1][-2:] == ["-k", "chunk"]
    assert wb.test(["--phase", "no-such-phase"]) == 2


def _no_chromium(wb, monkeypatch, euid, which):
    monkeypatch.setattr(wb.Path, "exists", lambda self: False if str(self) == "/usr/bin/chromium" else
                        os.path.exists(self))
    monkeypatch.setattr(wb.os, "geteuid", lambda: euid)
    monkeypatch.setattr(wb.shutil, "which", lambda name: which.get(name))


def test_chromium_without_root_or_sudo_is_a_reason_not_an_exit(wb, monkeypatch):
    _no_chromium(wb, monkeypatch, euid=1000, which={})
    path, reason = wb.ensure_chromium()
    assert path is None and "neither root nor has sudo" in reason and "apt-get install chromium" in reason


def test_chromium_apt_failure_is_a_reason_not_an_exit(wb, monkeypatch):
    _no_chromium(wb, monkeypatch, euid=0, which={"apt-get": "/usr/bin/apt-get"})
    calls = []

    def fake_run(cmd, check=True, **kw):
        calls.append(cmd)
        return type("Done", (), {"returncode": 100, "stderr": "E: Could not resolve 'deb.debian.org'\n"})()

    monkeypatch.setattr(wb, "run", fake_run)
    path, reason = wb.ensure_chromium()
    assert path is None and "exit 100" in reason and "Could not resolve" in reason
    assert calls == [["apt-get", "update", "-q"]]


# ------------------------------------------------------------------ a fresh machine: venv without ensurepip

@pytest.fixture
def python_without_ensurepip(tmp_path):
    """This Python, with an `ensurepip` that cannot be imported: Debian's python3 without python3-venv."""
    shadow = tmp_path / "shadow"
    (shadow / "ensurepip").mkdir(parents=True)
    (shadow / "ensurepip" / "__init__.py").write_text("raise ImportError('No module named ensurepip')\n")
    script = tmp_path / "python3"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={shadow} exec {sys.executable} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_venv_problem_names_the_package(wb, python_without_ensurepip):
    assert wb.venv_problem(sys.executable) is None
    problem = wb.venv_problem(python_without_ensurepip)
    version = "%d.%d" % sys.version_info[:2]
    assert "apt install python3-venv" in problem and f"python{version}-venv" in problem


def test_create_venv_exits_before_creating_anything(wb, tmp_path, python_without_ensurepip):
    venv = tmp_path / ".venv"
    with pytest.raises(SystemExit) as exit_:
        wb.create_venv(venv, python_without_ensurepip)
    assert "python3-venv" in str(exit_.value.code)
    assert not venv.exists()


def test_half_made_venv_is_removed_and_not_reused(wb, tmp_path, monkeypatch, python_without_ensurepip):
    venv = tmp_path / ".venv"
    # what Debian's `python3 -m venv` leaves without python3-venv: a real venv without pip
    made = wb.subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0 and (venv / "bin" / "python").exists()
    assert not wb.venv_complete(venv)
    # the next run removes it, then stops at the missing ensurepip instead of reusing it
    with pytest.raises(SystemExit):
        wb.create_venv(venv, python_without_ensurepip)
    assert not venv.exists()


def test_venv_failing_half_way_is_removed(wb, tmp_path):
    """`-m venv` that makes bin/python and pyvenv.cfg, then fails (as Debian's does without ensurepip)."""
    fake = tmp_path / "python3"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && ln -s {sys.executable} "$3/bin/python" && echo "home = /usr/bin" > "$3/pyvenv.cfg"
  echo "The virtual environment was not created successfully because ensurepip is not available." >&2
  exit 1
fi
exec {sys.executable} "$@"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    venv = tmp_path / ".venv"
    with pytest.raises(SystemExit) as exit_:
        wb.create_venv(venv, str(fake))
    message = str(exit_.value.code)
    assert "removed" in message and "ensurepip is not available" in message and "python3-venv" in message
    assert not venv.exists()


def test_complete_venv_is_kept(wb, tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib" / "python3.11" / "site-packages" / "pip").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "pip" / "__init__.py").write_text("")
    assert wb.venv_complete(venv)
    wb.create_venv(venv, "/nonexistent/python")  # nothing to do: the interpreter is never asked
    assert (venv / "pyvenv.cfg").exists()
    assert wb.venv_complete(wb.VENV)  # the real one, as CI has it


def test_venv_with_a_finished_setup_is_never_removed(wb, tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert not wb.venv_complete(venv)  # no pip: what a failed creation leaves
    (venv / wb.STAMP.name).write_text("stamp")  # but the set-up finished here once (pip since removed, say)
    assert wb.venv_complete(venv)
    wb.create_venv(venv, "/nonexistent/python")
    assert (venv / "pyvenv.cfg").exists()


# ------------------------------------------------------------------ the learner's edition
def test_notebooks_are_the_editions_sources(wb):
    from fla_lab.teaching import edition

    assert wb.notebooks() == edition.sources() and len(wb.notebooks()) >= 8


def test_lab_opens_the_learner_edition_with_its_own_figures(wb, monkeypatch):
    calls = []
    monkeypatch.setattr(wb, "setup", lambda: None)
    monkeypatch.setattr(wb, "run", lambda cmd, **kw: calls.append(("run", [str(c) for c in cmd])))
    monkeypatch.setattr(wb.subprocess, "call", lambda cmd, **kw: calls.append(("lab", cmd, kw["env"])) or 0)
    assert wb.lab([]) == 0
    (_, build), (_, lab, env) = calls
    assert build[-3:] == ["-m", "fla_lab", "edition"]
    assert str(ROOT / "learner" / "00_start_here.ipynb") in lab and not any("notebooks/" in a for a in lab)
    assert env["FLA_LAB_FIGURES_DIR"] == str(ROOT / "learner" / "figures")


def test_lab_roots_jupyterlab_at_the_learner_edition(wb, monkeypatch):
    """The server's root is learner/, set on the command line (a user's Jupyter config cannot move it): the
    reference notebooks/ and the guide's docs/ are outside the learner's file browser."""
    calls = []
    monkeypatch.setattr(wb, "setup", lambda: None)
    monkeypatch.setattr(wb, "run", lambda cmd, **kw: None)
    monkeypatch.setattr(wb.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    assert wb.lab(["--port=9999"]) == 0
    (cmd,) = calls
    roots = [a.split("=", 1)[1] for a in cmd if a.startswith(("--ServerApp.root_dir=", "--notebook-dir="))]
    assert roots == [str(ROOT / "learner")] == [str(wb.lab_root())]
    assert cmd[cmd.index("lab") + 1:] == [*wb.lab_arguments(ROOT / "learner"), "--port=9999", *(
        ["--allow-root"] if os.geteuid() == 0 else [])]
    opened = [Path(a) for a in cmd if a.endswith(".ipynb")]
    assert opened == [ROOT / "learner" / "00_start_here.ipynb"]  # inside the root, as JupyterLab requires
    assert "--ServerApp.terminals_enabled=False" in cmd  # a terminal would open a shell in the checkout
    for outside in (ROOT / "notebooks", ROOT / "docs" / "onboarding.md"):
        assert Path(roots[0]) not in outside.parents
    assert wb.lab_root(Path("/elsewhere")) == Path("/elsewhere/learner")  # the browser test's copy of the tree


def test_reset_names_the_notebook_or_prints_its_usage(wb, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(wb, "setup", lambda: None)
    monkeypatch.setattr(wb, "run", lambda cmd, **kw: calls.append([str(c) for c in cmd]) or
                        wb.subprocess.CompletedProcess(cmd, 0))
    assert wb.reset([]) == 2 and "usage" in capsys.readouterr().out and not calls
    assert wb.reset(["03a"]) == 0
    assert calls[0][-4:] == ["fla_lab", "edition", "--reset", "03a"]


def test_offline_gpu_setup_without_usable_torch_says_what_to_do(wb, monkeypatch, tmp_path):
    monkeypatch.setattr(wb, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(wb, "index_reachable", lambda: False)
    monkeypatch.setattr(wb, "preinstalled_torch", lambda: (None, "its torch 2.13.0+cpu is not a CUDA build >= 2.11"))
    monkeypatch.setattr(wb, "create_venv", lambda venv: pytest.fail("nothing is created before the reason is given"))
    with pytest.raises(SystemExit) as exit_:
        wb.setup()
    message = str(exit_.value)
    assert "no network" in message and "not a CUDA build" in message and "PIP_FIND_LINKS" in message


def test_offline_gpu_setup_uses_the_preinstalled_torch(wb, monkeypatch, tmp_path):
    """No network, a CUDA torch in the interpreter: .venv sees its packages (a .pth), only the missing pins are
    installed, from local wheels (--no-index), and torch is never downloaded."""
    venv, site = tmp_path / ".venv", tmp_path / "site"
    site.mkdir()
    found = {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "python": "/opt/py", "dirs": ["/opt/site"]}
    calls = []
    monkeypatch.setattr(wb, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(wb, "index_reachable", lambda: False)
    monkeypatch.setattr(wb, "preinstalled_torch", lambda: (found, ""))
    monkeypatch.setattr(wb, "create_venv", lambda v: venv.mkdir(exist_ok=True))
    monkeypatch.setattr(wb, "STAMP", venv / ".fla_lab_setup")
    monkeypatch.setattr(wb, "missing_requirements", lambda: ["nbval==0.11.0", "ipykernel==7.4.0"])
    monkeypatch.setattr(wb, "install_torch", lambda *a: pytest.fail("torch is not installed"))
    monkeypatch.setattr(wb, "pip", lambda *a, check=True: calls.append(a) or subprocess.CompletedProcess(a, 0))

    def fake_run(cmd, check=True, **kw):
        calls.append(tuple(map(str, cmd)))
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{site}\n")

    monkeypatch.setattr(wb, "run", fake_run)
    wb.setup()
    # triton 3.6's interpreter needs a numpy before 2.4 (numpy_for_triton), so its pin comes along
    assert ("--no-index", "nbval==0.11.0", "ipykernel==7.4.0", "numpy==2.3.5") in calls
    assert (site / wb.PREINSTALLED_PTH).read_text().splitlines() == ["/opt/site", str(wb.ROOT)]
    assert "preinstalled" not in wb.STAMP.read_text() and wb.STAMP.read_text() == wb.wanted_stamp(
        "gpu+preinstalled torch 2.11.0+cu130 triton 3.6.0")


def test_missing_requirements_counts_any_installed_version(wb, monkeypatch):
    have = {"torch": "2.11.0+cu130", "triton": "3.6.0", "numpy": "2.4.1", "matplotlib": "3.10.0", "tqdm": "4.0",
            "pytest": "8.0", "pytest-xdist": "3.0", "hypothesis": "6.0"}
    monkeypatch.setattr(wb, "installed_names", lambda python=None: have)
    todo = wb.missing_requirements()
    assert not any(t.startswith(("torch==", "triton==", "numpy==", "matplotlib==")) for t in todo)
    assert "nbval==0.11.0" in todo and "ipykernel==7.4.0" in todo
    have["numpy"] = "2.5.2"  # Triton's interpreter fails with it: the pin goes into .venv
    assert any(t.startswith("numpy==") for t in wb.missing_requirements())


def test_a_preinstalled_triton_3_6_gets_a_numpy_its_interpreter_can_use(wb):
    todo = ["numpy==2.4.6", "nbval==0.11.0"]
    assert wb.numpy_for_triton(todo, "2.5.2", "3.6.0") == ["nbval==0.11.0", "numpy==2.3.5"]
    assert wb.numpy_for_triton(["nbval==0.11.0"], "2.3.5", "3.6.0") == ["nbval==0.11.0"]
    assert wb.numpy_for_triton(todo, "2.5.2", "3.7.1") == todo


def test_saved_outputs_do_not_depend_on_the_cpu(wb, monkeypatch):
    """The interpreter's dots run in numpy's OpenBLAS, whose kernels differ by CPU: every phase and `execute` pin one
    family on x86-64 (a user's own choice kept), so the saved outputs' last digits are the same on every machine."""
    monkeypatch.setattr(wb.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert wb.test_env()["OPENBLAS_CORETYPE"] == "Haswell" == wb.lab_env()["OPENBLAS_CORETYPE"]
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert wb.test_env()["OPENBLAS_CORETYPE"] == "Zen"
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.setattr(wb.platform, "machine", lambda: "aarch64")
    assert "OPENBLAS_CORETYPE" not in wb.test_env()


def test_the_other_cpu_phase_compares_the_same_outputs_as_another_machine_would(wb):
    """Issue 42: the saved outputs must not depend on the thread count or the CPU's vector width. The second nbval
    phase compares the same notebooks (not the prose: the same markdown) with the thread count this machine would
    not use and AVX2 kernels in ATen, oneDNN and MKL."""
    by = {p.name: p for p in wb.plan_phases(gpu=False, nbs=NBS)}
    other, main = by["notebooks-other-cpu"], by["notebooks"]
    assert [a for a in other.args if a != wb.PROSE_TEST] == [a for a in main.args if a != wb.PROSE_TEST]
    assert wb.PROSE_TEST not in other.args and not main.env
    env = wb.phase_env(other, base={"OMP_NUM_THREADS": "8"})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2" == env["ONEDNN_MAX_CPU_ISA"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert wb.another_cpu(cores=2)["OMP_NUM_THREADS"] == "1" and wb.another_cpu(cores=1)["OMP_NUM_THREADS"] == "2"
    assert "ATEN_CPU_CAPABILITY=avx2" in wb.describe_phase(other)


def test_execute_saves_through_short_polls_not_nbconvert(wb, monkeypatch, tmp_path):
    """`workbook.py execute` runs fla_lab.teaching.edition.execute_file (nbclient, short socket polls), not `nbconvert
    --execute`, whose single long poll can miss a widget cell's reply and wait out the cell's timeout."""
    calls = []
    monkeypatch.setattr(wb, "setup", lambda: None)
    monkeypatch.setattr(wb, "clean_saved_outputs", lambda nb: None)
    monkeypatch.setattr(wb, "run", lambda cmd, check=True, **kw: calls.append(([str(c) for c in cmd], kw)))
    assert wb.execute([str(NBS[0])]) == 0
    (cmd, kw), = calls
    assert "nbconvert" not in " ".join(cmd) and "execute_file" in cmd[2] and cmd[-1] == str(NBS[0])
    assert kw["env"]["CUDA_VISIBLE_DEVICES"] == "" and kw["cwd"] == NBS[0].parent
