"""``run_cli``'s warm interpreter (tests/warm_cli.py) ends a run as ``python -m pipeline`` does.

Most of the suite's command lines run forked from it, so what it changes would change what every
end-to-end test proves: these compare it with a cold start of the same command.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import warm_cli
from tests.conftest import ROOT, tiny_args

# Every test here runs the command line, some through the zygote's own call, which the cli
# marking in tests/conftest.py does not follow.
pytestmark = pytest.mark.cli


@pytest.fixture(scope="module")
def zygote():
    z = warm_cli.Zygote({**os.environ, "PYTHONPATH": str(ROOT)})
    yield z
    z.close()


def cold(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [["model=nope"], ["quant=int9"], ["gate.min_speedup=fast"],
                                  ["model.checkpoint=missing.safetensors"]])
def test_a_forked_run_ends_with_the_cold_runs_code_and_words(zygote, tmp_path, args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    warm, ref = zygote.run(args, tmp_path, env, 300), cold(args, tmp_path, env)
    assert (warm.returncode, warm.stdout, warm.stderr) == (ref.returncode, ref.stdout, ref.stderr)
    assert warm.returncode == 2, warm.stderr  # each is a config error: not a pass by accident


def test_a_forked_run_has_its_own_folder_environment_and_module_path(zygote, tmp_path):
    """The zygote started elsewhere, without the variable: the run still sees the test's."""
    (tmp_path / "probe_here.py").write_text(
        "import json, os, sys\n"
        "json.dump({'cwd': os.getcwd(), 'probe': os.environ.get('WARM_PROBE'),\n"
        "           'path0': sys.path[0], 'argv0': sys.argv[0]}, open('seen.json', 'w'))\n"
        "def build():\n    raise ValueError('not a network')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WARM_PROBE": "from the test"}
    args = ["model=torch", "model.factory=probe_here:build", "model.inputs={x: [batch, 4]}",
            "model.outputs=[y]", "data=imagefolder", f"data.path={tmp_path}", "metric=agreement",
            f"workdir={tmp_path / 'work'}"]
    proc = zygote.run(args, tmp_path, env, 300)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"cwd": str(tmp_path), "probe": "from the test", "path0": str(tmp_path),
                    "argv0": str(ROOT / "pipeline" / "__main__.py")}, proc.stderr
    assert proc.returncode != 0


def test_a_run_past_its_timeout_is_killed_and_raises(zygote, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run(tiny_args(tmp_path), tmp_path, env, timeout=0.5)
    assert not list(zygote.folder.glob("*.out"))  # nothing of the run is left behind


def test_runs_share_the_zygotes_forkserver_and_its_children_write_to_the_run(zygote, tmp_path):
    """The stage children of two runs come from one forkserver (tests/warm_cli.py), started
    with the run's environment, and each child writes to its own run's stderr."""
    from tests import byo_net

    byo_net.write_folder(tmp_path / "data", 4)
    (tmp_path / "probe_fs.py").write_text(
        "import json, os, sys\n"
        "from pipeline.core import isolate\n"
        "from tests.byo_net import small_cnn\n"
        "def build():\n"
        "    if not isolate._IN_CHILD:  # the command line's own checks\n"
        "        return small_cnn()\n"
        "    with open('seen.jsonl', 'a') as f:\n"
        "        f.write(json.dumps({'ppid': os.getppid(),\n"
        "                            'probe': os.environ.get('WARM_PROBE')}) + '\\n')\n"
        "    print('probe says hello', file=sys.stderr, flush=True)\n"
        "    raise ValueError('not a network')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WARM_PROBE": "from the test"}
    args = ["model=torch", "model.factory=probe_fs:build",
            "model.inputs={image: [batch, 3, 16, 16]}", "model.outputs=[logits]",
            "data=imagefolder", f"data.path={tmp_path / 'data'}",
            "data.calibration_samples=4", "data.evaluation_samples=4", "metric=classification",
            f"workdir={tmp_path / 'work'}", "registry=null"]
    procs = [zygote.run(args, tmp_path, env, 300) for _ in range(2)]
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert len(seen) == 2, procs[0].stdout + procs[0].stderr
    assert seen[0]["ppid"] == seen[1]["ppid"]  # one forkserver for both runs
    assert all(s["probe"] == "from the test" for s in seen)
    for proc in procs:
        assert proc.returncode != 0 and "probe says hello" in proc.stderr, proc.stderr


def test_what_picks_a_zygote_and_a_forkserver():
    """Variables libraries set for themselves, or those of libraries no zygote holds, pick no new
    interpreter; one read when a held library is imported (the hub's offline switch) does. A
    Hugging Face model type's code is left to the child, and only model=hf runs and the model
    builder fork from the zygote that holds transformers."""
    base = {"PATH": "/bin", "HF_HUB_OFFLINE": "1"}
    same = {**base, "TORCHINDUCTOR_CACHE_DIR": "/tmp/x", "ORT_LIB_PATH": "/x.so",
            "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
            "PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace", "PYTEST_CURRENT_TEST": "t"}
    assert warm_cli._keyed(same) == warm_cli._keyed(base)
    assert warm_cli._keyed({"PATH": "/bin"}) != warm_cli._keyed(base)
    asked = ["numpy", "transformers", "transformers.models.auto.modeling_auto",
             "transformers.models.bert.modeling_bert", "torch"]
    assert warm_cli._shared_preload(asked) == [
        "numpy", "transformers", "transformers.models.auto.modeling_auto", "torch",
        "transformers.modeling_utils"]
    assert warm_cli._shared_preload(["numpy", "torch"]) == ["numpy", "torch"]
    assert warm_cli._kind("pipeline", ["model=hf", "quant=int8"]) == warm_cli.HF
    assert warm_cli._kind(warm_cli.BUILDER, ["-i", "x"]) == warm_cli.HF
    assert warm_cli._kind("pipeline", ["model=ocr_tiny"]) == ""
    assert warm_cli._kind("pipeline.registry", ["model=hf"]) == ""
