"""``vitscope probe linear|knn|segment|depth|tokens|pib|pca``: what a frozen backbone's features hold, layer by layer.

Each writes ``results.json`` (the shared results schema: rows for the model, the same architecture with random
weights, and the chance level), ``results.csv`` and a figure of score against token layer; ``pca`` writes a PNG
grid of input images above their PCA maps and the explained variance.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitscope.cli.options import add_common, add_model_changes, positive_float, positive_int, unit_fraction
from vitscope.cli.out_folders import check_output_dir, locked_out, output_dir, print_files

METRICS = {"linear": "top1", "knn": "knn_top1"}
DEFAULT_STEPS = 1000  # vitscope.probes.dense.training.DEFAULT_STEPS (not imported: the CLI loads torch lazily)
DEFAULT_LRS = (1e-3, 1e-2, 1e-1)  # vitscope.probes.dense.settings' defaults, as above
DEFAULT_WEIGHT_DECAYS = (1e-4, 1e-1)
DEFAULT_HELD_FRACTION = 0.2


def _numbers(least: float, inclusive: bool):
    """An argparse type: comma-separated numbers, each > ``least`` (>= with ``inclusive``)."""
    def parse(text: str) -> tuple[float, ...]:
        try:
            values = tuple(float(x) for x in text.split(",") if x.strip())
        except ValueError:
            values = ()
        if not values or any(not (v >= least if inclusive else v > least) or v != v or v == float("inf")
                             for v in values):
            raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated numbers "
                                             f"{'>=' if inclusive else '>'} {least:g}, e.g. 0.001,0.01")
        return values
    return parse


def register(commands) -> None:
    probe = commands.add_parser("probe", help="probe a frozen backbone's features")
    kinds = probe.add_subparsers(dest="probe", metavar="PROBE", required=True)
    linear = kinds.add_parser("linear", help="image class by logistic regression (lr/wd sweep on held-out train)")
    knn = kinds.add_parser("knn", help="image class by DINO's weighted kNN (k=20, T=0.07)")
    tokens = kinds.add_parser("tokens", help="what single tokens carry: position, pixels, image class")
    pib = kinds.add_parser("pib", help="Point-in-Box per layer, with its chance level (synthetic, tiny-imagenet, "
                                       "voc, imagenet)")
    pca = kinds.add_parser("pca", help="first three principal components of patch features as RGB maps")
    segment = kinds.add_parser("segment", help="linear segmentation (mIoU): voc, ade20k, cityscapes, segfolder, "
                                               "synthetic")
    depth = kinds.add_parser("depth", help="linear depth (RMSE): nyu, depthfolder, synthetic")
    for sub in (linear, knn, tokens, pib, pca, segment, depth):
        add_common(sub, f"vitscope-probe-{sub.prog.split()[-1]}")  # the folder run_* writes without --out
        add_model_changes(sub)
        spread = ", spread (5 layers from 0 to the last)" if sub in (segment, depth) else ""
        sub.add_argument("--layers", default="last", help=f"token layers: last, all{spread} or e.g. 0,4,last (0 = "
                                                          "embedding, l = output of block l; default: %(default)s)")
        sub.add_argument("--no-norm", dest="norm", action="store_false",
                         help="read tokens before the final norm (default: after it)")
        sub.add_argument("--no-baseline", dest="baseline", action="store_false",
                         help="skip the randomly initialised backbone row")
        sub.add_argument("--label", default=None, help="name of the model in results (default: --model)")
        sub.add_argument("--no-cache", dest="cache", action="store_false",
                         help="do not keep features in $VITSCOPE_CACHE/features")
    for sub in (segment, depth):
        sub.add_argument("--with-cls", default="both", choices=["no", "yes", "both"],
                         help="concatenate the CLS token to every patch: no, yes or both (both: claim S3 judged "
                              "per layer, with-minus-without and its 95 %% interval)")
        sub.set_defaults(layers="spread")
        sub.add_argument("--steps", type=positive_int, default=None,
                         help=f"optimiser steps of every head (default {DEFAULT_STEPS}; the loss is recorded and a "
                              "line says when it had not converged)")
        sub.add_argument("--epochs", type=positive_float, default=None,
                         help="instead of --steps: passes over the training images (default: none, --steps "
                              "decides)")
        sub.add_argument("--lr", type=_numbers(0.0, False), default=None, metavar="LR[,LR...]",
                         help="learning rates swept on a held-out part of the training split (default "
                              f"{','.join(f'{x:g}' for x in DEFAULT_LRS)}); one value and one --weight-decay: "
                              "no sweep")
        sub.add_argument("--weight-decay", type=_numbers(0.0, True), default=None, metavar="WD[,WD...]",
                         help=f"weight decays swept (default {','.join(f'{x:g}' for x in DEFAULT_WEIGHT_DECAYS)})")
        sub.add_argument("--held-fraction", type=unit_fraction, default=DEFAULT_HELD_FRACTION,
                         help="the last share of the training images (file order) that chooses each head's lr and "
                              "weight decay (default 0.2)")
        sub.add_argument("--head-seeds", type=positive_int, default=1,
                         help="heads refitted with this many seeds; scores are their mean and intervals add their "
                              "spread (default 1)")
        sub.add_argument("--head-batch-size", type=positive_int, default=16, help="images per head training step")
        sub.add_argument("--blocks", type=positive_int, default=None,
                         help="jackknife the intervals over this many runs of consecutive evaluation images "
                              "(frames of a video; default: one image a group)")
        sub.add_argument("--train-images", type=positive_int, default=None,
                         help="a seeded sample of N training images (default: all)")
        sub.add_argument("--size", type=positive_int, default=None,
                         help="resize images to this short side, train on random crops of the model's input side "
                              "and evaluate by sliding window (default: each image resized whole to the input)")
        sub.add_argument("--crops-per-image", type=positive_int, default=1,
                         help="random training crops per image (--size)")
        sub.add_argument("--loss-points", default="4096", metavar="N|full",
                         help="label pixels per image in each training step's loss, sampled uniformly from the "
                              "valid ones (an unbiased estimate of the full loss); full: every pixel (default 4096)")
        sub.set_defaults(handler=run_dense)
    depth.add_argument("--eigen-crop", action=argparse.BooleanOptionalAction, default=None,
                       help="evaluate inside the NYU Eigen crop (default: on for nyu, off otherwise)")
    depth.add_argument("--max-depth", type=float, default=10.0, help="largest depth bin in metres")
    depth.add_argument("--bin-resolution", default="x4", choices=["x4", "label"],
                       help="where the 256 depth bins are normalised: x4 (DINOv2's linear head: on the patch grid "
                            "upsampled x4, then the depth map resized to the label) or label (at every "
                            "label pixel, the logits resized first)")
    for sub in (linear, knn):
        sub.add_argument("--pool", default="cls", choices=["cls", "mean", "both"], help="image feature")
        sub.add_argument("--train-images", type=positive_int, default=None,
                         help="a seeded class-stratified sample of N training images (default: all)")
    linear.add_argument("--dino-last4", action="store_true",
                        help="also DINO's protocol: CLS of the last 4 blocks concatenated")
    linear.add_argument("--epochs", type=positive_int, default=100, help="epochs of each logistic-regression fit")
    knn.add_argument("--k", type=positive_int, default=20, help="neighbours that vote (default: 20)")
    knn.add_argument("--temperature", type=positive_float, default=0.07,
                     help="votes weighted by exp(cosine similarity / T) (default: 0.07)")
    tokens.add_argument("--probes", default="position,pixels,class",
                        help="comma-separated: position, pixels, pixels-mlp, class")
    tokens.add_argument("--max-tokens", type=positive_int, default=2048, help="tokens per group and split")
    tokens.set_defaults(handler=run_tokens, layers="0,last")
    pib.add_argument("--score", default="attention", choices=["attention", "norm", "cosine", "class"],
                     help="patch score: CLS-to-patch attention (mean over heads), token norm, cosine to CLS, or "
                          "class (each patch's evidence for the image's class from a linear patch-token classifier "
                          "fitted on half the images; PiB on the other half)")
    pib.set_defaults(handler=run_pib, layers="all")
    pca.add_argument("--count", type=positive_int, default=8, help="images shown")
    pca.add_argument("--per-image", dest="joint", action="store_false", help="fit the PCA per image")
    pca.add_argument("--foreground", type=unit_fraction, default=None,
                     help="threshold in [0, 1] on the first component; patches below are black "
                          "(default: none, every patch shown)")
    pca.set_defaults(handler=run_pca)
    linear.set_defaults(handler=run_image)
    knn.set_defaults(handler=run_image)
    for sub in (linear, knn, tokens, pib, pca, segment, depth):  # one writer per --out, from before the model loads
        name = sub.prog.split()[-1]
        sub.set_defaults(handler=locked_out(sub.get_default("handler"), f"vitscope-probe-{name}"))


def _load(args: argparse.Namespace, split: str, count: int | None, model):
    """``split`` of the dataset, images of mixed sizes viewed at ``model``'s input side (as it sees them)."""
    from vitscope.analyze.inputs import model_view_options
    from vitscope.data import load_dataset

    view = {} if args.dataset == "synthetic" else model_view_options(model, args.dataset, args.img_size)
    dataset = load_dataset(args.dataset, args.data_dir, split, download=args.download, **view)
    return dataset.subset(count, seed=args.seed)


