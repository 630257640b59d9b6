"""The sparse-attention paper's claims (seed 001, arXiv 2605.23868: entmax-1.5 against semantic diffusion).

Setting in the seed: DINO (v1) ViT-S/16, 200 epochs on ImageNet-1k; baselines: the plain CLS model (softmax),
Register-4 and CLS/patch Specialization. The seed gives no operational definition of semantic diffusion or of
Point-in-Box, and no dense-probe protocol beyond "the depth protocol concatenates CLS and patch features".
"""

from __future__ import annotations

from vitscope.claims.registry import Claim, ClaimTest, Paper

DINO_S16 = "DINO (v1) ViT-S/16"
IMAGENET_200 = "ImageNet-1k pretraining, 200 epochs"
DENSE = ("linear dense probe (BN + 1x1 linear on patch tokens, bilinear upsampling) on the last layer; the seed "
         "gives no protocol (crop, epochs, head)")


def _segmentation(cid: str, dataset: str, layout: str, before: float, after: float) -> Claim:
    return Claim(cid, "sparse", f"entmax-1.5 raises {dataset} mIoU over the CLS baseline: {before:.2f} -> {after:.2f}",
                 f"Against the CLS baseline, entmax-1.5 improved {dataset} mIoU from {before:.2f} to {after:.2f} "
                 f"({after - before:+.2f}); segmentation saw the largest gains.",
                 Paper({"CLS baseline": before, "entmax-1.5": after}, dataset, DINO_S16, IMAGENET_200),
                 ClaimTest("difference", effect=round(after - before, 4), unit="mIoU (points)"),
                 measure=f"seg:{layout}",
                 a="entmax15", b="softmax", vitscope=f"{DENSE}; judged on {dataset} alone (the paper's numbers are "
                                                     "per set)")


