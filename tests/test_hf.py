"""model=hf: a transformer from a local Hugging Face folder, end to end, on a tiny random BERT.

The folder (``tests.hf_tiny``: a ``BertConfig`` with 2 layers, hidden 32, 2 heads, random
weights, and a WordPiece tokenizer trained here on generated sentences) is saved with
``save_pretrained``; its text data is a generated JSONL file. Export and parity against
transformers in torch, the fusions onnxruntime.transformers finds, dynamic INT8, the gate and the
report run through ``python -m pipeline`` once (an embedding model on sentence pairs with gold
similarity scores, gated on Spearman's rho; shared by the tests that read it); a classifier's export and scores go through the stages in process; bad folders end with one
line and exit 2. Stage children start with torch and transformers already imported
(``pipeline.core.isolate``), so a run takes seconds.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import one_line, run_cli, skip_without

skip_without("transformers")

FAST = ["registry=null", "bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=0.3",
        "bench.warmup_max_runs=20", "bench.size_buckets=2", "bench.cold_start_repeats=0",
        "bench.aa_tolerance=0.5", "gate.min_speedup=0", "gate.check_slo_p99=false",
        "gate.require_aa_check=false",  # timing verdicts off: tests/conftest.py tiny_args
        "quant.profile_runs=3", "quant.ranking_samples=20",
        "quant.region_trials=0"]  # regions: tests/test_auto.py
DATA = ["data=jsonl", "data.input_column=text", "data.calibration_samples=24",
        "data.evaluation_samples=40"]
# STS-B style pairs: each pair is two sentences, so 12 + 20 pairs read as many sentences as DATA
PAIRS = ["data=jsonl", "data.pair_columns=[sentence1,sentence2]", "data.label_column=score",
         "data.calibration_samples=12", "data.evaluation_samples=20"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    from tests import hf_tiny

    root = tmp_path_factory.mktemp("hf")
    hf_tiny.bert(root / "embed")
    hf_tiny.bert(root / "classify", task="sequence-classification", num_labels=3)
    hf_tiny.text_data(root / "text.jsonl", 80)
    hf_tiny.text_data(root / "labelled.jsonl", 80, labels=3)
    hf_tiny.pair_data(root / "pairs.jsonl", 40)
    return root


def _key(folder: Path, data: Path, metric: str = "agreement", params: dict | None = None,
         top_k: int = 5, primary: str = "", **data_kw):
    from pipeline.config import ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models.sources import task_key

    data_kw = {"input_column": "text", "calibration_samples": 24, "evaluation_samples": 40,
               **data_kw}
    return task_key(ModelConfig(name="hf", path=str(folder), params=params or {}),
                    DataConfig(format="jsonl", path=str(data), **data_kw),
                    MetricConfig(name=metric, top_k=top_k, primary=primary),
                    data_dir=str(folder.parent / "data"))


def _pairs_key(hf: Path, primary: str = "spearman"):
    return _key(hf / "embed", hf / "pairs.jsonl", primary=primary,
                pair_columns=["sentence1", "sentence2"], label_column="score",
                calibration_samples=12, evaluation_samples=20)


def _run(root: Path, workdir: str, *args: str):
    return run_cli(*args, f"workdir={root / workdir}", f"data_dir={root / workdir / 'data'}",
                   *FAST)


def _report(root: Path, workdir: str) -> dict:
    return json.loads((root / workdir / "runs" / "latest" / "report.json").read_text())


def test_the_task_reads_the_folder_and_meets_the_contract(hf):
    from pipeline.task.contract import check
    from pipeline.models import task as build

    t = build(_key(hf / "embed", hf / "text.jsonl"))
    assert check(t) == []
    assert [i.name for i in t.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i.dtype == "int64" and i.shape == ("batch", "sequence") for i in t.inputs)
    assert t.outputs[0].shape == ("batch", 32) and t.metrics.primary == "cosine_mean"
    assert t.fusion == {"model_type": "bert", "num_heads": 2, "hidden_size": 32,
                        "source_type": "bert"}
    ds = t.dataset(t.split("evaluation", 40, str(hf / "data")))
    sizes = t.sizes(ds)
    assert sizes.min() < sizes.max()          # varied real lengths, not one padded shape
    batch = next(t.batches(ds, 8))
    ids, mask = batch.feeds["input_ids"], batch.feeds["attention_mask"]
    assert ids.dtype == np.int64 and ids.shape == mask.shape
    assert ids.shape[1] == mask.sum(axis=1).max()  # padded per batch to its longest row
    # the embedding is the mean over real tokens, L2-normalized
    out = t._reference(batch.feeds)
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)

    c = build(_key(hf / "classify", hf / "labelled.jsonl", "classification",
                   {"max_length": 16}))
    assert c.kind == "sequence-classification" and c.outputs[0].shape == ("batch", 3)
    assert c.metrics.primary == "top1" and check(c) == []
    assert max(c.sizes(c.dataset(c.split("evaluation", 40, str(hf / "data"))))) == 16


@pytest.fixture(scope="module")
def embed_run(hf):
    """One end-to-end run of the embedding model with dynamic INT8 on sentence pairs, gated on
    Spearman's rho against the gold scores (cosine against FP16 reported next to it), shared by
    the tests below."""
    proc = _run(hf, "run_embed", "model=hf", f"model.path={hf / 'embed'}", *PAIRS,
                f"data.path={hf / 'pairs.jsonl'}", "metric=agreement", "metric.primary=spearman",
                "quant=dynamic", "gate.max_accuracy_drop=0.05")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return _report(hf, "run_embed")


def _meta(rep: dict, role: str) -> dict:
    path = Path(rep["lineage"][role]["path"]) / "artifact.json"
    return json.loads(path.read_text())["meta"]


def test_export_fuse_and_parity(embed_run):
    """The stages themselves: the export matches transformers in torch with named dynamic axes,
    the fusions are found and keep parity."""
    import onnxruntime

    export = _meta(embed_run, "export")
    assert export["parity_vs_torch"]["max_abs_diff"] < 1e-4
    assert export["parity_vs_torch"]["decoded_agreement"] == 1.0
    model = Path(embed_run["lineage"]["export"]["path"]) / "model.onnx"
    sess = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert {i.name: i.shape for i in sess.get_inputs()}["input_ids"] == ["batch", "sequence"]
    fused = _meta(embed_run, "fp32")
    assert embed_run["lineage"]["fp32"]["stage"] == "fuse"
    for op in ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization"):
        assert fused["fusions"].get(op, 0) > 0, fused["fusions"]
    assert fused["fusions"].get("BiasGelu", 0) + fused["fusions"].get("Gelu", 0) > 0
    assert sum(fused["nodes"].values()) < sum(fused["nodes_before"].values())
    assert fused["parity_vs_export"]["decoded_agreement"] == 1.0


def test_embeddings_end_to_end_with_dynamic_int8(hf, embed_run):
    rep = embed_run
    stages = {s["label"]: s for s in rep["stages"]}
    assert {"load", "export", "fuse", "fp16", "quantize"} <= set(stages)
    # dynamic INT8 quantizes the graph itself: quant_pre_process's rewrites cost it speed and
    # it calibrates nothing, so no prepare stage runs
    assert not any(label.startswith("prepare") for label in stages)
    fusion = rep["fusion"]
    assert fusion["fusions"]["Attention"] == 2 and fusion["nodes_after"] < fusion["nodes_before"]
    md = (hf / "run_embed" / "runs" / "latest" / "report.md").read_text()
    assert "## Transformer fusions" in md and "| Attention | 2 |" in md
    rows = {r["role"]: r for r in rep["rows"]}
    assert rows["fp32"]["cosine_mean"] > 0.9999
    assert 0.9 < rows["candidate"]["cosine_mean"] <= 1.0 + 1e-9
    assert rows["candidate"]["cosine_p1"] <= rows["candidate"]["cosine_mean"]
    assert rep["verdict"]["checks"][0]["check"] == "accuracy_drop"
    # embeddings agree within a tolerance (compared exactly, every embedding model read 0 %)
    agree = next(c for c in rep["verdict"]["checks"] if c["check"] == "output_agreement")
    assert "within 0.25 relative error" in agree["detail"]
    assert agree["value"] == rows["candidate"]["agreement_with_fp16"] > 0
    assert rep["model"] == "embed"  # the folder's name
    # the fused attention's projections run as INT8 too, and are reported so, unless this
    # machine timed every attention slower in INT8 and the latency-aware step kept them float
    # (or timed the unfused export's INT8 faster: then no Attention is left to quantize)
    explain = rep["quantization"]["explain"]
    if rep["quantization"]["dynamic_source"]["chosen"] == "export":
        assert not any(r["fp32_op"] == "Attention" for r in explain["nodes"])
        return
    kept_float = [n for n in rep["quantization"]["latency_exclusions"] or []
                  if n.startswith("Attention")]
    assert ("QAttention" in explain["int8_kernels"]) == (len(kept_float) < 2)
    assert not any("QAttention" in op for op in explain["float_compute"])


def test_dynamic_int8_quantizes_both_graphs_and_keeps_the_faster(hf, embed_run):
    """The tiny BERT's fusions change its graph, so dynamic INT8 is built from the fused graph
    and from the export, both timed head to head at the gate's batch size; the one the timing
    picks (ties: the fused one) is the candidate, and the report says so with both timings."""
    from pipeline.measure.results import Speedup
    from pipeline.recipes.int8 import pick_source

    src = embed_run["quantization"]["dynamic_source"]
    assert src["forced"] is None and src["batch_size"] == 8
    assert set(src["candidates"]) == {"fused", "export"}
    assert src["candidates"]["fused"] != src["candidates"]["export"]
    assert src["ms"]["fused"] > 0 and src["ms"]["export"] > 0
    assert src["chosen"] == pick_source(Speedup.of(src["export_over_fused_speedup"]))
    assert embed_run["lineage"]["candidate"]["digest"] == src["candidates"][src["chosen"]]
    stages = [s["label"] for s in embed_run["stages"]]
    assert "compare[dynamic: export vs fused]" in stages
    md = (hf / "run_embed" / "runs" / "latest" / "report.md").read_text()
    assert f"unfused export {src['ms']['export']:.2f} ms at batch 8" in md
    assert f"kept the {src['chosen']} one" in md


def test_per_layer_table_names_transformer_modules(hf, embed_run):
    """The INT8 table names each node by the module it came from: a MatMul by its Linear
    (encoder.layer.0.intermediate.dense), a fused attention by its block
    (encoder.layer.0.attention.self), the pooling the wrapper adds by its node name."""
    from pipeline.report.quant import layer_rows

    nodes = embed_run["quantization"]["explain"]["nodes"]
    module = {r["node"]: r["module"] for r in nodes}
    matmuls = [r["node"] for r in nodes if r["fp32_op"] == "MatMul"]
    # Which graph was quantized is a timing verdict (test above): the export's INT8 may time
    # faster, and its attention blocks are unfused, their own Linear layers (query, key, value)
    # and score MatMuls beside the three every layer has outside attention.
    fused = embed_run["quantization"]["dynamic_source"]["chosen"] == "fused"
    if not fused:
        matmuls = [n for n in matmuls if (module[n] or "").endswith(("output.dense", "intermediate.dense"))]
    assert len(matmuls) == 6                 # 3 Linear layers outside attention, 2 layers
    assert {module[n] for n in matmuls} == {
        f"encoder.layer.{k}.{m}" for k in (0, 1)
        for m in ("attention.output.dense", "intermediate.dense", "output.dense")}
    assert {module[r["node"]] for r in nodes if r["fp32_op"] == "Attention"} == ({
        "encoder.layer.0.attention.self", "encoder.layer.1.attention.self"} if fused else set())
    # the embeddings' normalization: one fused node for the block, or its own LayerNorm module
    embed_norm = "EmbedLayerNormalization" if fused else "LayerNormalization"
    assert {module[r["node"]] for r in nodes if r["fp32_op"] == embed_norm
            and (module[r["node"]] or "").startswith("embeddings")} == (
        {"embeddings"} if fused else {"embeddings.LayerNorm"})
    assert all(module[r["node"]] is None for r in nodes if not r["node"][:1].isalpha()
               and r["node"].count("/") == 1)  # /Mul, /ReduceSum: the pooling around the model
    rows = layer_rows(embed_run["quantization"])
    md = (hf / "run_embed" / "runs" / "latest" / "report.md").read_text()
    for r in rows:  # what stayed INT8 is listed under its module path
        assert r.module.startswith(module[r.node] or r.node)
        assert f"| {r.module} | {r.op} →" in md
    # which nodes stay INT8 is the latency-aware step's timing verdict (on a busy machine every
    # one may time slower and go float): the names above are checked whatever it decided
    assert not rows or any(r.module.startswith("encoder.layer.") for r in rows)


def test_spearman_on_sentence_pairs_gates_when_named(hf, embed_run):
    """Pairs with gold scores: every row reports Spearman's rho next to the cosine against FP16;
    the FP32 row's rho is the one the folder's model in torch gives on the same pairs; the gate
    judges it because metric.primary names it."""
    from pipeline.metrics.pairs import spearman
    from pipeline.models import task

    rep = embed_run
    metrics = {m["name"]: m for m in rep["metrics"]}
    assert metrics["spearman"]["primary"] and metrics["spearman"]["against"] == "gold_scores"
    assert metrics["cosine_mean"]["against"] == "fp16_outputs"
    rows = {r["role"]: r for r in rep["rows"]}
    for r in rows.values():
        assert -1.0 <= r["spearman"] <= 1.0, r
    # the same pairs through the folder's model in torch, paired up and ranked here
    t = task(_pairs_key(hf))
    assert t.metrics.primary == "spearman" and t.label_free
    ds = t.dataset(t.split("evaluation", 20, str(hf / "data")))
    assert len(ds) == 40                   # 20 pairs: both sides as plain sentences
    emb, gold = [None] * len(ds), [None] * len(ds)
    for batch in t.batches(ds, 8):
        for i, e, lab in zip(batch.indices, t._reference(batch.feeds), batch.labels):
            emb[i], gold[i] = e, lab
    assert all(gold[i]["pair"] == gold[i + 1]["pair"] for i in range(0, 40, 2))
    cos = [float(emb[i] @ emb[i + 1] / np.linalg.norm(emb[i]) / np.linalg.norm(emb[i + 1]))
           for i in range(0, 40, 2)]
    golds = [gold[i]["gold"] for i in range(0, 40, 2)]
    rho = spearman(cos, golds)
    assert rows["fp32"]["spearman"] == pytest.approx(rho, abs=1e-9)
    try:
        from scipy.stats import spearmanr
    except ImportError:
        pass
    else:
        assert rho == pytest.approx(float(spearmanr(cos, golds).statistic), abs=1e-12)
    check = rep["verdict"]["checks"][0]
    assert check["check"] == "accuracy_drop" and "spearman" in check["detail"]
    assert check["value"] == pytest.approx(rows["fp16"]["spearman"] - rows["candidate"]["spearman"])
    # the cosine against FP16 is still measured over every sentence of every pair
    assert rows["fp16"]["cosine_mean"] == pytest.approx(1.0)


def test_pair_data_mistakes_are_config_errors(hf):
    """One line each, before any stage (the command line makes them exit 2)."""
    from pipeline.config.data import DataConfig
    from pipeline.core.errors import ConfigError
    from pipeline.models import task

    with pytest.raises(ConfigError, match="name two different text columns"):
        DataConfig(format="jsonl", path="x.jsonl", pair_columns=["sentence1"])
    with pytest.raises(ConfigError, match="sentence3 is not a column"):
        task(_key(hf / "embed", hf / "pairs.jsonl", pair_columns=["sentence1", "sentence3"],
                  label_column="score", calibration_samples=12, evaluation_samples=20))
    with pytest.raises(ConfigError, match="need gold similarity scores"):
        task(_key(hf / "embed", hf / "pairs.jsonl", pair_columns=["sentence1", "sentence2"],
                  calibration_samples=12, evaluation_samples=20))
    with pytest.raises(ConfigError, match="gold similarity scores must be numbers"):
        task(_key(hf / "embed", hf / "pairs.jsonl", pair_columns=["sentence1", "sentence2"],
                  label_column="sentence2", calibration_samples=12, evaluation_samples=20))
    # spearman named where there are no pairs: the task's own metrics are listed
    with pytest.raises(ConfigError, match="metric.primary=spearman: .* reports cosine_mean") as e:
        task(_key(hf / "embed", hf / "text.jsonl", primary="spearman"))
    assert "\n" not in str(e.value) and "data.pair_columns" in str(e.value)
    assert task(_pairs_key(hf, primary="")).metrics.primary == "cosine_mean"


def test_static_int8_on_an_albert_classifier_and_its_partial_attention_fusion(tmp_path):
    """ALBERT (one layer's weights shared by three): onnxruntime's symbolic shape inference
    stops on it unless its dimensions are merged, and without it no tensor past a fused
    Attention had a type, so the calibrator skipped them and quantizing the classifier's bias
    failed ("Unable to get valid quantization scale"). And where the transformer optimizer
    fuses only some of the attention blocks, the report says how many."""
    from hf_tiny import albert, text_data

    model = albert(tmp_path / "albert")
    text_data(tmp_path / "text.jsonl", 60, labels=3)
    proc = run_cli("model=hf", f"model.path={model}", *DATA[:2],
                   f"data.path={tmp_path / 'text.jsonl'}", "data.calibration_samples=10", "data.evaluation_samples=30",
                   "metric=classification", f"workdir={tmp_path / 'w'}", *FAST)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    rep = json.loads((tmp_path / "w" / "runs" / "latest" / "report.json").read_text())
    stages = {s["label"]: s for s in rep["stages"]}
    prepared = json.loads((Path(stages["prepare"]["path"]) / "artifact.json").read_text())
    assert prepared["meta"]["symbolic_shape_inference"] is True
    assert rep["quantization"]["settings"]["format"] == "QDQ"
    blocks, fusions = rep["fusion"]["attention_blocks"], rep["fusion"]["fusions"]
    assert blocks == 3
    done = fusions.get("Attention", 0) + fusions.get("MultiHeadAttention", 0)
    partial = f"Attention fused in {done} of the export's 3 attention blocks"
    md = (tmp_path / "w" / "runs" / "latest" / "report.md").read_text()
    assert (partial in md) == (0 < done < 3)


def test_static_int8_on_a_transformer(hf, embed_run):
    """quant=int8 on the same folder and pairs: static QDQ for the matrix products, calibrated on
    the calibration split's per-batch padded sentences, the fused attention dynamic (the task's
    dynamic op types: no static kernel for it), LayerNorm and GELU float; the latency-aware step
    keeps float what it timed slower. The float stages come from the embedding run's cache."""
    shutil.copytree(hf / "run_embed" / "cache", hf / "run_int8" / "cache")
    proc = run_cli("model=hf", f"model.path={hf / 'embed'}", *PAIRS,
                   f"data.path={hf / 'pairs.jsonl'}", "metric=agreement", "metric.primary=spearman",
                   "quant=int8", "gate.max_accuracy_drop=0.05", "gate.min_output_agreement=0",
                   f"workdir={hf / 'run_int8'}", f"data_dir={hf / 'run_embed' / 'data'}", *FAST)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    rep = _report(hf, "run_int8")
    stages = {s["label"]: s for s in rep["stages"]}
    assert all(stages[k]["reused"] for k in ("load", "export", "fuse", "fp16", "evaluate[fp16]"))
    assert not stages["calibrate[minmax]"]["reused"] and rep["quantization"]["calibration"]
    assert rep["quantization"]["settings"]["format"] == "QDQ"
    first = json.loads((Path(stages["quantize"]["path"]) / "artifact.json").read_text())
    precision = first["meta"]["precision"]
    fused = {r["node"]: r["fp32_op"] for r in rep["quantization"]["explain"]["nodes"]}
    by_op = {op: {precision.get(n, "float") for n, o in fused.items() if o == op}
             for op in set(fused.values())}
    assert by_op["MatMul"] == {"int8-static"} and by_op["Attention"] == {"int8-dynamic"}
    # the residual norms are SkipLayerNormalization, or Add + LayerNormalization where the fuse
    # stage timed that faster on this machine (pipeline.stages.norms): float either way
    norm = ("LayerNormalization" if _meta(rep, "fp32")["norms"]["flattened"]
            else "SkipLayerNormalization")
    for op in (norm, "BiasGelu", "EmbedLayerNormalization"):
        assert by_op[op] == {"float"}, (op, by_op)
    final = _meta(rep, "candidate")["precision"]
    kept = set(rep["quantization"]["latency_exclusions"] or [])
    assert all(final.get(n, "float") == ("float" if n in kept else precision.get(n, "float"))
               for n in fused)
    rows = {r["role"]: r for r in rep["rows"]}
    assert 0.9 < rows["candidate"]["cosine_mean"] <= 1.0 + 1e-9
    assert -1.0 <= rows["candidate"]["spearman"] <= 1.0


