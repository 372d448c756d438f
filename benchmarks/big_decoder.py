"""A decoder larger than memory, compiled to INT4 on the streaming path (docs/llm.md, "Models
larger than memory"): ``python -m benchmarks.big_decoder --shape 7b`` on a quiet machine.

Random bf16 weights of a Llama-shaped decoder are written shard by shard (one transformer block
per safetensors file, never the whole model in memory, a ``model.safetensors.index.json``
naming them) with a word-level tokenizer; then ``python -m pipeline model=hf quant=int8
quant.decoder.bits=4`` compiles it in a child whose peak RSS is measured
(the sum over its process tree, sampled: ``TreeRss``) against the machine's memory, with the
run's own memory plan, each stage's wall time and peak, and decode speed from its report
against the bandwidth bound measured now. ``--bench-json bench.json`` adds the record to that
file's ``llm`` section (``big_decoder_<shape>``, with its own time and CPU, and a target) and
renders the results page again, as ``benchmarks.run`` does for a section.
``--shape tiny`` checks the mechanics in seconds with ``--budget`` forcing the streaming path.
A benchmark, not a test: nothing here asserts; the target is printed with the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import results as bench_results
from benchmarks.decoder_runs import TreeRss, add_to_llm_section, stage_peak

# Llama 2 7B's shape (Touvron et al. 2023; conf/model/llm_7b.yaml), and a tiny one for a check.
SHAPES = {
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000},
    # TinyLlama 1.1B's shape: the 7 B run's mechanics at a seventh of its size
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
           "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000},
    # the shape docs/llm.md's per-step memory factors were measured on (160 M parameters)
    "160m": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
             "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000},
    "tiny": {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
             "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 2048},
}
TARGET_SHARE = 0.60  # issue 39: peak RSS at most 60 % of the machine's memory
WORDS = 512          # the tokenizer's vocabulary (ids below the model's: any id is valid)


def write_checkpoint(folder: Path, shape: dict, seed: int = 0) -> int:
    """Random bf16 weights of a LlamaForCausalLM of ``shape``, one safetensors shard per block:
    at most one block's tensors are in memory at a time. Returns the parameter count."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    folder.mkdir(parents=True, exist_ok=True)
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    vocab = shape["vocab_size"]
    head = h // heads
    cfg = LlamaConfig(**shape, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=False, dtype="bfloat16")
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(folder)
    gen = torch.Generator().manual_seed(seed)

    def rand(*dims, scale=None):  # init scale as a trained model's: std 1/sqrt(fan-in)
        return (torch.randn(*dims, generator=gen) * (scale or dims[-1] ** -0.5)).to(torch.bfloat16)

    def shards():  # one at a time: made, written, dropped
        yield {"model.embed_tokens.weight": rand(vocab, h, scale=0.02)}
        for i in range(layers):
            p = f"model.layers.{i}."
            yield {p + "self_attn.q_proj.weight": rand(heads * head, h),
                   p + "self_attn.k_proj.weight": rand(kv * head, h),
                   p + "self_attn.v_proj.weight": rand(kv * head, h),
                   p + "self_attn.o_proj.weight": rand(h, heads * head),
                   p + "mlp.gate_proj.weight": rand(inter, h),
                   p + "mlp.up_proj.weight": rand(inter, h),
                   p + "mlp.down_proj.weight": rand(h, inter),
                   p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                   p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)}
        yield {"model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
               "lm_head.weight": rand(vocab, h)}

    index, total, params, count = {}, 0, 0, layers + 2
    for n, tensors in enumerate(shards()):
        file = f"model-{n + 1:05d}-of-{count:05d}.safetensors"
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        for k, t in tensors.items():
            index[k], total, params = file, total + t.numel() * 2, params + t.numel()
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": index}, indent=1))
    _tokenizer(folder)
    return params


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(WORDS)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", bos_token="w1",
                            eos_token="w2").save_pretrained(folder)


def _text(path: Path, rows: int = 24, seed: int = 0) -> None:
    import random

    r = random.Random(seed)
    path.write_text("".join(json.dumps({"text": " ".join(f"w{r.randrange(3, WORDS)}"
                                                          for _ in range(96))}) + "\n"
                            for _ in range(rows)))


def _bound(folder: Path, tokens_per_s: float | None, kv_len: int = 64) -> dict:
    """The candidate's decode against this machine's bandwidth bound: read bandwidth measured
    now (``pipeline.measure.bandwidth``), bytes per token counted from its graph."""
    from pipeline.bill.token_bytes import bound_tokens_per_s, count
    from pipeline.measure.bandwidth import read_bandwidth
    from pipeline.metrics.generation import model_file

    bw = read_bandwidth(threads=os.cpu_count() or 1)
    bound = bound_tokens_per_s(bw["gbs"], count(model_file(folder)), kv_len)
    return {"bandwidth_gbs": bw["gbs"], "kv_len": kv_len, "bound_tokens_per_s": bound,
            "tokens_per_s": tokens_per_s,
            "share_of_bound": tokens_per_s / bound if tokens_per_s else None}


