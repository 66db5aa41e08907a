#!/usr/bin/env python3
"""Run notebooks top to bottom in a Jupyter kernel (nbclient) and say where the time goes, cell by cell.

    python -m dev.notebook_times                       # every notebook, this machine's device
    python -m dev.notebook_times --device cpu 00 03a   # CUDA hidden (the interpreter), two notebooks
    python -m dev.notebook_times --repeat 2 --triton-cache /tmp/tc --json times.json   # cold, then warm

For each notebook: the kernel's start, each code cell's wall time, and, on a GPU, how many Triton kernel
specialisations the cell compiled (a miss of Triton's in-process cache: compiled, or loaded from its disk cache)
and the seconds spent in those compiles. Every cell has a timeout (--timeout); a cell that runs past it stops that
notebook, and the kernel's threads are dumped (faulthandler) so the report shows where it hangs.

Widgets (`--widgets`): after the last cell, every ipywidgets explorer the notebook made is driven from the kernel
as a learner would drive it: each control is moved to another value (the first move may compile kernels), moved
back, and moved again (warm); the time of each redraw is reported, and an error inside a redraw fails the run. This is
the kernel's side of a widget's response (the browser adds its rendering: tests/browser times that on the CPU).

Exercises: each exercise's check cell (tag `check`) runs on the stub and must print NOT YET; the `solution` cells after
it (the solution, then the same check) must print PASS (reported per exercise, and a
failure of either fails the run).

`--repeat 2` with an empty `--triton-cache` gives a cold run (every kernel compiled) and a warm one (Triton's disk
cache filled, a fresh kernel process: what a learner meets on a second session). Exit status: 0 when every
notebook ran to the end and every exercise check said what it should.

Each notebook's wall time, and its kernel process's CPU seconds (user + system: unlike wall time, independent of
what else runs) with the load average before and after it. The times file (`notebook_times_data.py`):

    python -m dev.notebook_times --device cpu --record benchmarks/results/notebook_times.json
    python -m dev.notebook_times --record benchmarks/results/notebook_times.json \
        --import times_h100.json --meta meta_h100.json        # a run made elsewhere (its card, versions, date)
    python -m dev.notebook_times --render [--write]   # the guide's and README's times from the file

`--record` merges this run (device, versions, date, commit, command, per-notebook times) into the file, replacing
the earlier run of the same device; `--render --write` rewrites the passages between `<!-- times:...:begin/end -->`.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from dev import notebook_times_data as times

ROOT = Path(__file__).resolve().parent.parent

# Runs in the kernel before the first cell (ipykernel's exec_files): faulthandler on SIGUSR1, and a wrapper around
# Triton's JITFunction._do_compile that logs each compile. It imports nothing heavy: the wrapper is installed when
# the notebook itself first imports triton.runtime.jit, so the notebook's import order (fla_lab before triton,
# which switches the interpreter on without CUDA) is untouched.
KERNEL_STARTUP = r'''
import faulthandler as _fh, importlib.abc as _iabc, importlib.util as _iutil, json as _json, os as _os
import signal as _signal, sys as _sys, time as _time
_fla_stack_file = open(_os.environ["FLA_LAB_NB_STACKS"], "w")
_fh.register(_signal.SIGUSR1, file=_fla_stack_file, all_threads=True)

def _fla_patch_jit(module):
    cls = getattr(module, "JITFunction", None)
    original = getattr(cls, "_do_compile", None)
    if original is None or getattr(original, "_fla_timed", False):
        return
    log = _os.environ["FLA_LAB_NB_COMPILES"]
    def _do_compile(self, *args, **kwargs):
        start = _time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            with open(log, "a") as f:
                f.write(_json.dumps({"kernel": getattr(self, "__name__", "?"), "s": _time.perf_counter() - start})
                        + "\n")
    _do_compile._fla_timed = True
    cls._do_compile = _do_compile

class _FlaJitHook(_iabc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "triton.runtime.jit":
            return None
        _sys.meta_path.remove(self)
        spec = _iutil.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _fla_patch_jit(module)
        spec.loader.exec_module = exec_module
        return spec

if "triton.runtime.jit" in _sys.modules:
    _fla_patch_jit(_sys.modules["triton.runtime.jit"])
else:
    _sys.meta_path.insert(0, _FlaJitHook())
del _FlaJitHook
'''


def notebook_list(names: list[str]) -> list[Path]:
    import workbook  # the repository's root module (this runs from the root: python -m dev.notebook_times)

    every = workbook.notebooks()
    if not names:
        return every
    chosen = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            chosen.append(path.resolve())
            continue
        matches = [nb for nb in every if nb.name.startswith(name)]
        if not matches:
            sys.exit(f"no notebook matches {name!r} (have: {', '.join(nb.name for nb in every)})")
        chosen.extend(matches)
    return chosen


def text_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(out["text"] if isinstance(out["text"], str) else "".join(out["text"]))
        elif out.get("output_type") in ("execute_result", "display_data"):
            parts.append(str(out.get("data", {}).get("text/plain", "")))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join(parts)


def exercise_checks(nb) -> list[dict]:
    """For each exercise: its check cell (tag `check`, run on the stub) must say NOT YET, and the `solution` cells
    after it (the solution, then the same check) must print a PASS, with no error."""
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    found = []
    for pos, (i, cell) in enumerate(code):
        if "check" not in cell.metadata.get("tags", []):
            continue
        block = []
        for j, c in code[pos + 1:]:
            tags = c.metadata.get("tags", [])
            if "solution" not in tags:
                if block:
                    break
                continue
            block.append((j, c))
        before, after = text_of(cell), "".join(text_of(c) for _, c in block)
        found.append({"stub_check_cell": i, "check_cell": block[-1][0] if block else None,
                      "solution_cell": block[0][0] if block else None, "before": before, "after": after,
                      "before_ok": "NOT YET" in before and "PASS" not in before,
                      "after_ok": bool(block) and "PASS" in after and "NOT YET" not in after and not any(
                          o.get("output_type") == "error" for _, c in block for o in c.get("outputs", []))})
    return found


# Runs in the kernel after the notebook's last cell (--widgets): one JSON line with each control's redraw times.
WIDGET_PROBE = r'''
def _fla_widget_probe():
    import json, time
    import ipywidgets
    from ipywidgets.widgets import widget as _widget

    live = getattr(_widget, "_instances", None) or getattr(ipywidgets.Widget, "widgets", {})
    found = []
    for w in list(live.values()):
        if not isinstance(w, ipywidgets.interactive) or getattr(w, "_fla_probed", False):
            continue
        w._fla_probed = True
        button = getattr(w, "manual_button", None)  # interact_manual: a change redraws on the button's click
        for c in w.kwargs_widgets:
            if isinstance(c.value, tuple) and len(c.value) > 1:  # a multiple selection: drop one, restore it
                first, other = c.value, c.value[:-1]
                moves = [("value", other), ("value", first), ("value", other)]
            elif hasattr(c, "options") and len(c.options) > 1:
                first, other = c.index, (c.index + 1) % len(c.options)
                moves = [("index", other), ("index", first), ("index", other)]
            elif hasattr(c, "max") and hasattr(c, "min"):
                first = c.value
                if type(c).__name__ == "FloatLogSlider":
                    other = 10 ** (c.min + 0.75 * (c.max - c.min))
                else:
                    other = c.max if c.value != c.max else c.min
                moves = [("value", other), ("value", first), ("value", other)]
            else:
                continue
            times, errors = [], 0
            for attr, value in moves:
                t0 = time.perf_counter()
                setattr(c, attr, value)
                if button is not None:
                    button.click()
                times.append(round(time.perf_counter() - t0, 3))
                errors += sum(o.get("output_type") == "error" for o in w.out.outputs)
            found.append({"control": c.description, "first_s": times[0], "back_s": times[1], "warm_s": times[2],
                          "errors": errors})
    print("FLA_WIDGETS " + json.dumps(found))
_fla_widget_probe()
'''


def widget_times(client, nb) -> list[dict]:
    """Drive every explorer of the finished notebook from the kernel (WIDGET_PROBE) and read its timings."""
    import nbformat

    from nbclient.exceptions import CellExecutionError

    cell = nbformat.v4.new_code_cell(WIDGET_PROBE)
    nb.cells.append(cell)
    try:
        client.execute_cell(cell, len(nb.cells) - 1)
    except CellExecutionError as exc:  # the probe's own failure, reported as such (the notebook itself ran)
        raise RuntimeError(f"the widget probe failed: {str(exc)[-600:]}") from None
    finally:
        nb.cells.pop()
    for line in text_of(cell).splitlines():
        if line.startswith("FLA_WIDGETS "):
            return json.loads(line[len("FLA_WIDGETS "):])
    raise RuntimeError(f"the widget probe printed no timings: {text_of(cell)[-500:]}")


def kernel_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system, its finished children's too) the kernel process has used: unlike wall time, this
    does not grow when other processes share the cores."""
    if not pid:
        return None
    try:
        import psutil  # ipykernel depends on it

        t = psutil.Process(pid).cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    except Exception:  # no psutil, or the kernel is gone
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None