def _prepare(args: argparse.Namespace):
    import torch

    from vitscope.models import load
    from vitscope.provenance import resolve_device

    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    model = load(args.model, weights=args.weights, attention=args.attention, num_registers=args.num_registers,
                 img_size=args.img_size, pos_interp=args.pos_interp, pretrained=args.pretrained,
                 download=args.download)
    out = check_output_dir(args.out or f"vitscope-probe-{args.probe}")  # made once the data loads: refused, no folder
    args.model_load = getattr(model, "vitscope_load", None)  # origin, keys, drops, position interpolation: provenance
    return out, device, model, args.label or args.model


def _provenance(args: argparse.Namespace, device, subsets: dict) -> dict:
    from vitscope.provenance import provenance

    config = {k: v for k, v in vars(args).items()
              if k not in ("command", "probe", "debug", "handler", "shared_defaults")}
    return provenance(config=config, seed=args.seed, dataset=args.dataset, dataset_root=args.data_dir,
                      device=device, subsets=subsets)


def _cached(args: argparse.Namespace, model, data: list, compute):
    """Reuse or store the result in the run folder when ``--model`` is one (``vitscope.probes.run_cache``)."""
    from vitscope.data.dense import DenseDataset
    from vitscope.probes.features import dataset_fingerprint, model_fingerprint
    from vitscope.probes.run_cache import cached_probe, dense_fingerprint

    run_dir = args.model if Path(args.model).is_dir() else None
    if run_dir is None:
        return compute()
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "debug", "device", "handler",
                                                                  "shared_defaults", "cache", "batch_size")}
    key = {"model": model_fingerprint(model), "settings": settings,
           "data": [dense_fingerprint(d) if isinstance(d, DenseDataset) else dataset_fingerprint(d) for d in data]}
    result, reused = cached_probe(run_dir, args.probe, key, compute)
    if reused:
        print(f"reused the stored result in {run_dir}/probes")
    return result