def _machine_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--out", default=str(Path("artifacts") / "big_decoder"))
    ap.add_argument("--budget", type=float, default=None,
                    help="quant.decoder.memory_budget (a share of the machine's memory)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="bench.max_seconds of the run's decode timing")
    ap.add_argument("--bench-json", type=Path, default=None,
                    help="add the record to this file's llm section (and render docs/results.md)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the checkpoint and the run's artifacts (default: delete them, "
                         "they are many GB at 7 B)")
    # anything else is a pipeline override (a 7 B model decodes about a token a second here:
    # bench.min_rounds=3 quant.decoder.new_tokens=8 keep its timing to minutes)
    args, overrides = ap.parse_known_args(argv)
    root = Path(args.out) / args.shape
    folder = root / "checkpoint"
    t0 = time.time()
    params = (json.loads((root / "params.json").read_text())["params"]
              if (folder / "model.safetensors.index.json").is_file()
              else write_checkpoint(folder, SHAPES[args.shape]))
    (root / "params.json").write_text(json.dumps({"params": params}))
    written = time.time() - t0
    _text(root / "text.jsonl")
    cmd = [sys.executable, "-m", "pipeline", "model=hf", f"model.path={folder}", "quant=int8",
           "quant.decoder.bits=4", "data=jsonl", f"data.path={root / 'text.jsonl'}",
           "data.input_column=text", f"workdir={root / 'work'}", f"data_dir={root / 'data'}",
           f"registry.root={root / 'registry'}", "gate.min_speedup=0",
           "data.evaluation_samples=8", "data.calibration_samples=4",
           *([f"quant.decoder.memory_budget={args.budget}"] if args.budget else []),
           *([f"bench.max_seconds={args.max_seconds}"] if args.max_seconds else []),
           *overrides]
    shutil.rmtree(root / "work", ignore_errors=True)  # a fresh compile: reused stages cost nothing
    t1 = time.time()
    with TreeRss() as tree:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    peak = tree.peak
    out = {"shape": args.shape, "params": params, "overrides": overrides,
           "checkpoint_seconds": round(written, 1),
           "compile_seconds": round(time.time() - t1, 1), "returncode": proc.returncode,
           "peak_rss_bytes": peak, "cpu_seconds": round(tree.cpu_seconds, 1),
           "machine_bytes": _machine_bytes(),
           "peak_share_of_machine": round(peak / _machine_bytes(), 4),
           "target": f"peak RSS <= {TARGET_SHARE:.0%} of the machine's memory"}
    report = root / "work" / "runs" / "latest" / "report.json"
    # exit 1 is the gate's verdict (random weights score as they score): compiled all the same
    if proc.returncode in (0, 1) and report.is_file():
        r = json.loads(report.read_text())
        out["memory"] = r["settings"].get("memory")
        out["stages"] = [{"stage": st.get("label"), "seconds": st.get("seconds"),
                          "reused": st.get("reused"),
                          "peak_rss_mb": stage_peak(st.get("path"))} for st in r["stages"]]
        out["stage_peak_rss"] = (r.get("scoring") or {}).get("peak_rss")
        out["reference"] = r["settings"].get("reference")
        out["gate"] = r["verdict"]["summary"]
        out["rows"] = [{k: row.get(k) for k in ("role", "weights_mb", "perplexity",
                                                "perplexity_rise_pct", "decode")}
                       for row in r["rows"]]
        out["bound"] = _bound(Path(r["lineage"]["candidate"]["path"]),
                              ({row["role"]: row for row in out["rows"]}["candidate"].get("decode")
                               or {}).get("tokens_per_s"))
    else:
        out["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
    out["target_met"] = "rows" in out and out["peak_share_of_machine"] <= TARGET_SHARE
    compile_peak(out)
    print(json.dumps(out, indent=1))
    if args.bench_json:
        record(args.bench_json, out)
    if not args.keep:  # numbers kept, gigabytes not
        shutil.rmtree(root, ignore_errors=True)
    return out


def compile_peak(out: dict) -> None:
    """The compile's own peak beside the run's: the largest of the stages that build the model
    (the export and the quantizations, each in a child of its own), apart from scoring and decode
    timing, which hold sessions of the reference and the candidate; and a note where the decode
    speed beats the bound (then the bandwidth probe, read beside other work, under-measured)."""
    built = [st["peak_rss_mb"] for st in out.get("stages", []) if st["peak_rss_mb"] and
             str(st["stage"]).startswith(("decoder_export", "weight_only"))]
    if built:
        out["compile_peak_rss_bytes"] = int(max(built) * 2 ** 20)
        out["compile_peak_share_of_machine"] = round(max(built) * 2 ** 20 / out["machine_bytes"],
                                                     4)
        out["compile_target_met"] = out["compile_peak_share_of_machine"] <= TARGET_SHARE
    share = (out.get("bound") or {}).get("share_of_bound")
    if share and share > 1:
        out["bound_note"] = ("decode ran faster than the bound: the read bandwidth, probed "
                             "beside other work, was under-measured; not a valid bound")


def record(bench_json: Path, out: dict) -> None:
    """``out`` into ``bench_json``'s ``llm`` section as ``big_decoder_<shape>``, with its
    targets (``add_to_llm_section``)."""
    what = f"{out['shape']}-shaped decoder to INT4 on the streaming path"
    targets = {f"{what}: peak RSS of the whole run (scoring and decode timing included) <= "
               f"{TARGET_SHARE:.0%} of the machine's memory": [out["peak_share_of_machine"],
                                                               out["target_met"]]}
    if "compile_peak_share_of_machine" in out:
        targets[f"{what}: peak RSS of the compile (export, quantizations) <= "
                f"{TARGET_SHARE:.0%} of the machine's memory"] = [
            out["compile_peak_share_of_machine"], out["compile_target_met"]]
    add_to_llm_section(bench_json, f"big_decoder_{out['shape']}", out, targets)
    bench_results.write(bench_json, Path("docs") / "results.md")  # the page, never by hand


if __name__ == "__main__":
    main()
