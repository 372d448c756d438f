"""Decoder LLMs through the command line: a tiny Llama folder built with ``save_pretrained``
compiled end to end (FP32 with a KV cache, weight-only INT8, scored on text against FP32 at
accuracy level 0, decode timed against FP32, published), the pulled folder loaded by
onnxruntime-genai as it is and generating; a GGUF file converted once into an FP32 folder equal
to the one it was written from; and each refusal in one line before any stage runs. The speed
gate is off (a 2-layer model's decode is all overhead); nothing asserts a timing verdict."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, one_line, run_cli

FAST = ["gate.min_speedup=0", "bench.max_seconds=1", "quant.decoder.new_tokens=4",
        "quant.decoder.prompts=2", "quant.decoder.prompt_tokens=8",
        "data.evaluation_samples=12", "data.calibration_samples=4"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from hf_tiny import text_data
    from llm_tiny import llama

    root = tmp_path_factory.mktemp("llm")
    llama(root / "tiny")
    text_data(root / "text.jsonl", 20)
    return root


def _args(root: Path, *extra: str, model: str | None = None) -> list[str]:
    return ["model=hf", f"model.path={model or root / 'tiny'}", "data=jsonl",
            f"data.path={root / 'text.jsonl'}", "data.input_column=text",
            f"workdir={root / 'work'}", f"data_dir={root / 'work' / 'data'}",
            f"registry.root={root / 'registry'}", *FAST, *extra]


def test_int8_end_to_end_published_folder_generates(root):
    proc = run_cli(*_args(root, "quant=int8"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((root / "work" / "runs" / "latest" / "report.json").read_text())
    assert report["kind"] == "decoder" and report["verdict"]["passed"]
    rows = {r["role"]: r for r in report["rows"]}
    # every projection and the output layer: 2 blocks x (qkv, o, gate, up, down) + lm_head
    assert rows["candidate"]["matmul_bits"] == {"4": 0, "8": 11}
    assert rows["candidate"]["weights_mb"] < 0.6 * rows["fp32"]["weights_mb"]
    # the scores are the FP32 reference's own at accuracy level 0, and FP32's exported logits
    # follow transformers' own
    assert rows["candidate"]["perplexity_rise_pct"] == pytest.approx(
        100 * (rows["candidate"]["perplexity"] / rows["fp32"]["perplexity"] - 1))
    assert report["export"]["parity_vs_transformers"]["max_abs_diff"] < 1e-2
    assert "GroupQueryAttention" in report["export"]["nodes"]
    checks = {c["check"] for c in report["verdict"]["checks"]}
    assert {"perplexity_rise_drop", "top1_agreement_drop", "speedup_ci_low"} <= checks
    # how much text the verdict rests on, in both reports
    ev = report["evaluation"]
    assert ev["sequences"] == 12 and ev["tokens_scored"] >= 97
    assert (f"Scored on {ev['sequences']} evaluation sequences, {ev['tokens_scored']} predicted "
            "tokens") in (root / "work" / "runs" / "latest" / "report.md").read_text()

    ref = report["published"].split("@")[0]
    out = root / "pulled"
    pull = subprocess.run([sys.executable, "-m", "pipeline.registry", "pull", ref, "--out",
                           str(out), f"registry.root={root / 'registry'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert pull.returncode == 0, pull.stdout + pull.stderr
    import onnxruntime_genai as og

    model = og.Model(str(out))  # the folder as pulled: nothing renamed or added
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    prompt = tok.encode("the quick brown fox")
    params.set_search_options(max_length=len(prompt) + 6, min_length=len(prompt) + 6,
                              do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
    assert len(gen.get_sequence(0)) == len(prompt) + 6


def test_int8_at_a_block_wider_than_the_rows_builds_scores_and_records_its_block(root):
    """quant=auto's wider-block INT8 (block 128) on matrices whose rows are shorter than a
    block (hidden 64): built, scored against FP32 and timed like block 32, every MatMulNBits
    node at block 128 and the report saying so."""
    import onnx

    proc = run_cli(*_args(root, "quant=int8", "quant.decoder.block_size=128"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((root / "work" / "runs" / "latest" / "report.json").read_text())
    assert report["settings"]["block_size"] == 128
    cand = {r["role"]: r for r in report["rows"]}["candidate"]
    assert cand["matmul_bits"] == {"4": 0, "8": 11} and cand["perplexity"] > 0
    folder = Path(report["lineage"]["candidate"]["path"])
    blocks = {onnx.helper.get_attribute_value(a) for f in folder.glob("*.onnx")
              for n in onnx.load(str(f), load_external_data=False).graph.node
              if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "block_size"}
    assert blocks == {128}


@pytest.mark.slow  # the conversion's child loads torch, transformers and accelerate
def test_a_gguf_file_converts_once_into_the_folder_it_was_written_from(root, tmp_path):
    """The GGUF file read tensor by tensor with transformers' tables (undoing llama.cpp's Q/K
    layout); the cached folder has the same tensors as the original and no quantization_config, and a second resolve reuses it."""
    import numpy as np
    from safetensors.numpy import load_file

    from llm_tiny import gguf_file, tokenizer
    from pipeline.models.decoder import resolve

    path = gguf_file(root / "tiny", tmp_path / "tiny.gguf")
    # neighbours transformers would read beside the file, not in the cache key (the GGUF's
    # sha256): they are not what is converted
    tokenizer(tmp_path, seed=1, vocab=280)  # tokenizer.json and tokenizer_config.json
    first = resolve(str(path), tmp_path / "work")
    folder = Path(first.folder)
    assert folder.parent == (tmp_path / "work" / "cache" / "gguf").resolve()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    vocab = json.loads((root / "tiny" / "tokenizer.json").read_text())["model"]["vocab"]
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"] == vocab
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no scratch left
    # converted tensor by tensor into shards their index names (pipeline.models.gguf_stream)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    want, got = load_file(str(root / "tiny" / "model.safetensors")), {}
    for shard in sorted(set(index.values())):
        got.update(load_file(str(folder / shard)))
    assert set(want) == set(got) == set(index)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    stamp = (folder / "model.safetensors.index.json").stat().st_mtime_ns
    again = resolve(str(path), tmp_path / "work")
    assert again.digest == first.digest
    assert (folder / "model.safetensors.index.json").stat().st_mtime_ns == stamp  # not again


def _config(folder: Path, **cfg) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_a_decoder_the_builder_does_not_export_is_refused(root, tmp_path):
    gpt2 = _config(tmp_path / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    proc = run_cli(*_args(root, "quant=int8", model=str(gpt2)))
    one_line(proc, 2, "GPT2LMHeadModel", "model builder")


def test_a_pickled_decoder_is_refused_unread(root, tmp_path):
    folder = tmp_path / "pickled"
    shutil.copytree(root / "tiny", folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not read")
    proc = run_cli(*_args(root, "quant=int8", model=str(folder)))
    one_line(proc, 2, "safetensors")


def test_a_missing_gguf_file_is_refused(root, tmp_path):
    proc = run_cli(*_args(root, "quant=int8", model=str(tmp_path / "none.gguf")))
    one_line(proc, 2, "none.gguf", "no such file")


def test_decoder_settings_on_an_encoder_are_refused(root, tmp_path):
    from hf_tiny import bert

    enc = bert(tmp_path / "bert")
    proc = run_cli("model=hf", f"model.path={enc}", "data=jsonl",
                   f"data.path={root / 'text.jsonl'}", "data.input_column=text",
                   "metric=agreement", "quant=int8", "quant.decoder.bits=4",
                   f"workdir={tmp_path / 'work'}")
    one_line(proc, 2, "quant.decoder", "not one")


def test_float16_is_refused_for_a_decoder(root):
    proc = run_cli(*_args(root, "quant=fp16"))
    one_line(proc, 2, "quant=fp16", "weight-only")


def test_accuracy_level_follows_the_cpu_flags():
    from pipeline.config import DecoderQuant
    from pipeline.recipes.decoder import accuracy_level

    assert accuracy_level(DecoderQuant(), ["avx2", "fma"])[0] == 4
    assert accuracy_level(DecoderQuant(), ["amx_int8", "avx512_vnni"])[0] == 4
    assert accuracy_level(DecoderQuant(), ["avx", "sse4_2"])[0] == 0
    assert accuracy_level(DecoderQuant(accuracy_level=0), ["avx2"]) == (
        0, "set by quant.decoder.accuracy_level")


def test_groups_are_blocks_and_the_output_layer():
    from pipeline.recipes.decoder import groups

    names = ["/model/layers.0/attn/qkv_proj/MatMul", "/model/layers.0/mlp/down_proj/MatMul",
             "/model/layers.10/attn/o_proj/MatMul", "/lm_head/MatMul"]
    assert groups(names) == {"layers.0": names[:2], "layers.10": [names[2]],
                             "lm_head": [names[3]]}


def test_the_mixed_search_widens_the_output_layer_then_the_most_sensitive_blocks():
    """search() on three groups whose trial passes only when the output layer and block 1 are
    wider than 4 bits: block 1 is the more sensitive (the higher proxy), so the answer is the
    first two groups of the order at 8 bits, found by bisection; every trial is a whole plan
    (no per-block trial: the proxy ranks them before the search)."""
    from pipeline.recipes.decoder import search

    groups = {"layers.0": ["a"], "layers.1": ["b"], "lm_head": ["c"]}
    tried = []

    def trial(plan, what):
        tried.append((what, dict(plan)))
        assert len(plan) == 3  # never a group alone
        return plan.get("c", 0) != 4 and plan.get("b", 0) != 4

    assert search(groups, 4, trial, lambda: {"layers.0": 0.1, "layers.1": 0.5}) == \
        "first 2 of 3 groups at 8 bits"
    assert len(tried) == 3  # all at 4, then bisection over 3 prefixes: k=2, k=1
    plans = dict(tried)
    assert plans["all at 4 bits"] == {"a": 4, "b": 4, "c": 4}
    assert plans["first 2 of 3 groups at 8 bits"] == {"a": 4, "b": 8, "c": 8}
    assert plans["first 1 of 3 groups at 8 bits"] == {"a": 4, "b": 4, "c": 8}
    assert "first 3 of 3 groups at 8 bits" not in plans  # bisection: not every prefix is built


def test_the_mixed_search_falls_back_to_float_and_reports_failure():
    from pipeline.recipes.decoder import search

    groups = {"layers.0": ["a"], "lm_head": ["c"]}
    tried = []

    def float_head(plan, what):  # passes only with the output layer float
        tried.append(what)
        return "c" not in plan and plan.get("a") in (4, 8)

    assert search(groups, 4, float_head, dict) == "first 1 of 2 groups at float"
    assert search(groups, 8, lambda plan, what: False, dict) is None
    # a first plan that passes needs no ranking: the proxy's forward pass is never run
    assert search(groups, 8, lambda plan, what: True, lambda: 1 / 0) == "all at 8 bits"


class _FakeRun:
    """The parts of the decoder recipe's run that ``_auto`` calls: builds recorded by block
    size, scores and decode speedups given by the test (the choice is the logic under test).
    ``rise`` is a candidate's perplexity rise on the sequences a search scores, ``full_rise``
    (default: the same) on the full text."""

    def __init__(self, cfg, rise: dict, speedup: dict, block_size: int = 32,
                 full_rise: dict | None = None, mixed_rise: float = 1.0):
        from types import SimpleNamespace as NS

        self.cfg, self.decoder, self.trials, self.builds = cfg, None, [], []
        self.q = NS(block_size=block_size)
        self.names = ["/model/layers.0/mlp/MatMul", "/lm_head/MatMul"]
        self.fp32 = NS(digest="fp32")
        self.source = self.fp32
        self.memory = NS(reference_name="FP32")  # not streaming: FP32 is the reference
        self.scores = {"fp32": NS(meta={"perplexity_rise_pct": 0.0, "top1_agreement": 1.0,
                                        "kl_mean": 0.0})}
        self.rise, self.speedup = {**rise, "mixed": mixed_rise}, speedup
        self.full_rise = {**self.rise, **(full_rise or {})}
        self.full_scored, self.mixed_calls = [], []

    def uniform(self, bits):
        return {n: bits for n in self.names}

    def _scores(self, role, rise):
        from types import SimpleNamespace as NS

        return NS(meta={"perplexity_rise_pct": rise[role], "top1_agreement": 0.95,
                        "kl_mean": 0.01})

    def build(self, plan, label, block_size=None, block_size_8=None, full=False):
        from types import SimpleNamespace as NS

        role = {"all8": "int8", "all4": "int4", "all8_b128": "int8_wide"}[label]
        self.builds.append((label, block_size or self.q.block_size))
        return NS(digest=role), self._scores(role, self.rise)

    def score(self, art, label, full=False):
        assert full  # _auto rescoring its pick: always on every sequence
        self.full_scored.append(art.digest)
        return self._scores(art.digest, self.full_rise)

    def speed(self, candidates):
        from types import SimpleNamespace as NS

        from pipeline.core.env import environment

        return NS(meta={"speedup_vs_fp32": {r: {"median": self.speedup[r],
                                                "ci95": [self.speedup[r] - 0.02,
                                                         self.speedup[r] + 0.02]}
                                            for r in candidates},
                        "environment": environment(self.cfg.hardware.target())})

    def mixed(self, int4_faster, block_size_8=None, hopeless=None):
        from types import SimpleNamespace as NS

        self.mixed_calls.append(block_size_8)
        if "mixed" not in self.speedup:  # the mixed search lands on INT8 here
            return self.build(self.uniform(8), "all8")
        return NS(digest="mixed"), self._scores("mixed", self.rise)

    def matmul_weights(self):
        return {self.names[0]: 100, self.names[1]: 300}

    def tally(self):
        from pipeline.recipes.decoder_record import ScoringCost

        return ScoringCost()


def _settings(block_size: int):
    from pipeline.recipes.decoder_record import DecoderSettings

    return DecoderSettings(block_size=block_size)


def test_decoder_auto_tries_int8_at_a_wider_block_and_ships_it_only_when_it_passes():
    """quant=auto on a decoder builds 8 bits at block 128 beside block 32 (fewer scales, a coarser
    activation grid at accuracy level 4): the faster one ships when the gate passes it, and the
    report's block size is the winner's; past the perplexity budget it loses to block 32."""
    from pipeline.config import Config
    from pipeline.recipes.decoder import WIDE_BLOCK, _auto

    cfg = Config()
    speed = {"int8": 2.07, "int4": 2.6, "int8_wide": 2.25}
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0, "int8_wide": 1.9}, speed)
    out = _auto(cfg, run, _settings(32))
    assert ("all8_b128", WIDE_BLOCK) in run.builds and ("all8", 32) in run.builds
    assert out.auto.winner == "int8_wide" and out.quant.settings.block_size == WIDE_BLOCK
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0, "int8_wide": 2.5}, speed)  # over 2 %
    out = _auto(cfg, run, _settings(32))
    assert out.auto.winner == "int8" and out.quant.settings.block_size == 32
    assert not out.auto.candidates["int8_wide"].passed
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0}, speed, block_size=WIDE_BLOCK)
    _auto(cfg, run, _settings(WIDE_BLOCK))  # already that wide: no second INT8 build
    assert [b for b in run.builds if b[0] == "all8_b128"] == []


def test_what_only_the_last_stages_would_find_is_refused_before_any_stage(root, tmp_path):
    """A gate limit for a metric a decoder does not report, and a generation longer than the
    tiny model's 128-token context, each in one line before anything is exported or scored."""
    for extra, words in ((["gate.max_accuracy_drop={top1: 1}"], ("top1", "does not report")),
                         (["quant.decoder.new_tokens=1000"],
                          ("quant.decoder.new_tokens=1000", "context is 128"))):
        work = tmp_path / "work"
        args = [a for a in _args(root, "quant=int8", *extra) if not a.startswith("workdir=")]
        proc = run_cli(*args, f"workdir={work}")
        one_line(proc, 2, *words)
        assert not (work / "runs").exists() and not (work / "cache" / "decoder_export").exists()


