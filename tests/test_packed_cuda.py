"""The packed GPU path: a training step makes no host synchronisation (CUDA only; skipped on CPU)."""

import pytest
import torch

from vitscope.data import load_dataset
from vitscope.train import ABLATION, TrainConfig
from vitscope.train.packed.train import Pack, build_member

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("attention", ["softmax", "entmax15", "entmax:learned"])
@pytest.mark.parametrize("compile_model", [False, True])
def test_packed_step_makes_no_host_sync(tmp_path, compile_model, attention):
    """Every protocol of the ablation (AutoAugment, CutMix, smoothing and their combinations) in one pack, with
    members at different steps and schedules; the sparse normalisers defer their exactness check."""
    device = torch.device("cuda")
    common = {"model": "vit-micro", "dataset": "synthetic", "batch_size": 32, "amp": "bf16", "device": "cuda",
              "dataset_options": {"num_images": 512, "num_classes": 4}, "epochs": 2,
              "model_options": {"attention": attention}}
    cfgs = [TrainConfig.from_dict({**common, "protocol": p, "seed": s, "lr": 1e-3 * (s + 1),
                                   "out": str(tmp_path / p)}) for s, p in enumerate(ABLATION)]
    train_set = load_dataset("synthetic", None, "train", **common["dataset_options"])
    members = [build_member(c, train_set, device, resume=False, hooks=[]) for c in cfgs]
    for k, member in enumerate(members):
        member.global_step = k  # each at its own position in the epoch (16 steps: no epoch ends here)
    pack = Pack(members, train_set.images.to(device), train_set.labels.to(device), compile_model, "bf16")
    pack.step()  # warm-up: compilation, lazy CUDA initialisation, the lr tables sent to the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses = [pack.step() for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(bool(torch.isfinite(loss).all()) for loss in losses)
    assert [m.global_step for m in members] == [k + 4 for k in range(len(members))]
