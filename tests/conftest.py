import os
import sys

import pytest
import torch

import fla_lab  # noqa: F401  (switches the interpreter on before any kernel module is imported)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one pytest worker per core already: torch's own threads would only contend with the other workers
    torch.set_num_threads(1)


def pytest_runtest_logreport(report):
    """With FLA_LAB_TEST_TIMES=FILE, append each test's phase time and outcome to FILE as it finishes (in the
    controller only under xdist): a GPU run cut off by its time limit still leaves every finished test's time."""
    path = os.environ.get("FLA_LAB_TEST_TIMES")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when == "call" or report.outcome != "passed":
        with open(path, "a") as out:
            out.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_edition_session():
    """`edition.learner_session()` latches its first answer per process: each test decides afresh."""
    from fla_lab.teaching import edition

    edition.reset_session()
    yield
    edition.reset_session()


def run_python(code: str, env_overrides: dict | None = None, drop=("TRITON_INTERPRET",)):
    """Run `code` in a fresh interpreter (the runtime switch happens at import, once per process)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_overrides or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.fixture(autouse=True)
def _report_value_checks_in_their_own_test():
    """On a GPU the value checks are read later (no sync per call): report a test's bad input in that test."""
    yield
    from fla_lab.ops import contract

    contract.flush_value_checks()
