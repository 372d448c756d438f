"""Shared fixtures: a tiny OCR-shaped pipeline run once per test session and reused."""
from __future__ import annotations

import atexit
import functools
import importlib.util
import inspect
import json
import linecache
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each xdist worker has machine-wide locks of its own (``pipeline.core.locks``; every run a test starts
# inherits this). The pipeline's timed stages hold the machine alone, which for two workers meant
# that one idled through every benchmark, profile and load test of the other. The tests
# judge timings only against themselves (A/A, ratios of side-by-side rounds, with wide
# tolerances), never against a number, so a neighbour's load spoils none of them. Within a worker
# the locks still work as in production, and the tests of the locks (tests/test_sweep.py) see
# them whole.
if os.environ.get("PYTEST_XDIST_WORKER") and "PIPELINE_LOCK_DIR" not in os.environ:
    os.environ["PIPELINE_LOCK_DIR"] = tempfile.mkdtemp(
        prefix=f"pipeline-locks-{os.environ['PYTEST_XDIST_WORKER']}-")
    # Removed when the worker ends, not by a process forked from it (those inherit atexit).
    atexit.register(lambda folder=os.environ["PIPELINE_LOCK_DIR"], pid=os.getpid():
                    os.getpid() == pid and shutil.rmtree(folder, ignore_errors=True))


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 600, env: dict | None = None,
            module: str = "pipeline") -> subprocess.CompletedProcess:
    """``python -m pipeline *args`` (or another of its commands, ``module``: the registry, the
    bill; or onnxruntime-genai's model builder); forked from a warm interpreter where that is the
    same (tests/warm_cli.py)."""
    from tests import warm_cli

    args = tuple(map(str, args))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    warm = warm_cli.run(list(args), cwd, env, timeout, module)
    if warm is not None:
        return warm
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)



