"""The locality study's paper-scale command and our estimate of its cost (read by the report's opening)."""

from __future__ import annotations

# Our estimates, not measurements: the H200 figure from the training engine's 20,000 images/s target, the CPU one
# from the measured step time (docs/locality-study.md); each names its machine.
PAPER_SCALE = ("vitscope study locality --preset paper --dataset cifar100 --data-dir DATA/cifar100_jpg.tar.gz "
               "--conditions ablation --seeds 0,1,2 --pack auto --out locality-paper",
               "with vitscope's 200-epoch schedule (the seed states none): about 4 hours for the 24 runs (8 "
               "conditions x 3 seeds) on one H200 GPU, about 10 minutes per run; "
               "on this project's 2-core CPU machine about 26 hours per run; estimates")
