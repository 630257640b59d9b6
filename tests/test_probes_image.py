"""Image probes: planted classes are read perfectly, floors are reported, real CIFAR-10 is read above chance."""

from pathlib import Path

import pytest
import torch

from vitscope.data import ImageDataset, load_dataset
from vitscope.models import create
from vitscope.probes import knn_probe, linear_probe
from vitscope.probes.settings import ImageProbeSettings

FAST = {"lrs": (0.05,), "weight_decays": (0.0,), "epochs": 60}
CIFAR10 = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "cifar10_jpg.tar.gz"
CIFAR10 = CIFAR10 if CIFAR10.exists() else Path("/work/shared/data/cifar10_jpg.tar.gz")


def _flat(split: str, per_class: int) -> ImageDataset:
    """Flat images whose colour is the class, with a little per-image noise."""
    labels = torch.arange(4).repeat(per_class)
    colours = torch.tensor([[30, 30, 30], [200, 30, 30], [30, 200, 30], [30, 30, 200]])
    generator = torch.Generator().manual_seed(hash(split) % 1000)
    noise = torch.randint(-20, 21, (len(labels), 3, 32, 32), generator=generator)
    images = (colours[labels].view(-1, 3, 1, 1) + noise).clamp(0, 255).to(torch.uint8)
    return ImageDataset("flat", split, images, labels, list("abcd"), (0.5,) * 3, (0.25,) * 3)


def test_planted_classes_give_100_percent_with_floors_beside_them():
    torch.manual_seed(0)
    model = create("vit-micro", num_classes=0)
    train, held = _flat("train", 12), _flat("eval", 6)
    result = linear_probe(model, train, held, "0,last", ImageProbeSettings(
        pool="mean", cache=False, progress=False, fit_options=FAST, dino_last4=True))
    assert result.value(0, "mean", "top1") == 1.0 and result.value(4, "mean", "top1") == 1.0
    assert result.value(4, "mean", "top1", model="chance") == pytest.approx(0.25)
    assert result.value(4, "dino-last4", "top1") >= 0.9
    assert {r["model"] for r in result.rows} == {"model", "model (random init)", "chance"}
    near = knn_probe(model, train, held, "0", ImageProbeSettings(pool="mean", k=5, cache=False, progress=False,
                                                                 baseline=False))
    assert near.value(0, "mean", "knn_top1") == 1.0


def test_cls_pool_refused_on_a_model_without_cls():
    model = create("vit-micro", class_token=False, pool="gap")
    with pytest.raises(ValueError, match="pool='mean'"):
        knn_probe(model, _flat("train", 2), _flat("eval", 2), "last",
                  ImageProbeSettings(cache=False, progress=False, baseline=False))


@pytest.mark.real_model  # real photos at length: run apart with the real-model tests
@pytest.mark.skipif(not CIFAR10.exists(), reason="real CIFAR-10 archive absent")
def test_linear_and_knn_read_real_cifar10_above_chance():
    train = load_dataset("cifar10", CIFAR10, "train").subset(400, seed=0)
    held = load_dataset("cifar10", CIFAR10, "eval").subset(200, seed=0)
    assert len(train.labels.unique()) == 10
    torch.manual_seed(0)
    model = create("vit-micro")
    quick = ImageProbeSettings(pool="mean", baseline=False, cache=False, progress=False)
    lin = linear_probe(model, train, held, "0", quick.replace(fit_options=FAST))
    near = knn_probe(model, train, held, "0", quick)
    chance = lin.value(0, "mean", "top1", model="chance")
    assert chance <= 0.11
    assert lin.value(0, "mean", "top1") > chance + 0.08
    assert near.value(0, "mean", "knn_top1") > chance + 0.05


def _named(split: str, classes: list[str], per_class: int = 4) -> ImageDataset:
    """Flat images whose colour is the class name's (the same name is the same colour in either split)."""
    colour = {"bird": (30, 30, 200), "cat": (200, 30, 30), "dog": (30, 200, 30), "horse": (120, 120, 120)}
    labels = torch.arange(len(classes)).repeat(per_class)
    generator = torch.Generator().manual_seed(len(split))
    noise = torch.randint(-10, 11, (len(labels), 3, 32, 32), generator=generator)
    rgb = torch.tensor([colour[name] for name in classes])
    images = (rgb[labels].view(-1, 3, 1, 1) + noise).clamp(0, 255).to(torch.uint8)
    return ImageDataset("named", split, images, labels, classes, (0.5,) * 3, (0.25,) * 3)


def test_labels_are_matched_by_class_name_and_the_odd_classes_are_said(capsys):
    """train/{bird,cat,dog} against val/{cat,dog,horse}: cat and dog are read (2 of 3 held-out classes: 0.67),
    horse images are scored wrong, and both odd classes are said on stderr and in the settings (matched by index,
    the val cat would have been scored against train's bird)."""
    torch.manual_seed(0)
    model = create("vit-micro", num_classes=0)
    train, held = _named("train", ["bird", "cat", "dog"]), _named("val", ["cat", "dog", "horse"])
    settings = ImageProbeSettings(pool="mean", k=1, cache=False, progress=False, baseline=False)
    near = knn_probe(model, train, held, "0", settings)
    assert near.value(0, "mean", "knn_top1") == pytest.approx(2 / 3)
    lin = linear_probe(model, train, held, "0", settings.replace(fit_options=FAST))
    assert lin.value(0, "mean", "top1") == pytest.approx(2 / 3)
    assert lin.settings["classes"] == {"aligned_by": "name", "eval_only": {"horse": 4}, "train_only": ["bird"]}
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("vitscope: knn probe: held-out classes not in training, scored as wrong: horse (4 images); "
                      "training classes not held out: bird (labels matched by class name)")
    shuffled = _named("val", ["dog", "cat"])  # the same classes in another order: every image read
    assert knn_probe(model, train, shuffled, "0", settings).value(0, "mean", "knn_top1") == 1.0
    with pytest.raises(ValueError, match=r"^the training classes \(bird, cat, dog\) and the held-out classes "
                                         r"\(horse\) share no name; use two splits of the same dataset$"):
        knn_probe(model, train, _named("val", ["horse"]), "0", settings)