@pytest.mark.slow
def test_classifier_export_and_scores(hf, tmp_path):
    """A sequence classifier through the stages that differ from the embedding run's: the export
    agrees with transformers in torch by argmax, and labels score top-1 and top-k. (The recipe
    around them is the embedding run's, above: a second run through the command line would double
    this file's time.)"""
    import onnxruntime

    from pipeline.config import HardwareConfig
    from pipeline.models import task
    from pipeline.engine.runner import Runner
    from pipeline.stages.export import Export
    from pipeline.stages.load import Load

    key = _key(hf / "classify", hf / "labelled.jsonl", "classification", top_k=2)
    t = task(key)
    assert t.kind == "sequence-classification" and t.fusion["num_heads"] == 2
    hw = HardwareConfig().target()
    runner = Runner(tmp_path, hw, log=lambda *a, **k: None)
    parity = t.split("evaluation", 16, str(hf / "data"))
    exported = runner.run(Export(task=key, opset=18, data=parity, hardware=hw),
                          runner.run(Load(task=key, checkpoint=None, checkpoint_sha256=None)))
    assert exported.meta["parity_vs_torch"]["decoded_agreement"] == 1.0
    sess = onnxruntime.InferenceSession(str(exported.model), providers=["CPUExecutionProvider"])
    ds = t.dataset(t.split("evaluation", 40, str(hf / "data")))
    preds, labels = [], []
    for batch in t.batches(ds, 8):
        out = sess.run(None, batch.feeds)[0]
        assert out.shape == (len(batch.labels), 3)
        assert (out.argmax(-1) == t._reference(batch.feeds).argmax(-1)).all()
        preds += t.predictions(out)
        labels += batch.labels
    scores = t.score(preds, labels)
    assert set(scores) == {"top1", "top2"} and 0 <= scores["top1"] <= scores["top2"] <= 100


