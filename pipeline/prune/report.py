"""The pruning part of the report: what pruning did, on rows of its own.

In: the recipe's ``Outcome`` of a ``prune=channels`` run (its ``pruning`` artifacts: load, prune
and the unpruned export). Out: a JSON-ready dict for report.json and Markdown lines for report.md.
One row per step, so each effect stands alone: the unpruned network, the pruned one before
recovery, and the recovered one, each with parameters, MACs, ONNX size and the task's metrics on
the prune stage's held-out samples (scored in torch). The pruned network's ONNX size is the export
row's; the unpruned one's is a real export of the unpruned network (``export[unpruned]``). Latency
of pruned against unpruned is measured by ``make bench`` side by side, not here: a single run holds
only one of them.
"""
from __future__ import annotations


def as_dict(outcome) -> dict:
    import json

    p = outcome.pruning
    meta = p["prune"].meta
    params = json.loads((p["prune"].path / "net.json").read_text())["params"]
    cfg = p["prune"].config.get("prune", {})
    size = {"unpruned": p["unpruned_export"].model.stat().st_size / 1e6,
            "pruned": outcome.models["export"].model.stat().st_size / 1e6}
    held = meta["held_out"]
    common = {"parameters": meta["parameters"], "macs": meta["macs"], "onnx_mb": size["pruned"]}
    rows = [
        {"step": "load (unpruned)", "parameters": meta["parameters_before"],
         "macs": meta["macs_before"], "onnx_mb": size["unpruned"], **held["unpruned"]},
        {"step": f"prune (ratio {cfg.get('ratio')}, {cfg.get('importance')}, round to "
                 f"{cfg.get('round_to')}), before recovery", **common, **held["pruned"]},
        {"step": f"recovery ({meta['recover']['steps']} steps, {meta['recover']['seconds']} s, "
                 f"{meta['recover'].get('precision', 'bfloat16')})",
         **common, **held["recovered"]},
    ]
    return {"config": cfg, "rows": rows, "layers": meta["layers"], "params": params,
            "metrics": list(held["unpruned"]), "macs_per": meta["macs_per"],
            "macs_reduction": meta["macs_reduction"],
            "parameters_reduction": 1 - meta["parameters"] / meta["parameters_before"],
            "onnx_size_reduction": 1 - size["pruned"] / size["unpruned"],
            "held_out": {"seed": held["seed"], "samples": held["samples"],
                         "what": held.get("what") or f"{held['samples']} samples"},
            "recover": meta["recover"], "artifact": p["prune"].digest}


def markdown(section: dict, units: dict | None = None) -> list[str]:
    """``units``: each metric's unit (from the report's metric specs), for the column heads."""
    units = units or {}
    names = section["metrics"]
    heads = "".join(f" held-out {n} {units.get(n, '')}".rstrip() + " |" for n in names)
    lines = ["", "## Pruning", "",
             f"| step | parameters | MACs ({section['macs_per']}) | ONNX MB |{heads}",
             "|---|---|---|---|" + "---|" * len(names)]
    for r in section["rows"]:
        lines.append(f"| {r['step']} | {r['parameters']:,} | {r['macs'] / 1e6:.1f} M | "
                     f"{r['onnx_mb']:.2f} |" + "".join(f" {r[n]:.2f} |" for n in names))
    layers = ", ".join(f"{name} {b}->{a}" for name, b, a in section["layers"])
    params = ", ".join(f"{k} {v}" for k, v in section["params"].items())
    lines += ["", f"Parameters -{100 * section['parameters_reduction']:.1f} %, MACs "
              f"-{100 * section['macs_reduction']:.1f} %, ONNX size "
              f"-{100 * section['onnx_size_reduction']:.1f} %. Held-out: "
              f"{section['held_out']['what']}, scored in torch.",
              f"Channels per pruned layer (LSTM: hidden units per direction): {layers}"
              + (f"; the network's params now: {params}" if params else "")
              + ". Latency against the unpruned network: one run of each, side by side (`make "
              "bench`, section `pruning`)."]
    return lines