def test_too_little_text_to_carry_the_agreement_budget_is_refused(tmp_path):
    """Top-1 agreement on n tokens is uncertain by up to +-98/sqrt(n) points: under its limit's
    width the verdict is luck. 96 tokens are too few for the default 10 points, 97 enough; a
    limit of 1 point needs 9604."""
    from pipeline.core.errors import ConfigError
    from pipeline.models.decoder import _token_file, enough_text

    def text(*lengths):
        return _token_file([[1] * (n + 1) for n in lengths], tmp_path, "evaluation")

    with pytest.raises(ConfigError, match=r"k=1: the evaluation text scores 96 tokens in 2 "
                                          r"sequences.*\+-10.0 points.*at least 97 tokens"):
        enough_text(text(48, 48), 10.0, "k=1")
    enough_text(text(48, 49), 10.0, "k=1")
    with pytest.raises(ConfigError, match="at least 9604 tokens"):
        enough_text(text(5000), 1.0, "k=1")
    enough_text(text(3), 0.0, "k=1")  # exact agreement asked: any count can refute it


def test_a_decoder_gated_on_one_short_sequence_is_refused_before_any_stage(root, tmp_path):
    work = tmp_path / "work"
    args = [a for a in _args(root, "quant=int8", "data.evaluation_samples=1",
                             "+model.params.max_length=32")
            if not a.startswith(("workdir=", "data.evaluation_samples=12"))]
    proc = run_cli(*args, f"workdir={work}")
    one_line(proc, 2, "data.evaluation_samples=1", "in 1 sequence;", "at least 97 tokens")
    assert not (work / "cache" / "decoder_export").exists()


