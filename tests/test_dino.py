"""DINO: loss, centring and schedules against independent formulas; multi-crop randomness; the objective
end to end (kill/resume exactness, 2 gloo ranks == 1 process, run folder, sparse attention)."""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torchvision.transforms.v2 import functional as TF

from test_train import kill_and_resume, launch, wait_for_checkpoint
from vitscope.data.multicrop import MultiCropSpec, color_jitter, gaussian_blur, multicrop, shift_hue
from vitscope.train import TrainConfig, train
from vitscope.train.checkpoint import latest_checkpoint, load_state
from vitscope.train.dino.head import DINOHead
from vitscope.train.dino.loss import dino_loss, teacher_temperature, update_centre
from vitscope.train.engine import clip_gradients
from vitscope.train.logging import read_metrics
from vitscope.train.schedules import cosine

TINY_DINO = {
    "objective": "dino", "model": "vit-micro", "model_options": {"depth": 2, "embed_dim": 32, "num_heads": 2},
    "dataset": "synthetic", "dataset_options": {"num_images": 96}, "eval_images": 32, "batch_size": 32,
    "epochs": 2, "lr": 0.002, "warmup_epochs": 1, "weight_decay": 0.04, "weight_decay_end": 0.4, "grad_clip": 3.0,
    "progress": False, "log_every_steps": 2, "device": "cpu",
    "objective_options": {"out_dim": 64, "hidden_dim": 32, "bottleneck_dim": 16, "global_size": 32, "local_size": 16,
                          "n_local": 2, "drop_path": 0.0, "warmup_teacher_temp_epochs": 2, "knn_bank": 96,
                          "blur_sigma": [0.1, 1.0], "knn_every": 10},
}


def dino_config(tmp_path: Path, name: str, **changes) -> TrainConfig:
    return TrainConfig.from_dict({**TINY_DINO, "out": str(tmp_path / name), **changes})


# ---- formulas against independent implementations ----

def reference_loss(student, teacher, centre, t_temp, s_temp, batch):
    """Per image and per pair of views, in float64 numpy: the definition in the DINO paper (eq. 3 with centring)."""
    s, t, c = (np.asarray(a, dtype=np.float64) for a in (student, teacher, centre))
    views, globals_ = len(s) // batch, len(t) // batch
    pairs = []
    for i in range(globals_):
        for v in range(views):
            if v == i:
                continue
            per_image = []
            for b in range(batch):
                p = np.exp((t[i * batch + b] - c[0]) / t_temp)
                p /= p.sum()
                logits = s[v * batch + b] / s_temp
                log_q = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
                per_image.append(-(p * log_q).sum())
            pairs.append(np.mean(per_image))
    return float(np.mean(pairs))


@pytest.mark.parametrize("views,batch", [(2, 3), (6, 4)])
def test_loss_matches_the_definition_and_only_the_student_gets_gradients(views, batch):
    g = torch.Generator().manual_seed(views)
    student = torch.randn(views * batch, 17, generator=g, requires_grad=True)
    teacher = torch.randn(2 * batch, 17, generator=g, requires_grad=True)
    centre = torch.randn(1, 17, generator=g) * 0.3
    loss = dino_loss(student, teacher, centre, teacher_temp=0.05, student_temp=0.1)
    expected = reference_loss(student.detach(), teacher.detach(), centre, 0.05, 0.1, batch)
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)
    loss.backward()
    assert teacher.grad is None and student.grad is not None and student.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="whole views"):
        dino_loss(student[:-1], teacher, centre, 0.05)


def test_centre_is_an_ema_of_the_teacher_batch_mean():
    teacher = [torch.randn(8, 5), torch.randn(8, 5)]
    centre = torch.zeros(1, 5)
    expected = np.zeros((1, 5))
    for out in teacher:
        centre = update_centre(centre, out, 0.9)
        expected = 0.9 * expected + 0.1 * out.numpy().mean(axis=0, keepdims=True)
    np.testing.assert_allclose(centre.numpy(), expected, rtol=1e-6, atol=1e-7)


