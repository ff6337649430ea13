"""Shared fixtures: the toy model (built once into out/, where train.py also finds it) and in-process vLLM
engines, one per engine configuration, shared by the whole test session (start-up costs seconds)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import config  # noqa: E402
import data  # noqa: E402


@pytest.fixture(scope="session")
def toy_path():
    return data.build_toy_model(os.path.join(ROOT, "out"))


@pytest.fixture(scope="session")
def tokenizer(toy_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(toy_path)


_engines = {}


@pytest.fixture(scope="session")
def make_generator(toy_path, tokenizer):
    """make_generator(*flags) -> a Generator for the toy with those flags, built once per distinct flags.
    Tests may change cfg fields the engine does not depend on (budgets, group, k) on the returned object."""
    import generate

    def make(*flags, path=None):
        key = (flags, path)
        if key not in _engines:
            cfg = config.parse_args(list(flags))
            _engines[key] = generate.Generator(cfg, path or toy_path, tokenizer, "cpu")
        return _engines[key]
    yield make
    _engines.clear()


@pytest.fixture(scope="session")
def toy_rows(tokenizer):
    cfg = config.parse_args([])
    train, val, grade = data.load_task(cfg, tokenizer)
    return train, val, grade


OUT = os.path.join(ROOT, "out")  # train.py's default out_dir: the toy model is cached there


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


def run_train(*args, timeout=600, env=None, cwd=ROOT):
    """Run train.py as users do; returns the CompletedProcess (stdout+stderr in .stdout)."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **(env or {})})
