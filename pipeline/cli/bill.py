"""``python -m pipeline.bill [probe | capacity] [options] [overrides]``: the bill, before hardware.

  python -m pipeline.bill                          the 7B LLM (model=llm_7b) on hardware=cpu
  python -m pipeline.bill hardware=l4              ... on a 24 GB card: does it fit?
  python -m pipeline.bill --compare precision      fp32 / fp16 / int8 / int4 side by side
  python -m pipeline.bill model=llm_7b_gqa --compare hardware    every hardware profile
  python -m pipeline.bill model=ocr                the latest pipeline run's ONNX models
  python -m pipeline.bill model=ocr --onnx m.onnx bill.input_shape=[1,32,200]
  python -m pipeline.bill capacity                 instances and cost for slo, from the latest run
  python -m pipeline.bill capacity --p99-ms 12 --throughput 900 --batch 8 hardware.price_per_hour=1
  python -m pipeline.bill probe                    measure this CPU (cached for hardware=cpu)

Options: --compare precision|hardware, --json (print JSON instead of tables), --onnx PATH,
--p99-ms, --throughput, --batch (capacity from your own measurement), --seconds (probe time).
Overrides are Hydra's, on conf/bill.yaml: the model, hardware and slo groups and bill.* keys.
Exit codes: 0 done, 2 a bad option or config value (one line), 3 a model or report unreadable.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.cli.args import Parser
from pipeline.core.errors import ConfigError, StageError, cli

COMMANDS = ("probe", "capacity")
ROLES = ("export", "fp32", "fp16", "candidate")


def main(argv: list[str] | None = None) -> int:
    return cli(_run, sys.argv[1:] if argv is None else list(argv), __doc__)


def _run(argv: list[str]) -> int:
    command = argv.pop(0) if argv and argv[0] in COMMANDS else None
    ap = Parser(prog="python -m pipeline.bill", add_help=False)
    ap.add_argument("--compare", choices=("precision", "hardware"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--onnx", type=Path)
    ap.add_argument("--p99-ms", type=float)
    ap.add_argument("--throughput", type=float)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0)
    args, overrides = ap.parse_known_args(argv)
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        raise ConfigError(f"unknown option {flags[0]}; see python -m pipeline.bill --help")
    from pipeline.engine.compose import compose

    cfg = compose(overrides, config_name="bill")
    if command == "probe":
        return _probe(cfg, args)
    if command == "capacity":
        return _capacity(cfg, args)
    if cfg.model.llm is not None:
        return _llm(cfg, args, overrides)
    return _artifact(cfg, args, overrides)


def _emit(args, obj, text: str) -> int:
    from pipeline.core.json_record import to_json

    print(json.dumps(to_json(obj), indent=2, default=str) if args.json else text)
    return 0


def _llm_setting(bill, overrides):
    """``bill.input_shape`` for an LLM: one sample is a sequence of token ids, ``[tokens]``, so it
    sets ``bill.seq`` (``bill.batch`` is the number of sequences). Any other shape means nothing
    here, and a ``bill.seq`` given beside it that disagrees is ambiguous: one line each."""
    import dataclasses

    shape = bill.input_shape
    if shape is None:
        return bill
    if len(shape) != 1:
        raise ConfigError(f"bill.input_shape={list(shape)}: an LLM's sample is one sequence of "
                          "token ids, [tokens]; give bill.input_shape=[N] or bill.seq=N "
                          "(bill.batch sets the number of sequences)")
    if any(o.lstrip("+~").startswith("bill.seq=") for o in overrides) and bill.seq != shape[0]:
        raise ConfigError(f"bill.input_shape={list(shape)} and bill.seq={bill.seq} disagree: "
                          "both set the tokens per sequence; give one")
    return dataclasses.replace(bill, seq=int(shape[0]))


def _llm(cfg, args, overrides) -> int:
    from pipeline.bill.llm import llm_bill
    from pipeline.config import Precision

    bill = _llm_setting(cfg.bill, overrides)
    if args.compare == "precision":
        bills = {p.value: llm_bill(cfg.model.llm, bill, cfg.hardware, p) for p in Precision}
        title = f"LLM bill: {cfg.model.name} on {cfg.hardware.name}, weights by precision"
    elif args.compare == "hardware":
        bills = {hw.name: llm_bill(cfg.model.llm, bill, hw) for hw in _profiles(overrides)}
        title = f"LLM bill: {cfg.model.name}, weights {bill.precision.value}, by hardware"
    else:
        bills = {cfg.hardware.name: llm_bill(cfg.model.llm, bill, cfg.hardware)}
        title = (f"LLM bill: {cfg.model.name} on {cfg.hardware.name}, weights "
                 f"{bill.precision.value}")
    from pipeline.bill.render import llm_text

    obj = bills if args.compare else next(iter(bills.values()))
    return _emit(args, {"compare": args.compare, "bills": bills} if args.compare else obj,
                 llm_text(bills, title))


def _profiles(overrides) -> list:
    """Every hardware option, each composed with the user's other overrides."""
    from pipeline.engine.compose import compose, group_options

    rest = [o for o in overrides if not o.lstrip("+~").startswith("hardware=")]
    return [compose([*rest, f"hardware={opt}"], config_name="bill").hardware
            for opt in group_options("hardware")]


