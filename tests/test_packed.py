"""Packed training: K models as one equal K solo runs (weights, run folders, checkpoints), resume either way."""

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitscope.models import create
from vitscope.models.packed import PackedViT, VmappedModels
from vitscope.train import TrainConfig, TrainingInterrupted, train
from vitscope.train.pack_state import clip_member_gradients, common_checkpoint_step
from vitscope.train.packed import auto_pack_size, check_pack_configs, train_packed

TINY = {"model": "vit-micro", "model_options": {"depth": 2, "embed_dim": 32, "num_heads": 2},
        "dataset": "synthetic", "dataset_options": {"num_images": 64, "num_classes": 4}, "eval_images": 32,
        "batch_size": 16, "epochs": 2, "warmup_epochs": 1, "progress": False, "log_every_steps": 2, "device": "cpu"}
# different protocols (crop + flip only; AutoAugment + CutMix + smoothing; CutMix) and seeds
MEMBERS = [("baseline", 0), ("modern", 1), ("baseline+cutmix", 2)]


def cfg(root: Path, group: str, protocol: str, seed: int, **changes) -> TrainConfig:
    return TrainConfig.from_dict({**TINY, "protocol": protocol, "seed": seed,
                                  "out": str(root / group / f"{protocol}-{seed}"), **changes})


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model.safetensors"))


def assert_close_weights(a: Path, b: Path, atol: float = 1e-5) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=atol, rtol=1e-4, msg=name)


def layout(run: Path) -> list[str]:
    """Relative paths in a run folder; TensorBoard event files are named by time and process."""
    return sorted("tensorboard/EVENTS" if p.parent.name == "tensorboard" else str(p.relative_to(run))
                  for p in run.rglob("*"))


@pytest.fixture(scope="module")
def solo_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    for protocol, seed in MEMBERS:
        train(cfg(root, "solo", protocol, seed))
    return root


@pytest.mark.parametrize("options", [{"attention": "softmax"}, {"attention": "entmax15", "num_registers": 2},
                                     {"pool": "gap", "pos_embed": "sincos", "num_classes": 0}])
def test_packed_forward_equals_each_model(options):
    torch.manual_seed(0)
    models = [create("vit-micro", depth=2, **options) for _ in range(3)]
    images = torch.randn(3, 4, 3, 32, 32)
    reference = torch.stack([m(images[k]) for k, m in enumerate(models)])
    torch.testing.assert_close(PackedViT(models)(images), reference, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(VmappedModels(models)(images), reference, atol=2e-5, rtol=1e-4)


def test_pack_gradients_and_clipping_match_each_model():
    torch.manual_seed(1)
    models = [create("vit-micro", depth=2) for _ in range(2)]
    images, labels = torch.randn(2, 4, 3, 32, 32), torch.randint(0, 10, (2, 4))
    packed = PackedViT(models)
    loss = sum(torch.nn.functional.cross_entropy(logits, y) for logits, y in zip(packed(images), labels, strict=True))
    loss.backward()
    clip_member_gradients(list(packed.parameters()), 0.05, "global")
    for k, model in enumerate(models):
        torch.nn.functional.cross_entropy(model(images[k]), labels[k]).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        assert norm > 0.05  # the clip acts
        for name, param in model.named_parameters():
            torch.testing.assert_close(packed.param(name).grad[k], param.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_packed_members_equal_their_solo_runs(solo_runs):
    summaries = train_packed([cfg(solo_runs, "pack", p, s) for p, s in MEMBERS])
    for (protocol, seed), summary in zip(MEMBERS, summaries, strict=True):
        solo, packed = solo_runs / "solo" / f"{protocol}-{seed}", solo_runs / "pack" / f"{protocol}-{seed}"
        assert_close_weights(solo, packed)
        assert layout(solo) == layout(packed)
        for name in ("summary.json", "config.json"):
            assert json.loads((solo / name).read_text()).keys() == json.loads((packed / name).read_text()).keys()
        assert summary["eval"]["loss"] == pytest.approx(json.loads((solo / "summary.json").read_text())["eval"]["loss"],
                                                        abs=1e-4)
        a = torch.load(next((solo / "checkpoints").glob("step-*")) / "state.pt", weights_only=False)
        b = torch.load(next((packed / "checkpoints").glob("step-*")) / "state.pt", weights_only=False)
        assert a.keys() == b.keys() and a["scheduler"] == b["scheduler"] and a["global_step"] == b["global_step"]
        assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
        assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
        for i, state in a["optimizer"]["state"].items():
            torch.testing.assert_close(b["optimizer"]["state"][i]["exp_avg_sq"], state["exp_avg_sq"], atol=1e-8,
                                       rtol=1e-3)
        solo_log = [json.loads(line) for line in (solo / "metrics.jsonl").read_text().splitlines()]
        pack_log = [json.loads(line) for line in (packed / "metrics.jsonl").read_text().splitlines()]
        assert [(r["kind"], r["step"]) for r in solo_log] == [(r["kind"], r["step"]) for r in pack_log]
        assert [r["loss"] for r in solo_log] == pytest.approx([r["loss"] for r in pack_log], abs=1e-4)


def test_interrupted_pack_resumes_packed_or_solo(solo_runs):
    sent = []

    def terminate_after_first_epoch(model):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return {}

    configs = [cfg(solo_runs, "killed", p, s, checkpoint_every_steps=1) for p, s in MEMBERS]
    with pytest.raises(TrainingInterrupted):
        train_packed(configs, hooks=[terminate_after_first_epoch])
    steps = {len(list((Path(c.out) / "checkpoints").glob("step-*"))) for c in configs}
    assert steps == {1} and common_checkpoint_step([Path(c.out) for c in configs]) == 4  # the first epoch's end
    assert not any((Path(c.out) / "summary.json").exists() for c in configs)
    # as if killed between members: the last member wrote step 5, the others did not
    late = Path(configs[2].out) / "checkpoints"
    (late / "step-000000005").mkdir()
    for name in ("state.pt", "model.safetensors"):
        (late / "step-000000005" / name).write_bytes((late / "step-000000004" / name).read_bytes())
    assert common_checkpoint_step([Path(c.out) for c in configs]) == 4
    train(configs[0], resume=True)  # a member resumes solo
    train_packed(configs[1:], resume=True)  # the others resume as a pack, from the step they share
    for c, (protocol, seed) in zip(configs, MEMBERS, strict=True):
        assert_close_weights(solo_runs / "solo" / f"{protocol}-{seed}", Path(c.out))
        assert [p.name for p in (Path(c.out) / "checkpoints").glob("step-*")] == ["step-000000008"]


def test_pack_refuses_what_it_cannot_pack(tmp_path):
    with pytest.raises(ValueError, match="must share lr"):
        check_pack_configs([cfg(tmp_path, "a", "baseline", 0), cfg(tmp_path, "b", "baseline", 1, lr=0.1)])
    with pytest.raises(ValueError, match="own out"):
        check_pack_configs([cfg(tmp_path, "a", "baseline", 0), cfg(tmp_path, "a", "baseline", 0)])
    with pytest.raises(ValueError, match="drop_path_rate"):
        PackedViT([create("vit-micro", drop_path_rate=0.1)])
    with pytest.raises(ValueError, match="one architecture"):
        PackedViT([create("vit-micro"), create("vit-micro", depth=2)])
    assert auto_pack_size(cfg(tmp_path, "a", "baseline", 0), runs=3, device=torch.device("cpu")) == 3