def test_temperature_and_momentum_schedules_follow_main_dino():
    warm, temp, epochs, warm_epochs = 0.04, 0.07, 10, 4
    table = np.concatenate([np.linspace(warm, temp, warm_epochs), np.ones(epochs - warm_epochs) * temp])
    assert np.allclose([teacher_temperature(e, warm, temp, warm_epochs) for e in range(epochs)], table)
    # utils.cosine_scheduler(base, final, epochs, niter): final + 0.5 (base - final) (1 + cos(pi i / n))
    n = 37
    iters = np.arange(n)
    reference = 1.0 + 0.5 * (0.996 - 1.0) * (1 + np.cos(np.pi * iters / n))
    assert np.allclose([cosine(0.996, 1.0, i / n) for i in iters], reference)
    wd = 0.4 + 0.5 * (0.04 - 0.4) * (1 + np.cos(np.pi * iters / n))
    assert np.allclose([cosine(0.04, 0.4, i / n) for i in iters], wd)


def test_teacher_update_is_an_ema_with_main_dinos_momentum_at_that_step(tmp_path):
    from vitscope.data import synthetic_scenes
    from vitscope.train.dino.objective import DinoObjective
    from vitscope.train.distributed import setup_distributed

    objective = DinoObjective(dino_config(tmp_path, "ema"))
    objective.setup(synthetic_scenes("train", 32), synthetic_scenes("eval", 8), setup_distributed("cpu"))
    with torch.no_grad():
        for p in objective.student.parameters():
            p.add_(torch.randn_like(p))
    student = [p.detach().clone() for p in objective.student.parameters()]
    teacher = [p.detach().clone() for p in objective.teacher.parameters()]
    objective.after_optimizer_step(7, 37)
    # main_dino.py: momentum_schedule = utils.cosine_scheduler(0.996, 1, epochs, niter_per_ep)[it]
    m = 1.0 + 0.5 * (0.996 - 1.0) * (1 + math.cos(math.pi * 7 / 37))
    for new, t, s in zip(objective.teacher.parameters(), teacher, student, strict=True):
        torch.testing.assert_close(new, m * t + (1 - m) * s, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(new, t) for new, t in zip(objective.teacher.parameters(), teacher, strict=True))


def test_per_tensor_clipping_is_dinos():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    params[0].grad, params[1].grad = torch.tensor([3.0, 4.0, 0.0]), torch.full((2, 2), 0.1)
    clip_gradients(params, 1.0, "per_tensor")
    assert torch.allclose(params[0].grad, torch.tensor([3.0, 4.0, 0.0]) / (5 + 1e-6))  # norm 5 -> 1
    assert torch.allclose(params[1].grad, torch.full((2, 2), 0.1))  # norm 0.2: left alone


def test_head_is_l2_normalised_before_a_unit_norm_last_layer():
    head = DINOHead(32, 100, hidden_dim=48, bottleneck_dim=16)
    out = head(torch.randn(5, 32))
    assert out.shape == (5, 100)
    g = head.last_layer.parametrizations.weight.original0
    assert not g.requires_grad and torch.all(g == 1)
    weight = head.last_layer.weight  # rows have unit norm, so |logit| <= 1 for a unit input
    assert torch.allclose(weight.norm(dim=1), torch.ones(100), atol=1e-5) and out.abs().max() <= 1 + 1e-5
    assert sum(isinstance(m, torch.nn.Linear) for m in head.mlp) == 3


@pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")  # lightly builds its head with the old API
def test_loss_centre_temperature_and_head_match_lightly():
    """lightly's DINOLoss and DINOProjectionHead as an independent oracle (a dev extra; skipped without it):
    several steps of loss + centre update through the teacher-temperature warmup, and the head on copied weights."""
    lightly_loss = pytest.importorskip("lightly.loss")
    lightly_heads = pytest.importorskip("lightly.models.modules")
    batch, views, dim, warm_epochs = 4, 5, 33, 3
    oracle = lightly_loss.DINOLoss(dim, warmup_teacher_temp=0.04, teacher_temp=0.07,
                                   warmup_teacher_temp_epochs=warm_epochs, student_temp=0.1, center_momentum=0.9)
    g = torch.Generator().manual_seed(3)
    centre = torch.zeros(1, dim)
    for epoch in range(5):
        student = torch.randn(views * batch, dim, generator=g)
        teacher = torch.randn(2 * batch, dim, generator=g)
        temperature = teacher_temperature(epoch, 0.04, 0.07, warm_epochs)
        ours = dino_loss(student, teacher, centre, temperature, 0.1)
        theirs = oracle(list(teacher.split(batch)), list(student.split(batch)), epoch=epoch)
        assert math.isclose(ours.item(), theirs.item(), rel_tol=1e-5), epoch
        centre = update_centre(centre, teacher, 0.9)
        torch.testing.assert_close(centre, oracle.center.view(1, dim), rtol=1e-6, atol=1e-7)

    ours_head = DINOHead(24, 50, hidden_dim=40, bottleneck_dim=12, norm_last_layer=False)
    their_head = lightly_heads.DINOProjectionHead(24, 40, 12, 50, norm_last_layer=False)
    with torch.no_grad():
        ours_head.last_layer.parametrizations.weight.original0.mul_(1.5)  # a g that is not 1
        linears = [m for m in ours_head.mlp if isinstance(m, torch.nn.Linear)]
        theirs = [m for m in their_head.modules() if isinstance(m, torch.nn.Linear) and m is not their_head.last_layer]
        for mine, other in zip(linears, theirs, strict=True):
            other.weight.copy_(mine.weight)
            other.bias.copy_(mine.bias)
        their_head.last_layer.weight_g.copy_(ours_head.last_layer.parametrizations.weight.original0)
        their_head.last_layer.weight_v.copy_(ours_head.last_layer.parametrizations.weight.original1)
    x = torch.randn(6, 24, generator=g)
    torch.testing.assert_close(ours_head(x), their_head(x), rtol=1e-5, atol=1e-6)


# ---- multi-crop ----

def test_shift_hue_and_jitter_match_torchvision_per_image():
    x = torch.rand(6, 3, 9, 11)
    shift = torch.linspace(-0.1, 0.1, 6)
    ours = shift_hue(x, shift)
    for i in range(6):
        torch.testing.assert_close(ours[i], TF.adjust_hue(x[i], float(shift[i])), atol=1e-5, rtol=0)
    u = torch.rand(6, 4)
    only_brightness = color_jitter(x, u, (0.4, 0.0, 0.0, 0.0))
    for i in range(6):
        factor = 0.6 + 0.8 * float(u[i, 0])
        torch.testing.assert_close(only_brightness[i], TF.adjust_brightness(x[i], factor), atol=1e-6, rtol=0)
    only_contrast = color_jitter(x, u, (0.0, 0.4, 0.0, 0.0))
    for i in range(6):
        factor = 0.6 + 0.8 * float(u[i, 1])
        torch.testing.assert_close(only_contrast[i], TF.adjust_contrast(x[i], factor), atol=1e-5, rtol=0)


def test_blur_matches_torchvision_gaussian_blur():
    x = torch.rand(3, 3, 20, 20)
    sigma = torch.tensor([0.5, 1.0, 1.5])
    ours = gaussian_blur(x, sigma)
    radius = math.ceil(3 * 1.5)
    for i in range(3):
        ref = TF.gaussian_blur(x[i], [2 * radius + 1] * 2, [float(sigma[i])] * 2)
        torch.testing.assert_close(ours[i], ref, atol=1e-5, rtol=0)


def test_multicrop_shapes_and_per_image_randomness():
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    spec = MultiCropSpec(global_size=24, local_size=12, n_local=3, blur_sigma=(0.1, 1.0))
    stats = ((0.5,) * 3, (0.25,) * 3)
    views = multicrop(images, torch.arange(100, 108), 7, 2, spec, *stats)
    assert [tuple(v.shape) for v in views] == [(8, 3, 24, 24)] * 2 + [(8, 3, 12, 12)] * 3
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in views)
    # an image's views depend on (seed, epoch, index) only: not on its batch or position
    part = multicrop(images[[5, 2]], torch.tensor([105, 102]), 7, 2, spec, *stats)
    for whole, piece in zip(views, part, strict=True):
        torch.testing.assert_close(piece, whole[[5, 2]])
    other_epoch = multicrop(images, torch.arange(100, 108), 7, 3, spec, *stats)
    assert not torch.allclose(other_epoch[0], views[0])
    same_image = images[[0, 0]]
    twins = multicrop(same_image, torch.tensor([1, 2]), 7, 2, spec, *stats)
    assert not torch.allclose(twins[0][0], twins[0][1])  # two indices, two different crops of one picture
    with pytest.raises(ValueError, match="global_scale"):
        MultiCropSpec(global_scale=(0.0, 1.0))


