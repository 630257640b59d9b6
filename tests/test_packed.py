"""Packed training: K models at their own schedule positions equal K solo runs (weights, run folders,
checkpoints, logs); members leave the pack as they finish; resume packed or solo from any member's step."""

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitscope.models import create
from vitscope.models.own.packed import PackedViT, VmappedModels
from vitscope.train import TrainConfig, TrainingInterrupted, train
from vitscope.train.packed.adamw import PackedAdamW
from vitscope.train.packed.state import clip_member_gradients, solo_optimizer
from vitscope.train.packed.train import auto_pack_size, check_pack_configs, train_packed

TINY = {"model": "vit-micro", "model_options": {"depth": 2, "embed_dim": 32, "num_heads": 2},
        "dataset": "synthetic", "dataset_options": {"num_images": 32, "num_classes": 4}, "eval_images": 16,
        "batch_size": 16, "epochs": 2, "warmup_epochs": 1, "progress": False, "log_every_steps": 1, "device": "cpu"}
# 2 steps per epoch; members with their own protocol (crop + flip only; AutoAugment + CutMix + smoothing;
# CutMix), seed and schedule (epochs, lr, warmup, weight decay and its schedule, clipping): a fresh pack
# trains 4 steps as 3, then 2 as 2 (the first has left), then 2 as 1
MEMBERS = [("baseline", 0, {}),
           ("modern", 1, {"epochs": 3, "lr": 2e-3, "warmup_epochs": 0.5, "weight_decay_end": 0.3, "grad_clip": 0.5}),
           ("baseline+cutmix", 2, {"epochs": 4, "lr": 5e-4, "weight_decay": 0.1, "grad_clip": 0.0})]


def cfg(root: Path, group: str, protocol: str, seed: int, **changes) -> TrainConfig:
    return TrainConfig.from_dict({**TINY, "protocol": protocol, "seed": seed,
                                  "out": str(root / group / f"{protocol}-{seed}"), **changes})


def member_cfgs(root: Path, group: str, **changes) -> list[TrainConfig]:
    return [cfg(root, group, p, s, **(member_changes | changes)) for p, s, member_changes in MEMBERS]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model.safetensors"))


def assert_close_weights(a: Path, b: Path, atol: float = 1e-5) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=atol, rtol=1e-4, msg=name)


def layout(run: Path) -> list[str]:
    """Relative paths in a run folder; TensorBoard event files (one per process that wrote the run) are
    named by time and process; of the kept checkpoints (the last two, at the run's own cadence) the newest."""
    kept = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    older = set(kept[:-1])
    paths = [p.relative_to(run) for p in run.rglob("*")]
    return sorted({"tensorboard/EVENTS" if p.parent.name == "tensorboard" else str(p) for p in paths
                   if not (p.parts[0] == "checkpoints" and len(p.parts) > 1 and p.parts[1] in older)})


def assert_same_run(solo: Path, packed: Path) -> None:
    """Weights, files, checkpoint state, log lines and summary keys of a packed member equal its solo run's."""
    assert_close_weights(solo, packed)
    assert layout(solo) == layout(packed)
    for name in ("summary.json", "config.json"):
        assert json.loads((solo / name).read_text()).keys() == json.loads((packed / name).read_text()).keys()
    assert json.loads((solo / "summary.json").read_text())["eval"]["loss"] == pytest.approx(
        json.loads((packed / "summary.json").read_text())["eval"]["loss"], abs=1e-4)
    a = torch.load(max((solo / "checkpoints").glob("step-*")) / "state.pt", weights_only=False)
    b = torch.load(max((packed / "checkpoints").glob("step-*")) / "state.pt", weights_only=False)
    assert a.keys() == b.keys() and a["scheduler"] == b["scheduler"] and a["global_step"] == b["global_step"]
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    for i, state in a["optimizer"]["state"].items():
        assert float(b["optimizer"]["state"][i]["step"]) == float(state["step"])
        torch.testing.assert_close(b["optimizer"]["state"][i]["exp_avg_sq"], state["exp_avg_sq"], atol=1e-8,
                                   rtol=1e-3)
    solo_log, pack_log = ([r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                           if r["kind"] != "epoch"] for run in (solo, packed))  # "epoch": test hooks' lines
    assert [(r["kind"], r["step"]) for r in solo_log] == [(r["kind"], r["step"]) for r in pack_log]
    assert [r["loss"] for r in solo_log] == pytest.approx([r["loss"] for r in pack_log], abs=1e-4)
    assert [r.get("lr", 0) for r in solo_log] == pytest.approx([r.get("lr", 0) for r in pack_log], rel=1e-12)


