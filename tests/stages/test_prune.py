"""prune: channels removed from the loaded network, then a short recovery; the files it writes
(safetensors and net.json, no pickle) rebuild the pruned network, the recovery is deterministic
by seed and runs in the precision the CPU's flags choose (float32 under an AVX2 cap)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipeline.config import PruneConfig, PruneMethod
from pipeline.prune import cost as pruning_cost

WIDTHS = (8, 16, 32, 32, 32)


def cfg(**kw) -> PruneConfig:
    # the OCR task's own default for prune.ignored (the config's null means the model's)
    from pipeline.models import task

    return PruneConfig(method=PruneMethod.channels,
                       **{"ignored": list(task("ocr").prune_ignored), **kw})


def _load_artifact(tmp_path, widths=WIDTHS, hidden=16):
    from pipeline.stages.load import Load, params_key

    d = tmp_path / "load"
    d.mkdir()
    Load("ocr", None, None, params_key({"widths": widths, "hidden": hidden})).run(None, d)
    return SimpleNamespace(path=d, digest="0" * 64)


def _run_stage(parent, out, **kw):
    from pipeline.stages.prune import Prune

    out.mkdir()
    settings = dict(ratio=0.5, recover_steps=3, recover_batch_size=4, eval_samples=8)
    return Prune("ocr", cfg(**{**settings, **kw})).run(parent, out)


@pytest.mark.slow
def test_stage_writes_safetensors_and_widths_that_rebuild_the_network(tmp_path, capsys):
    from safetensors.torch import load_file

    from pipeline.models import task
    from pipeline.stages.load import network_from

    meta = _run_stage(_load_artifact(tmp_path), tmp_path / "a")
    net_json = json.loads((tmp_path / "a" / "net.json").read_text())
    assert net_json["params"]["widths"] == meta["params"]["widths"] == [8, 8, 16, 16, 16, 16]
    assert net_json["params"]["hidden"] == meta["params"]["hidden"] == 8
    assert net_json["parameters"] == meta["parameters"]
    tensors = load_file(str(tmp_path / "a" / "model.safetensors"))
    assert tensors["cnn.4.weight"].shape == (8, 8, 3, 3)
    assert tensors["collapse.0.weight"].shape[0] == 16
    assert tensors["rnn.weight_ih_l0"].shape == (4 * 8, 16) and tensors["head.weight"].shape[1] == 16
    net = network_from(SimpleNamespace(path=tmp_path / "a"), task("ocr"))
    assert pruning_cost.parameters(net) == meta["parameters"] < meta["parameters_before"]
    assert not list((tmp_path / "a").glob("*.pt*")), "no pickles"
    assert 0 < meta["macs"] < meta["macs_before"] and meta["recover"]["steps"] == 3
    assert [name for name, _, _ in meta["layers"]] == ["cnn.4", "cnn.8", "cnn.11", "cnn.15",
                                                       "collapse.0", "rnn"]  # network order
    assert set(meta["held_out"]) >= {"unpruned", "pruned", "recovered"}
    assert "recovery [" in capsys.readouterr().out  # the progress bar
    # the recovery precision this CPU's flags choose, recorded with its speed
    from pipeline.core.env import effective_flags, training_precision

    assert meta["recover"]["precision"] == training_precision(effective_flags())["dtype"]
    assert meta["recover"]["steps_per_second"] > 0 and meta["recover"]["precision_reason"]


@pytest.mark.slow
def test_stage_is_deterministic_by_seed(tmp_path):
    parent = _load_artifact(tmp_path)
    blobs = [(_run_stage(parent, tmp_path / name, seed=seed),
              (tmp_path / name / "model.safetensors").read_bytes())
             for name, seed in (("a", 0), ("b", 0), ("c", 1))]
    assert blobs[0][1] == blobs[1][1]
    assert blobs[0][1] != blobs[2][1]  # the seed really drives the recovery


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx2"])  # native: test_stage_writes_safetensors_...
def test_stage_records_the_recovery_precision_capped_at_avx2(tmp_path, isa):
    """Under an AVX2 cap even an AMX machine must recover in float32, and say so."""
    from pipeline.core.env import effective_flags

    assert not {"avx512_bf16", "amx_bf16"} & set(effective_flags())
    meta = _run_stage(_load_artifact(tmp_path), tmp_path / "a")
    assert meta["recover"]["precision"] == "float32" and "no avx512_bf16" in \
        meta["recover"]["precision_reason"]