def test_bad_folders_end_with_one_line(hf, tmp_path):
    """Through the command line: one line and exit 2 (the task is checked before any stage)."""
    # (unknown architecture, mismatched weights and the rest: in process, below)
    no_tok = tmp_path / "no_tokenizer"
    shutil.copytree(hf / "embed", no_tok)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / f).unlink()
    proc = _run(tmp_path, "bad", "model=hf", f"model.path={no_tok}", *DATA,
                f"data.path={hf / 'text.jsonl'}", "metric=agreement")
    one_line(proc, 2, "no_tokenizer", "no tokenizer")
    # pair columns are checked when the config is composed (the other pair mistakes and a
    # metric.primary the task does not report, when the task is built: in process, below)
    proc = _run(tmp_path, "bad", "model=hf", f"model.path={hf / 'embed'}", *PAIRS,
                f"data.path={hf / 'pairs.jsonl'}", "data.pair_columns=[sentence1]",
                "metric=agreement")
    one_line(proc, 2, "data.pair_columns", "two different text columns")


def test_a_tokenizer_input_the_model_does_not_read_is_one_line(hf, tmp_path):
    """A DistilBERT whose tokenizer config also lists token_type_ids (a generic tokenizer saved
    beside it): the exporter drops the input the network never reads, and every later stage
    would feed a name the ONNX model lacks (an onnxruntime error). One line naming both."""
    import json

    import torch
    from transformers import DistilBertConfig, DistilBertModel

    folder = tmp_path / "distilbert"
    shutil.copytree(hf / "embed", folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    for f in ("config.json", "model.safetensors"):
        (folder / f).unlink()
    torch.manual_seed(0)
    DistilBertModel(DistilBertConfig(vocab_size=vocab, dim=32, n_layers=1, n_heads=2,
                                     hidden_dim=64, max_position_embeddings=64)
                    ).eval().save_pretrained(str(folder))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    proc = _run(tmp_path, "distil", "model=hf", f"model.path={folder}", *DATA,
                f"data.path={hf / 'text.jsonl'}", "metric=agreement", "quant=dynamic")
    one_line(proc, 3, "token_type_ids", "DistilBertModel", "model_input_names")


def test_more_bad_folders_are_config_errors(hf, tmp_path):
    """The same checks in process (the command line turns a ConfigError into one line, exit 2,
    as the test above shows): weights that do not fit config.json, an unknown architecture, no
    folder, a metric that does not fit the model."""
    from pipeline.core.errors import ConfigError
    from pipeline.models import task

    misfit = tmp_path / "misfit"
    shutil.copytree(hf / "embed", misfit)
    cfg = json.loads((misfit / "config.json").read_text())
    (misfit / "config.json").write_text(json.dumps({**cfg, "hidden_size": 64,
                                                    "intermediate_size": 256}))
    with pytest.raises(ConfigError, match="do not match config.json") as e:
        task(_key(misfit, hf / "text.jsonl"))
    assert "\n" not in str(e.value) and "misfit" in str(e.value)
    unknown = tmp_path / "unknown"
    shutil.copytree(hf / "embed", unknown)
    cfg = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**cfg, "model_type": "nosuchformer"}))
    with pytest.raises(ConfigError, match="unknown architecture") as e:
        task(_key(unknown, hf / "text.jsonl"))
    assert "\n" not in str(e.value) and "unknown" in str(e.value)
    with pytest.raises(ConfigError, match="no such folder"):
        _key(tmp_path / "absent", hf / "text.jsonl")
    # an embedding model scored as a classifier: refused before any stage
    with pytest.raises(ConfigError, match="feature-extraction"):
        task(_key(hf / "embed", hf / "labelled.jsonl", "classification"))