def kernel_pid(client) -> int | None:
    km = client.km
    for getter in (lambda: km.provisioner.process.pid, lambda: km.kernel.pid, lambda: km.provisioner.pid):
        try:
            pid = getter()
            if pid:
                return int(pid)
        except Exception:
            pass
    return None


from fla_lab.teaching.edition import short_polls  # noqa: E402  (waits on the kernel's sockets in short slices)


def _trace_channels(client, timeline: list, state: dict) -> None:
    """Log every message the client receives (channel, type, whether it answers the running cell, seconds into it)."""
    for name in ("iopub", "shell"):
        channel = getattr(client.kc, f"{name}_channel")
        original = channel.get_msg

        async def get_msg(*args, _original=original, _name=name, **kwargs):
            msg = await _original(*args, **kwargs)
            if state.get("msg_id") is not None:
                mine = msg.get("parent_header", {}).get("msg_id") == state["msg_id"]
                detail = msg.get("content", {}).get("execution_state") or msg.get("content", {}).get("name") or ""
                timeline.append((round(time.perf_counter() - state["t0"], 3), _name, msg["msg_type"], detail, mine))
            return msg

        channel.get_msg = get_msg


def _watchdog(client, stacks: Path, after: float, state: dict, result: dict) -> None:
    """After `after` seconds in one cell, dump the kernel's threads (SIGUSR1: faulthandler) and the client's."""
    import faulthandler
    import threading

    def watch():
        dumped = set()
        while not state.get("done"):
            time.sleep(0.5)
            index, t0 = state.get("index"), state.get("t0")
            if index is None or index in dumped or time.perf_counter() - t0 < after:
                continue
            dumped.add(index)
            pid = kernel_pid(client)
            before = stacks.stat().st_size
            if pid:
                os.kill(pid, signal.SIGUSR1)
            time.sleep(1.5)
            with open(stacks) as f:
                f.seek(before)
                kernel = f.read()
            with tempfile.TemporaryFile("w+") as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
                f.seek(0)
                mine = f.read()
            result.setdefault("slow_cells", {})[index] = {"kernel_stacks": kernel, "client_stacks": mine}

    threading.Thread(target=watch, daemon=True).start()


