"""``python -m pipeline`` for the tests, forked from a warm interpreter instead of started cold.

The suite runs the command line about 85 times. A cold start imports the same libraries each
time (``datasets``, onnx, onnxruntime, hydra and its plugins, matplotlib, the pipeline's own
modules). Measured on a 2-core EPYC, three runs each: a tiny OCR run took 17.0 to 17.9
CPU-seconds cold and 14.8 to 16.6 forked; a whole suite, 953 CPU-seconds and 515 s cold, 882
and 470 s forked.
Each xdist worker therefore keeps an interpreter that has imported them (a "zygote"); a run
is a fork of it that then does what ``python -m pipeline`` does: ``runpy`` runs the package's
``__main__`` with the run's argv, environment, working directory and ``sys.path[0]``. It ends as
the interpreter would (threads joined, atexit, multiprocessing's cleanup, streams flushed) and
then leaves through ``os._exit``, as multiprocessing's own children do (below). Its forkserver,
stages and children are started by the run as in a cold one.

What a fork cannot make equal it does not try to: a variable read when a library was imported
keeps the zygote's value, so there is one zygote for each environment (``run``), and the first
run with an environment other than the test process's own, sweeps, and every run when
``PIPELINE_TEST_COLD_CLI=1`` start cold. The
zygote imports neither torch nor transformers: the pipeline's forkserver preloads what its parent
holds of those (``pipeline.core.isolate.IF_LOADED``), and a run that never needed them must not
look as if it had; ``model=hf`` runs, whose parents import both, fork from one that holds them
(``WARM_HF``). It does import ``datasets``, which nearly every run's parent imports to check
its data: a run that would not have has its forkserver preload it too (a second, no more).

The pipeline's other commands the tests run as often (``MODULES``: the registry, the bill) fork
from it the same way, and the forkserver a run starts is the zygote's, shared by the runs that
ask for the same one (below, "one forkserver for the runs of a zygote").
"""
from __future__ import annotations

import atexit
import os
import pickle
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# What a run's parent imports before its first stage (measured on a tiny OCR run), less torch
# and transformers (above), and pyplot, which every run that reaches its report imports to draw
# it (0.4 s).
WARM = ["datasets", "onnx", "onnxruntime", "PIL.Image", "matplotlib.pyplot", "hydra", "omegaconf",
        "pipeline.cli.main", "pipeline.cli.finish", "pipeline.recipes.main",
        "pipeline.engine.runner", "pipeline.report.manifest", "pipeline.models.ocr.task",
        "pipeline.data.real_batches"]
MUST_NOT_HOLD = ("torch", "transformers", "ray", "mlflow")
# The commands a zygote forks: the pipeline, those the tests run as often (each a package with
# a ``__main__``, whose imports the pipeline's mostly cover), and the decoder fixtures' model
# builder (from the zygote that holds transformers: ``_kind``).
BUILDER = "onnxruntime_genai.models.builder"
MODULES = ("pipeline", "pipeline.registry", "pipeline.bill", BUILDER)
# A ``model=hf`` run's parent reads the folder with transformers' Auto classes before its first
# stage, importing transformers and torch (2.3 CPU-seconds, every run): its forkserver preloads
# them whether the parent held them from its start or not. Such runs fork from a zygote of their
# own that holds them too (``HF``), and only they: the others must not look as if they had.
WARM_HF = ["transformers.models.auto.configuration_auto",
           "transformers.models.auto.tokenization_auto"]
HF = "hf"


def _kind(module: str, args: list[str]) -> str:
    # onnxruntime-genai's model builder, which tests run to lay out a tiny decoder as it ships,
    # imports what a model=hf parent does and more (4 CPU-seconds of its 6)
    return HF if module == BUILDER or (module == "pipeline" and "model=hf" in args) else ""


def _send(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj)
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv(sock: socket.socket):
    head = _exactly(sock, 4)
    return None if head is None else pickle.loads(_exactly(sock, struct.unpack("!I", head)[0]))


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# ---- the test's side ------------------------------------------------------------------------

