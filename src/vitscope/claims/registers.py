"""The registers reassessment's claims (seed 004, arXiv 2603.25803, after Darcet et al. arXiv 2309.16588).

Setting in the seed: a lay summary of a reassessment of Darcet et al. across architectures and sizes (pretrained
models; which ones, how high-norm tokens were detected and at what threshold are not in the seed). It gives no
number anywhere: every claim here is a direction, an existence or an equivalence, and the margins are vitscope's.
"""

from __future__ import annotations

from vitscope.claims.registry import Claim, ClaimTest, Paper

ACROSS = "pretrained models across architectures and sizes (not named in the seed)"
NO_NUMBER = "no number in the seed"
# A classification change this small counts as none (top-1): vitscope's, the seed gives none
CLASSIFICATION_MARGIN = 0.01
MARGIN_WHY = "vitscope's: the seed gives no margin; one top-1 point"
HIGH_VS_REST = ("the high-norm patch tokens (above the census's first threshold, by default the split of the "
                "separate-mode test) against the other patch tokens of the same images, at each model's deepest layer "
                "whose own norms have a separate mode")
STAND_IN = ("; on a model without a separate mode, a stand-in group (e.g. each image's top-k norms) may be measured, "
            "labelled as such, never as artifacts")


CLAIMS = (
    Claim("R1", "registers", "High-norm tokens are not confined to large models: some smaller models grow them "
          "too, depending on the architecture",
          "The original study thought only large, advanced models produce the high-norm tokens; the reassessment "
          "finds that some smaller models do too, and that whether they do depends on how the model is built.",
          Paper({}, "", ACROSS, NO_NUMBER), ClaimTest("census", expect=True), measure="separate_mode", a="small models",
          vitscope="a model has high-norm tokens when some layer's own patch-token norms have a separate high mode "
                   "(the largest gap in the upper tail, metrics/high_norm.py; the seed names no test or threshold); "
                   "small is under 250M parameters (vitscope's line; ViT-L is about 300M; the seed names no size); "
                   "planted and random models never count, and 'none has them' needs pretrained models of two or "
                   "more families"),
    Claim("R2", "registers", "DINO (v1) never grows high-norm tokens, whatever its size",
          "One kind of model, DINO, never produces them, however large it gets, and does not need registers.",
          Paper({}, "", "DINO (v1) models of several sizes", NO_NUMBER), ClaimTest("census", expect=False),
          measure="separate_mode", a="DINO (v1) models", family="dino",
          vitscope="the same separate-mode test on every DINO (v1) model measured (given with DINO weights, or "
                   "trained here with the DINO objective); 'none has them' needs a pretrained one"),
    Claim("R3", "registers", "In standard ViTs high-norm tokens sit on redundant background patches and store global "
          "information there",
          "The original idea, that the tokens appear on dull, repetitive parts of the image (sky, a blank wall) "
          "and store global information there, largely holds for standard models.",
          Paper({}, "", "standard (plain) ViTs", NO_NUMBER), ClaimTest("direction", sign=-1,
                                                                  unit="local variance (relative)"),
          measure="patch_local_variance", a="high-norm", b="other patches", family="plain",
          vitscope="local pixel variance of the patch under each token, " + HIGH_VS_REST + "; the share of "
                   "high-norm tokens on background (masks or boxes) is measured, not judged"),
    Claim("R4-texture", "registers", "In Swin the high-norm tokens carry local detail (texture): better pixel "
          "reconstruction than the quiet tokens, the reverse of a standard ViT",
          "In Swin the loud tokens carry the detail (the texture of fur or leaves) while the quiet ones carry the "
          "location: the exact opposite of the standard model.",
          Paper({}, "", "Swin", NO_NUMBER), ClaimTest("direction", sign=-1, unit="pixel MSE"), measure="pixels_mse",
          a="high-norm", b="other patches", family="swin",
          vitscope="pixel reconstruction error (lower is better) of a linear probe per token group, per stage"),
    Claim("R4-position", "registers", "In Swin the quiet tokens carry position better than the high-norm ones",
          "In Swin the loud tokens carry the detail while the quiet ones carry the location: the exact opposite of "
          "the standard model.",
          Paper({}, "", "Swin", NO_NUMBER), ClaimTest("direction", sign=-1, unit="position top-1"),
          measure="position_top1", a="high-norm", b="other patches", family="swin",
          vitscope="position probe top-1 per token group, per stage"),
    Claim("R5-position", "registers", "In PVT the high-norm tokens know where things are (position)",
          "In PVT the loud tokens are map readers who know exactly where things are, but are very poor at describing "
          "their shape.",
          Paper({}, "", "PVT", NO_NUMBER), ClaimTest("direction", sign=+1, unit="position top-1"),
          measure="position_top1", a="high-norm", b="other patches", family="pvt",
          vitscope="position probe top-1 per token group, per stage (vitscope's reading of 'know where things are')"),
    Claim("R5-shape", "registers", "In PVT the high-norm tokens describe shape poorly (worse pixel reconstruction)",
          "In PVT the loud tokens know where things are but are very poor at describing their shape.",
          Paper({}, "", "PVT", NO_NUMBER), ClaimTest("direction", sign=+1, unit="pixel MSE"), measure="pixels_mse",
          a="high-norm", b="other patches", family="pvt",
          vitscope="pixel reconstruction error per token group (vitscope's reading of 'shape')"),
    Claim("R6", "registers", "Registers remove the high-norm tokens in models that had them; attention maps become "
          "clean",
          "Adding registers to the models that had the artifacts made the noise disappear and the picture clear.",
          Paper({}, "", "models with artifacts", NO_NUMBER), ClaimTest("direction", sign=-1,
                                                                  unit="fraction of high-norm tokens"),
          measure="separate_mode_fraction", a="with registers", b="without registers",
          vitscope="the fraction of patch tokens in the separate high mode (0 without one), same architecture with "
                   "and without registers: pairs trained here (per seed) or given pairs such as DINOv2 with and "
                   "without reg4 (per image); needs the model without registers to have a mode; the attention maps "
                   "are shown, not judged"),
    Claim("R7", "registers", "Registers do not improve classification: the models were already right without them",
          "Adding registers did not make the models better at classification: they already got the answer right "
          "without them; registers only cleaned up how they reason.",
          Paper({}, "", "models with artifacts", NO_NUMBER),
          ClaimTest("equivalence", margin=CLASSIFICATION_MARGIN, margin_why=MARGIN_WHY, unit="top-1"),
          measure="top1", a="with registers", b="without registers",
          vitscope="top-1 (the models' own head, or a linear probe for given backbones), with minus without "
                   "registers, two one-sided tests"),
    Claim("R8-local", "registers", "High-norm tokens cannot reconstruct their patch (local texture)",
          "The loud tokens are very bad at describing their own piece (they cannot rebuild its texture).",
          Paper({}, "", "standard (plain) ViTs", NO_NUMBER), ClaimTest("direction", sign=+1, unit="pixel MSE"),
          measure="pixels_mse", a="high-norm", b="other patches", family="plain",
          vitscope="pixel reconstruction error of a linear probe, " + HIGH_VS_REST + STAND_IN),
    Claim("R8-global", "registers", "High-norm tokens predict the image class well (global information)",
          "The loud tokens are surprisingly good at telling what the whole image is, which confirms they store the "
          "big picture there.",
          Paper({}, "", "standard (plain) ViTs", NO_NUMBER), ClaimTest("direction", sign=+1, unit="class top-1"),
          measure="class_top1", a="high-norm", b="other patches", family="plain",
          vitscope="image class from a single token by a linear probe, " + HIGH_VS_REST + STAND_IN),
    Claim("R9", "registers", "Adding the high-norm tokens to the classifier adds little beyond CLS",
          "Using the loud tokens to help guess the image label did not help much: the [CLS] token already carried "
          "the global information, so they only repeated what was known.",
          Paper({}, "", "standard (plain) ViTs", NO_NUMBER),
          ClaimTest("equivalence", margin=CLASSIFICATION_MARGIN, margin_why=MARGIN_WHY, unit="top-1"),
          measure="class_top1", a="CLS + high-norm tokens", b="CLS", family="plain",
          vitscope="a linear image classifier on CLS concatenated with the mean of the image's high-norm tokens, "
                   "minus one on CLS alone, both fitted and scored on the same images (those with a high-norm "
                   "token), paired per held-out image (probes/cls_with_tokens.py)" + STAND_IN),
    Claim("R10", "registers", "Registers are not a universal fix: each architecture has to be understood first",
          "Registers are a good tool to clean up visual noise in standard models, but the fix cannot be copied to "
          "every kind of model: in hierarchical models the loud tokens may carry the most important details.",
          Paper({}, "", ACROSS, NO_NUMBER), ClaimTest("qualitative"),
          vitscope="every registers finding is judged per family (plain ViT, DINO, Swin, PVT)"),
)