def run_notebook(path: Path, timeout: int, kernel_args: list[str], out_dir: Path | None, work: Path,
                 trace_after: float | None = None, keep_going: bool = False, long_polls: bool = False,
                 widgets: bool = False) -> dict:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(path, as_version=4)
    compiles = work / f"{path.stem}.compiles.jsonl"
    stacks = work / f"{path.stem}.stacks.txt"
    for f in (compiles, stacks):
        f.unlink(missing_ok=True)
        f.touch()
    startup = work / "kernel_startup.py"
    startup.write_text(KERNEL_STARTUP)
    os.environ["FLA_LAB_NB_COMPILES"] = str(compiles)
    os.environ["FLA_LAB_NB_STACKS"] = str(stacks)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            extra_arguments=[f"--IPKernelApp.exec_files={startup}", *kernel_args])
    result = {"notebook": path.name, "cells": [], "status": "ok", "compiles": 0, "compile_s": 0.0,
              "load_avg_before": round(os.getloadavg()[0], 2)}
    t_nb = time.perf_counter()
    pid = None
    seen = 0
    state: dict = {}
    try:
        with client.setup_kernel():
            result["kernel_start_s"] = time.perf_counter() - t_nb
            pid = kernel_pid(client)
            result["kernel_start_cpu_s"] = kernel_cpu_s(pid)
            if not long_polls:
                short_polls(client)
            timeline: list = []
            if trace_after is not None:
                _trace_channels(client, timeline, state)
                _watchdog(client, stacks, trace_after, state, result)
                original_execute = client.kc.execute

                def execute(*args, **kwargs):  # the id of the cell's request, to tell its replies from others
                    state["msg_id"] = original_execute(*args, **kwargs)
                    return state["msg_id"]

                client.kc.execute = execute
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                t0 = time.perf_counter()
                state.update(index=index, t0=t0, msg_id=None)
                timeline.clear()
                status = "ok"
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    status = "timeout"
                    pid = kernel_pid(client)
                    if pid:
                        os.kill(pid, signal.SIGUSR1)
                        time.sleep(2.0)
                    result["stacks"] = stacks.read_text()
                except CellExecutionError as exc:
                    status = "error"
                    result.setdefault("error", str(exc)[-2000:])
                elapsed = time.perf_counter() - t0
                state["index"] = None
                if trace_after is not None and elapsed >= trace_after:
                    result.setdefault("slow_cells", {}).setdefault(index, {})["messages"] = list(timeline)
                lines = compiles.read_text().splitlines()
                new = [json.loads(x) for x in lines[seen:]]
                seen = len(lines)
                first_line = next((ln for ln in cell.source.splitlines() if ln.strip() and not ln.startswith("#")), "")
                cpu = kernel_cpu_s(pid)
                result["cells"].append({"index": index, "s": round(elapsed, 3), "status": status,
                                        "cpu_s_so_far": None if cpu is None else round(cpu, 3),
                                        "compiles": len(new), "compile_s": round(sum(c["s"] for c in new), 3),
                                        "kernels": sorted({c["kernel"] for c in new}), "first_line": first_line[:70]})
                result["compiles"] += len(new)
                result["compile_s"] += sum(c["s"] for c in new)
                if status != "ok":
                    result["status"] = result.get("status") if result["status"] != "ok" else f"{status} in cell {index}"
                    if not (keep_going and status == "error"):
                        break
            cpu = kernel_cpu_s(pid)  # the notebook's cells and the kernel's start, not the widget probe
            result["cpu_s"] = None if cpu is None else round(cpu, 3)
            if widgets and result["status"] == "ok":
                try:
                    result["widgets"] = widget_times(client, nb)
                except RuntimeError as exc:
                    result["status"], result["error"] = "widget probe failed", str(exc)
                if any(w["errors"] for w in result.get("widgets", [])):
                    result["status"] = "error in a widget redraw"
    except Exception as exc:  # the kernel died, or could not start
        result["status"] = f"failed: {type(exc).__name__}: {exc}"[:500]
    state["done"] = True
    result["total_s"] = round(time.perf_counter() - t_nb, 3)
    result["load_avg_after"] = round(os.getloadavg()[0], 2)
    result["compile_s"] = round(result["compile_s"], 3)
    result["exercises"] = exercise_checks(nb) if result["status"] == "ok" else []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / path.name)
    return result