@pytest.fixture(scope="module")
def solo_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    for c in member_cfgs(root, "solo"):
        train(c)
    return root


def stop_after_first_epoch():
    """An epoch hook that sends this process SIGTERM the first time it is called."""
    sent = []

    def terminate(model):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return {}

    return terminate


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


def test_members_with_their_own_schedules_equal_their_solo_runs(solo_runs):
    configs = member_cfgs(solo_runs, "pack")
    summaries = train_packed(configs)
    for c, summary in zip(configs, summaries, strict=True):
        assert summary["steps"] == c.epochs * 2
        assert_same_run(solo_runs / "solo" / Path(c.out).name, Path(c.out))


def test_interrupted_pack_resumes_packed_or_solo_from_each_members_step(solo_runs):
    configs = member_cfgs(solo_runs, "killed", checkpoint_every_steps=1)
    with pytest.raises(TrainingInterrupted):
        train_packed(configs, hooks=[stop_after_first_epoch()])
    assert [max(p.name for p in (Path(c.out) / "checkpoints").glob("step-*")) for c in configs] == [
        "step-000000002"] * 3  # every member checkpointed at the first epoch's end
    assert not any((Path(c.out) / "summary.json").exists() for c in configs)
    with pytest.raises(TrainingInterrupted):  # the last member goes on solo for one more epoch
        train(configs[2], resume=True, hooks=[stop_after_first_epoch()])
    train(configs[0], resume=True)  # a member resumes solo
    train_packed(configs[1:], resume=True)  # the others resume as a pack, at steps 2 and 4
    for c in configs:
        assert_same_run(solo_runs / "solo" / Path(c.out).name, Path(c.out))


def test_packed_adamw_equals_torch_adamw_per_member():
    """Members at different steps, lrs and weight decays: one packed step equals each solo AdamW step."""
    torch.manual_seed(2)
    models = [create("vit-micro", depth=1, embed_dim=16, num_heads=2) for _ in range(2)]
    configs = [TrainConfig.from_dict({"lr": 1e-2, "weight_decay": 0.05}),
               TrainConfig.from_dict({"lr": 3e-3, "weight_decay": 0.2})]
    solos = [solo_optimizer(m, c, 10)[0] for m, c in zip(models, configs, strict=True)]
    images = torch.randn(2, 4, 3, 32, 32)
    for _ in range(3):  # member 0 is three steps ahead
        models[0](images[0]).square().mean().backward()
        solos[0].step()
        solos[0].zero_grad()
    packed = PackedViT(models)
    optimizer = PackedAdamW.from_solo(packed, solos, models)
    assert optimizer.steps.tolist() == [3, 0]
    for _ in range(2):
        packed(images).square().mean(dim=(1, 2)).sum().backward()
        lr = torch.tensor([[g["lr"] for g in (s.param_groups[i] for s in solos)] for i in range(2)])
        wd = torch.tensor([[g["weight_decay"] for g in (s.param_groups[i] for s in solos)] for i in range(2)])
        optimizer.step(lr, wd)
        optimizer.zero_grad()
        for k, model in enumerate(models):
            model(images[k]).square().mean().backward()
            solos[k].step()
            solos[k].zero_grad()
    assert wd[0].tolist() != wd[1].tolist() and lr[0, 0] != lr[0, 1]  # decayed and undecayed groups, two lrs
    for k, model in enumerate(models):
        for name, param in model.named_parameters():
            torch.testing.assert_close(packed.param(name)[k], param, atol=1e-6, rtol=1e-5)
        state = optimizer.write_member(k, solo_optimizer(models[k], configs[k], 10)[0])
        assert [float(s["step"]) for s in state["state"].values()] == [float(s["step"]) for s in solos[
            k].state_dict()["state"].values()]


