"""The locality paper's claims (seed 000, arXiv 2605.16390: the training protocol and spatial locality).

Setting in the seed: a compact ViT (depth 8, width 192, 8 heads, about 2.4M parameters, internal dropout 0) trained
from scratch on CIFAR-10, CIFAR-100 and Tiny-ImageNet, every image as 8 x 8 = 64 patches; Baseline = random crop +
flip + cross-entropy, Modern = AutoAugment (ColorJitter on Tiny-ImageNet) + CutMix + label smoothing; one
initialisation seed; the 8-way ablation on CIFAR-100 only. The seed does not state the epochs, optimiser, batch size,
how MAD is normalised, whether CLS is excluded, which layers are "early", or the CutMix and label-smoothing settings.
"""

from __future__ import annotations

from vitscope.claims.registry import Claim, ClaimTest, Paper

COMPACT = "compact ViT (depth 8, width 192, 8 heads, ~2.4M parameters, 64 patches), from scratch"
SCALE = "one initialisation seed; epochs, optimiser and batch size not stated in the seed"
ALL_THREE = "CIFAR-10, CIFAR-100 and Tiny-ImageNet"
ABLATION = "CIFAR-100 (the ablation: all 8 combinations of the three components)"
MAD_READING = ("MAD normalised by the grid's largest patch distance (uniform attention: 0.4178 on 8 x 8), rows "
               "renormalised over patch keys with CLS excluded, 'early' = the first quarter of the layers; the seed "
               "fixes none of these (the results also give MAD with CLS counted at distance 0, and early = layers "
               "1-2)")
# No independent effect, in normalised MAD: the study's own "measurably local" margin
# (studies.locality.verdicts.LOCAL_MARGIN), about a quarter of the paper's CutMix gap (0.210 - 0.024 = 0.186)
EQUIVALENCE_MARGIN = 0.05
# The seed gives the accuracy gains as "about 6-7 points"; 6.5, the middle, is the effect the difference test uses
GAIN = "gain (points; the seed: about 6-7)"

def _alone_no_effect(component: str, name: str, in_sentence: str) -> Claim:
    """L5 for one component: Baseline + it alone gives about Baseline's MAD (an equivalence)."""
    return Claim(f"L5-{component}", "locality", f"{name} alone has no effect on locality: Baseline + {in_sentence} "
                 "gives MAD values almost identical to Baseline's",
                 f"{name} showed no independent effect on locality: adding it alone to Baseline gave MAD values "
                 "almost identical to Baseline's.",
                 Paper({}, ABLATION, COMPACT, SCALE),
                 ClaimTest("equivalence", margin=EQUIVALENCE_MARGIN, unit="normalised MAD",
                           margin_why="ours: the seed gives no margin; 0.05 is the study's 'measurably local' margin, "
                                      "about a quarter of the paper's CutMix gap"),
                 measure="min_early_mad", a=f"baseline+{component}", b="baseline", vitscope=MAD_READING)


