"""
Tests for study.py's run table: offline, no training (~5 s).

    python -m pytest tests/test_study.py -q
"""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import config  # noqa: E402
import study  # noqa: E402

RUNS = [name for part in study.PARTS.values() for name in part]


@pytest.mark.parametrize("name", RUNS)
def test_every_run_is_a_valid_command_line(name):
    """A typo in the table would cost an afternoon of study before the run that has it fails."""
    cfg = config.parse_args([*study.flags_of(name), "--run_name", name])
    assert cfg.run_name == name


def test_2x_doubles_the_toy_preset():
    cfg = config.parse_args(study.flags_of("budget2x-s0"))
    assert (cfg.think_min_tokens, cfg.think_max_tokens) == (2 * config.TOY["think_min_tokens"],
                                                            2 * config.TOY["think_max_tokens"])


def test_each_axis_changes_one_thing_against_the_seeds():
    """An axis run differs from the default's seeds in its axis's flags and the seed only."""
    base = config.to_dict(config.parse_args(study.flags_of("default-s0")))
    for name in study.PARTS["axes"]:
        cfg = config.to_dict(config.parse_args(study.flags_of(name)))
        changed = {k for k in base if base[k] != cfg[k]} - {"seed"}
        typed = {f.removeprefix("--") for f in study.flags_of(name) if f.startswith("--")} - {"seed"}
        assert changed and changed <= typed | {"model_path"}, (name, changed)


def test_unknown_run_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "study.py", "--runs", "nosuch"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown runs ['nosuch']") and len(proc.stderr.strip().splitlines()) == 1


def test_a_run_is_finished_at_the_presets_max_steps():
    """Raising the toy's max_steps makes a finished run unfinished again, so study.py resumes it to the new end."""
    assert study.target_steps("default-s0") == config.TOY["max_steps"]
    assert study.target_steps("batch64-s0") == config.TOY["max_steps"]
