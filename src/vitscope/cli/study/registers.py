"""``vitscope study registers``: high-norm tokens and registers across architectures (arXiv 2603.25803)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vitscope.cli.options import add_shared, positive_int
from vitscope.cli.out_folders import output_dir
from vitscope.run_folder import writer_lock


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r} must be comma-separated integers, e.g. 0,1,4,16") from None


def add_parser(studies) -> None:
    """The ``registers`` subcommand of ``vitscope study``."""
    reg = studies.add_parser("registers", help="high-norm (artifact) tokens and registers (arXiv 2603.25803)")
    reg.add_argument("--preset", default="demo", choices=["demo", "demo-dino", "paper", "none"],
                     help="demo: vit-micro 0 vs 4 registers + random timm ViT/Swin/PVT-v2 + planted outliers; "
                          "demo-dino: vit-micro 0 vs 4 registers, supervised and DINO; "
                          "paper: timm models with your weights (--weights-dir); none: only what you name")
    reg.add_argument("--model", action="append", default=[], metavar="LABEL=SPEC[@WEIGHTS]",
                     help="measure this model too (repeatable): a run folder, checkpoint, preset or timm:NAME "
                          "(default: none)")
    reg.add_argument("--img-size", type=positive_int, default=None, metavar="N",
                     help="input side in pixels for every --model (its position table resampled; a multiple of its "
                          "patch size), e.g. 224 for DINOv2's patch-14 models, whose own default is 518 "
                          "(default: each model's own size); photos of mixed sizes are viewed at N first (default "
                          "224; shorter side resized, centre crop), each model then at its own side")
    reg.add_argument("--weights-dir", default=None, help="folder of <timm name>.safetensors for --preset paper "
                                                                    "(default: none)")
    reg.add_argument("--registers", default=None, help="register counts to train, e.g. 0,1,4,16 (none: ''; "
                                                                  "default: the preset's; --preset none: none)")
    reg.add_argument("--train-model", default=None, metavar="PRESET",
                     help="the vitscope preset trained with registers (default: vit-micro for demo, else vit-compact)")
    reg.add_argument("--objectives", default=None, metavar="LIST",
                     help="training objectives, each trains every register count: supervised, dino or "
                          "supervised,dino (default: the preset's)")
    reg.add_argument("--dino-config", default=None, metavar="NAME|FILE",
                     help="the DINO recipe (a shipped config such as dino-demo, or a file; default: the preset's)")
    reg.add_argument("--dataset", default="synthetic", help="dataset name (synthetic needs no directory)")
    reg.add_argument("--data-dir", default=None, help="dataset folder or archive (default: none, for synthetic)")
    reg.add_argument("--seeds", default=None, help="comma-separated training seeds (default: --seed)")
    reg.add_argument("--epochs", type=int, default=None, help="training epochs (default: the preset's)")
    reg.add_argument("--train-images", type=int, default=None, help="train on a sample of N training images "
                                                                           "(default: the preset's)")
    reg.add_argument("--eval-images", type=int, default=None, help="measure on a sample of N evaluation images "
                                                                          "(default: the preset's)")
    reg.add_argument("--thresholds", default="auto,percentile:98,absolute:150",
                     help="high-norm threshold modes; the first drives location, attention and probes (auto: the "
                          "separate-mode test's split at the largest gap)")
    reg.add_argument("--detect-layer", default="last", help="token layer whose patch tokens set the thresholds")
    reg.add_argument("--probe-layers", default=None, help="token layers to probe, e.g. 0,4,last (default: preset's)")
    reg.add_argument("--no-probes", action="store_true", help="skip the token probes")
    reg.add_argument("--plant", default=None, metavar="LABEL:LAYER",
                     help="also measure model LABEL with 2 planted outliers per image appearing at token layer LAYER "
                          "(default: the preset's)")
    reg.add_argument("--launcher", default="local", choices=["local", "slurm"],
                     help="slurm: one submitit job per training run; needs the 'slurm' extra")
    add_shared(reg, decided_by={"batch_size": "the preset's"}, device="auto", batch_size=None, seed=0,
               out="vitscope-registers")
    reg.set_defaults(handler=run_registers)


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [n for n in names if n not in ("supervised", "dino")]
    if unknown or not names:
        raise ValueError(f"--objectives {text!r} must list supervised and/or dino, e.g. --objectives supervised,dino")
    return names


def _plant(text: str | None) -> dict | str | None:
    if text is None:
        return "preset"
    label, sep, layer = text.rpartition(":")
    if not sep or not label or not layer.isdigit() or int(layer) < 1:
        raise ValueError(f"--plant {text!r} needs LABEL:LAYER with a token layer >= 1, e.g. --plant reg0:2")
    return {"model": label, "layer": int(layer) - 1, "count": 2, "scale": 20.0}


def run_registers_study(**options) -> Path:
    from vitscope.report.registers.page import build_report
    from vitscope.studies.registers.study import RegistersStudy, run

    study = RegistersStudy(**options)  # checks the options
    # then the folder is made, and locked until the report is written (one writer per study folder)
    with writer_lock(output_dir(study.out), what="study folder"):
        run(study)
        return build_report(study.out)


def run_registers(args: argparse.Namespace) -> int:
    from vitscope.cli.analyze import detect_layer_index
    from vitscope.studies.models import parse_model_entries
    from vitscope.studies.registers.census import CensusSettings

    detect_layer_index(args.detect_layer)  # one numbering with analyze norms: 1..L or last
    detect = args.detect_layer if args.detect_layer == "last" else int(args.detect_layer) \
        if args.detect_layer.isdigit() else args.detect_layer
    census = CensusSettings(thresholds=[t for t in args.thresholds.split(",") if t.strip()], detect_layer=detect,
                            img_size=args.img_size, **({"batch_size": args.batch_size} if args.batch_size else {}))
    probes = None
    if args.no_probes or args.probe_layers:
        from vitscope.studies.registers.presets import DEMO_PROBES

        probes = dict(DEMO_PROBES) if args.preset.startswith("demo") else {}
        probes |= {"enabled": not args.no_probes} | ({"layers": args.probe_layers} if args.probe_layers else {})
    report = run_registers_study(
        preset=args.preset, dataset=args.dataset, data_dir=args.data_dir,
        registers=None if args.registers is None else _ints(args.registers, "--registers"),
        model=args.train_model, objectives=_names(args.objectives), dino_config=args.dino_config,
        seeds=_ints(args.seeds, "--seeds") if args.seeds else [args.seed],
        models=parse_model_entries(args.model, img_size=args.img_size), weights_dir=args.weights_dir,
        plant=_plant(args.plant),
        census=census, probes=probes, epochs=args.epochs, batch_size=args.batch_size,
        train_images=args.train_images, eval_images=args.eval_images, device=args.device, out=args.out,
        launcher=args.launcher)
    print(f"report: {report}")
    return 0


def registers_demo(out: Path, device: str, seed: int, batch_size: int | None) -> Path:
    """The registers study's demo preset on synthetic scenes."""
    from vitscope.cli.demo import demo_seeds

    return run_registers_study(preset="demo", seeds=demo_seeds(seed), batch_size=batch_size, device=device,
                               out=str(out))