def _finish(args: argparse.Namespace, result, out: Path, device, subsets: dict, metrics: list[str]) -> int:
    from vitscope.models import has_random_weights
    from vitscope.report.figures.probes import score_by_layer

    if has_random_weights(args.model, args.weights, args.pretrained) and args.baseline:
        # two random draws of one architecture: the rows differ by the draw alone
        result.settings["random_weights"] = (
            f"{args.model} has random weights itself (drawn under --seed {args.seed}); its '(random init)' row is a "
            "second, independent random draw of the same architecture, so the two rows differ only by the draw")
        print(f"note: {result.settings['random_weights']}")
    for why in result.settings.get("not_measured", {}).values():  # a measure that could not discriminate
        print(f"note: {why}")
    files = result.write(output_dir(out), _provenance(args, device, subsets))
    for metric in metrics:
        if any(r["metric"] == metric for r in result.rows):
            files[metric] = score_by_layer(result.rows, metric, out / f"{metric}_by_layer.png",
                                           title=f"{args.probe} probe: {result.settings['model']}")
    for r in result.rows:
        if r["metric"] == "iou":  # per-class IoU is in the files
            continue
        tag = (r.get("group") or "") + (" +CLS" if r.get("with_cls") else "")
        print(f"{r['model']:>28} layer {r['layer']:>2} {tag:>12} {r['metric']:>18} {r['value']:.4f}  "
              f"(n={r.get('n', '')})")
    print_files(files)
    return 0