def _latest(cfg) -> tuple[Path, dict]:
    path = Path(cfg.workdir) / "runs" / "latest" / "report.json"
    if not path.is_file():
        raise ConfigError(f"no pipeline report at {path}: run `python -m pipeline` first, or pass "
                          "--onnx PATH (models) or --p99-ms/--throughput (capacity)")
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StageError(f"{path}: unreadable report ({e})") from None


def _identity(model: dict) -> tuple:
    """What makes two model configs the same network (the task name alone does not)."""
    source = model.get("source") or model.get("name")  # reports made before model.source
    return (source, *(json.dumps(model.get(k) or None, sort_keys=True, default=str)
                      for k in ("checkpoint", "params", "path", "factory")))


def _option_of(model: dict) -> str:
    """The conf/model option a model config came from, else its name."""
    from omegaconf import OmegaConf

    from pipeline.engine.compose import CONF_DIR, group_options

    for option in group_options("model"):
        raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{option}.yaml"))
        if _identity(raw) == _identity(model):
            return option
    return str(model.get("name"))


def _artifact(cfg, args, overrides) -> int:
    from pipeline.bill.artifact import artifact_bill, measured_beside, sample_shape
    from pipeline.bill.render import artifact_text, fmt_ms, table

    batch = cfg.bill.batch
    shape = cfg.bill.input_shape or sample_shape(cfg.model.source)
    measured, ran_on = {}, None
    if args.onnx is not None:
        if args.compare == "precision":
            raise ConfigError("--compare precision: one ONNX file has one precision; without "
                              "--onnx the latest run's fp32, fp16 and quantized models are "
                              "compared")
        if not args.onnx.is_file():
            raise ConfigError(f"--onnx {args.onnx}: no such file")
        models = {args.onnx.name: args.onnx}
    else:
        path, report = _latest(cfg)
        ran = report.get("config", {}).get("model", {})
        if _identity(ran) != _identity(vars(cfg.model)):  # another network: never billed silently
            asked, other = _option_of(vars(cfg.model)), _option_of(ran)
            raise ConfigError(f"model={asked}: the latest run in {path.parent} compiled "
                              f"model={other}; bill model={other}, run python -m pipeline "
                              f"model={asked} first, or pass --onnx PATH")
        models = {role: Path(report["lineage"][role]["path"]) / "model.onnx"
                  for role in ROLES if role in report.get("lineage", {})}
        ran_on = report["config"]["hardware"]["name"]
        priced = report.get("bill") or {}
        if (cfg.bill.input_shape is None and priced.get("batch") == batch
                and priced.get("input_shape")):
            shape = priced["input_shape"][1:]  # the shape the run priced: what its p50 measured
        for row in report["rows"]:
            lat = row["latency"].get(str(batch))
            if lat:
                measured[row["role"]] = lat["p50"]
    profiles = _profiles(overrides) if args.compare == "hardware" else [cfg.hardware]
    bills = {}
    for hw in profiles:
        for name, model in models.items():
            b = artifact_bill(model, batch, shape, hw)
            if hw.name == ran_on and name in measured:  # comparable only on its own machine
                b = measured_beside(b, measured[name])
            bills[(hw.name, name)] = b
    if args.compare != "hardware":
        by_name = {name: b for (_, name), b in bills.items()}
        return _emit(args, by_name, artifact_text(by_name))
    names = list(models)
    rows = [[name, *(fmt_ms(bills[(hw.name, name)].roofline.bound_ms) for hw in profiles),
             "—" if name not in measured else f"{measured[name]:.2f} ({ran_on})"]
            for name in names]
    text = (f"Roofline ms per inference at batch {batch}, input {shape}, by hardware profile\n\n"
            + table(["model", *(hw.name for hw in profiles), "measured p50"], rows))
    return _emit(args, {f"{h}/{n}": b for (h, n), b in bills.items()}, text)


