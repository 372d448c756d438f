"""Channel pruning on tiny networks: channels really removed and rounded, ignored layers kept,
coupled layers consistent, and every refusal a clear one before any work. (The prune stage, its
files and determinism: tests/stages/test_prune.py.)"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.prune import channels as pruning
from pipeline.prune import cost as pruning_cost
from pipeline.config import PruneConfig, PruneImportance, PruneMethod
from pipeline.core.errors import ConfigError, StageError
from pipeline.models.ocr.net import CRNN
from pipeline.models.ocr.prune import example, widths_of

WIDTHS = (8, 16, 32, 32, 32)


def tiny(widths=WIDTHS, hidden=16, seed=0) -> CRNN:
    torch.manual_seed(seed)
    return CRNN(widths, hidden).eval()


def cfg(**kw) -> PruneConfig:
    # the OCR task's own default for prune.ignored (the config's null means the model's)
    from pipeline.models import task

    return PruneConfig(method=PruneMethod.channels,
                       **{"ignored": list(task("ocr").prune_ignored), **kw})


def convs(net) -> dict[str, nn.Conv2d]:
    return {n: m for n, m in net.named_modules() if isinstance(m, nn.Conv2d)}


@pytest.mark.parametrize("ratio,round_to", [(0.5, 8), (0.3, 8), (0.3, 4)])
def test_channels_are_physically_removed_and_rounded(ratio, round_to):
    net = tiny()
    params_before = pruning_cost.parameters(net)
    layers = pruning.prune(net, example(), cfg(ratio=ratio, round_to=round_to))
    widths, hidden = widths_of(net)
    assert layers.pop("rnn") == [16, hidden] and hidden % round_to == 0
    assert net.rnn.weight_hh_l0.shape == (4 * hidden, hidden)
    for name, (before, after) in layers.items():
        conv = convs(net)[name]
        assert conv.weight.shape[0] == conv.out_channels == after < before
        assert after % round_to == 0
        assert before - after >= int(ratio * before)  # at least the ratio, rounding only removes
    assert widths[1:] == [layers[n][1] for n in ("cnn.4", "cnn.8", "cnn.11", "cnn.15",
                                                  "collapse.0")]
    assert pruning_cost.parameters(net) < params_before


def test_coupled_layers_stay_consistent_and_the_network_runs():
    net = tiny()
    pruning.prune(net, example(), cfg(ratio=0.5))
    modules = list(net.cnn) + list(net.collapse)
    for conv, bn in zip(modules, modules[1:]):
        if isinstance(conv, nn.Conv2d):
            assert isinstance(bn, nn.BatchNorm2d)
            assert bn.num_features == conv.out_channels == bn.weight.numel() == bn.running_mean.numel()
    cs = [m for m in modules if isinstance(m, nn.Conv2d)]
    for prev, nxt in zip(cs, cs[1:]):
        assert nxt.in_channels == prev.out_channels == nxt.weight.shape[1]
    assert net.rnn.input_size == net.collapse[0].out_channels == net.rnn.weight_ih_l0.shape[1]
    assert net.rnn.weight_ih_l0_reverse.shape[1] == net.rnn.input_size
    assert net.head.in_features == 2 * net.rnn.hidden_size == net.head.weight.shape[1]
    out = net(torch.zeros(3, 1, 32, 64))
    assert out.shape == (3, 16, net.head.out_features)


def test_lstm_hidden_units_are_removed_in_both_directions_and_gates():
    """Units whose recurrent and output weights are zero carry nothing: removing exactly them
    must leave the network's outputs unchanged, which only holds if every gate block of both
    directions and both halves of the head's input are sliced alike."""
    net = tiny()
    h, dead = 16, [1, 4, 6, 9, 11, 12, 14, 15]
    with torch.no_grad():
        for sfx in ("", "_reverse"):
            getattr(net.rnn, f"weight_hh_l0{sfx}")[:, dead] = 0
        net.head.weight[:, dead] = 0
        net.head.weight[:, [h + d for d in dead]] = 0
    x = torch.linspace(-1, 1, 2 * 32 * 96).reshape(2, 1, 32, 96)
    with torch.inference_mode():
        before = net(x)
    convs_and_head = [n for n in pruning.prunable_layers(net) if n != "rnn"]
    layers = pruning.prune(net, example(), cfg(ratio=0.5, ignored=convs_and_head))
    assert layers == {"rnn": [16, 8]}
    assert net.rnn.hidden_size == 8 and net.head.in_features == 16
    assert net.rnn.weight_hh_l0_reverse.shape == (32, 8) and net.rnn.bias_ih_l0.shape == (32,)
    with torch.inference_mode():
        torch.testing.assert_close(net(x), before)