def run_image(args: argparse.Namespace) -> int:
    from vitscope.probes import knn_probe, linear_probe
    from vitscope.probes.settings import ImageProbeSettings

    out, device, model, label = _prepare(args)
    train, held = _load(args, "train", args.train_images, model), _load(args, "eval", args.num_images, model)
    common = ImageProbeSettings(pool=args.pool, baseline=args.baseline, label=label, norm=args.norm,
                                batch_size=args.batch_size, device=device, img_size=args.img_size, cache=args.cache,
                                seed=args.seed)
    if args.probe == "linear":
        settings = common.replace(dino_last4=args.dino_last4, fit_options={"epochs": args.epochs})
        result = _cached(args, model, [train, held], lambda: linear_probe(model, train, held, args.layers, settings))
    else:
        settings = common.replace(k=args.k, temperature=args.temperature)
        result = _cached(args, model, [train, held], lambda: knn_probe(model, train, held, args.layers, settings))
    subsets = {"train": train.selection, "eval": held.selection}
    return _finish(args, result, out, device, subsets, [METRICS[args.probe]])


def run_tokens(args: argparse.Namespace) -> int:
    from vitscope.probes import probe_tokens

    probes = [p.strip() for p in args.probes.split(",") if p.strip()]
    out, device, model, label = _prepare(args)
    dataset = _load(args, "eval", args.num_images, model)
    result = _cached(args, model, [dataset], lambda: probe_tokens(
        model, dataset, args.layers, probes=probes, max_tokens=args.max_tokens, norm=args.norm,
        baseline=args.baseline, label=label, batch_size=args.batch_size, device=device, img_size=args.img_size,
        cache=args.cache, seed=args.seed))
    return _finish(args, result, out, device, {"eval": dataset.selection},
                   ["position_top1", "pixels_mse", "class_top1"])


def run_pib(args: argparse.Namespace) -> int:
    from vitscope.analyze.inputs import model_side
    from vitscope.data.boxes import BOX_DATASETS, load_box_dataset
    from vitscope.probes.pib import pib_probe

    out, device, model, label = _prepare(args)
    if args.dataset in BOX_DATASETS:
        side = model_side(model, args.img_size) or 224
        dataset = load_box_dataset(args.dataset, args.data_dir, "eval", image_size=side)
        dataset = dataset.subset(args.num_images, seed=args.seed)
    else:
        dataset = _load(args, "eval", args.num_images, model)
    result = _cached(args, model, [dataset], lambda: pib_probe(
        model, dataset, args.layers, score=args.score, norm=args.norm, baseline=args.baseline, label=label,
        batch_size=args.batch_size, device=device, img_size=args.img_size, cache=args.cache, seed=args.seed))
    return _finish(args, result, out, device, {"eval": dataset.selection}, ["pib"])