CLAIMS = (
    Claim("S1", "sparse", "Dense degradation in long training comes from semantic diffusion: global semantics spread "
          "into patch tokens beyond what is locally warranted; high-norm artifacts are symptoms, not the cause",
          "The paper reframes dense degradation as semantic diffusion, an optimisation shortcut in which global "
          "semantics spread through the patch tokens in a locally inconsistent way; high-norm artifacts and outlier "
          "tokens are symptoms rather than the root cause.",
          Paper({}, "ImageNet-1k", DINO_S16, IMAGENET_200), ClaimTest("qualitative"), measure="diffusion",
          vitscope="vitscope's own measures of diffusion (class top-1 from one background patch token; "
                   "background-patch/CLS cosine), both ours: the seed defines none, and none follows training time"),
    Claim("S2-alignment", "sparse", "Shallow layers keep better spatial alignment (higher Point-in-Box) than deep "
          "layers",
          "Point-in-Box and layer-wise probing show that shallow layers keep better spatial alignment (higher PiB).",
          Paper({}, "", DINO_S16 + " (the baseline model)", IMAGENET_200),
          ClaimTest("direction", sign=+1, unit="PiB (%) or position top-1"), measure="spatial_alignment", a="shallow",
          b="deep",
          vitscope="Point-in-Box with vitscope's class-evidence score (each patch's logit of the image's class under "
                   "a linear patch-token classifier; docs/definitions.md; the seed defines no score) and a position "
                   "probe; shallow (token layer L/4) minus deep (the last layer), paired by image"),
    Claim("S2-semantics", "sparse", "Deep layers carry more meaning than shallow ones (semantic richness)",
          "Shallow layers lack the semantic richness of the deeper layers.",
          Paper({}, "", DINO_S16 + " (the baseline model)", IMAGENET_200),
          ClaimTest("direction", sign=+1, unit="top-1 or mIoU"), measure="semantics", a="deep", b="shallow",
          vitscope="class from single patch tokens and segmentation mIoU, deep (the last layer) minus shallow "
                   "(token layer L/4)"),
    Claim("S3", "sparse", "The CLS token holds complementary global information: concatenated to the patch features "
          "it helps dense prediction substantially",
          "The [CLS] token keeps complementary global information which, combined with the patch features, helps "
          "dense prediction substantially; global context should be kept, but managed better.",
          Paper({}, "", DINO_S16, IMAGENET_200),
          ClaimTest("direction", sign=+1, unit="mIoU (points)"), measure="miou", a="with CLS", b="without CLS",
          vitscope="the dense probe (optimiser steps, a learning-rate and weight-decay sweep on held-out training "
                   "images, head seeds) with the same layer's CLS concatenated to every patch minus without, per "
                   "layer, its interval a jackknife over evaluation images plus the seed spread; 'substantially' is "
                   "not a number, so the direction is judged"),
    Claim("S4", "sparse", "entmax-1.5 raises ImageNet linear-probe top-1 over the CLS baseline: 69.50 -> 70.06",
          "The entmax-1.5 variant reached 70.06 % top-1 in ImageNet linear probing, slightly above the CLS baseline "
          "(69.50 %).",
          Paper({"CLS baseline": 69.50, "entmax-1.5": 70.06}, "ImageNet-1k", DINO_S16, IMAGENET_200),
          ClaimTest("difference", effect=round((70.06 - 69.50) / 100, 6), unit="top-1"), measure="linear_top1",
          a="entmax15", b="softmax",
          vitscope="logistic regression with a learning-rate and weight-decay sweep on DINO's ViT-S protocol "
                   "(the last four blocks' CLS tokens concatenated; every preset), the last layer's CLS alone as a "
                   "second reading; the seed names no protocol"),
    Claim("S4-reg4", "sparse", "entmax-1.5 is above Register-4 on the ImageNet linear probe",
          "entmax-1.5 was also above the other variants, Register-4 among them, on the linear probe.",
          Paper({}, "ImageNet-1k", DINO_S16, IMAGENET_200),
          ClaimTest("direction", sign=+1, unit="top-1"), measure="linear_top1", a="entmax15", b="softmax+reg4",
          vitscope="as S4, against the softmax model with 4 registers"),
    Claim("S4-specialization", "sparse", "entmax-1.5 is above CLS/patch Specialization on the ImageNet linear probe",
          "entmax-1.5 was also above the other variants, Specialization among them, on the linear probe.",
          Paper({}, "ImageNet-1k", DINO_S16, IMAGENET_200),
          ClaimTest("direction", sign=+1, unit="top-1"), measure="linear_top1", a="entmax15", b="specialization",
          vitscope="as S4, against vitscope's Specialization condition: the seed names it without describing it; "
                   "vitscope reads it as the layer specialization of arXiv 2602.08626 (the CLS token's own "
                   "parameters in every LayerNorm and in the first third of the qkv projections; "
                   "models/own/specialization.py)"),
    _segmentation("S5", "VOC", "voc", 42.80, 48.78),
    _segmentation("S6", "ADE20K", "ade20k", 19.85, 21.97),
    _segmentation("S7", "Cityscapes", "cityscapes", 36.79, 37.87),
    Claim("S8-reg4", "sparse", "entmax-1.5 beats Register-4 on all three segmentation sets",
          "It outperformed both Register-4 and CLS/patch Specialization on all three segmentation benchmarks.",
          Paper({}, "VOC, ADE20K, Cityscapes", DINO_S16, IMAGENET_200),
          ClaimTest("direction", sign=+1, unit="mIoU (points)"), measure="seg", a="entmax15", b="softmax+reg4",
          vitscope=f"{DENSE}; on every segmentation set the run measures, reproduced when every set is"),
    Claim("S8-specialization", "sparse", "entmax-1.5 beats CLS/patch Specialization on all three segmentation sets",
          "It outperformed both Register-4 and CLS/patch Specialization on all three segmentation benchmarks.",
          Paper({}, "VOC, ADE20K, Cityscapes", DINO_S16, IMAGENET_200),
          ClaimTest("direction", sign=+1, unit="mIoU (points)"), measure="seg", a="entmax15", b="specialization",
          vitscope=f"{DENSE}; on every segmentation set the run measures, reproduced when every set is"),
    Claim("S9", "sparse", "entmax-1.5 lowers depth RMSE by 0.004-0.005 on NYUv2, SUN RGB-D and KITTI, with a probe "
          "that concatenates CLS and patch features",
          "Depth gains were moderate but consistent on NYUv2, SUN RGB-D and KITTI (RMSE lower by 0.004-0.005); the "
          "authors note that the depth probe already concatenates [CLS] and patch features, which may partly "
          "compensate for semantic diffusion and make gains harder.",
          Paper({"RMSE change (low)": -0.004, "RMSE change (high)": -0.005}, "NYUv2, SUN RGB-D, KITTI", DINO_S16,
                IMAGENET_200),
          ClaimTest("difference", effect=-0.0045, unit="RMSE (m)"), measure="depth_rmse_with_cls", a="entmax15",
          b="softmax",
          vitscope="DINOv2's linear depth head on patch tokens with CLS concatenated (as the seed's protocol), at "
                   "the last layer, judged on NYUv2 (vitscope reads no SUN RGB-D or KITTI layout); the seed gives no "
                   "other detail"),
    Claim("S10", "sparse", "PCA maps of patch features are cleaner and more spatially coherent with entmax-1.5, with "
          "better foreground/background separation",
          "PCA views of the patch features show that entmax-1.5 gives cleaner, spatially more coherent feature maps "
          "with better foreground/background separation than the reference models.",
          Paper({}, "", DINO_S16, IMAGENET_200), ClaimTest("qualitative"), measure="pca",
          vitscope="the first three components as RGB (probes/pca.py), shown side by side; no statistic"),
    Claim("S11", "sparse", "entmax-1.5 gives exact zeros while keeping global connectivity and adding no parameters",
          "Unlike softmax, entmax-1.5 is a sparse mapping that can give exact zeros to low-value interactions; it "
          "keeps global connectivity (unlike local windows) and adds no parameters, registers or branches.",
          Paper({}, "", DINO_S16, "by construction"),
          ClaimTest("census", expect=True, every=True, unit="fraction of exact zeros"), measure="attention_zeros",
          a="entmax15 runs", b="softmax (0 by construction)",
          vitscope="a property each run shows or not: every entmax-1.5 run must give exactly zero attention "
                   "probabilities (a fraction above 0); softmax's fraction is 0 by construction. The fractions and "
                   "their difference from 0 are shown beside, not judged over seeds"),
    Claim("S12", "sparse", "Scope: only DINO (v1) ViT-S/16 was evaluated; larger models and longer schedules were not",
          "The authors limit their claims to DINOv1 ViT-S/16; larger models and longer pretraining schedules are not "
          "evaluated, and sparse attention is offered as evidence for selective token interaction, not as a final "
          "architecture.",
          Paper({}, "ImageNet-1k", DINO_S16, IMAGENET_200), ClaimTest("qualitative"),
          vitscope="every verdict says the model and scale it holds for"),
)