def _capacity(cfg, args) -> int:
    from pipeline.bill.capacity import plan
    from pipeline.bill.render import capacity_text

    if (args.p99_ms is None) != (args.throughput is None):
        raise ConfigError("--p99-ms and --throughput go together (one measured point)")
    if args.p99_ms is not None:
        if args.p99_ms <= 0 or args.throughput <= 0 or args.batch <= 0:
            raise ConfigError("--p99-ms, --throughput and --batch must be > 0")
        measured = {args.batch: {"p99_ms": args.p99_ms, "throughput": args.throughput}}
        source, widest = f"the command line (batch {args.batch})", None
    else:
        path, report = _latest(cfg)
        ran_on = report["config"]["hardware"]["name"]
        if ran_on != cfg.hardware.name:
            raise ConfigError(f"hardware={cfg.hardware.name}: the benchmark in {path} ran on "
                              f"hardware={ran_on}; use hardware={ran_on}, or give --p99-ms and "
                              f"--throughput measured on {cfg.hardware.name}")
        cand = next(r for r in report["rows"] if r["role"] == "candidate")
        measured = {int(b): {"p99_ms": lat["p99"], "throughput": lat["throughput"]}
                    for b, lat in cand["latency"].items()}
        source = f"{path} (candidate, {report['quant']})"
        widest = (report.get("bill", {}).get("capacity") or {}).get("measured_max_input")
    cap = plan(measured, cfg.slo, cfg.hardware.price_per_hour, widest)
    return _emit(args, cap, capacity_text(cap, source))


def _probe(cfg, args) -> int:
    from pipeline.measure.probe import probe, yaml_snippet
    from pipeline.bill.render import table

    if cfg.hardware.kind.value != "cpu":
        raise ConfigError(f"hardware={cfg.hardware.name}: the probe measures this machine's CPU; "
                          "use hardware=cpu")
    result = probe(cfg.hardware.intra_op_threads, args.seconds)
    from pipeline.measure import machine

    fp = machine.fingerprint(result["threads"])
    path = machine.cache_dir() / f"{fp}.json"
    try:  # hardware=cpu uses this longer measurement from now on
        machine.write(path, machine.record_of(result, fp))
        cached = f"Cached for hardware=cpu on this CPU: {path}"
    except OSError as e:
        cached = f"Not cached ({path.parent}: {e.strerror or e})"
    bw, mm = result["bandwidth"], result["gemm_tflops"]
    rows = [["copy bandwidth, numpy (GB/s)", f"{bw['numpy_copy_gbs']:.1f}"],
            ["copy bandwidth, torch (GB/s)", f"{bw['torch_copy_gbs']:.1f}"],
            *([f"GEMM {k.replace('_', ', ')} (TFLOP/s or TOPS)", f"{v:.3f}"]
              for k, v in mm.items() if not k.endswith("_note")),
            ["host memory (GB)", f"{result['memory_gb']:.1f}"]]
    notes = [f"{k[:-5]}: {v}" for k, v in mm.items() if k.endswith("_note")]
    busy = (["Other busy processes (the numbers are lower bounds): " + "; ".join(result["busy"])]
            if result["busy"] else [])
    text = "\n".join([f"Probe of {result['cpu']}, {result['threads']} threads, "
                      f"{result['seconds']} s", "", table(["", "best"], rows), *notes, *busy, "",
                      cached, "", "To pin these numbers in a profile of your own:",
                      yaml_snippet(result)])
    return _emit(args, result, text)


if __name__ == "__main__":
    raise SystemExit(main())
