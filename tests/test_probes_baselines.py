"""random_twin reseeds to build its weights and hands every generator back as it found it."""

import pytest
import torch

from vitscope.models import create
from vitscope.probes.baselines import random_twin


def test_random_twin_is_seeded_and_leaves_the_cpu_generator_alone():
    model = create("vit-micro")
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first, second = random_twin(model, seed=5), random_twin(model, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values(),
                                                  strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_random_twin_leaves_the_cuda_generator_alone():
    torch.cuda.manual_seed_all(123)
    before = torch.cuda.get_rng_state()
    random_twin(create("vit-micro"), seed=5)  # torch.manual_seed reseeds CUDA too: fork_rng must restore it
    assert torch.equal(torch.cuda.get_rng_state(), before)