def skip_without(module: str) -> None:
    """Skip the calling test module where ``module`` (an optional extra) is not installed. Not
    ``pytest.importorskip``: that imports it while collecting, in every xdist worker, whether or
    not the worker runs the module's tests (transformers alone is 2 s of a collection)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed", allow_module_level=True)


def one_line(proc, code: int, *words: str) -> None:
    """The command exited ``code`` with one line on stderr that names every one of ``words``."""
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def tiny_args(workdir: Path, *extra: str) -> list[str]:
    """A fast run of the whole recipe on the random tiny network. Its speed gate is off (a random
    network's INT8 is not expected to be faster), so are its latency SLO and its A/A self-check
    (a functional test must pass however busy the machine is: a busy moment read FP32 1.94x
    against its own copy in sub-millisecond timings of a few rounds, where the wide tolerance is
    0.5); everything else is the real pipeline. A test of those verdicts turns them back on."""
    return ["model=ocr_tiny", f"workdir={workdir}", f"data_dir={workdir / 'data'}",
            f"registry.root={workdir / 'registry'}", "bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=0.3",
            "bench.warmup_max_runs=20", "bench.size_buckets=2", "bench.cold_start_repeats=1",
            "bench.aa_tolerance=0.5",
            "gate.min_speedup=0", "gate.check_slo_p99=false", "gate.require_aa_check=false",
            *extra]


def run_folder(proc: subprocess.CompletedProcess) -> Path:
    """The run folder a finished command line reported (its ``report: .../report.md`` line): the
    run itself, where ``runs/latest`` may meanwhile name a later run in the same workdir."""
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("report: "))
    return Path(line.split("report: ", 1)[1].strip()).parent


def session_run(tiny_run) -> Path:
    """The shared tiny run's own run folder. Tests of several files run more runs in its
    workdir, in whatever order the files reach a worker, so ``runs/latest`` there names
    whichever ran last; a test about the session run reads it here."""
    return run_folder(tiny_run[1])


def seeded(tiny_run, work: Path) -> Path:
    """``work`` holding a copy of the shared tiny run's cache: a run there with ``seeded_args``
    reuses every stage its settings do not change (a full tiny run is 15 CPU-seconds)."""
    import shutil

    shutil.copytree(tiny_run[0] / "cache", work / "cache", ignore=shutil.ignore_patterns(".tmp-*"))
    return work


def seeded_args(tiny_run, work: Path, *extra: str) -> list[str]:
    """``tiny_args`` on ``work``, reading the tiny run's data sets (their folder is part of the
    stages' keys), then ``extra``."""
    args = [a for a in tiny_args(work) if not a.startswith("data_dir=")]
    return [*args, f"data_dir={tiny_run[0] / 'data'}", *extra]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The first full run of the tiny pipeline: (workdir, CompletedProcess)."""
    workdir = tmp_path_factory.mktemp("tiny")
    proc = run_cli(*tiny_args(workdir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workdir, proc


# CPU classes in the test matrix: a test that takes the ``isa`` argument runs twice, "native" on
# this CPU's full instruction set and "avx2" in a child pytest with the libraries capped at AVX2
# (oneDNN in OpenVINO and torch, torch's ATen kernels), so a VNNI/AMX machine also exercises the
# AVX2 path. Under the cap the pipeline's own flags (pipeline.core.env.effective_flags) drop what the
# cap forbids, so the test's expectations follow it. What the caps do not reach (ONNX Runtime's
# MLAS and OpenVINO's plugin read cpuid) the same AVX2 runs meet on an emulated AVX2-only CPU,
# all in one child: tests/test_cpu_emulation.py.
AVX2_CAPS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def avx2_python() -> Path | None:
    """The venv's Python on an emulated AVX2-only CPU (``tests/python-avx2``, copied into the
    venv's bin/ by ``make setup``), when it and QEMU's ``qemu-x86_64`` (``.ci/run`` installs it)
    are both there; else None."""
    import shutil

    wrapper = Path(sys.executable).with_name("python-avx2")
    return wrapper if wrapper.exists() and shutil.which("qemu-x86_64") else None


def capped_now() -> bool:
    return all(os.environ.get(k, "").upper() == v.upper() for k, v in AVX2_CAPS.items())


def avx2_is_native(flags=None) -> bool:
    """This CPU is itself an AVX2-only one: the caps forbid none of its flags, and it has none of
    the instruction sets ONNX Runtime's and OpenVINO's kernels dispatch on beyond AVX2 (AVX512,
    either VNNI, AMX), so its native runs take the kernels the capped and emulated runs exist to
    reach, and an AVX2 run would only repeat them. ``flags``: /proc/cpuinfo's, which neither the
    caps nor the emulator change."""
    from pipeline.core.env import capped, cpu_info

    flags = list(cpu_info()["flags"] if flags is None else flags)
    return "avx2" in flags and capped(flags, AVX2_CAPS) == flags


@pytest.fixture(params=["native", "avx2"])
def isa(request):
    return request.param


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    params = getattr(getattr(pyfuncitem, "callspec", None), "params", {})
    if params.get("isa") != "avx2" or capped_now():
        return None  # run here as usual
    if avx2_is_native():
        pytest.skip("this CPU is AVX2-only: its native run is the AVX2 run")
    import shutil
    import tempfile

    env = {**os.environ, **AVX2_CAPS, "PYTHONPATH": str(ROOT)}
    # Its own --basetemp: a child pytest on the default one would rotate away this session's
    # numbered temp folders (and the shared tiny run in them).
    base = tempfile.mkdtemp(prefix="pytest-capped-")
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                               "no:cacheprovider", f"--basetemp={base}/t", pyfuncitem.nodeid],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = proc.stdout + proc.stderr
    if proc.returncode == 0 and " skipped" in out.splitlines()[-1]:
        reason = [line for line in out.splitlines() if line.startswith("SKIPPED")]
        pytest.skip(f"capped at AVX2: {reason[0] if reason else 'skipped'}")
    assert proc.returncode == 0, f"capped at AVX2 ({AVX2_CAPS}):\n{out[-4000:]}"
    return True



# ``make test`` runs two workers (pytest-xdist). Each worker has its own session, so a session
# fixture runs once per worker that needs it: the files that use the tiny run are scheduled as
# TINY_RUN_UNITS units (a worker that gets one builds the run once, and both workers may: a
# second tiny run costs far less than one worker running a third of the suite's time alone
# while the other idles), every other file as a unit of its own (its module fixtures, e.g. a
# registry server or the quant=auto run, start once). xdist's own ``--dist loadgroup`` marks do
# not take effect with pytest 9, hence a scheduler of our own.
#
# Units are handed out longest first (``--no-loadscope-reorder`` keeps the collection's order,
# which ``_longest_units_first`` sets), and the tiny run's files are split into units of equal
# time, not alternately by name. A worker asks for its next unit when it is down to its last two
# tests, so a long unit handed out near the end kept one worker busy while the other had nothing
# left: xdist's own order (by number of tests) put the emulated AVX2 CPU's file (one test, a
# minute) last, and the alternate split made one tiny-run unit twice the other. A unit's time is
# its files' seconds (setup, call and teardown summed) from the last ``make test-durations``
# (tests/durations.json; a file's tests share its seconds equally); a file not in it counts 0
# and goes after the others, as collected. A stale file changes the order only, never what runs.
DURATIONS = Path(__file__).with_name("durations.json")
try:
    SECONDS: dict[str, float] = json.loads(DURATIONS.read_text())["seconds"]
except (OSError, ValueError, KeyError):
    SECONDS = {}
TINY_RUN_FILES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
                        if "tiny_run" in p.read_text())  # subfolders too (tests/stages/, ...)
TINY_RUN_UNITS = 2


def _balanced(files: list[str], units: int) -> dict[str, str]:
    """Each file to the unit with the least time so far (then the fewest files: files without a
    time, or no durations file at all, still spread over the units), the longest files first."""
    load = [(0.0, 0)] * units
    out = {}
    for f in sorted(files, key=lambda f: -SECONDS.get(f, 0.0)):
        i = load.index(min(load))
        out[f], load[i] = f"tiny_run/{i}", (load[i][0] + SECONDS.get(f, 0.0), load[i][1] + 1)
    return out


TINY_RUN_UNIT = _balanced(TINY_RUN_FILES, TINY_RUN_UNITS)
# Files whose tests are long but whose fixtures are cheap (seconds): each test is a unit of its
# own, so the two workers share them (the fixture is then built on both).
PER_TEST_FILES = {"tests/test_byo.py"}


def file_of(nodeid: str) -> str:
    """The file a test's node id names (``tests/test_x.py::test_y[p]`` -> ``tests/test_x.py``)."""
    return nodeid.split("::", 1)[0]


def unit(nodeid: str) -> str:
    """The scheduling unit of a test: what one worker runs as a whole."""
    file = file_of(nodeid)
    return nodeid if file in PER_TEST_FILES else TINY_RUN_UNIT.get(file, file)


def _longest_units_first(config, items) -> None:
    # Only an xdist worker's order is handed out; any other session keeps the order it was
    # given, a child pytest a worker started too (it inherits PYTEST_XDIST_WORKER, not
    # ``workerinput``). The emulated AVX2 CPU's child pytest relies on that
    # (tests/test_cpu_emulation.py): sorted, its CPU probe first (which then imported OpenVINO
    # in the test process), it hung in two whole-suite runs of three, its test process waiting
    # on an OpenVINO probe's child (the stack its faulthandler printed).
    if not hasattr(config, "workerinput"):
        return
    per_file: dict[str, int] = {}
    for i in items:
        file = file_of(i.nodeid)
        per_file[file] = per_file.get(file, 0) + 1
    weight: dict[str, float] = {}
    for i in items:
        file = file_of(i.nodeid)
        u = unit(i.nodeid)
        weight[u] = weight.get(u, 0.0) + SECONDS.get(file, 0.0) / per_file[file]
    items.sort(key=lambda i: -weight[unit(i.nodeid)])  # stable: a unit's tests as collected


_durations: dict[str, float] = {}  # make test-durations: each file's seconds so far


def pytest_runtest_logreport(report):
    if os.environ.get("PIPELINE_TEST_DURATIONS"):  # make test-durations
        path = file_of(report.nodeid)
        _durations[path] = _durations.get(path, 0.0) + report.duration


def pytest_sessionfinish(session):
    # the controller's (or a serial run's) tally; xdist's workers pass their reports to it
    if not os.environ.get("PIPELINE_TEST_DURATIONS") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from pipeline.core.env import cpu_info

    rounded = {k: round(v, 1) for k, v in sorted(_durations.items(), key=lambda kv: -kv[1])}
    DURATIONS.write_text(json.dumps({"cpu": cpu_info()["model"], "cores": os.cpu_count(),
                                     "seconds": rounded}, indent=1) + "\n")


if importlib.util.find_spec("xdist") is not None:
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScopeScheduling

        class ByFixture(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return unit(nodeid)

        return ByFixture(config, log)


# ``make test-fast``: the unit tests, without the whole-CLI runs (``-m "not cli"``). A test is
# marked ``cli`` here, at collection, when it or anything it uses (its fixtures, the module's
# helper functions they call, transitively) starts the command line: no list to keep up to date.
_STARTS_CLI = re.compile(r'run_cli\(|tiny_args\(|"-m", "pipeline|from pipeline\.__main__ import')


@functools.cache
def _source(fn) -> str | None:
    """A function's source lines, read once a session (the same fixtures and helpers are asked
    for by every test that uses them). Its lines come from its code object, from its first line
    to the last that any of its instructions (or a nested function's) stands on: what
    ``inspect.getsource`` reads, without tokenizing the file to find the function's end (that was
    2 s of each worker's collection)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    lines = linecache.getlines(code.co_filename) if code is not None else []
    if not lines:
        return None
    return "".join(lines[code.co_firstlineno - 1:_last_line(code)])


def _last_line(code) -> int:
    ends = [end for _, end, _, _ in code.co_positions() if end is not None]
    ends += [_last_line(c) for c in code.co_consts if inspect.iscode(c)]
    return max(ends, default=code.co_firstlineno)


def _starts_cli(fn, module, seen: set) -> bool:
    if fn in seen or not callable(fn):
        return False
    seen.add(fn)
    src = _source(fn)
    if src is None:
        return False
    if _STARTS_CLI.search(src):
        return True
    helpers = (getattr(module, name, None) for name in set(re.findall(r"\b(\w+)\(", src)))
    # the module's own helpers and those it imports from tests/ (serve_helpers.start, which
    # starts `python -m pipeline.serve`), each read in its own module
    return any(_starts_cli(h, inspect.getmodule(h), seen) for h in helpers
               if inspect.isfunction(h) and (h.__module__ == module.__name__
                                             or h.__module__.split(".")[0] == "tests"))


def pytest_collection_modifyitems(config, items):
    _leave_emulated_avx2_runs_to_the_emulator(config, items)
    _longest_units_first(config, items)
    for item in items:
        fn = getattr(item, "function", None)
        if fn is None:
            continue
        fixtures = [fd.func for defs in item._fixtureinfo.name2fixturedefs.values() for fd in defs]
        seen: set = set()
        if any(_starts_cli(f, inspect.getmodule(f) or item.module, seen) for f in [fn, *fixtures]):
            item.add_marker(pytest.mark.cli)
        if getattr(getattr(item, "callspec", None), "params", {}).get("isa") == "avx2":
            item.add_marker(pytest.mark.slow)  # a child pytest replays it under the AVX2 cap
            item.add_marker(pytest.mark.avx2)


def _leave_emulated_avx2_runs_to_the_emulator(config, items) -> None:
    """Where the emulated AVX2 CPU is there, the AVX2 runs of the files it runs
    (``tests/test_cpu_emulation.py: EMULATED``) are not also run capped: it sets the same caps
    and runs the kernels an AVX2 machine runs besides, so a capped copy would only cost time.
    Not inside that emulated run itself, nor when its test is not in this session."""
    if (os.environ.get("PIPELINE_TEST_EMULATED_AVX2") or capped_now() or avx2_is_native()
            or avx2_python() is None):
        return
    from tests.test_cpu_emulation import EMULATED

    if not any(i.nodeid.startswith("tests/test_cpu_emulation.py::test_the_isa_tests_pass")
               for i in items):
        return
    dropped = [i for i in items if file_of(i.nodeid) in EMULATED
               and getattr(getattr(i, "callspec", None), "params", {}).get("isa") == "avx2"]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


@pytest.fixture(autouse=True)
def _no_process_wide_thread_pool():
    """A test that creates a pipeline session in the test process sets onnxruntime's process-wide
    thread pool (``pipeline.runtimes.onnxruntime._options``), and every plain session created
    after it in that worker is refused ("use_per_session_threads must be false"), failing tests
    that have nothing to do with it. Such work belongs in a child process (``isolate.call``, as
    the runner runs stages): this names the test that forgot, instead of its victims."""
    def pool_set() -> bool:
        ort = sys.modules.get("pipeline.runtimes.onnxruntime")
        return bool(ort is not None and getattr(ort, "_pool_set", False))

    before = pool_set()
    yield
    if pool_set() and not before:  # the test that set it, not every one after
        pytest.fail("this test set onnxruntime's process-wide thread pool in the test process: "
                    "run its sessions in a child process (pipeline.core.isolate.call)")