def summary_line(r: dict) -> str:
    ex = r["exercises"]
    bad = [e for e in ex if not e["after_ok"] or e["before_ok"] is False]
    exercises = f"{len(ex) - len(bad)}/{len(ex)} exercises ok" if ex else "no exercises"
    cpu = f"  CPU {r['cpu_s']:6.1f} s" if r.get("cpu_s") is not None else ""
    return (f"{r['notebook']:<46} {r['total_s']:7.1f} s{cpu}  load {r['load_avg_before']:.1f}-{r['load_avg_after']:.1f}"
            f"  kernel start {r.get('kernel_start_s', 0):4.1f} s  "
            f"{len(r['cells']):3d} cells  {r['compiles']:3d} compiles {r['compile_s']:6.1f} s  {exercises}  "
            f"{r['status']}")


META_NAMES = {"gpu": "device", "card": "device", "device_name": "device", "gpu_name": "device", "command": "how",
              "torch_version": "torch", "triton_version": "triton", "python_version": "python", "git_commit": "commit",
              "date_utc": "date", "cpu_count": "cores"}


def fields(pairs: list[str]) -> dict:
    return dict(pair.split("=", 1) for pair in pairs)


def this_machine(device: str, argv: list[str] | None) -> dict:
    """Device, versions, date, commit and command of a run made here (for --record)."""
    import datetime
    import importlib.metadata as md
    import platform
    import subprocess

    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    name = "cpu"
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"device": name, "python": platform.python_version(), "torch": md.version("torch"),
            "triton": md.version("triton"), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if dirty else ""),
            "how": "python -m dev.notebook_times " + " ".join(argv if argv is not None else sys.argv[1:]),
            "cpu_model": model, "cores": os.cpu_count()}