def test_a_decoder_folder_without_architectures_is_told_what_it_lacks(root, tmp_path):
    """It was an encoder to compose ("needs a metric") and a decoder to the command line
    ("leave metric= unset"): one rule now, and the one line names what is missing."""
    folder = tmp_path / "noarch"
    shutil.copytree(root / "tiny", folder)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["architectures"]
    (folder / "config.json").write_text(json.dumps(cfg))
    proc = run_cli(*_args(root, "quant=int8", model=str(folder)))
    one_line(proc, 2, "config.json names no architectures (model_type llama)",
             '"architectures": ["LlamaForCausalLM"]')


def test_new_evaluation_text_does_not_export_the_decoder_again(tmp_path):
    """The FP32 export reads the folder alone (the text only feeds its parity check): its key
    is the same for any text, and every stage that scores the text keys on it."""
    from pipeline.config import HardwareConfig
    from pipeline.engine.runner import Runner
    from pipeline.models.decoder import Decoder, _token_file
    from pipeline.stages.decoder_export import DecoderExport
    from pipeline.stages.score_text import ScoreText

    runner = Runner(tmp_path / "work", HardwareConfig().target(), log=lambda m: None)
    decoder = Decoder(str(tmp_path), "d" * 64, "LlamaForCausalLM", str(tmp_path))
    one, two = (_token_file(ids, tmp_path / "tokens", "evaluation")
                for ids in ([[1, 2, 3]], [[4, 5, 6, 7]]))
    assert runner.key(DecoderExport(decoder, one), None, {}) == \
        runner.key(DecoderExport(decoder, two), None, {})
    assert runner.key(ScoreText(one), None, {}) != runner.key(ScoreText(two), None, {})