class Zygote:
    """One warm interpreter, started on first use by this process and ended with it (it reads
    its stdin, a pipe from here, and leaves at end of file)."""

    def __init__(self, env: dict[str, str], kind: str = ""):
        self.folder = Path(tempfile.mkdtemp(prefix="pipeline-zygote-"))
        self.address = str(self.folder / "socket")
        self.proc = subprocess.Popen([sys.executable, __file__, self.address, kind], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the warm interpreter did not start: {ready!r}")

    def close(self) -> None:
        self.proc.stdin.close()  # it leaves at end of file; runs it forked go on to their end
        self.proc.wait()
        self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout: float,
            module: str = "pipeline") -> subprocess.CompletedProcess:
        out, err = (Path(tempfile.mkstemp(dir=self.folder, suffix=s)[1]) for s in (".out", ".err"))
        cmd = [sys.executable, "-m", module, *args]
        try:
            code = self._ask({"module": module, "argv": list(args), "cwd": str(cwd), "env": env,
                              "stdout": str(out), "stderr": str(err)}, cmd, timeout)
            return subprocess.CompletedProcess(cmd, code, out.read_text(), err.read_text())
        finally:
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)

    def _ask(self, request: dict, cmd: list[str], timeout: float) -> int:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self.address)
            _send(sock, request)
            pid = _recv(sock)
            sock.settimeout(timeout)
            try:
                return _recv(sock)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(cmd, timeout) from None
            except BaseException:  # the test was interrupted: no run outlives it
                os.kill(pid, signal.SIGKILL)
                raise


# Variables left out of the keys that pick a zygote and a forkserver (``_keyed``): values that
# libraries write into the environment for themselves (torch's inductor cache folder, the path
# onnxruntime-genai found onnxruntime's library at: a process without them computes the same),
# and those of libraries neither holds (Ray, which also sets PYTHONBREAKPOINT, and MLflow: never
# imported there, MUST_NOT_HOLD). An in-process test that used one of those libraries changed the
# worker's environment for good, and every later run paid for a new zygote and its forkservers:
# 4 of a suite's 8 zygotes. A forked run still gets its whole environment (``_become_the_run``).
NOT_KEYED = re.compile(r"(PYTEST_CURRENT_TEST|TORCHINDUCTOR_CACHE_DIR|ORT_LIB_PATH"
                       r"|PYTHONBREAKPOINT)$|_?MLFLOW_|RAY_")


def _keyed(env: dict[str, str]) -> frozenset:
    return frozenset((k, v) for k, v in env.items() if not NOT_KEYED.match(k))


# One zygote for each environment a run asked for twice (NOT_KEYED aside):
# the first run with an environment starts cold, so one that only a single test sets (a
# variable naming its temporary folder) never pays for a zygote. The test process's own
# environment (``run_cli`` without ``env``) is asked for by most tests: its first run forks too.
# A few at most; the least recently used goes.
ZYGOTES = 3
_zygotes: dict[tuple, Zygote] = {}
_seen: set[tuple] = set()


@atexit.register
def _close_all() -> None:
    while _zygotes:
        _zygotes.popitem()[1].close()


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float,
        module: str = "pipeline") -> subprocess.CompletedProcess | None:
    """``python -m <module> *args`` (the pipeline, or one of its other commands: ``MODULES``),
    forked from a zygote; None where it is to start cold (above)."""
    from pipeline.cli.sweep.launch import is_sweep

    assert module in MODULES, module
    if (os.environ.get("PIPELINE_TEST_COLD_CLI") == "1"
            or (module == "pipeline" and is_sweep(args))):
        return None  # a sweep hands its jobs to launchers that start interpreters anyway
    kind = _kind(module, args)
    key = (_keyed(env), kind)
    zygote = _zygotes.pop(key, None)  # put back last: the least recently used goes first
    if zygote is None:
        if key not in _seen and not _the_tests_own(env):
            _seen.add(key)
            return None
        if len(_zygotes) >= ZYGOTES:
            _zygotes.pop(next(iter(_zygotes))).close()
        zygote = Zygote(env, kind)
    _zygotes[key] = zygote
    return zygote.run(args, cwd, env, timeout, module)


def _the_tests_own(env: dict[str, str]) -> bool:
    """``env`` is this test process's environment with the checkout on PYTHONPATH."""
    def rest(e):
        return {k: v for k, v in e.items() if k not in ("PYTEST_CURRENT_TEST", "PYTHONPATH")}

    return rest(env) == rest(os.environ)


# ---- the zygote's side ----------------------------------------------------------------------

