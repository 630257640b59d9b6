"""Kill/resume stays bit-exact with learnable per-head alpha (its parameters and optimizer state are checkpointed)."""

from pathlib import Path

import torch

from test_train import config, kill_and_resume, launch, wait_for_checkpoint, weights
from vitscope.train import train
from vitscope.train.checkpoint import latest_checkpoint


def test_learned_alpha_run_resumes_to_identical_weights(tmp_path):
    common = {"epochs": 1, "protocol": "baseline", "deterministic": True, "checkpoint_every_steps": 1,
              "model_options": {"depth": 2, "embed_dim": 32, "num_heads": 2, "attention": "entmax:learned"}}
    reference = config(tmp_path, "reference", **common)
    train(reference)
    victim = config(tmp_path, "victim", **common)
    proc = launch(victim, tmp_path)
    wait_for_checkpoint(Path(victim.out), proc, min_step=3)  # of 8
    kill_and_resume(Path(victim.out), proc)
    ours, theirs = weights(Path(victim.out)), weights(Path(reference.out))
    alphas = [k for k in ours if k.endswith("normalizer.alpha_logit")]
    assert len(alphas) == 2 and all(not torch.all(ours[k] == 0) for k in alphas)  # learned, then saved
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert latest_checkpoint(Path(victim.out)) is not None