def test_pack_refuses_what_it_cannot_pack(tmp_path):
    with pytest.raises(ValueError, match="must share batch_size"):
        check_pack_configs([cfg(tmp_path, "a", "baseline", 0), cfg(tmp_path, "b", "baseline", 1, batch_size=8)])
    check_pack_configs([cfg(tmp_path, "a", "baseline", 0), cfg(tmp_path, "b", "modern", 1, lr=0.1, epochs=3)])
    with pytest.raises(ValueError, match="own out"):
        check_pack_configs([cfg(tmp_path, "a", "baseline", 0), cfg(tmp_path, "a", "baseline", 0)])
    with pytest.raises(ValueError, match="drop_path_rate"):
        PackedViT([create("vit-micro", drop_path_rate=0.1)])
    with pytest.raises(ValueError, match="one architecture"):
        PackedViT([create("vit-micro"), create("vit-micro", depth=2)])
    assert auto_pack_size(cfg(tmp_path, "a", "baseline", 0), runs=3, device=torch.device("cpu")) == 3


def test_a_partial_last_batch_is_reported_not_hidden(tmp_path, capsys):
    """40 images in batches of 16: each epoch trains on 32 (2 full batches), solo and packed alike; the summary
    says so beside the 40, and one line on stderr says it once per run or pack."""
    changes = {"dataset_options": {"num_images": 40, "num_classes": 4}, "epochs": 1, "warmup_epochs": 0.5}
    solo = train(cfg(tmp_path, "solo", "baseline", 0, **changes))
    err = capsys.readouterr().err
    assert err.count("each epoch trains on 32 of the 40 training images (2 full batches of 16)") == 1
    packed = train_packed([cfg(tmp_path, "pack", "baseline", s, **changes) for s in (0, 1)])
    assert capsys.readouterr().err.count("each epoch trains on 32 of the 40") == 1
    for summary in (solo, *packed):
        assert (summary["train_images"], summary["train_images_per_epoch"], summary["steps"]) == (40, 32, 2)


@pytest.mark.parametrize(("clip_mode", "bound"), [("global", float("inf")), ("per_tensor", 0.05)])
def test_flat_adamw_step_equals_the_per_tensor_step(clip_mode, bound):
    """The flat (K, P) step (parameters re-homed into one buffer) against its per-tensor twin: same weights and
    moments after steps with two parameter groups, per-member lr, weight decay and clipping. (A binding global
    clip sums the squares in another order, and AdamW turns that rounding into sign flips of near-zero gradients
    such as the key bias's; the pack-vs-solo run tests cover it at run level.)"""
    torch.manual_seed(3)
    models = [create("vit-micro", depth=1, embed_dim=16, num_heads=2) for _ in range(3)]
    images = torch.randn(3, 4, 3, 32, 32)
    configs = [TrainConfig.from_dict({"lr": 1e-2 * (k + 1), "weight_decay": 0.05 * (k + 1)}) for k in range(3)]
    packs = {}
    for flat in (True, False):
        packed = PackedViT(models)
        solos = [solo_optimizer(m, c, 10)[0] for m, c in zip(models, configs, strict=True)]
        packs[flat] = (packed, PackedAdamW.from_solo(packed, solos, models, flat=flat))
    assert packs[True][1].flat and not packs[False][1].flat
    lr = torch.tensor([[1e-2, 2e-2, 3e-2], [1e-2, 2e-2, 3e-2]])
    wd = torch.tensor([[0.05, 0.1, 0.15], [0.0, 0.0, 0.0]])
    max_norm = torch.tensor([bound, float("inf"), 10 * bound])
    for _ in range(3):
        for packed, optimizer in packs.values():
            packed(images).square().mean(dim=(1, 2)).sum().backward()
            optimizer.step(lr, wd, max_norm, clip_mode)
            optimizer.zero_grad()
    (flat_model, flat_opt), (each_model, each_opt) = packs[True], packs[False]
    for name in flat_model.names:
        torch.testing.assert_close(flat_model.param(name), each_model.param(name), atol=0, rtol=0)
        p_flat, p_each = flat_model.param(name), each_model.param(name)
        torch.testing.assert_close(flat_opt.exp_avg_sq[p_flat], each_opt.exp_avg_sq[p_each], atol=0, rtol=0)
    assert flat_opt.steps.tolist() == each_opt.steps.tolist() == [3.0, 3.0, 3.0]
    # the parameters are views of the optimiser's buffer: a step moves the model
    assert all(p.untyped_storage().data_ptr() == flat_opt.buffer.untyped_storage().data_ptr()
               for p in flat_model.parameters())