CLAIMS = (
    Claim("L1", "locality", "Modern gives more local early-layer attention than Baseline, on all three datasets",
          "Across the three datasets, the Modern protocol consistently produced more local and more concentrated "
          "attention in the first layers than the Baseline protocol.",
          Paper({}, ALL_THREE, COMPACT, SCALE),
          ClaimTest("direction", sign=-1, unit="normalised MAD"), measure="min_early_mad", a="modern", b="baseline",
          vitscope="minimum early-layer MAD per seed; " + MAD_READING),
    Claim("L1-entropy", "locality", "Modern gives more concentrated (lower-entropy) early-layer attention than "
          "Baseline, on all three datasets",
          "Modern attention in the first layers is more concentrated than Baseline's (lower normalised entropy), "
          "on all three datasets.",
          Paper({}, ALL_THREE, COMPACT, SCALE),
          ClaimTest("direction", sign=-1, unit="normalised entropy"), measure="early_entropy", a="modern", b="baseline",
          vitscope="mean normalised entropy of the early-layer heads per seed (divided by log of the number of patch "
                   "keys; the seed states no base or key count)"),
    Claim("L2", "locality", "On CIFAR-100 the minimum MAD falls from 0.316 (Baseline) to 0.008 (Modern)",
          "The effect was clearest on CIFAR-100, where the minimum MAD fell from 0.316 under Baseline to 0.008 under "
          "Modern.",
          Paper({"Baseline": 0.316, "Modern": 0.008}, "CIFAR-100", COMPACT, SCALE),
          ClaimTest("difference", effect=0.008 - 0.316, unit="normalised MAD"), measure="min_early_mad", a="modern",
          b="baseline", vitscope="Modern minus Baseline, one value per seed: the smallest head MAD of the early "
                                 "layers (the seed says 'minimum MAD' in a comparison of the first layers, without "
                                 "the layers it spans); " + MAD_READING),
    Claim("L3", "locality", "In MAD-entropy space Baseline heads sit uniformly in the high-distance, high-entropy "
          "region, while Modern moves the early layers to low distance and low entropy and the deeper layers back "
          "to global attention, like a CNN's hierarchy",
          "In the MAD-entropy plane, Baseline spreads the heads evenly over the far, diffuse region; Modern moves the "
          "first layers towards near, concentrated attention before the deeper layers settle on global attention, "
          "mimicking a CNN's hierarchy.",
          Paper({}, "CIFAR-100", COMPACT, SCALE), ClaimTest("qualitative"), measure="behaviour_space",
          vitscope="the report's MAD-entropy figure: every head of every condition, coloured by layer "
                   "(report/figures/locality.py); no statistic"),
    Claim("L4", "locality", "CutMix alone decides locality: every condition with CutMix has minimum MAD <= 0.024, "
          "every condition without it >= 0.210",
          "The ablation found CutMix to be the only factor that decides whether spatial locality appears: every "
          "condition with CutMix (Modern, -AutoAugment, -Label Smoothing, +CutMix) had a minimum MAD of at most "
          "0.024, and every condition without it (Baseline, -CutMix, +AutoAugment, +Label Smoothing) stayed at 0.210 "
          "or more.",
          Paper({"with CutMix (max)": 0.024, "without CutMix (min)": 0.210}, ABLATION, COMPACT, SCALE),
          ClaimTest("separation", upper=0.024, lower=0.210, unit="normalised MAD"), measure="min_early_mad",
          a="conditions with cutmix", b="conditions without cutmix",
          vitscope="every (with, without) pair of conditions compared over seeds; separated when each pair's "
                   "difference reaches half the paper's gap (0.093); the paper's absolute bounds are reported beside "
                   "(they depend on the MAD reading); " + MAD_READING),
    _alone_no_effect("autoaugment", "AutoAugment", "AutoAugment"),
    _alone_no_effect("labelsmoothing", "Label smoothing", "label smoothing"),
    Claim("L6-cutmix", "locality", "CutMix raises test accuracy over Baseline by about 6-7 points",
          "CutMix and AutoAugment each improved test accuracy over Baseline by similar amounts (about 6-7 "
          "percentage points).",
          Paper({GAIN: 6.5}, ABLATION, COMPACT, SCALE),
          ClaimTest("difference", effect=0.065, unit="top-1"), measure="accuracy", a="baseline+cutmix", b="baseline",
          vitscope="top-1 on the evaluation split, Baseline + CutMix minus Baseline, one value per seed"),
    Claim("L6-autoaugment", "locality", "AutoAugment raises test accuracy over Baseline by about 6-7 points",
          "CutMix and AutoAugment each improved test accuracy over Baseline by similar amounts (about 6-7 "
          "percentage points).",
          Paper({GAIN: 6.5}, ABLATION, COMPACT, SCALE),
          ClaimTest("difference", effect=0.065, unit="top-1"), measure="accuracy", a="baseline+autoaugment",
          b="baseline",
          vitscope="top-1 on the evaluation split, Baseline + AutoAugment minus Baseline, one value per seed"),
    Claim("L7", "locality", "Accuracy gains do not imply a change of attention: AutoAugment gains accuracy without "
          "locality, CutMix gains both",
          "Gains in accuracy do not necessarily come with changes in the attention's structure: AutoAugment and "
          "CutMix reach similar gains through very different internal mechanisms (more varied inputs against local "
          "feature extraction).",
          Paper({}, ABLATION, COMPACT, SCALE), ClaimTest("qualitative"),
          vitscope="follows from L5-autoaugment with L6-autoaugment (and L4 with L6-cutmix); not judged on its own"),
    Claim("L8", "locality", "Mechanism (a hypothesis): CutMix forces classification from partial regions, which "
          "pushes the early layers to local features",
          "The authors hypothesise that CutMix induces locality by forcing correct classification from only partial "
          "regions of the image, which pushes the first layers to extract discriminative information from local "
          "neighbourhoods, a CNN-like inductive bias.",
          Paper({}, "", COMPACT, "a hypothesis, not a measurement"), ClaimTest("qualitative"),
          vitscope="not implemented: testing it needs control conditions (e.g. Cutout, same-image CutMix)"),
    Claim("L9", "locality", "The training protocol alone induces locality from scratch on 50k-100k images, without "
          "large-scale pretraining; CutMix is an alternative, sufficient factor to data scale",
          "The paper claims to show that training protocols can induce spatial locality in ViTs trained from "
          "scratch on mid-sized datasets (50,000-100,000 images), challenging the idea that it needs large-scale "
          "pretraining or architectural constraints; pressure to classify partial regions (CutMix) is an "
          "alternative, sufficient factor to data size (Raghu et al. had found data size decisive).",
          Paper({}, ALL_THREE, COMPACT, SCALE), ClaimTest("qualitative"),
          vitscope="the whole study; judged through L1, L2 and L4"),
)