# ---- the objective end to end ----

def test_dino_run_folder_snapshots_and_frozen_last_layer(tmp_path):
    cfg = dino_config(tmp_path, "run", keep_every=1, model_options={"depth": 2, "embed_dim": 32, "num_heads": 2,
                                                                    "num_registers": 2, "attention": "entmax15"})
    summary = train(cfg)
    run = Path(cfg.out)
    from vitscope import record_attention
    from vitscope.models import load

    model = load(str(run)).eval()
    assert model.cfg.num_registers == 2 and model.cfg.attention == "entmax15" and model.cfg.num_classes == 0
    state = load_state(latest_checkpoint(run))["objective"]
    teacher = {k[len("backbone."):]: v for k, v in state["teacher"].items() if k.startswith("backbone.")}
    assert all(torch.equal(teacher[k], v) for k, v in model.state_dict().items())  # the run's model is the teacher
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["epoch-0001.safetensors",
                                                                      "epoch-0002.safetensors"]
    with torch.no_grad(), record_attention(model) as rec:
        model(torch.randn(4, 3, 32, 32))
    assert [tuple(m.shape) for m in rec.maps] == [(4, 2, 67, 67)] * 2  # CLS + 2 registers + 64 patches
    assert 0 <= summary["eval"]["knn_top1"] <= 1 and "knn_top1_init" in summary
    assert summary["objective"] == "dino" and "protocol" not in summary  # no supervised protocol was used
    assert "protocol" not in json.loads((run / "summary.json").read_text())
    logs = [m for m in read_metrics(run) if m["kind"] == "train"]
    assert all(m["teacher_entropy"] >= 0 and m["kl_teacher_centre"] >= -1e-6 for m in logs)


@pytest.mark.parametrize("attention", ["entmax15", "softmax"])
def test_entmax_dino_run_records_exact_zeros_and_softmax_none(tmp_path, attention):
    """Train the tiny DINO config a few steps hard enough for attention to leave uniform (lr 0.03 per 32 images, a
    teacher at momentum 0.5), load the run folder's model and record its attention on synthetic eval scenes:
    entmax-1.5 rows hold exact zeros and sum to 1; the same run with softmax has none."""
    from vitscope import record_attention
    from vitscope.data import load_dataset, normalize
    from vitscope.models import load

    options = {**TINY_DINO["objective_options"], "momentum_teacher": 0.5, "lr_reference_batch": 32}
    cfg = dino_config(tmp_path, attention, epochs=4, lr=0.03, warmup_epochs=0.5, objective_options=options,
                      model_options={**TINY_DINO["model_options"], "attention": attention})
    train(cfg)
    model = load(cfg.out).eval()
    assert model.cfg.attention == attention
    scenes = load_dataset("synthetic", None, "eval", num_images=16)
    with torch.no_grad(), record_attention(model) as rec:
        model(normalize(scenes.images, scenes.mean, scenes.std))
    maps = torch.stack(rec.maps)  # (layers, B, heads, T, T)
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5, rtol=0)
    zeros = float((maps == 0).float().mean())
    if attention == "entmax15":
        assert zeros > 0.05, zeros  # measured: about 0.3 of all weights over both layers
    else:
        assert zeros == 0.0


def test_last_layer_frozen_during_the_first_epoch(tmp_path):
    cfg = dino_config(tmp_path, "frozen", epochs=1, objective_options={
        **TINY_DINO["objective_options"], "norm_last_layer": False})
    from vitscope.train.dino.objective import DinoObjective

    initial = {}

    class Spy(DinoObjective):
        def setup(self, *args):
            super().setup(*args)
            initial.update({k: v.clone() for k, v in self.student.state_dict().items()})

    from vitscope.train.distributed import setup_distributed
    from vitscope.train.engine import run

    objective = Spy(cfg)
    run(cfg, objective, setup_distributed("cpu"))
    after = objective.student.state_dict()
    moved = {k for k in after if not torch.equal(after[k], initial[k])}
    assert moved and not any("last_layer" in k for k in moved)


