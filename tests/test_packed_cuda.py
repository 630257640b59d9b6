"""The packed GPU path: a training step makes no host synchronisation (CUDA only; skipped on CPU)."""

import pytest
import torch

from vitscope.data import load_dataset
from vitscope.train import TrainConfig
from vitscope.train.packed import build_members, pack_batches, pack_step
from vitscope.train.schedules import epoch_order

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("compile_model", [False, True])
def test_packed_step_makes_no_host_sync(tmp_path, compile_model):
    device = torch.device("cuda")
    common = {"model": "vit-micro", "dataset": "synthetic", "batch_size": 32, "amp": "bf16", "device": "cuda",
              "dataset_options": {"num_images": 128, "num_classes": 4}}
    # the protocols whose augmentations keep every decision on the device (AutoAugment and CutMix read
    # their per-batch choices back to the host)
    cfgs = [TrainConfig.from_dict({**common, "protocol": p, "seed": s, "out": str(tmp_path / p)})
            for p, s in (("baseline", 0), ("baseline+labelsmoothing", 1))]
    train_set = load_dataset("synthetic", None, "train", **common["dataset_options"])
    members, packed, optimizer = build_members(cfgs, train_set, device)
    model = torch.compile(packed) if compile_model else packed
    images, labels = train_set.images.to(device), train_set.labels.to(device)
    orders = [epoch_order(len(train_set), c.seed, 0).to(device) for c in cfgs]

    def step(i: int) -> torch.Tensor:
        inputs, targets = pack_batches(members, images, labels, orders, i, 0, device)
        return pack_step(model, optimizer, inputs, targets, cfgs[0])

    step(0)  # warm-up: compilation, optimiser state, lazy CUDA initialisation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses = [step(i) for i in (1, 2, 3)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(bool(torch.isfinite(loss).all()) for loss in losses)