def test_decoder_auto_scores_its_pick_in_full_and_takes_the_next_when_the_full_text_fails_it():
    """The search's scores (sequential by default) pick the fastest passing candidate; it is
    scored on every sequence before the gate, and when the full text puts it past the limit the
    next fastest passing one is scored in full and ships."""
    from pipeline.config import Config
    from pipeline.recipes.decoder import _auto

    cfg = Config()
    speed = {"int8": 2.07, "int4": 2.6, "int8_wide": 2.25}
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0, "int8_wide": 1.9}, speed,
                   full_rise={"int8_wide": 2.3})
    out = _auto(cfg, run, _settings(32))
    assert run.full_scored == ["int8_wide", "int8"] and out.auto.winner == "int8"
    assert out.verdict.passed and not out.auto.candidates["int8_wide"].passed
    assert out.evals["candidate"].meta["perplexity_rise_pct"] == 0.7
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0, "int8_wide": 1.9}, speed)
    assert _auto(cfg, run, _settings(32)).auto.winner == "int8_wide"
    assert run.full_scored == ["int8_wide"]  # one full scoring when the pick holds


def test_decoder_auto_mix_takes_the_int8_winners_block_and_starts_only_when_it_can_win():
    """The mix's 8-bit part is at the block that won for all-INT8 (128 when INT8 at block 128
    passes and is faster, else the configured 32); when a passing candidate is already at least
    as fast as INT4 everywhere could be (the mix's best), the mix is not started."""
    from pipeline.config import Config
    from pipeline.recipes.decoder import WIDE_BLOCK, _auto

    cfg = Config()
    speed = {"int8": 2.07, "int4": 2.6, "int8_wide": 2.25}
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0, "int8_wide": 1.9}, speed)
    _auto(cfg, run, _settings(32))
    assert run.mixed_calls == [WIDE_BLOCK]
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0, "int8_wide": 2.5}, speed)  # wide fails
    _auto(cfg, run, _settings(32))
    assert run.mixed_calls == [32]
    # INT8 at block 128 passes at 2.57x, INT4 at most 2.42x: no mix can beat it
    run = _FakeRun(cfg, {"int8": 0.7, "int4": 40.0, "int8_wide": 1.9},
                   {"int8": 2.07, "int4": 2.4, "int8_wide": 2.57})
    out = _auto(cfg, run, _settings(32))
    assert run.mixed_calls == [] and out.auto.mixed.startswith("not started")
    assert out.auto.winner == "int8_wide"


