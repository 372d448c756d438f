"""load: the network the task builds, with the checkpoint's weights (safetensors only), written
as files that rebuild it: what export and every later stage start from."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tests.stages.support import mlp, torch_key


def test_the_artifact_holds_the_checkpoints_weights_and_rebuilds_its_network(tmp_path):
    import torch
    from safetensors.torch import save_file

    from pipeline.models import task
    from pipeline.stages.load import Load, network_from

    trained = {k: v * 2 + 0.5 for k, v in mlp().state_dict().items()}  # not the factory's init
    checkpoint = tmp_path / "trained.safetensors"
    save_file(trained, str(checkpoint))
    rows = np.random.default_rng(0).standard_normal((8, 6))
    key = torch_key(tmp_path, rows, checkpoint)
    out = tmp_path / "load"
    out.mkdir()
    meta = Load(key, str(checkpoint), key.sha256).run(None, out)
    assert meta["source"] == str(checkpoint) and meta["parameters"] == 6 * 8 + 8 + 8 * 3 + 3

    rebuilt = network_from(SimpleNamespace(path=out), task(key))
    assert all(torch.equal(rebuilt.state_dict()[k], v) for k, v in trained.items())
    x = torch.from_numpy(rows.astype(np.float32))
    want = mlp()
    want.load_state_dict(trained)
    with torch.inference_mode():
        assert torch.equal(rebuilt(x), want(x)) and not torch.allclose(rebuilt(x), mlp()(x))