def record(path: str, repeats: list[list[dict]], meta: dict) -> None:
    data = times.load(Path(path)) if Path(path).exists() else {"reading": {}, "runs": []}
    run = times.run_from_results(repeats, meta)
    missing = [k for k in times.RUN_KEYS if not run.get(k)]
    if missing:
        sys.exit(f"notebook_times: the run names no {', '.join(missing)} (--meta, --set KEY=VALUE)")
    times.save(times.merge(data, run), Path(path))
    print(f"notebook_times: recorded the {run['device']} run ({run['date']}) in {path}")


def times_file_only(args, argv) -> int:
    """--import (record an earlier run's results) and --render: no notebook runs."""
    if args.import_from:
        if not args.record:
            sys.exit("notebook_times: --import needs --record FILE")
        raw = json.loads(Path(args.import_from).read_text())
        meta = {}
        if isinstance(raw, dict):  # {"card", "commit", "meta": {versions, date}, "runs": {"cold": [...], "warm": [...]}}
            meta = {**raw.get("meta", {}), "card": raw.get("card"), "commit": raw.get("commit")}
            raw = list(raw["runs"].values())
        if raw and isinstance(raw[0], dict):  # one flat list, each result labelled by its run (cold, warm)
            labels = list(dict.fromkeys(r.get("run", "run 1") for r in raw))
            raw = [[r for r in raw if r.get("run", "run 1") == label] for label in labels]
        meta.update(json.loads(Path(args.meta).read_text()) if args.meta else {})
        meta = {META_NAMES.get(k, k): v for k, v in {**meta, **fields(args.set)}.items()}
        meta["date"] = str(meta.get("date", ""))[:10] or None  # a day, not a time of day
        record(args.record, raw, meta)
    if args.render:
        data = times.load(Path(args.record) if args.record else times.TIMES_FILE)
        if args.write:
            changed = times.render(data, write=True)
            print("notebook_times: rewrote " + (", ".join(changed) if changed else "nothing (already up to date)"))
        else:
            for path, passages in times.blocks(data).items():
                for name, body in passages.items():
                    print(f"== {path.relative_to(times.ROOT)}: times:{name}\n{body}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="names or prefixes (default: every notebook)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="cpu hides CUDA (CUDA_VISIBLE_DEVICES=''), gpu keeps it (default: as the environment)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole list (2: cold, then warm cache)")
    parser.add_argument("--triton-cache", help="TRITON_CACHE_DIR for the kernels (emptied first)")
    parser.add_argument("--kernel-arg", action="append", default=[], help="extra ipykernel argument")
    parser.add_argument("--out", help="folder for the executed notebooks (last run)")
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--trace-slow", type=float, metavar="SECONDS",
                        help="for a cell still running after SECONDS: dump the kernel's and the client's threads and "
                             "list the messages the client received during it")
    parser.add_argument("--long-polls", action="store_true",
                        help="wait on the kernel's sockets as nbclient does (one poll per timeout): shows the stall")
    parser.add_argument("--keep-going", action="store_true", help="run the cells after a failing cell too")
    parser.add_argument("--widgets", action="store_true",
                        help="after the last cell, move every explorer's controls and time each redraw")
    parser.add_argument("--cells", type=int, default=5, help="slowest cells listed per notebook (default 5)")
    parser.add_argument("--record", metavar="FILE", help="merge this run into the times file (notebook_times.json)")
    parser.add_argument("--import", dest="import_from", metavar="JSON",
                        help="with --record: record the results of an earlier --json run instead of running")
    parser.add_argument("--meta", metavar="JSON", help="with --import: the run's device (card), versions, date, "
                        "commit and command (keys device, python, torch, triton, date, commit, how)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="with --record: a run field")
    parser.add_argument("--render", action="store_true",
                        help="print the guide's and README's time passages made from the times file")
    parser.add_argument("--write", action="store_true", help="with --render: write them into their files")
    args = parser.parse_args(argv)
    if args.render or args.import_from:
        return times_file_only(args, argv)

    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif args.device == "gpu" and os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        del os.environ["CUDA_VISIBLE_DEVICES"]
    os.environ.pop("TRITON_INTERPRET", None)
    if args.triton_cache:
        import shutil

        shutil.rmtree(args.triton_cache, ignore_errors=True)
        Path(args.triton_cache).mkdir(parents=True)
        os.environ["TRITON_CACHE_DIR"] = args.triton_cache
    paths = notebook_list(args.notebooks)
    work = Path(tempfile.mkdtemp(prefix="nbtimes-"))
    runs = []
    for rep in range(args.repeat):
        label = ("cold" if rep == 0 else "warm") if args.triton_cache else f"run {rep + 1}"
        print(f"== {label} ({args.device}, cell timeout {args.timeout} s)", flush=True)
        results = []
        for path in paths:
            r = run_notebook(path, args.timeout, args.kernel_arg, Path(args.out) if args.out else None, work,
                             args.trace_slow, args.keep_going, args.long_polls, args.widgets)
            r["run"] = label
            results.append(r)
            print(summary_line(r), flush=True)
            for c in sorted(r["cells"], key=lambda c: -c["s"])[:args.cells]:
                kernels = f" [{', '.join(c['kernels'][:4])}{', ...' if len(c['kernels']) > 4 else ''}]" if c["kernels"] else ""
                print(f"    cell {c['index']:>3} {c['s']:7.2f} s  compiles {c['compiles']:3d} ({c['compile_s']:5.1f} s)"
                      f"  {c['status']:<7} {c['first_line']}{kernels}", flush=True)
            if r.get("widgets") is not None:
                ws = r["widgets"]
                worst = max(ws, key=lambda w: w["warm_s"], default=None)
                print(f"    widgets: {len(ws)} controls; first move max {max((w['first_s'] for w in ws), default=0):.2f} s, "
                      f"warm max {max((w['warm_s'] for w in ws), default=0):.2f} s"
                      + (f" ({worst['control']})" if worst else ""), flush=True)
                for w in ws:
                    print(f"      {w['control']:<24} first {w['first_s']:6.2f} s  back {w['back_s']:6.2f} s  "
                          f"warm {w['warm_s']:6.2f} s  errors {w['errors']}", flush=True)
            for e in r["exercises"]:
                print(f"    exercise (solution cell {e['solution_cell']}): stub check "
                      f"{'NOT YET' if e['before_ok'] else ('-' if e['before_ok'] is None else 'WRONG')}, "
                      f"solution check {'PASS' if e['after_ok'] else 'WRONG'}", flush=True)
            for index, slow in r.get("slow_cells", {}).items():
                messages = slow.get("messages", [])
                print(f"    cell {index}: {len(messages)} messages received while it ran (seconds, channel, type, "
                      f"state/name, answers this cell):")
                for m in messages[:25] + ([("...",)] if len(messages) > 35 else []) + messages[25:][-10:]:
                    print("      " + " ".join(map(str, m)))
                for who in ("kernel", "client"):
                    if slow.get(f"{who}_stacks"):
                        print(f"    cell {index}: {who} threads after {args.trace_slow:g} s:")
                        print("\n".join("      " + ln for ln in slow[f"{who}_stacks"].splitlines()[:60]))
            if r.get("stacks"):
                print("    kernel threads at the timeout:\n" + "\n".join("      " + ln for ln in r["stacks"].splitlines()[:80]))
            if r.get("error"):
                print("    error: " + r["error"][-800:].replace("\n", "\n      "))
        runs.append(results)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    if args.record:
        record(args.record, runs, {**this_machine(args.device, argv), **fields(args.set)})
    print("\nnotebook" + "".join(f" | {r[0]['run']:>9}" for r in runs) + " | cells | compiles | compile s")
    for i, path in enumerate(paths):
        row = runs[0][i]
        print(f"{path.name[:40]:<40}" + "".join(f" | {rs[i]['total_s']:8.1f}s" for rs in runs)
              + f" | {len(row['cells']):5d} | {row['compiles']:8d} | {row['compile_s']:8.1f}")
    ok = all(r["status"] == "ok" and all(e["after_ok"] and e["before_ok"] is not False for e in r["exercises"])
             for rs in runs for r in rs)
    print("notebook_times: " + ("every notebook ran to the end, every exercise check as expected" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
