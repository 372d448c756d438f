"""Train an OCR network (the CRNN, or ``--task ocr_mobile``'s MobileNetV3-style one) from scratch
on freshly generated synthetic lines.

In: a task, a step count, a seed and an output path. Out: a safetensors checkpoint plus a JSON card
beside it (sha256, parameter count, widths, the exact command, held-out accuracy). Every batch is
generated on the fly from the seed, so no data set is stored and the run is reproducible on a
machine with the same torch build and thread count. Usage (what `make train-ocr` runs):

    python -m pipeline.models.ocr.train --steps 6000 --out pipeline/models/checkpoints/ocr_crnn.safetensors

``make train-ocr-mobile`` runs it with ``--task ocr_mobile`` (see the Makefile for its steps).

``fit`` is the loop itself (AdamW, one-cycle schedule, CTC loss, bf16 autocast); the ``prune``
stage reuses it for its recovery fine-tune on a different seed stream.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors.torch import save_file

from pipeline.core.env import training_precision
from pipeline.models.ocr.data import ALPHABET, collate, generate, to_array
from pipeline.models.ocr.decode import greedy_decode, score

TRAIN_WIDTH_BUCKET = 32  # few distinct shapes, so oneDNN reuses its kernels between steps
TRAIN_SEED = 1000  # calibration uses seed 1, evaluation seed 2: the streams never meet
# The network class of each trainable task (its module also holds DEFAULT_WIDTHS, LSTM_HIDDEN).
NETWORKS = {"ocr": ("pipeline.models.ocr.net", "CRNN"),
            "ocr_mobile": ("pipeline.models.ocr.mobile_net", "MobileCRNN")}


def network(task: str, widths: list[int] | None = None, hidden: int | None = None) -> torch.nn.Module:
    """A freshly initialised network of ``task`` (defaults: its module's widths and hidden size)."""
    module_name, cls = NETWORKS[task]
    module = importlib.import_module(module_name)
    return getattr(module, cls)(tuple(widths or module.DEFAULT_WIDTHS), hidden or module.LSTM_HIDDEN)


def batches(seed: int, batch_size: int, start: int = 0):
    i = start
    while True:
        samples = list(generate(seed, batch_size, start=i))
        i += batch_size
        yield samples


def targets(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    flat = [ALPHABET.index(c) + 1 for t in texts for c in t]
    return torch.tensor(flat, dtype=torch.long), torch.tensor([len(t) for t in texts])


def evaluate(model: torch.nn.Module, seed: int, count: int, batch_size: int = 64) -> dict[str, float]:
    return evaluate_samples(model, list(generate(seed, count)), batch_size)


def evaluate_samples(model: torch.nn.Module, samples: list[dict], batch_size: int = 64) -> dict[str, float]:
    """Sequence accuracy and CER on given samples; leaves the model in training mode."""
    model.eval()
    preds, labels = [], []
    with torch.inference_mode():
        for k in range(0, len(samples), batch_size):
            chunk = samples[k:k + batch_size]
            x = torch.from_numpy(collate([to_array(s) for s in chunk]))
            preds += greedy_decode(model(x).numpy())
            labels += [s["text"] for s in chunk]
    model.train()
    return score(preds, labels)


def fit(model: torch.nn.Module, data: Iterator[list[dict]], steps: int, lr: float,
        bf16: bool | None = None, on_step: Callable[[int, float], None] | None = None) -> float:
    """Train ``model`` in place for ``steps`` batches from ``data``; returns the last loss.

    ``bf16=None`` takes float32 or bfloat16 autocast from the CPU's flags
    (``pipeline.core.env.training_precision``).

    AdamW with a one-cycle schedule peaking at ``lr``: the warm-up protects a freshly pruned
    network as much as a random one. ``on_step(step, loss)`` is called after every step.
    """
    if bf16 is None:
        bf16 = training_precision()["dtype"] == "bfloat16"
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    ctc = torch.nn.CTCLoss(blank=0, zero_infinity=True)
    loss = torch.zeros(())
    for step in range(1, steps + 1):
        samples = next(data)
        x = torch.from_numpy(collate([to_array(s) for s in samples], multiple=TRAIN_WIDTH_BUCKET))
        tgt, tgt_len = targets([s["text"] for s in samples])
        # bfloat16 autocast halves the step time on CPUs with AVX512-BF16/AMX (and is emulated,
        # far slower, without them); weights, optimizer state and the loss stay float32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        logp = logits.float().log_softmax(-1).permute(1, 0, 2)  # CTC wants [T, N, C]
        in_len = torch.full((x.shape[0],), logp.shape[0], dtype=torch.long)
        loss = ctc(logp, tgt, in_len, tgt_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        if on_step is not None:
            on_step(step, loss.item())
    model.eval()
    return float(loss.item())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(NETWORKS), default="ocr")
    ap.add_argument("--widths", type=int, nargs="+", default=None, help="default: the network's")
    ap.add_argument("--hidden", type=int, default=None, help="default: the network's")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bfloat16 autocast (default: from the CPU's flags)")
    ap.add_argument("--eval-count", type=int, default=2000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = network(args.task, args.widths, args.hidden)
    choice = training_precision()
    if args.bf16 is None:
        args.bf16 = choice["dtype"] == "bfloat16"
        print(f"training precision: {choice['dtype']} ({choice['reason']})", flush=True)
    else:
        print(f"training precision: {'bfloat16' if args.bf16 else 'float32'} (--bf16 given)",
              flush=True)
    t0 = time.time()

    def log(step: int, loss: float) -> None:
        if step % 100 == 0 or step == args.steps:
            rate = step / (time.time() - t0)
            print(f"step {step}/{args.steps} loss {loss:.4f} ({rate:.1f} steps/s)", flush=True)
        if step % 1000 == 0 and step < args.steps:
            print(f"  held-out (500): {evaluate(model, 2, 500)}", flush=True)

    fit(model, batches(TRAIN_SEED + args.seed, args.batch_size), args.steps, args.lr, args.bf16, log)

    metrics = evaluate(model, 2, args.eval_count)
    print(f"held-out ({args.eval_count} lines, evaluation seed 2): {metrics}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp),
              metadata={"widths": json.dumps(model.widths), "hidden": str(model.hidden)})
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    tmp.replace(args.out)
    card = {
        "file": args.out.name, "sha256": digest,
        "task": args.task, "parameters": sum(p.numel() for p in model.parameters()),
        "widths": list(model.widths), "hidden": model.hidden,
        "command": "python -m pipeline.models.ocr.train " + " ".join(sys.argv[1:] if argv is None else argv),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "train_seconds": round(time.time() - t0, 1),
        "precision": "bfloat16" if args.bf16 else "float32",
        "held_out": {"seed": 2, "count": args.eval_count, **metrics},
    }
    args.out.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