def test_dino_resumes_bit_exactly_after_sigkill(tmp_path):
    common = {"deterministic": True, "checkpoint_every_steps": 1, "epochs": 2}
    reference = dino_config(tmp_path, "reference", **common)
    train(reference)
    victim = dino_config(tmp_path, "victim", **common)
    proc = launch(victim, tmp_path)
    wait_for_checkpoint(Path(victim.out), proc, min_step=2, timeout=180)
    resumed = kill_and_resume(Path(victim.out), proc)
    assert "kNN top-1" in resumed.stdout and "at initialisation" in resumed.stdout
    ours, theirs = load_file(str(Path(victim.out) / "model.safetensors")), load_file(
        str(Path(reference.out) / "model.safetensors"))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    a = load_state(latest_checkpoint(Path(victim.out)))["objective"]
    b = load_state(latest_checkpoint(Path(reference.out)))["objective"]
    assert torch.equal(a["centre"], b["centre"])
    assert all(torch.equal(a["student"][k], b["student"][k]) for k in b["student"])


def assert_two_ranks_match_one_process(single: TrainConfig, double: TrainConfig, tmp_path: Path,
                                       log_lines: int) -> None:
    """Train ``single`` in this process and ``double`` on 2 gloo ranks (torchrun); their DINO centres and
    logged losses must agree."""
    train(single)
    path = tmp_path / "double.json"
    path.write_text(json.dumps(double.to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as probe:  # a free port: other suites may run torchrun beside this one
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", port, "-m", "vitscope.cli", "train", "--config", str(path)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    one = load_state(latest_checkpoint(Path(single.out)))["objective"]
    two = load_state(latest_checkpoint(Path(double.out)))["objective"]
    torch.testing.assert_close(two["centre"], one["centre"], atol=1e-5, rtol=1e-4)
    losses = [[m["loss"] for m in read_metrics(Path(c.out)) if m["kind"] == "train"] for c in (single, double)]
    assert len(losses[0]) == len(losses[1]) == log_lines
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


def test_two_gloo_ranks_give_the_centre_and_loss_of_one_process(tmp_path):
    assert_two_ranks_match_one_process(dino_config(tmp_path, "single", epochs=1),
                                       dino_config(tmp_path, "double", epochs=1), tmp_path, log_lines=2)


def test_shipped_configs_and_bad_options(tmp_path):
    from vitscope.train import load_config

    for name in ("dino-demo", "dino-compact", "dino-vit-s16"):
        cfg = load_config(name)
        assert cfg.objective == "dino" and cfg.objective_options
    with pytest.raises(ValueError, match="unknown DINO objective_options"):
        train(dino_config(tmp_path, "bad", objective_options={"outdim": 3}))
    with pytest.raises(ValueError, match=r"objective_options.global_scale: expected a list of 2 numbers"):
        train(dino_config(tmp_path, "bad2", objective_options={"global_scale": "big"}))


def test_the_fused_ema_update_equals_the_per_parameter_update():
    from vitscope.train.dino.objective import ema_update

    torch.manual_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    teacher = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    expected = [t.detach().clone() for t in teacher.parameters()]
    for momentum in (0.996, 0.5, 1.0):
        with torch.no_grad():
            for t, s in zip(expected, student.parameters(), strict=True):  # the per-parameter update
                t.mul_(momentum).add_((1 - momentum) * s.detach())
        ema_update(list(teacher.parameters()), list(student.parameters()), momentum)
        for t, e in zip(teacher.parameters(), expected, strict=True):
            torch.testing.assert_close(t.detach(), e, rtol=1e-6, atol=1e-7)
    assert not any(t.requires_grad and t.grad is not None for t in teacher.parameters())
    with pytest.raises(ValueError, match="teacher has 6 parameters and student 2"):
        ema_update(list(teacher.parameters()), list(student[0].parameters()), 0.9)
