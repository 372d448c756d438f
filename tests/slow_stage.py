"""A stage that sleeps, run by the real runner in its own process: ``python -m tests.slow_stage
WORKDIR SECONDS TAG``. Named ``benchmark`` so it is timed: it holds the key lock and the
machine-wide lock while it sleeps (tests/test_sweep.py)."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Slow:
    seconds: float
    tag: str
    name = "benchmark"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        (out_dir / "pid").write_text(str(os.getpid()))
        time.sleep(self.seconds)
        (out_dir / "out.txt").write_text(self.tag)
        return {"slept": self.seconds}


if __name__ == "__main__":
    from pipeline.config import HardwareConfig
    from pipeline.engine.runner import Runner

    runner = Runner(sys.argv[1], HardwareConfig().target(), remote="")
    art = runner.run(Slow(float(sys.argv[2]), sys.argv[3]))
    print("RESULT", "reused" if runner.record[-1]["reused"] else "built", art.digest, flush=True)
