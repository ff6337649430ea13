"""The math-verify grader (rewards.MathGrader) against adversarial completions.

    .venv/bin/python -m pytest tests/test_grader.py -q

Every item of CORPUS must get -1.0 within timeout_s plus a small margin, write nothing to disk, and leave the
grader working for the items after it; CONTROLS must get +1.0, so the tests cannot pass by always saying -1.
Items that carry a payload name their marker file as "@ABS@" (a path inside pytest's tmp_path) and "@REL@"
(a relative name: the workers' cwd is the grader's temp workdir); both are checked for afterwards.
Gold answers are bare LaTeX in MATH-style datasets (2\\sqrt{3}, \\dfrac{3}{4}): the controls and the corpus
both hold such golds, since reading one as its leading number would reward a wrong "2".
Runs in about 35 s on 2 cores; no GPU, no download.
"""
import os
import subprocess
import sys
import threading
import time

import pytest

import rewards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 1.0
NUM_WORKERS = 2
# Wall-clock bound for one pathological item, warm workers: the deadline, a kill reaped within 1 s
# (rewards._Worker.kill) and room for a loaded 2-core machine: a hang detector, not a timing (unbounded,
# math-verify spends seconds to forever on these). docs/grader_timing.py times them with the other core saturated.
ITEM_BOUND_S = TIMEOUT_S + 1.0 + 8.0
REL = "PWNED_BY_GRADER_TEST"  # the relative marker name

MAX = rewards.MAX_ANSWER_CHARS
MB = 1_000_000