def test_the_mixed_search_stops_when_the_fastest_plan_left_cannot_win():
    """hopeless() is asked before each bisection step about the narrowest plan still possible:
    here every plan with a float group is hopeless, so once 8 bits fail the float phase never
    builds a plan."""
    from pipeline.recipes.decoder import search

    groups = {"layers.0": ["a"], "layers.1": ["b"], "lm_head": ["c"]}
    tried = []

    def trial(plan, what):
        tried.append(what)
        return False

    assert search(groups, 4, trial, dict, lambda plan: len(plan) < 3) is None
    assert tried == ["all at 4 bits", "first 2 of 3 groups at 8 bits",
                     "first 3 of 3 groups at 8 bits"]


def test_the_mix_speed_bound_blends_int4_and_int8_by_weight_shares():
    """A plan's decode speedup is predicted from INT4's and all-INT8's upper bounds by its
    MatMuls' weight shares (float parts at FP32's speed) and compared with the best passing
    candidate's median."""
    from types import SimpleNamespace as NS

    from pipeline.measure.results import Speedup
    from pipeline.recipes.decoder import _cannot_beat

    run = NS(matmul_weights=lambda: {"a": 1, "b": 1})
    sp = {"int4": Speedup(2.9, 2.8, 3.0), "int8": Speedup(1.9, 1.8, 2.0),
          "int8_wide": Speedup(2.2, 2.1, 2.3)}
    hopeless = _cannot_beat(run, sp, "int8", "int8_wide")
    assert not hopeless({"a": 4, "b": 8})   # 1 / (0.5 / 3 + 0.5 / 2) = 2.4x > 2.2x
    assert "2.00x" in hopeless({"a": 8, "b": 8})
    assert hopeless({"a": 4})                # half float: 1.5x
    assert _cannot_beat(run, sp, "int8", None) is None  # nothing passes yet: never stops


