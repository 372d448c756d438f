"""Compose the config from ``conf/`` and the command line, turning Hydra's errors into one line.

In: override strings (``quant=int8``, ``gate.max_accuracy_drop=0.5``). Out: a validated
``Config``. Hydra's compose API does the work; we call it instead of ``@hydra.main`` so that the
runner, not Hydra, owns the output folders, and so that every mistake ends with one line naming the
key, the bad value and the valid choices (exit code 2) instead of a multi-line report.
"""
from __future__ import annotations

import sys
import typing
from dataclasses import is_dataclass
from pathlib import Path

from pipeline.config import APPS, GROUPS, register
from pipeline.core.errors import ConfigError

NULLABLE = {"registry"}  # groups whose stage is optional
RENAMED = {"bench.width_buckets": "bench.size_buckets"}  # old key -> new key, still accepted
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def compilable_models(conf_dir: Path = CONF_DIR) -> list[str]:
    """Model options the compile pipeline can run (kind: task); LLM shapes are for the bill."""
    from omegaconf import OmegaConf

    return [o for o in group_options("model", conf_dir)
            if OmegaConf.load(conf_dir / "model" / f"{o}.yaml").get("kind", "task") == "task"]


def _renamed(overrides: list[str]) -> list[str]:
    """Overrides of a renamed key, under its new name, with one line saying so."""
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and key in RENAMED:
            print(f"pipeline: {key} is deprecated, use {RENAMED[key]}", file=sys.stderr)
            o = f"{RENAMED[key]}={value}"
        out.append(o)
    return out


def compose(overrides: list[str] | None = None, conf_dir: Path = CONF_DIR,
            config_name: str = "config"):
    """A validated ``Config`` (or ``BillApp`` for ``config_name="bill"``) from the overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = _renamed(list(overrides or []))
    schema = APPS[config_name]
    groups = [g for g in GROUPS if g in schema.__dataclass_fields__]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(f"cannot parse override: {_first_line(e)}") from None
    dropped = []  # groups set to null: their stage is dropped (Hydra itself wants `~group`)
    for ov in parsed:
        key = ov.key_or_group
        if key in GROUPS and key not in groups:
            raise ConfigError(f"{key}={ov.value()}: not a config group of this command; its "
                              f"groups: {', '.join(groups)}")
        if key in GROUPS and not ov.is_delete():
            value = ov.value()
            options = group_options(key, conf_dir)
            if value is None:
                if key not in NULLABLE:
                    raise ConfigError(f"{key}=null: {key} cannot be dropped; valid choices: "
                                      f"{', '.join(options)}")
                dropped.append(key)
            elif value not in options:
                raise ConfigError(f"{key}={value}: no such option; valid choices: "
                                  f"{', '.join(options)}")
    _check_added_keys(parsed, schema)
    overrides = [o for o, ov in zip(overrides, parsed) if ov.key_or_group not in dropped]
    overrides = _expand_dicts(overrides, parsed)
    overrides += [f"~{g}" for g in dropped]
    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
        result = OmegaConf.to_object(cfg)
        for group in dropped:
            setattr(result, group, None)
        if getattr(result, "registry", None) is not None:
            from pipeline.registry.names import check_repository

            check_repository(result.registry.repository)  # before any stage runs: exit 2
        if getattr(result, "registry", "absent") != "absent" and result.model.llm is None:
            from pipeline.registry.names import check_name

            check_name(result.model.name, "model.name")  # it names the published model
        if getattr(result, "gate", None) is not None:
            from pipeline.metrics.limits import check_names

            check_names(result.gate.max_accuracy_drop)  # a limit for a metric that does not exist
        if getattr(result, "hardware", None) is not None:
            from pipeline.measure.machine import apply

            apply(result.hardware)  # hardware=cpu: this machine's numbers, not another's
        return result
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(_first_line(e)) from None
    except OmegaConfBaseException as e:
        raise ConfigError(_describe(e, schema)) from None
    except HydraException as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, OmegaConfBaseException):
            raise ConfigError(_describe(cause, schema)) from None
        raise ConfigError(_first_line(e)) from None
    finally:
        GlobalHydra.instance().clear()


# Free-form dict fields: Hydra merges a dict override into the existing (struct) node, which
# refuses new keys; each entry is set on its own instead (``++``: add or replace).
DICT_FIELDS = ("model.params", "model.inputs", "model.input_dtypes")


def _expand_dicts(overrides: list[str], parsed) -> list[str]:
    import json

    out = []
    for text, ov in zip(overrides, parsed):
        value = ov.value() if ov.key_or_group in DICT_FIELDS and not ov.is_delete() else None
        if isinstance(value, dict):
            out += [f"++{ov.key_or_group}.{k}={json.dumps(v)}" for k, v in value.items()]
        else:
            out.append(text)
    return out


def _check_added_keys(parsed, schema) -> None:
    """``+gate.max_acuracy_drop=0.5`` is Hydra's way to add a key, and the typed config then
    drops it without a word: a misspelt key must not be a setting that silently did nothing.
    Adding is for the free-form dicts (``+model.params.max_length=128``) and groups."""
    for ov in parsed:
        key = ov.key_or_group
        if not (ov.is_add() or ov.is_force_add()) or key in GROUPS or key.startswith("hydra") \
                or any(key == f or key.startswith(f + ".") for f in DICT_FIELDS):
            continue
        parent, _, leaf = key.rpartition(".")
        node = _schema_at(schema, parent)
        if node is not None and leaf not in node.__dataclass_fields__:
            raise ConfigError(f"+{key}: no such key; valid keys: "
                              f"{', '.join(node.__dataclass_fields__)}")


def _schema_at(root, path: str):
    """The dataclass at a dotted path of the root schema ('' = root), or None."""
    node = root
    for part in filter(None, path.split(".")):
        hint = typing.get_type_hints(node).get(part)
        hint = next((a for a in typing.get_args(hint) if is_dataclass(a)), hint)  # Optional[X]
        if not is_dataclass(hint):
            return None
        node = hint
    return node


def _describe(e, root) -> str:
    """'key=value: reason (valid choices)' from an OmegaConf error."""
    key = getattr(e, "full_key", None)
    msg = str(getattr(e, "msg", e)).splitlines()[0]
    field = next((f for f in DICT_FIELDS if key and key.startswith(f + ".")), None)
    if field and "not in" in msg:  # a free-form dict takes new keys, with Hydra's +
        return f"{key}: not among the model's {field}; to add it: +{key}=VALUE"
    if "not in" in msg and key:  # unknown key: list the keys the group does have
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        schema = _schema_at(root, parent)
        if schema is not None:
            valid = ", ".join(schema.__dataclass_fields__)
            return f"{key}: no such key; valid keys: {valid}"
    value = getattr(e, "value", None)
    where = f"{key}={value!r}" if key else "config"
    if "could not be converted" in msg.lower():
        expected = msg.rsplit(" to ", 1)[-1].lower()
        return f"{where}: expected {'an' if expected[:1] in 'aeiou' else 'a'} {expected}"
    return f"{where}: {msg}"


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__