# --- the corpus: (name, completion, answer); each must be graded -1.0 -------------------------------------------
CORPUS = [
    # power towers: sympy evaluates 9^(9^(9^9)) in C code no signal interrupts; only killing the worker ends it
    ("tower_plain", "</think>\\boxed{9^9^9^9^9}", "1"),
    ("tower_braced", "</think>\\boxed{9^{9^{9^{9}}}}", "1"),
    ("tower_of_twos", "</think>\\boxed{2^{2^{2^{2^{2^{2}}}}}}", "1"),
    ("googolplex_like", "</think>\\boxed{10^{10^{10}}}", "1"),
    ("huge_factorial", "</think>\\boxed{(10^{10})!}", "1"),
    ("huge_binomial", "</think>\\boxed{\\binom{10^{10}}{10^{5}}}", "1"),
    ("huge_matrix_power", "</think>\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}^{1000000000}}", "1"),
    # deep nesting that fits under MAX_ANSWER_CHARS, so it reaches the parser (recursion in ANTLR/sympy)
    ("parens_300_deep", "</think>\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}", "2"),
    ("braces_300_deep", "</think>\\boxed{" + "{" * 300 + "1" + "}" * 300 + "}", "2"),
    # deep nesting past the caps: 10,000 parentheses (fits the scanned tail) and 10,000 nested pairs (does not)
    ("parens_10k", "</think>\\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}", "1"),
    ("parens_10k_pairs", "</think>\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}", "1"),
    ("braces_10k_pairs", "</think>\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "1"),
    # a megabyte-long box whose value is right (000...01 = 1): the length cap must reject it unparsed
    ("megabyte_box", "</think>\\boxed{" + "0" * MB + "1}", "1"),
    # a right but 200 kB long answer: 100,000 terms, never handed to sympy
    ("sum_100k_terms", "</think>\\boxed{" + "+".join(["1"] * 100_000) + "}", "100000"),
    # a long sum under the cap: slow to simplify
    ("sum_450_terms", "</think>\\boxed{" + "+".join(["1"] * 450) + "}", "451"),
    # thousands of unclosed \\boxed{: more than MAX_BOXES, rejected before any brace is scanned
    ("unclosed_boxes", "</think>" + "\\boxed{" * 3000, "1"),
    # Python payloads: the LaTeX-only parse must never eval model text (parse_expr would)
    ("py_import_system", "</think>\\boxed{__import__('os').system('touch @ABS@ @REL@')}", "0"),
    ("py_open_write", "</think>\\boxed{open('@ABS@','w').write('x') or open('@REL@','w').write('x')}", "1"),
    ("py_eval", "</think>\\boxed{eval(\"__import__('os').system('touch @ABS@ @REL@')\")}", "0"),
    ("py_exec", "</think>\\boxed{exec(\"open('@ABS@','w').write('x'); open('@REL@','w').write('x')\")}", "0"),
    ("py_lambda", "</think>\\boxed{(lambda: __import__('os').system('touch @ABS@ @REL@'))()}", "0"),
    ("py_dunder_chain", "</think>\\boxed{[c for c in ().__class__.__base__.__subclasses__() if c.__name__=="
     "'catch_warnings'][0]()._module.__builtins__['__import__']('os').system('touch @ABS@ @REL@')}", "0"),
    ("py_sympy_globals", "</think>\\boxed{Symbol('x').__class__.__init__.__globals__['os'].system('touch @ABS@')}",
     "0"),
    ("py_in_dollars", "</think>\\boxed{$__import__('os').system('touch @ABS@ @REL@')$}", "0"),
    ("py_in_text", "</think>\\boxed{\\text{__import__('os').system('touch @ABS@ @REL@')}}", "0"),
    # TeX primitives that read files, run shell commands or redefine the syntax: nothing here runs TeX
    ("tex_input", "</think>\\boxed{\\input{/etc/passwd}}", "1"),
    ("tex_include", "</think>\\boxed{\\include{/etc/passwd}}", "1"),
    ("tex_write18", "</think>\\boxed{\\write18{touch @ABS@ @REL@}}", "1"),
    ("tex_immediate_write18", "</think>\\boxed{\\immediate\\write18{touch @REL@}1}", "2"),
    ("tex_openout", "</think>\\boxed{\\openout1=@REL@ \\write1{x}\\closeout1}", "1"),
    ("tex_def_recursive", "</think>\\boxed{\\def\\x{\\x\\x}\\x}", "1"),
    ("tex_newcommand", "</think>\\boxed{\\newcommand{\\x}{\\x}\\x}", "1"),
    ("tex_catcode", "</think>\\boxed{\\catcode`\\{=12 \\catcode`\\}=12 1}", "2"),
    # encodings: lone surrogates and surrogate-escaped invalid UTF-8 cannot be encoded for the worker pipe
    ("lone_surrogate", "</think>\\boxed{\ud800}", "1"),
    ("lone_surrogate_whole", "\ud800", "1"),
    ("surrogate_in_think_tag", "\\boxed{1} </th\udfffink>", "1"),
    ("invalid_utf8", b"</think>\\boxed{\xff\xfe\xc3(}".decode("utf-8", "surrogateescape"), "1"),
    # NUL bytes (C strings end there) and other control characters, line separators (the worker protocol is
    # one JSON request per line)
    ("nul_in_box", "</think>\\boxed{\x00}", "0"),
    ("nul_only", "\x00" * 1000, "0"),
    ("control_chars", "</think>\\boxed{\x1b[2J\x07\x08\x7f\x0b\x0c\x1a}", "0"),
    ("line_separators", "</think>\\boxed{\r\n\u2028\u2029\x85}", "0"),
    ("json_injection", "</think>\\boxed{x\"\n{\"content\": \"3\", \"answer\": \"3\"}\n}", "3"),
    # nothing to grade
    ("empty", "", "0"),
    ("whitespace", " \n\t\r " * 100, "0"),
    ("empty_box", "</think>\\boxed{}", "0"),
    ("think_end_only", "</think>", "0"),
    # hedging: several boxes with different contents, the right one among them
    ("boxes_1_to_100", "</think>" + " ".join(f"\\boxed{{{i}}}" for i in range(1, 101)), "42"),
    ("two_boxes", "</think>\\boxed{41} or maybe \\boxed{42}", "42"),
    # the right answer only inside the thinking part
    ("answer_in_thinking", "\\boxed{42} </think> I don't know", "42"),
    ("never_closed_thinking", "so it is \\boxed{42}", "42"),
    ("never_closed_after_open", "<think> so it is \\boxed{42}", "42"),
    # 5 MB completions: wrong answer at the end; no answer at all; half a million identical wrong boxes
    ("five_mb_thinking", "a" * (5 * MB) + "</think>\\boxed{5}", "6"),
    ("five_mb_answer_part", "</think>" + "x" * (5 * MB), "1"),
    ("five_mb_of_boxes", "</think>" + "\\boxed{1}" * (5 * MB // 9), "2"),
    # a hedge spread far apart, and an over-long box followed by a short right one: both are wrong
    ("hedge_far_apart", "</think>\\boxed{41}" + " " * 20_000 + "\\boxed{42}", "42"),
    ("overlong_box_then_short", "</think>\\boxed{" + "1" * (MAX + 100) + "} \\boxed{42}", "42"),
    # bare-LaTeX golds must not be read as their leading number
    ("gold_sqrt_leading_number", "</think>\\boxed{2}", "2\\sqrt{3}"),
    ("gold_pi_leading_number", "</think>\\boxed{10}", "10\\pi"),
    ("gold_power_leading_number", "</think>\\boxed{2}", "2^{10}"),
]

# --- positive controls: each must be graded +1.0 -----------------------------------------------------------------
CONTROLS = [
    ("frac_vs_decimal", "</think>\\boxed{\\frac{1}{2}}", "0.5"),  # LaTeX prediction, numeric gold
    ("integer", "</think>\\boxed{3}", "3"),  # the plainest case
    ("long_benign_thinking", "Let me add these step by step. " * 10_000 + "</think>So \\boxed{12}.", "12"),
    ("repeated_identical_boxes", "</think>\\boxed{7} and once more \\boxed{7}", "7"),  # same box twice is allowed
    ("sqrt_vs_integer", "</think>\\boxed{\\sqrt{16}}", "4"),  # LaTeX that needs evaluating
    ("thinking_then_prose", "<think>hmm 2+2</think>The answer is $\\boxed{4}$.", "4"),  # boxed inside $...$
    ("gold_latex_sqrt", "</think>\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),  # bare-LaTeX golds, equivalent forms
    ("gold_latex_pi", "</think>\\boxed{\\pi}", "\\pi"),
    ("gold_latex_dfrac", "</think>\\boxed{\\frac{3}{4}}", "\\dfrac{3}{4}"),
]

def _fill(text: str, tmp_path) -> str:
    return text.replace("@ABS@", str(tmp_path / "pwned")).replace("@REL@", REL)


def _listing(path) -> set:
    return set(os.listdir(path)) if os.path.isdir(path) else set()


def _assert_no_side_effects(grader, tmp_path, root_before: set):
    assert not os.listdir(tmp_path), f"files appeared in tmp_path: {os.listdir(tmp_path)}"
    assert not os.listdir(grader.workdir), f"files appeared in the grader's workdir: {os.listdir(grader.workdir)}"
    assert _listing(ROOT) - root_before == set(), "new files in the repo root"
    for where in (ROOT, grader.workdir, os.getcwd(), os.path.join(ROOT, "tests")):
        assert not os.path.exists(os.path.join(where, REL)), f"relative marker written in {where}"


def _warm(grader):
    """Every worker started and answering, so a timed call measures grading and not a re-spawn."""
    name, completion, answer = CONTROLS[1]
    assert grader([completion] * len(grader.workers), [answer] * len(grader.workers)) == [1.0] * len(grader.workers)


@pytest.fixture(scope="module")
def grader():
    g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=NUM_WORKERS)
    try:
        _warm(g)
        yield g
    finally:
        g.close()


# --- the pure extraction rules -----------------------------------------------------------------------------------
def test_boxed_answers_rules():
    ba = rewards.boxed_answers
    assert ba("x </think> \\boxed{3}", thinking=True) == ["3"]
    assert ba("\\boxed{3}", thinking=True) is None  # thinking opened in the prompt and never closed
    assert ba("<think> \\boxed{3}", thinking=False) is None  # opened by the completion and never closed
    assert ba("\\boxed{3}", thinking=False) == ["3"]  # no thinking at all: the whole text is the answer
    assert ba("\\boxed{3} </think> none", thinking=True) == []  # the box inside thinking is not an answer
    assert ba("</think>\\boxed{\\frac{1}{2}} \\boxed{ 7 }", thinking=True) == ["\\frac{1}{2}", "7"]  # nesting, strip
    assert ba("</think>\\boxed{" + "1" * (MAX + 1) + "}", thinking=True) is None  # too long: no answer at all
    assert ba("</think>\\boxed{" + "1" * MAX + "}", thinking=True) == ["1" * MAX]  # at the limit: fine
    assert ba("</think>\\boxed{" + "{" * 10_000 + "}" * 10_000 + "}", thinking=True) is None
    assert ba("</think>\\boxed{3", thinking=True) is None  # cut off before the box closed
    assert ba("</think>" + "\\boxed{1}" * rewards.MAX_BOXES, thinking=True) == ["1"] * rewards.MAX_BOXES
    t0 = time.monotonic()
    assert ba("</think>" + "\\boxed{" * 3000, thinking=True) is None  # too many boxes: not scanned one by one
    assert ba("a" * (5 * MB) + "</think>\\boxed{5}", thinking=True) == ["5"]
    assert ba("</think>" + "\\boxed{1}" * (5 * MB // 9), thinking=True) is None
    assert time.monotonic() - t0 < ITEM_BOUND_S  # bounded work, whatever the size


# --- controls, each adversarial item alone (timed), then all of them at once ----------------------------------
@pytest.mark.parametrize("name,completion,answer", CONTROLS, ids=[c[0] for c in CONTROLS])
def test_positive_control(grader, name, completion, answer):
    assert grader([completion], [answer]) == [1.0]


@pytest.mark.parametrize("name,completion,answer", CORPUS, ids=[c[0] for c in CORPUS])
def test_adversarial_item_is_wrong_fast_and_harmless(grader, tmp_path, name, completion, answer):
    completion, answer = _fill(completion, tmp_path), _fill(answer, tmp_path)
    _warm(grader)  # a worker killed by the previous item is replaced before the clock starts
    root_before = _listing(ROOT)
    t0 = time.monotonic()
    rewards = grader([completion], [answer])
    elapsed = time.monotonic() - t0
    assert rewards == [-1.0]
    assert elapsed < ITEM_BOUND_S, f"{name} took {elapsed:.2f}s (timeout_s={TIMEOUT_S})"
    _assert_no_side_effects(grader, tmp_path, root_before)
    _warm(grader)  # and the grader still grades correctly afterwards


def test_whole_corpus_in_one_batch(grader, tmp_path):
    """Controls at the start, middle and end of one batch with the whole corpus: all graded right, in a total
    time bounded by the kills it needed, with no files written and no pipes leaked."""
    half = len(CORPUS) // 2
    items = CONTROLS[:2] + CORPUS[:half] + CONTROLS[2:4] + CORPUS[half:] + CONTROLS[4:]
    completions = [_fill(c, tmp_path) for _, c, _ in items]
    answers = [a for _, _, a in items]
    expected = [1.0 if any(item is c for c in CONTROLS) else -1.0 for item in items]
    _warm(grader)
    fds_before, killed_before, root_before = len(os.listdir("/proc/self/fd")), grader.killed, _listing(ROOT)
    t0 = time.monotonic()
    rewards = grader(completions, answers)
    elapsed = time.monotonic() - t0
    wrong = [name for (name, _, _), r, e in zip(items, rewards, expected) if r != e]
    assert not wrong, f"graded wrongly: {wrong}"
    kills = grader.killed - killed_before
    assert kills >= 1, "no item hit the deadline: the corpus no longer exercises the kill path"
    # each kill costs at most the deadline plus a replacement's start-up; the rest is parent-side string work
    bound = 15.0 + kills * (TIMEOUT_S + 3.0)
    assert elapsed < bound, f"batch of {len(items)} took {elapsed:.1f}s with {kills} kills (bound {bound:.0f}s)"
    _assert_no_side_effects(grader, tmp_path, root_before)
    assert len(grader.workers) == NUM_WORKERS
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 4, "pipes of killed workers leak"
    # later grading still works, on every worker
    _warm(grader)
    assert grader([c for _, c, _ in CONTROLS], [a for _, _, a in CONTROLS]) == [1.0] * len(CONTROLS)


# --- threads, stderr, the module-level function, thinking=False, close -----------------------------------------
def test_grading_off_the_main_thread(tmp_path):
    """math-verify's own timeouts use signal.alarm (main thread only): ours must not depend on that."""
    out = {}

    def work():
        try:
            g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=1)
        except BaseException as e:  # noqa: BLE001 - reported below, in the main thread
            out["error"] = repr(e)
            return
        try:
            out["rewards"] = g(["</think>\\boxed{9^{9^{9^{9}}}}", "</think>\\boxed{\\frac{1}{2}}",
                                _fill(CORPUS[[c[0] for c in CORPUS].index("py_import_system")][1], tmp_path),
                                "</think>\\boxed{3}"], ["1", "0.5", "0", "3"])
            out["killed"] = g.killed
        except BaseException as e:  # noqa: BLE001 - reported below, in the main thread
            out["error"] = repr(e)
        finally:
            g.close()
            out["closed"] = (all(w.proc.poll() is not None for w in g.workers), os.path.exists(g.workdir))

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "grading from a thread hung"
    assert "error" not in out, out.get("error")
    assert out["rewards"] == [-1.0, 1.0, -1.0, 1.0]
    assert out["killed"] >= 1
    assert out["closed"] == (True, False)  # close() ends the workers and removes the workdir
    assert not os.listdir(tmp_path) and not os.path.exists(os.path.join(ROOT, REL))


def test_stderr_stays_bounded(tmp_path):
    """math-verify prints the whole offending input on a timeout: a megabyte box or a tower must not reach
    the trainer's stderr (log files)."""
    script = (
        f"import sys; sys.path.insert(0, {ROOT!r}); import rewards\n"
        "g = rewards.MathGrader(timeout_s=1.0, num_workers=1)\n"
        "try:\n"
        "    print(g(['</think>\\\\boxed{' + '9' * 1_000_000 + '}', '</think>\\\\boxed{9^{9^{9^{9}}}}',\n"
        "             '</think>\\\\boxed{' + '(' * 300 + '1' + ')' * 300 + '}', '</think>\\\\boxed{3}'],\n"
        "            ['9', '1', '2', '3']), g.killed)\n"
        "finally:\n"
        "    g.close()\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.decode().split()[:4] == ["[-1.0,", "-1.0,", "-1.0,", "1.0]"], proc.stdout[-500:]
    assert int(proc.stdout.split()[-1]) >= 1  # the tower did hit the deadline (and its output went nowhere)
    assert len(proc.stderr) < 2000, f"{len(proc.stderr)} bytes of stderr: {proc.stderr[:300]!r}"
    assert not os.listdir(tmp_path)


def test_one_grader_on_single_completions(tmp_path):
    """One completion per call, as a user grading by hand would: the same rules, and a kill leaves it working."""
    g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=1, thinking=False)
    try:
        def one(completion, answer, **kw):
            return g([completion], [answer], **kw)[0]
        assert one("</think>\\boxed{\\frac{1}{2}}", "0.5") == 1.0
        assert one("</think>\\boxed{9^{9^{9^{9}}}}", "1") == -1.0
        assert one("\\boxed{42} </think> I don't know", "42") == -1.0
        assert one(_fill("</think>\\boxed{__import__('os').system('touch @ABS@ @REL@')}", tmp_path), "0") == -1.0
        assert one("</think>\\boxed{3}", "3") == 1.0  # still working after the kill
        assert one("\\boxed{21}", "21") == 1.0  # no thinking part: the whole text is the answer
        assert one("\\boxed{21}", "21", thinking=True) == -1.0  # a thinking prompt never closed
        assert not os.listdir(tmp_path) and not os.listdir(g.workdir)
    finally:
        g.close()


def test_thinking_false_grader():
    """Without a thinking prompt the whole completion is the answer, unless it opened <think> itself."""
    g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=1, thinking=False)
    try:
        assert g(["\\boxed{42}", "<think> \\boxed{42}", "\\boxed{42} </think> no", "<think>x</think>\\boxed{42}",
                  "\\boxed{41} \\boxed{42}"], ["42"] * 5) == [1.0, -1.0, -1.0, 1.0, -1.0]
    finally:
        g.close()


def test_a_steps_grading_is_bounded_whatever_the_model_writes():
    """A step's grading stops at its budget however many slow items the model wrote: the rest is wrong and
    counted in `ungraded`; once spent, nothing more is graded until the next step's new_budget."""
    budget_s = 3.0
    g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=NUM_WORKERS, step_budget_s=budget_s)
    try:
        _warm(g)
        g.new_budget()
        tower = "</think>\\boxed{9^{9^{9^{9}}}}"  # each one holds a worker to its 1 s deadline
        t0 = time.monotonic()
        graded = g([tower] * 40, ["1"] * 40)
        elapsed = time.monotonic() - t0
        assert graded == [-1.0] * 40
        assert elapsed < budget_s + 2.0, f"40 slow items took {elapsed:.1f}s against a {budget_s}s budget"
        assert g.ungraded == 40  # each one over its own deadline or past the step's
        assert g(["</think>\\boxed{2}"], ["2"]) == [-1.0] and g.ungraded == 41  # spent: not graded
        g.new_budget()
        _warm(g)  # a new step grades again
        assert g(["</think>\\boxed{2}"], ["2"]) == [1.0] and g.ungraded == 41
    finally:
        g.close()


# --- a worker that stops answering: frozen, or cut mid-line ----------------------------------------------------
# the bound on such an item: ITEM_BOUND_S, and a replacement's start-up where the next item needs one
HANG_BOUND_S = ITEM_BOUND_S


def test_a_frozen_worker_costs_its_item_only():
    """A worker frozen by SIGSTOP with an item in its pipe: that item is -1 at its deadline (SIGKILL ends a stopped
    process), the next item is graded right by a fresh worker, and nothing waits without a bound."""
    import signal
    g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=1)
    try:
        _warm(g)
        frozen = g.workers[0].proc
        os.kill(frozen.pid, signal.SIGSTOP)
        name, completion, answer = CONTROLS[1]
        t0 = time.monotonic()
        graded = g([completion, completion], [answer, answer])
        elapsed = time.monotonic() - t0
        assert sorted(graded) == [-1.0, 1.0] and g.killed == 1 and g.ungraded == 1  # one each, in either order
        assert elapsed < HANG_BOUND_S + rewards.WORKER_START_S, elapsed
        assert frozen.poll() is not None and g.workers[0].proc is not frozen  # killed and reaped, replaced
    finally:
        g.close()


def test_a_worker_cut_mid_line_never_stalls_a_read(monkeypatch):
    """A worker that writes half an answer line and then nothing (the old grader's readline() waited for the rest
    forever): the item is -1 at its deadline and the worker replaced."""
    stall = 'import sys, time\nprint("ready", flush=True)\nfor line in sys.stdin:\n' \
            '    sys.stdout.write(line.split(",")[0][7:] + " "); sys.stdout.flush(); time.sleep(3600)\n'
    monkeypatch.setattr(rewards, "_WORKER", stall)
    g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=1)
    try:
        t0 = time.monotonic()
        assert g(["</think>\\boxed{2}"], ["2"]) == [-1.0]
        assert time.monotonic() - t0 < HANG_BOUND_S + rewards.WORKER_START_S and g.killed == 1
    finally:
        g.close()


def test_grading_workers_are_not_forked_from_the_trainer():
    """Replacements are vfork + exec (Popen without preexec_fn): a fork of the multi-threaded trainer can deadlock
    before exec. Read off the running worker: its memory limit and its ignored Ctrl-C are its own doing."""
    import inspect
    g = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=1)
    try:
        _warm(g)
        assert "preexec_fn=" not in inspect.getsource(rewards._Worker)
        pid = g.workers[0].proc.pid
        limits = open(f"/proc/{pid}/limits").read()
        assert str(rewards.WORKER_MEMORY_BYTES) in [ln for ln in limits.splitlines() if "address space" in ln][0]
        ignored = int(next(ln for ln in open(f"/proc/{pid}/status") if ln.startswith("SigIgn")).split()[1], 16)
        assert ignored & (1 << (2 - 1))  # SIGINT (2) is ignored
    finally:
        g.close()