def test_auto_scores_fp32_once_and_its_pick_on_every_sequence(root):
    """quant=auto end to end on the tiny Llama: FP32 is scored once (one text_reference stage,
    whatever the number of candidates), every candidate against it, the shipped one on every
    sequence; the report tallies the scoring and the stages' peak memory, and the log shows the
    scoring's progress with the time left."""
    proc = run_cli(*_args(root, "quant=auto", "quant.decoder.score_min_sequences=8"))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    report = json.loads((root / "work" / "runs" / "latest" / "report.json").read_text())
    stages = [s["stage"] for s in report["stages"]]
    assert stages.count("text_reference") == 1 and stages.count("score_text") >= 3
    scoring = report["scoring"]
    assert scoring["candidate_scorings"] >= 3
    assert scoring["reference"]["sequences"] == 12 and scoring["reference"]["top_k"] == 16
    assert scoring["peak_rss"]["stage_mb"] > 0 and scoring["peak_rss"]["pipeline_mb"] > 0
    winner = report["auto"]["winner"]
    if winner != "fp32":
        assert winner in report["auto"]["scored_in_full"]
        cand = {r["role"]: r for r in report["rows"]}["candidate"]
        assert cand["sequences"] == cand["sequences_total"] == 12
    assert "sequences, elapsed" in proc.stdout and "left" in proc.stdout
    md = (root / "work" / "runs" / "latest" / "report.md").read_text()
    assert "Scoring: FP32 once on 12 sequences" in md


@pytest.mark.parametrize("override, expected", [
    ("quant.decoder.score=fast", "quant.decoder.score=fast: full or sequential"),
    ("quant.decoder.score_min_sequences=4", "quant.decoder.score_min_sequences=4: at least 8")])
def test_bad_scoring_settings_are_refused_at_compose(override, expected):
    from pipeline.core.errors import ConfigError
    from pipeline.engine.compose import compose

    assert compose(["quant=auto"]).quant.decoder.score == "sequential"
    assert compose(["quant=mixed", "quant.decoder.score=full"]).quant.decoder.score == "full"
    with pytest.raises(ConfigError) as e:
        compose(["quant=auto", override])
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_the_8_bit_block_is_part_of_a_plan_only_when_the_plan_has_8_bit_nodes():
    """The mix's all-4-bit trial is the INT4 candidate itself (same stage key, so reused), and
    its all-8-bit one all-INT8 at the mix's 8-bit block; a plan with both widths carries the
    8-bit block when it differs from the 4-bit one."""
    from types import SimpleNamespace as NS

    from pipeline.recipes.decoder import _Run

    stages = []
    run = NS(q=NS(block_size=32, symmetric=True, algorithm="rtn"), level=4, sets={}, fp32=None,
             memory=NS(streaming=False), run=lambda stage, parent, label: stages.append(stage))
    _Run.build(run, {"a": 4, "b": 4}, "all4", scored=False)
    _Run.build(run, {"a": 4, "b": 4}, "all_at_4_bits", block_size_8=128, scored=False)
    _Run.build(run, {"a": 4, "b": 8}, "mix", block_size_8=128, scored=False)
    _Run.build(run, {"a": 8, "b": 8}, "all8", block_size_8=32, scored=False)
    _Run.build(run, {"a": 8, "b": 8}, "all8_b128", 128, scored=False)
    _Run.build(run, {"a": 8, "b": 8}, "first_2_of_2_groups_at_8_bits", block_size_8=128,
               scored=False)
    assert stages[0] == stages[1] and stages[1].block_size_8 is None
    assert stages[2].block_size_8 == 128 and stages[3].block_size_8 is None
    assert stages[4] == stages[5]  # the mix with every group at 8 bits is INT8 at its block


