"""The pruning part of the report: what pruning did, on rows of its own.

In: the recipe's ``Outcome`` of a ``prune=channels`` run (its ``pruning`` artifacts: load, prune
and the unpruned export). Out: a JSON-ready dict for report.json and Markdown lines for report.md.
One row per step, so each effect stands alone: the unpruned network, the pruned one before
recovery, and the recovered one, each with parameters, MACs, ONNX size and held-out accuracy
(torch, on the prune stage's held-out lines). The pruned network's ONNX size is the export row's;
the unpruned one's is a real export of the unpruned network (``export[unpruned]``). Latency of
pruned against unpruned is measured by ``make bench`` side by side, not here: a single run holds
only one of them.
"""
from __future__ import annotations


def as_dict(outcome) -> dict:
    p = outcome.pruning
    meta = p["prune"].meta
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
    return {"config": cfg, "rows": rows, "layers": meta["layers"], "widths": meta["widths"],
            "hidden": meta["hidden"], "macs_per": meta["macs_per"],
            "macs_reduction": meta["macs_reduction"],
            "parameters_reduction": 1 - meta["parameters"] / meta["parameters_before"],
            "onnx_size_reduction": 1 - size["pruned"] / size["unpruned"],
            "held_out": {"seed": held["seed"], "samples": held["samples"]},
            "recover": meta["recover"], "artifact": p["prune"].digest}


def markdown(section: dict) -> list[str]:
    lines = ["", "## Pruning", "",
             f"| step | parameters | MACs ({section['macs_per']}) | ONNX MB | held-out seq acc % "
             "| CER % |", "|---|---|---|---|---|---|"]
    for r in section["rows"]:
        lines.append(f"| {r['step']} | {r['parameters']:,} | {r['macs'] / 1e6:.1f} M | "
                     f"{r['onnx_mb']:.2f} | {r['sequence_accuracy']:.2f} | {r['cer']:.2f} |")
    layers = ", ".join(f"{name} {b}->{a}" for name, b, a in section["layers"])
    held = section["held_out"]
    lines += ["", f"Parameters -{100 * section['parameters_reduction']:.1f} %, MACs "
              f"-{100 * section['macs_reduction']:.1f} %, ONNX size "
              f"-{100 * section['onnx_size_reduction']:.1f} %. Held-out: {held['samples']} "
              f"generated lines (seed {held['seed']}), scored in torch.",
              f"Channels per pruned layer (LSTM: hidden units per direction): {layers}; widths "
              f"now {section['widths']}, LSTM hidden {section['hidden']}. Latency against the "
              "unpruned network: `make bench`, section `pruning`."]
    return lines
