"""Shared fixtures: the toy model (built once into OUT, a folder outside the repository that every test run of
train.py uses as its --out_dir) and in-process vLLM engines, one per engine configuration, shared by the whole
test session (start-up costs seconds)."""
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import config  # noqa: E402
import data  # noqa: E402
import rollouts  # noqa: E402
import toy  # noqa: E402

# train.py's --out_dir in every test: the toy model is cached there across sessions, run folders are removed;
# never the repository's own out/
OUT = os.path.join(tempfile.gettempdir(), "scalerl-tests-out")


@pytest.fixture(scope="session")
def toy_path():
    return toy.build_toy_model(OUT)


@pytest.fixture(scope="session")
def tokenizer(toy_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(toy_path)


_engines = {}


@pytest.fixture(scope="session")
def make_generator(toy_path, tokenizer):
    """make_generator(*flags) -> a Generator for the toy with those flags, built once per distinct flags.
    Tests may swap gen.cfg for a dataclasses.replace of it with other budgets (the engine reads them per request)."""
    import generate

    def make(*flags, path=None):
        key = (flags, path)
        if key not in _engines:
            cfg = config.parse_args(list(flags))
            _engines[key] = generate.Generator(cfg, path or toy_path, tokenizer, "cpu",
                                               updates_in_flight=rollouts.SCHEDULES[cfg.mode].updates_in_flight)
        return _engines[key]
    yield make
    _engines.clear()


@pytest.fixture(scope="session")
def toy_rows(tokenizer):
    cfg = config.parse_args([])
    train, val, grade = data.load_task(cfg, tokenizer)
    return train, val, grade


@pytest.fixture
def run_name(request):
    """A fresh run name; its checkpoint folder under out/ is removed afterwards (the toy cache stays)."""
    import shutil
    import uuid
    names = []

    def make(tag=""):
        names.append(f"test-{tag or request.node.name[:40]}-{uuid.uuid4().hex[:6]}")
        return names[-1]
    yield make
    for name in names:
        shutil.rmtree(os.path.join(OUT, name), ignore_errors=True)


def train_cmd(*args, env=None) -> list[str]:
    """train.py with --out_dir OUT unless given; through tests/faults.py when env plants a fault."""
    script = "tests/faults.py" if any(k.startswith("SCALERL_FAULT_") for k in env or {}) else "train.py"
    out = [] if any(a == "--out_dir" or a.startswith("--out_dir=") for a in args) else ["--out_dir", OUT]
    return [os.path.join(ROOT, script), *args, *out]


def run_train(*args, timeout=600, env=None, cwd=ROOT):
    """Run train.py as users do; returns the CompletedProcess (stdout+stderr in .stdout)."""
    return subprocess.run([sys.executable, *train_cmd(*args, env=env)], cwd=cwd, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **(env or {})})


# The suite's budget (issue 59: 30 minutes on a quiet 2-core machine) holds only if no test grows unnoticed: a test
# whose set-up, call and teardown together take longer than TEST_BOUND_S fails, naming its time. Set-up includes a
# session fixture's first build (an engine: ~5 s), so the bound is on the slowest real test, the torchrun runs, with
# room for a loaded machine; SCALERL_TEST_BOUND_S raises it for a slow one (0 turns it off).
TEST_BOUND_S = float(os.environ.get("SCALERL_TEST_BOUND_S", 150))
_spent = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    _spent[item.nodeid] = _spent.get(item.nodeid, 0.0) + report.duration
    if report.when == "teardown" and TEST_BOUND_S and _spent[item.nodeid] > TEST_BOUND_S and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {_spent[item.nodeid]:.0f} s, over the per-test bound of "
                           f"{TEST_BOUND_S:.0f} s (tests/conftest.py TEST_BOUND_S): share its engines or runs with "
                           f"other tests through fixtures, or make it smaller")
