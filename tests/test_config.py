"""Every option of every group composes; bad values end with one line and exit code 2."""
from __future__ import annotations

import pytest

from pipeline.compose import compose, group_options
from pipeline.config import GROUPS, QuantMode
from pipeline.errors import ConfigError
from tests.conftest import run_cli


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_option_composes(group):
    options = group_options(group)
    assert options, f"conf/{group} has no options"
    for option in options:
        cfg = compose([f"{group}={option}"])
        assert getattr(cfg, group) is not None


def test_quant_options_map_to_modes():
    assert {compose([f"quant={o}"]).quant.mode for o in group_options("quant")} == set(QuantMode)


def test_registry_can_be_dropped():
    assert compose(["registry=null"]).registry is None


@pytest.mark.parametrize("override, expected", [
    ("quant=int9", "quant=int9: no such option; valid choices: auto, bf16, dynamic, fp16, int8, mixed, none"),
    ("gate.max_accuracy_drop=abc", "gate.max_accuracy_drop='abc'"),
    ("quant.calibration=median", "expected one of [minmax, entropy, percentile, auto]"),
    ("gate.max_acuracy_drop=1", "valid keys: max_accuracy_drop"),
    ("gate.max_accuracy_drop=-1", "must be >= 0"),
    ("gate.speedup_batch_size=4", "is not benchmarked"),
    ("model=null", "model cannot be dropped"),
])
def test_bad_values_name_key_value_and_choices(override, expected):
    with pytest.raises(ConfigError) as e:
        compose([override])
    assert expected in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("override, key", [("quant=int9", "quant=int9"),
                                           ("gate.max_accuracy_drop=abc", "gate.max_accuracy_drop")])
def test_cli_bad_config_is_one_line_and_exit_2(override, key, tmp_path):
    proc = run_cli(override, f"workdir={tmp_path}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir()), "a config error must not write anything"