def run_pca(args: argparse.Namespace) -> int:
    from vitscope.atomic_io import write_json
    from vitscope.probes.pca import pca_maps
    from vitscope.report.figures.probes import pca_grid

    out, device, model, label = _prepare(args)
    dataset = _load(args, "eval", args.num_images, model)
    layer = args.layers.split(",")[-1]
    result = pca_maps(model, dataset, layer, joint=args.joint, foreground=args.foreground, count=args.count,
                      norm=args.norm, batch_size=args.batch_size, device=device, img_size=args.img_size,
                      cache=args.cache)
    titles = [dataset.classes[int(y)] for y in dataset.labels[: len(result.maps)]]
    files = {"figure": pca_grid(result.images.numpy(), result.maps.numpy(), output_dir(out) / "pca_maps.png",
                                titles)}
    payload = {"schema_version": 1, "kind": "pca", "settings": {"model": label, **result.settings},
               "explained_variance": result.explained.tolist(),
               "provenance": _provenance(args, device, {"eval": dataset.selection})}
    files["json"] = write_json(out / "pca.json", payload)
    print(f"explained variance of components 1-3 at layer {result.settings['layer']}: "
          + ", ".join(f"{v:.3f}" for v in result.explained.mean(0).tolist()))
    print_files(files)
    return 0


def run_dense(args: argparse.Namespace) -> int:
    from vitscope.data.dense_layouts import load_dense
    from vitscope.probes.dense.probe import dense_probe, loss_points_of
    from vitscope.probes.dense.settings import DenseProbeSettings

    loss_points_of(args.loss_points)  # a bad --loss-points is refused before the model loads
    task = "segmentation" if args.probe == "segment" else "depth"
    if not getattr(args, "max_depth", 10.0) > 0:  # before anything loads (a negative bound gave a wrong RMSE)
        raise ValueError(f"--max-depth {args.max_depth} must be a depth in metres > 0, e.g. --max-depth 10")
    out, device, model, label = _prepare(args)
    train = load_dense(args.dataset, args.data_dir, "train", task=task).subset(args.train_images, seed=args.seed)
    held = load_dense(args.dataset, args.data_dir, "eval", task=task).subset(args.num_images, seed=args.seed)
    with_cls = {"no": (False,), "yes": (True,), "both": (False, True)}[args.with_cls]
    sweep = {key: value for key, value in (("lrs", args.lr), ("weight_decays", args.weight_decay)) if value}
    settings = DenseProbeSettings(
        with_cls=with_cls, steps=args.steps, epochs=args.epochs, eigen_crop=getattr(args, "eigen_crop", None),
        max_depth=getattr(args, "max_depth", 10.0), baseline=args.baseline, label=label, norm=args.norm,
        batch_size=args.batch_size, device=device, img_size=args.img_size, cache=args.cache, seed=args.seed,
        size=args.size, crops_per_image=args.crops_per_image, loss_points=args.loss_points,
        held_fraction=args.held_fraction, head_seeds=args.head_seeds, head_batch_size=args.head_batch_size,
        blocks=args.blocks, **sweep, **({"bin_resolution": args.bin_resolution} if task == "depth" else {}))
    result = _cached(args, model, [train, held], lambda: dense_probe(model, train, held, args.layers, settings))
    subsets = {"train": train.settings.get("subset"), "eval": held.settings.get("subset")}
    code = _finish(args, result, out, device, subsets, ["miou", "rmse"])
    _print_dense_summary(result)
    return code


def _print_dense_summary(result) -> None:
    """The best layer, each layer's with-minus-without CLS verdict, and any training note, one line each."""
    best = result.settings.get("best")
    if best:
        cls = " with CLS" if best.get("with_cls") else " without CLS" if best.get("with_cls") is False else ""
        layers = ",".join(str(x) for x in result.settings.get("layers", []))
        print(f"best layer of {result.settings['model']} among {layers}: {best['layer']}{cls} "
              f"({best['metric']} {best['value']:.2f})")
    for claim in result.claims:
        low, high = claim.get("ci95_low"), claim.get("ci95_high")
        interval = f"95 % interval {low:+.2f} to {high:+.2f}" if low is not None else "no interval"
        print(f"claim {claim['claim_id']} layer {claim['layer']}: with CLS minus without {claim['difference']:+.2f} "
              f"({interval}): {claim['verdict']}")
    for note in result.settings.get("notes", []):
        print(f"note: {note}")