def _serve(address: str, kind: str) -> None:
    import importlib

    import matplotlib

    matplotlib.use("Agg")  # as pipeline.report.plots does before its first plot
    for name in WARM:
        importlib.import_module(name)
    from hydra.core.plugins import Plugins

    Plugins.instance()  # the scan of hydra_plugins every compose starts with
    if kind == HF:  # as the run's parent imports them: after turning the hub off
        from pipeline.models.hf_folder import offline

        offline()
        for name in WARM_HF:
            importlib.import_module(name)
    held = [m for m in MUST_NOT_HOLD if m in sys.modules
            and not (kind == HF and m in ("torch", "transformers"))]
    assert not held, f"the warm interpreter must not hold {held}"

    global _ADDRESS
    _ADDRESS = address
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its waiters are reaped by the kernel
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ)
    events.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in events.select():
            if key.fileobj is sys.stdin:  # the test process is gone
                return
            conn, _ = listener.accept()
            request = _recv(conn)
            if request is not None and request.get("forkserver"):
                _hand_a_forkserver(conn, request)
            elif request is not None and os.fork() == 0:
                events.close()
                listener.close()
                _wait_for_run(conn, request)  # never returns
            conn.close()


def _wait_for_run(conn: socket.socket, request: dict) -> None:
    """A waiter: fork the run, tell the test its pid, then its exit code."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become_the_run(request)  # never returns
    try:
        _send(conn, pid)
        _, status = os.waitpid(pid, 0)
        _send(conn, os.waitstatus_to_exitcode(status))
    except OSError:  # the test gave up on the run (a timeout) and killed it
        pass
    os._exit(0)


def _become_the_run(request: dict) -> None:
    import runpy

    os.setsid()  # as a test's subprocess: no terminal, and not in the zygote's process group
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, name in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
        target = os.open(name, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.path[0] = request["cwd"]  # ``python -m`` puts the working directory first
    sys.argv = ["-m", *request["argv"]]
    _ask_the_zygote_for_the_forkserver()
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught error
        sys.excepthook(*sys.exc_info())
        code = 1
    # The interpreter's own exit, less the C libraries' static destructors: onnxruntime's wait
    # forever on a thread pool the zygote had and a fork does not (multiprocessing's children
    # leave through os._exit for the same reason).
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1



# ---- one forkserver for the runs of a zygote ------------------------------------------------
# Every run of the pipeline starts multiprocessing's forkserver, which imports what its stages
# need (torch, sympy, onnxscript, datasets: ``pipeline.core.isolate``) before its first child: 2.5
# CPU-seconds a run, a tenth of the suite's CPU time, spent on the same imports each time. A run
# forked from a zygote asks the zygote for it instead: the zygote starts one as multiprocessing
# starts it (the same command, preload, interpreter flags, and the run's environment and working
# folder at that moment, so HF_HUB_OFFLINE set by the run is there), keeps it, and hands it to
# every later run that asks for the same. Each child's stdout and stderr are the asking run's own
# (passed with the child's other fds). What differs from a run's own forkserver: its stage
# children are the zygote's forkserver's, so a run killed outright (a test's timeout) leaves a
# stage child to finish its stage rather than die with the run; and a Hugging Face model type's
# code is imported by each child, not by the forkserver (MODEL_CODE).
FORKSERVERS = 2  # kept per zygote (each holds torch); the least recently used goes
# A Hugging Face run asks its forkserver for its model type's code too (``pipeline.models.
# hf_folder``): each model type was a forkserver of its own, torch and transformers imported
# again (4 CPU-seconds). The shared one imports what every model type's code imports
# (transformers.modeling_utils, 1.6 s of bert's 2.1), and each child its own type's (0.05 s).
MODEL_CODE = re.compile(r"transformers\.models\.(?!auto\.)[\w.]+$")


def _shared_preload(asked: list[str]) -> list[str]:
    kept = [m for m in asked if not MODEL_CODE.match(m)]
    return kept + ["transformers.modeling_utils"] if len(kept) < len(asked) else kept


_forkservers: dict = {}
_ADDRESS = None  # the zygote's socket, known to the runs it forks


def _ask_the_zygote_for_the_forkserver() -> None:
    """In a run: have multiprocessing take its forkserver from the zygote."""
    from multiprocessing import forkserver, reduction, resource_tracker, spawn, util

    fs = forkserver._forkserver
    connect = fs.connect_to_new_process

    def ensure_running() -> None:
        with fs._lock:
            resource_tracker.ensure_running()
            if fs._forkserver_address is not None:
                return
            data = {}
            if fs._preload_modules:  # as ForkServer.ensure_running computes it
                data = {k: v for k, v in spawn.get_preparation_data("ignore").items()
                        if k in ("main_path", "sys_path")}
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(_ADDRESS)
                _send(sock, {"forkserver": True, "preload": list(fs._preload_modules),
                             "data": data, "env": dict(os.environ), "cwd": os.getcwd(),
                             "flags": util._args_from_interpreter_flags()})
                reduction.sendfds(sock, [1, 2])  # the server's own output, as a run's would be
                fs._forkserver_address, fs._forkserver_pid = _recv(sock)
                fs._forkserver_alive_fd = reduction.recvfds(sock, 1)[0]

    def connect_to_new_process(fds):
        return connect([*fds, 1, 2])  # the child's stdout and stderr: this run's

    fs.ensure_running = forkserver.ensure_running = ensure_running
    forkserver.connect_to_new_process = connect_to_new_process


class _Forkserver:
    """A forkserver the zygote started for runs with one (preload, data, environment)."""

    def __init__(self, request: dict, out: int, err: int):
        from multiprocessing import connection

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.address = connection.arbitrary_address("AF_UNIX")
        listener.bind(self.address)
        os.chmod(self.address, 0o600)
        listener.listen()
        alive_r, self.alive_w = os.pipe()
        load = ("import importlib.util as u; s = u.spec_from_file_location('warm_forkserver', "
                f"{__file__!r}); m = u.module_from_spec(s); s.loader.exec_module(m); ")
        cmd = load + (f"m.forkserver_main({listener.fileno()}, {alive_r}, "
                      f"{request['preload']!r}, **{request['data']!r})")
        self.proc = subprocess.Popen(
            [sys.executable, *request["flags"], "-c", cmd], stdin=subprocess.DEVNULL,
            stdout=out, stderr=err, pass_fds=(listener.fileno(), alive_r),
            env=request["env"], cwd=request["cwd"])
        self.pid = self.proc.pid
        os.close(alive_r)
        listener.close()

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def close(self) -> None:
        os.close(self.alive_w)  # it leaves once no run holds the other copies either


def _hand_a_forkserver(conn: socket.socket, request: dict) -> None:
    from multiprocessing import reduction

    out, err = reduction.recvfds(conn, 2)
    request = {**request, "preload": _shared_preload(request["preload"])}
    key = (tuple(request["preload"]), repr(sorted(request["data"].items())),
           tuple(request["flags"]), _keyed(request["env"]))
    server = _forkservers.pop(key, None)  # put back last: the least recently used goes first
    if server is not None and not server.alive():
        server.close()
        server = None
    if server is None:
        if len(_forkservers) >= FORKSERVERS:
            _forkservers.pop(next(iter(_forkservers))).close()
        server = _Forkserver(request, out, err)
    _forkservers[key] = server
    os.close(out)
    os.close(err)
    _send(conn, (server.address, server.pid))
    reduction.sendfds(conn, [server.alive_w])


# What a stage child imports beyond its forkserver's preload, where many children of one shared
# forkserver do: torch's exporter (torch.export's tracer, onnxscript's aten functions: 0.7 s in
# every export child, more on busy cores). A run's own forkserver does not preload them: a run
# exports once, if at all (its export may be cached). Not onnxruntime-genai's model builder: it
# imports onnxruntime.transformers, whose __init__ puts its own folder on sys.path, and a child
# starts from its run's sys.path, so the fuse stage's import of that package's optimizer failed.
AFTER = {"torch": ["torch.export._trace", "torch.onnx._internal.exporter._core",
                   "onnxscript.function_libs.torch_lib.ops"]}


def forkserver_main(listener_fd: int, alive_r: int, preload: list, **data) -> None:
    """multiprocessing's forkserver, whose every child first takes the stdout and stderr its
    run passed last among the child's fds (``connect_to_new_process`` above)."""
    from multiprocessing import forkserver

    preload = preload + [m for after, ms in AFTER.items() if after in preload for m in ms]

    serve_one = forkserver._serve_one

    def _serve_one(child_r, fds, unused_fds, handlers):
        *fds, out, err = fds
        for fd, target in ((out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        return serve_one(child_r, fds, unused_fds, handlers)

    forkserver._serve_one = _serve_one
    # as in a run: the zygote ignores SIGCHLD (its waiters are reaped by the kernel), and an
    # ignored signal stays ignored through exec, into every stage child and its subprocesses
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    forkserver.main(listener_fd, alive_r, preload, **data)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
