"""Every option of every group composes; bad values end with one line and exit code 2."""
from __future__ import annotations

import pytest

from pipeline.engine.compose import compose, group_options
from pipeline.config import GROUPS, QuantMode
from pipeline.core.errors import ConfigError
from tests.conftest import run_cli


# The user's own model needs its file (or factory), a data set and a metric; composing checks
# only that they are named (files are read when the run starts).
USER = {"onnx": ["model.path=m.onnx"],
        "torch": ["model.factory=pkg.mod:fn", "model.inputs={image: [batch, 3, 16, 16]}"],
        "hf": ["model.path=my-encoder"]}
COMPANIONS = ["data=imagefolder", "data.path=.", "metric=agreement"]


def _with_companions(group: str, option: str) -> list[str]:
    if group == "model" and option in USER:
        return [f"model={option}", *USER[option], *COMPANIONS]
    if group in ("data", "metric"):
        rest = [c for c in COMPANIONS if not c.startswith(f"{group}=")
                and not c.startswith(f"{group}.")]
        own = [f"{group}={option}"] + (["data.path=.", "data.labels=l.csv"] if group == "data"
                                       else [])
        return ["model=onnx", *USER["onnx"], *own, *rest]
    return [f"{group}={option}"]


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_option_composes(group):
    options = group_options(group)
    assert options, f"conf/{group} has no options"
    for option in options:
        cfg = compose(_with_companions(group, option))
        assert getattr(cfg, group) is not None


def test_quant_options_map_to_modes():
    assert {compose([f"quant={o}"]).quant.mode for o in group_options("quant")} == set(QuantMode)


def test_a_renamed_key_still_works_and_says_so(capsys):
    assert compose(["bench.width_buckets=3"]).bench.size_buckets == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pipeline: bench.width_buckets is deprecated, use bench.size_buckets"]
    assert compose(["bench.size_buckets=3"]).bench.size_buckets == 3
    assert capsys.readouterr().err == ""


def test_registry_can_be_dropped():
    assert compose(["registry=null"]).registry is None


@pytest.mark.parametrize("override, expected", [
    ("quant=int9", "quant=int9: no such option; valid choices: auto, bf16, dynamic, fp16, int8, mixed, none"),
    ("gate.max_accuracy_drop=abc", "gate.max_accuracy_drop='abc'"),
    ("quant.calibration=median", "expected one of [minmax, entropy, percentile, auto]"),
    ("gate.max_acuracy_drop=1", "valid keys: max_accuracy_drop"),
    ("gate.max_accuracy_drop=-1", "must be in [0, 100]"),
    ("gate.speedup_batch_size=4", "is not benchmarked"),
    ("bench.batch_sizes=[8]", "slo.batch_size=1 is not benchmarked"),
    ("model=null", "model cannot be dropped"),
])
def test_bad_values_name_key_value_and_choices(override, expected):
    with pytest.raises(ConfigError) as e:
        compose([override])
    assert expected in str(e.value)
    assert "\n" not in str(e.value)


def test_an_untimed_slo_batch_is_refused_only_while_the_slo_is_checked():
    assert compose(["bench.batch_sizes=[8]", "gate.check_slo_p99=false"]).bench.batch_sizes == [8]
    assert compose(["bench.batch_sizes=[8]", "slo.batch_size=8"]).slo.batch_size == 8


@pytest.mark.parametrize("override, key", [("quant=int9", "quant=int9"),
                                           ("gate.max_accuracy_drop=abc", "gate.max_accuracy_drop")])