def test_a_search_stopped_as_hopeless_returns_nothing_and_the_report_says_which_trial_stopped():
    """_Run.mixed with a hopeless() that refuses any plan with 8-bit nodes: the all-4-bit trial
    is scored (sequentially, stopping early: that is its scoring's stop, not the search's), the
    search stops before the first bisection step and the mix is None; the report's trials say
    the scored one failed and the search stopped."""
    from types import SimpleNamespace as NS

    from pipeline.core.json_record import to_json
    from pipeline.recipes.decoder import _Run
    from pipeline.report.decoder import markdown

    built = []
    fake = NS(groups={"layers.0": ["a"], "lm_head": ["c"]}, names=["a", "c"], trials=[],
              sensitivity=lambda: {"layers.0": 1.0}, passes=lambda s: False)
    fake.build = lambda plan, label, block_size_8=None: (built.append(label) or NS(digest=label),
                                                         NS(meta={"perplexity_rise_pct": 30.0,
                                                                  "sequences": 32,
                                                                  "sequences_total": 64,
                                                                  "stopped": "clear fail"}))
    fake._note = lambda what, plan, scored: _Run._note(fake, what, plan, scored)
    out = _Run.mixed(fake, True, 128, lambda plan: "cannot win" if 8 in plan.values() else None)
    assert out is None and built == ["all_at_4_bits"]
    assert [bool(t.search_stopped) for t in fake.trials] == [False, True]
    report = {"model": "m", "quant": "auto", "verdict": {"passed": True, "checks": []},
              "settings": {}, "rows": [], "search": to_json(fake.trials)}
    md = markdown(report)
    assert "| all at 4 bits | 2/0/0 | 30.00 |" in md and "32/64 (clear fail) | False |" in md
    assert "| stopped: cannot win |" in md and md.rstrip().endswith("| stopped |")


def test_a_sliding_window_is_the_context_and_the_built_folder_is_capped_there(tmp_path):
    """The model builder's Mistral and Phi-3 attend to the whole past (no local window), so past
    the window they compute what transformers does not: the decoder is scored, gated and served
    within its window, and the folder it publishes says so. A window a config turns off (Qwen2's
    use_sliding_window: false) is no limit."""
    from pipeline.models.decoder import Decoder, cap_context, context, max_length

    from pipeline.core.errors import ConfigError

    def decoder(**config) -> Decoder:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 256, **config}))
        return Decoder(str(folder), "digest", "MistralForCausalLM", str(folder))

    assert context(decoder()) == 256
    assert context(decoder(sliding_window=128)) == 128
    assert context(decoder(sliding_window=4096)) == 256
    assert context(decoder(sliding_window=128, use_sliding_window=False)) == 256
    assert context(decoder(sliding_window=None)) == 256
    with pytest.raises(ConfigError, match="2..128"):
        max_length({"max_length": 250}, context(decoder(sliding_window=128)))
    built = tmp_path / "built"
    built.mkdir()
    (built / "genai_config.json").write_text(json.dumps(
        {"model": {"context_length": 256, "decoder": {}}, "search": {"max_length": 256}}))
    cap_context(built, 128)
    config = json.loads((built / "genai_config.json").read_text())
    assert config["model"]["context_length"] == config["search"]["max_length"] == 128