def test_ignored_layers_are_untouched():
    net = tiny()
    kept = {n: convs(net)[n].weight.detach().clone() for n in ("cnn.0", "cnn.8")}
    head = net.head.bias.detach().clone()
    layers = pruning.prune(net, example(), cfg(ratio=0.5, ignored=["cnn.0", "cnn.8", "head"]))
    assert "cnn.0" not in layers and "cnn.8" not in layers and "cnn.4" in layers
    assert torch.equal(convs(net)["cnn.0"].weight, kept["cnn.0"])
    # cnn.8 keeps all of its filters; only its inputs shrink with cnn.4's outputs
    assert convs(net)["cnn.8"].out_channels == 32
    assert convs(net)["cnn.8"].in_channels == layers["cnn.4"][1]
    # the head keeps its outputs (the alphabet); its inputs shrink with the LSTM's hidden units
    assert net.head.out_features == 37 and torch.equal(net.head.bias, head)
    assert net.head.in_features == 2 * net.rnn.hidden_size < 32


def test_bn_scale_keeps_the_channels_with_the_largest_gamma():
    net = tiny()
    bn = net.cnn[5]  # after cnn.4 (16 channels)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([float((7 * k) % 16) for k in range(16)]))
    gammas = sorted(bn.weight.tolist())
    pruning.prune(net, example(), cfg(ratio=0.5, importance=PruneImportance.bn_scale))
    assert sorted(net.cnn[5].weight.tolist()) == gammas[8:]


def test_l1_and_l2_rank_by_weight_magnitude():
    for importance in (PruneImportance.l1, PruneImportance.l2):
        net = tiny()
        with torch.no_grad():  # filter k of cnn.4 scaled by k: the small ones must go
            w = net.cnn[4].weight
            w.copy_(w.sign() * torch.arange(1, 17, dtype=torch.float32).view(16, 1, 1, 1))
        pruning.prune(net, example(), cfg(ratio=0.5, importance=importance))
        kept = net.cnn[4].weight.abs().amax(dim=(1, 2, 3))
        assert kept.min() > 8, importance


def test_a_ratio_that_removes_a_whole_layer_is_refused_before_pruning():
    net = tiny((8, 8, 16, 16, 16))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ConfigError, match=r"remove every channel of cnn\.4 \(8 -> 0\)"):
        pruning.prune(net, example(), cfg(ratio=0.3, round_to=8))
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "nothing may be pruned"


def test_unknown_ignored_name_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        pruning.plan(tiny(), example(), cfg(ignored=["cnn.0", "conv1"]))
    msg = str(e.value)
    assert "conv1" in msg and "valid names: cnn.0, cnn.4, cnn.8" in msg and "head" in msg
    assert "\n" not in msg