def test_cli_bad_config_is_one_line_and_exit_2(override, key, tmp_path):
    proc = run_cli(override, f"workdir={tmp_path}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir()), "a config error must not write anything"


@pytest.mark.parametrize("override, expected", [
    ("gate.max_accuracy_drop=nan", "gate.max_accuracy_drop=nan: must be in [0, 100]"),
    ("gate.max_accuracy_drop=150", "must be in [0, 100]"),
    ("quant.max_accuracy_drop=nan", "quant.max_accuracy_drop=nan"),
    ("gate.min_speedup=inf", "gate.min_speedup=inf: must be a finite number"),
    ("gate.min_speedup=nan", "gate.min_speedup=nan: must be a finite number"),
    ("gate.max_model_mb=nan", "gate.max_model_mb=nan"),
    ("bench.rel_ci=nan", "bench.rel_ci=nan: must be in (0, 1)"),
    ("bench.aa_tolerance=2", "bench.aa_tolerance=2.0: must be in (0, 1)"),
    ("bench.min_seconds=inf", "bench.min_seconds=inf: must be a finite number"),
    ("bench.load.soak_qps=nan", "bench.load.soak_qps=nan"),
    ("slo.p99_ms=inf", "slo.p99_ms=inf"),
    ("prune.recover_lr=nan", "prune.recover_lr=nan"),
    ("registry.timeout_s=inf", "registry.timeout_s=inf"),
    ("hardware.affinity=[0,0]", "expected distinct CPU ids"),
    ("hardware.affinity=[]", "hardware.affinity=[]"),
    ("quant.exclude=[cnn.0,cnn.0]", "quant.exclude"),
    ("quant.search_budget_s=nan", "quant.search_budget_s=nan: must be a finite number of seconds"),
    ("quant.search_budget_s=0", "quant.search_budget_s=0.0"),
    ("quant.search_groups=layers", "quant.search_groups=layers: blocks or nodes"),
    *((["model=hf", "model.path=m", f"+model.params.max_length={v}"],
       f"model.params.max_length={v!r}: must be a whole number") for v in ("abc", 1.5, 1)),
])
def test_numbers_are_finite_and_in_range_at_compose_time(override, expected):
    with pytest.raises(ConfigError) as e:
        compose(override if isinstance(override, list) else [override])
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_affinity_is_checked_against_this_process_cpus():
    import os

    allowed = sorted(os.sched_getaffinity(0))
    missing = max(allowed) + 1  # one past the last CPU this process may use
    with pytest.raises(ConfigError, match=f"CPU {missing} is not available to this process"):
        compose([f"hardware.affinity=[{allowed[0]},{missing}]"])
    assert compose([f"hardware.affinity=[{allowed[-1]}]"]).hardware.affinity == [allowed[-1]]


def test_cli_affinity_outside_this_machine_is_exit_2_before_any_stage(tmp_path):
    import os

    from tests.conftest import tiny_args

    # the tiny network, so that a regression costs seconds, not a real run
    proc = run_cli(*tiny_args(tmp_path, f"hardware.affinity=[{max(os.sched_getaffinity(0)) + 1}]"))
    assert proc.returncode == 2 and "hardware.affinity" in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir()), "a config error must not write anything"


@pytest.mark.parametrize("override,expected", [
    ("+gate.max_acuracy_drop=0.5", "+gate.max_acuracy_drop: no such key"),
    ("+foo=1", "+foo: no such key"),
    ("++bench.min_round=3", "+bench.min_round: no such key"),
])
def test_a_key_added_with_plus_must_exist(override, expected):
    """Hydra adds a ``+key`` that no schema has, and the typed config then drops it: a misspelt
    limit would silently be the default. Adding stays open where the config is free-form."""
    with pytest.raises(ConfigError, match=expected.replace("+", r"\+")):
        compose(["model=ocr_tiny", override])
    assert compose(["model=ocr_tiny", "+model.params.extra=1"]).model.params["extra"] == 1
    # and without the +, the error says how to add it
    with pytest.raises(ConfigError, match=r"to add it: \+model\.params\.extra=VALUE"):
        compose(["model=ocr_tiny", "model.params.extra=1"])


def test_a_sweep_on_a_launcher_whose_package_is_missing_is_one_line_and_exit_2(tmp_path):
    import importlib.util

    from tests.conftest import one_line

    try:
        installed = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except ModuleNotFoundError:
        installed = False
    if installed:
        pytest.skip("hydra-submitit-launcher is installed here")
    proc = run_cli("-m", "model=ocr_tiny", "hydra/launcher=slurm", f"workdir={tmp_path}")
    one_line(proc, 2, "hydra/launcher=slurm", ".[slurm]")