def test_a_decoder_with_local_attention_layers_is_scored_timed_and_published(tmp_path):
    """Gemma 2's local-attention layers: onnxruntime refuses a KV cache shorter than the window,
    which the teacher-forced scoring (an empty past) and a short generation both asked for. The
    export matches transformers' logits and the run publishes; the export implements the window
    (a local window in its attention), so the published folder keeps the model's whole context."""
    from hf_tiny import text_data
    from llm_tiny import gemma2

    model = gemma2(tmp_path / "gemma2", window=64)
    text_data(tmp_path / "text.jsonl", 20)
    proc = run_cli(*_args(tmp_path, "quant=int8", model=model))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    report = json.loads((tmp_path / "work" / "runs" / "latest" / "report.json").read_text())
    assert report["export"]["parity_vs_transformers"]["max_abs_diff"] < 1e-2
    assert {"perplexity_rise_drop", "speedup_ci_low"} <= \
        {c["check"] for c in report["verdict"]["checks"]}
    from pipeline.metrics.generation import local_window, model_file

    built = next((tmp_path / "work" / "cache" / "decoder_export").glob("*/genai_config.json"))
    assert local_window(model_file(built.parent)) == 64
    assert json.loads(built.read_text())["search"]["max_length"] == 128  # max_position_embeddings


def test_gemma3_as_its_released_checkpoints_are_written_exports_faithfully(tmp_path):
    """A Gemma 3 whose config.json is in transformers 4.x's form, as the released checkpoints
    are (``rope_theta`` for the global layers, ``rope_local_base_freq`` for the local ones),
    read by transformers 5 into per-kind ``rope_parameters``, which onnxruntime-genai's builder
    stopped on (KeyError 'rope_type'). Each kind keeps its own base: were the local layers given
    the global base, the logits would be 0.18 apart and the parity check would refuse it."""
    from hf_tiny import text_data
    from llm_tiny import gemma3

    from pipeline.metrics.generation import local_window, model_file

    model = gemma3(tmp_path / "gemma3", window=64, written_by_4x=True)
    text_data(tmp_path / "text.jsonl", 20)
    proc = run_cli(*_args(tmp_path, "quant=int8", model=model))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    report = json.loads((tmp_path / "work" / "runs" / "latest" / "report.json").read_text())
    assert report["export"]["parity_vs_transformers"]["max_abs_diff"] < 1e-3
    built = next((tmp_path / "work" / "cache" / "decoder_export").glob("*/genai_config.json"))
    assert local_window(model_file(built.parent)) == 64


def test_rotary_settings_the_builder_cannot_give_each_kind_of_layer_are_refused():
    """The builder gives local layers the global layers' scaling, only their base apart: a
    Gemma 3 whose global layers scale linearly (4B and up) is refused, naming what differs;
    one that differs only in the base is handed over in the builder's form."""
    from types import SimpleNamespace

    from pipeline.core.errors import StageError
    from pipeline.stages.decoder_export import rope_as_the_builder_reads

    decoder = SimpleNamespace(given="g3", architecture="Gemma3ForCausalLM")
    config = SimpleNamespace(rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    rope_as_the_builder_reads(config, decoder)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 1e6}
    assert (config.rope_theta, config.rope_local_base_freq) == (1e6, 1e4)
    flat = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    rope_as_the_builder_reads(flat, decoder)  # one kind of layer: left as it is
    assert flat.rope_parameters == {"rope_type": "default", "rope_theta": 5e5}
    scaled = SimpleNamespace(rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    with pytest.raises(StageError, match="g3 .*differ in their rotary factor, rope_type"):
        rope_as_the_builder_reads(scaled, decoder)


def test_a_sliding_window_the_export_ignores_holds_the_published_context_to_it(tmp_path):
    """Mistral as the model builder exports it attends to the whole past: past the window it is
    not the model transformers runs. Scored within the window, it publishes a folder whose
    context is the window, which the server holds to; longer sequences are refused at compose."""
    from hf_tiny import text_data
    from llm_tiny import mistral

    from pipeline.metrics.generation import local_window, model_file

    model = mistral(tmp_path / "mistral", window=64)
    text_data(tmp_path / "text.jsonl", 20)
    proc = run_cli(*_args(tmp_path, "quant=int8", model=model))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    built = next((tmp_path / "work" / "cache" / "decoder_export").glob("*/genai_config.json"))
    assert local_window(model_file(built.parent)) == 0
    config = json.loads(built.read_text())
    assert config["search"]["max_length"] == config["model"]["context_length"] == 64
    proc = run_cli(*_args(tmp_path, "quant=int8", "+model.params.max_length=100", model=model))
    one_line(proc, 2, "model.params.max_length=100", "2..64")
