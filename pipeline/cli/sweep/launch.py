"""``python -m pipeline -m model=ocr,ocr_mobile quant=int8,mixed``: a sweep through Hydra's multirun.

In: override strings with comma-separated choices (Hydra's sweep syntax), and optionally a
launcher (``hydra/launcher=joblib``, ``hydra/launcher=ray``, ``hydra/launcher=slurm``, see
docs/sweeps.md). Out: one run per point, each with its own report under ``<workdir>/runs``, and
a sweep folder ``<workdir>/sweeps/<time>-<id>/`` holding Hydra's per-point folders (the point's
log and result) and the summary (``pipeline.cli.sweep.summary``).

Hydra does the work: ``@hydra.main`` parses the command line, the basic sweeper expands the
points and the chosen launcher runs them. Every point is a fresh ``python -m pipeline`` process
with that point's overrides, so it composes and validates its config exactly like a single run,
never inherits another point's thread pools, and a crash costs only its own row. The points
share the workdir: its cache is locked per key and timed stages run alone on the machine
(``pipeline.core.locks``). Every point is composed once before anything runs, so a bad value ends the
sweep at once with exit 2. Exit code: 3 if any point ended in an error, else 1 if any point's
gate failed, else 0.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pipeline.cli.sweep.point import FILE as POINT_FILE
from pipeline.cli.sweep.point import PointResult
from pipeline.engine.compose import CONF_DIR, NULLABLE, compose
from pipeline.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]  # the checkout that holds this package
FLAGS = ("-m", "--multirun")


def is_sweep(argv: list[str]) -> bool:
    return any(a in FLAGS for a in argv)


def points(overrides: list[str]) -> list[list[str]]:
    """Every point's overrides, in the order Hydra's basic sweeper launches them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(f"cannot parse override: {str(e).splitlines()[0]}") from None
    batches = BasicSweeper.split_arguments(parsed, None)
    return [list(p) for batch in batches for p in batch]


def _to_hydra(arg: str) -> str:
    """``registry=null`` (our spelling for "no publishing") is ``~registry`` to Hydra."""
    key, _, value = arg.partition("=")
    return f"~{key}" if key in NULLABLE and value == "null" else arg


def _from_hydra(arg: str) -> str:
    return f"{arg[1:]}=null" if arg.startswith("~") and arg[1:] in NULLABLE else arg


def main(argv: list[str]) -> int:
    from pipeline.cli.sweep import summary as sweep_summary

    args = [a for a in argv if a not in FLAGS]
    ours = [a for a in args if not a.lstrip("~+").startswith("hydra")]
    todo = points(ours)
    cfgs = []
    for point in todo:  # fail fast: every point composes before any of them runs
        try:
            cfgs.append(compose(point))
        except ConfigError as e:
            raise ConfigError(f"{e} (point {' '.join(point)})") from None
    _check_launcher(args)
    given = next((a.split("=", 1)[1] for a in args if a.startswith("hydra.sweep.dir=")), None)
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    sweep_dir = Path(given or Path(cfgs[0].workdir) / "sweeps" / name).resolve()
    hydra_args = [a for a in args if not a.startswith("hydra.sweep.dir=")]
    sys.argv = [sys.argv[0], "--multirun", f"hydra.sweep.dir={sweep_dir}",
                "hydra.sweep.subdir=${hydra.job.num}", "hydra.job.name=pipeline",
                *map(_to_hydra, hydra_args)]
    print(f"sweep: {len(todo)} points, folder {sweep_dir}", flush=True)
    t0 = time.time()
    # For the progress line each point prints when it ends (in the launcher's workers).
    os.environ[PROGRESS_ENV] = f"{len(todo)}:{t0}"
    _hydra_main()
    summary = sweep_summary.write(sweep_dir, todo, cfgs, time.time() - t0)
    print(sweep_summary.terminal(summary))
    print(f"summary: {sweep_dir / 'summary.md'}")
    return summary.exit_code


# The package each launcher needs beyond the base install, and the extra that installs it:
# without it Hydra prints a multi-line config error and exits 1, which reads as a failed gate
LAUNCHER_NEEDS = {"slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
                  "ray": ("ray", "ray")}


def _check_launcher(args: list[str]) -> None:
    """``hydra/launcher=NAME`` whose package is not installed: one line and exit 2 before any
    point runs (an unknown NAME is Hydra's to name, with its choices)."""
    import importlib.util

    name = next((a.split("=", 1)[1] for a in args
                 if a.lstrip("+").startswith("hydra/launcher=")), None)
    module, extra = LAUNCHER_NEEDS.get(name, (None, None))
    if module is None:
        return
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        found = False
    if not found:
        raise ConfigError(f"hydra/launcher={name} needs {module}, not installed: "
                          f"pip install -e '.[{extra}]' (docs/sweeps.md)")


def _hydra_main():
    import hydra

    # Hydra owns the command line here; the task function below runs one point.
    return hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)(
        run_point)()


def run_point(cfg) -> PointResult:
    """Hydra's task function: one point as ``python -m pipeline <its overrides>``. It never raises
    (Hydra would end the sweep); whatever happens is written to ``point.json``."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    result = PointResult(num=int(hc.job.num), host=os.uname().nodename,
                         overrides=[_from_hydra(o) for o in hc.overrides.task])
    t0 = time.time()
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        with open(out / "point.log", "w") as log:
            proc = subprocess.run([sys.executable, "-m", "pipeline", *result.overrides],
                                  cwd=hc.runtime.cwd, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        result.exit_code = proc.returncode
        lines = (out / "point.log").read_text(errors="replace").splitlines()
        for line in lines:
            for key in ("report", "published", "error"):
                if line.startswith(f"{key}: "):
                    setattr(result, key, line[len(key) + 2:].strip())
        if proc.returncode not in (0, 1) and result.error is None:
            tail = [ln for ln in lines if ln.strip()][-1:] or [""]
            result.error = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                            else f"exit {proc.returncode}: {tail[0].strip()}")
    except Exception as e:  # noqa: BLE001 - a point's failure is its row, never the sweep's end
        result.error = f"{type(e).__name__}: {e}"
    result.started, result.ended = t0, time.time()
    result.seconds = round(result.ended - t0, 1)
    result.write(out)
    _progress(out.parent, result)
    return result


PROGRESS_ENV = "PIPELINE_SWEEP_PROGRESS"  # "<points>:<start time>", set by main for the workers


def _progress(sweep_dir: Path, result: PointResult) -> None:
    """One line per finished point: how many of how many, elapsed and time left (points run in
    parallel workers, so the count is the ``point.json`` files written so far)."""
    from pipeline.core.progress import Progress

    total, _, t0 = os.environ.get(PROGRESS_ENV, "").partition(":")
    if not total:
        return
    done = len(list(sweep_dir.glob(f"*/{POINT_FILE}")))
    bar = Progress(int(total), "sweep", clock=time.time, unit="points", every=0)
    bar.tty, bar.t0 = False, float(t0)  # workers print to a shared stream: plain lines
    code = result.exit_code
    bar.update(done, f"{' '.join(result.overrides)} (exit {code if code is not None else '-'})")