class _Functional(nn.Module):
    """A conv whose weight is used outside its module's forward: the trace never sees it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return nn.functional.conv2d(self.a(x), self.b.weight, padding=1)


class _Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3)  # wants 3 input channels, gets 1

    def forward(self, x):
        return self.a(x)


@pytest.mark.parametrize("model,match", [(_Functional, r"did not reach b in _Functional"),
                                         (_Broken, r"could not trace _Broken on an input")])
def test_a_model_the_graph_cannot_trace_fails_clearly(model, match):
    with pytest.raises(StageError, match=match) as e:
        pruning.plan(model(), example(), cfg(ignored=[]))
    assert "\n" not in str(e.value)


def test_a_stacked_lstm_must_be_ignored_explicitly():
    net = tiny()
    net.rnn = nn.LSTM(32, 16, num_layers=2, batch_first=True, bidirectional=True)
    with pytest.raises(ConfigError, match="rnn is a stacked or projected LSTM"):
        pruning.plan(net, example(), cfg())
    layers = pruning.prune(net, example(), cfg(ignored=["cnn.0", "head", "rnn"]))
    assert "rnn" not in layers and net.rnn.hidden_size == 16
    assert net.rnn.input_size == layers["collapse.0"][1]


def test_ratio_outside_range_is_a_config_error():
    from pipeline.engine.compose import compose

    for bad in ("1.0", "-0.1"):
        with pytest.raises(ConfigError, match=rf"prune.ratio={float(bad)}: must be in \[0, 1\)"):
            compose(["prune=channels", f"prune.ratio={bad}"])
    assert compose(["prune=channels", "prune.ratio=0"]).prune.ratio == 0


def test_macs_count_what_the_layers_compute():
    net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.Flatten(1, 2))
    assert pruning_cost.macs(net, torch.zeros(1, 2, 5, 7))["total"] == 4 * 5 * 7 * 2 * 9
    lstm = nn.LSTM(6, 5, batch_first=True, bidirectional=True)

    class Rnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = lstm, nn.Linear(10, 3)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    counted = pruning_cost.macs(Rnn(), torch.zeros(2, 7, 6))["layers"]
    assert counted == {"rnn": 2 * (2 * 7) * 4 * 5 * (6 + 5), "head": 2 * 7 * 3 * 10}


def test_progress_bar_in_a_log_prints_every_tenth():
    import io

    from pipeline.prune.progress import Progress

    out = io.StringIO()
    bar = Progress(50, stream=out)
    for step in range(1, 51):
        bar.update(step, 0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in out.getvalue()
    assert lines[-1].startswith("  recovery [########################] 50/50 loss 0.5000")


# ---- training precision from the CPU's flags ---------------------------------------------------

@pytest.mark.parametrize("flags, dtype", [
    (["avx2", "fma"], "float32"),                                   # AVX2-only (EPYC, older Xeon)
    (["avx2", "avx512f", "avx512_vnni"], "float32"),                # AVX512-VNNI without BF16
    (["avx2", "avx512f", "avx512_vnni", "avx512_bf16"], "bfloat16"),  # Cooper Lake, Zen 4
    (["avx2", "avx512f", "amx_tile", "amx_bf16", "amx_int8"], "bfloat16"),  # Sapphire Rapids
])
def test_training_precision_follows_the_bf16_flags(flags, dtype):
    from pipeline.core.env import training_precision

    choice = training_precision(flags)
    assert choice["dtype"] == dtype and choice["reason"]


def test_fit_runs_in_the_chosen_precision():
    """The choice reaches the forward pass: bfloat16 autocast makes conv outputs bf16."""
    from pipeline.models.ocr.train import batches, fit

    seen = []
    for bf16 in (False, True):
        net = CRNN(WIDTHS, 16)
        hook = net.cnn[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        fit(net, batches(5, 2), 1, 1e-3, bf16)
        hook.remove()
    assert seen == [torch.float32, torch.bfloat16]


def test_the_pruning_helper_comes_through_the_task_contract():
    """``prune`` reads a model's helper from the task (``Prunable.pruning_helper``), never by a
    module name; a task that cannot be pruned is refused with its own reason, in one line."""
    from types import SimpleNamespace

    from pipeline.models import task
    from pipeline.prune.helper import helper
    from pipeline.task.contract import Prunable

    crnn = task("ocr")
    assert isinstance(crnn, Prunable)
    h = helper(crnn, tiny())
    params = h.params_of(tiny())  # the CRNN's own helper: widths (the collapse conv's last)
    assert tuple(h.example().shape) == (2, 1, 32, 128) and not h.rebuild_by_history
    assert params["widths"][:len(WIDTHS)] == list(WIDTHS) and params["hidden"] == 16
    with pytest.raises(ConfigError, match=r"^prune=channels: model 'ocr_mobile' has no pruning"):
        helper(task("ocr_mobile"), tiny())
    onnx_like = SimpleNamespace(key="graph.onnx", no_pruning="only an ONNX graph")
    with pytest.raises(ConfigError, match=r"^prune=channels: only an ONNX graph$"):
        helper(onnx_like, None)
    with pytest.raises(ConfigError, match=r"model 'bare' has no pruning support$"):
        helper(SimpleNamespace(key="bare"), None)  # neither a helper nor a reason
