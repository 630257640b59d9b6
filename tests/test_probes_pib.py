"""Point-in-Box against planted answers, brute-force chance levels and an independent attention read-out."""

import pytest
import torch

from vitscope.data import synthetic_scenes
from vitscope.metrics.pib import centres_in_boxes, point_in_box
from vitscope.models import create
from vitscope.probes.pib import attention_scores, pib_probe


def test_planted_scores_give_the_planted_answer_and_ties_are_misses():
    grid, size = (4, 4), 8  # 32 px images, patch centres at 4, 12, 20, 28
    boxes = torch.tensor([[0.0, 0.0, 16.0, 16.0], [16.0, 16.0, 32.0, 32.0], [0.0, 0.0, 32.0, 32.0]])
    scores = torch.zeros(3, 16)
    scores[0, 5] = 1.0  # cell (1, 1), centre (12, 12): inside the first box
    scores[1, 0] = 1.0  # cell (0, 0), centre (4, 4): outside the second box
    found = point_in_box(scores, boxes, grid, size)  # the third image ties everywhere
    assert found.pib == pytest.approx(100 / 3) and found.ties == 1 and found.images == 3
    # chance by brute force: fraction of the 16 centres inside each box
    inside = [sum(b[0] <= (c + 0.5) * 8 <= b[2] and b[1] <= (r + 0.5) * 8 <= b[3] for r in range(4) for c in range(4))
              / 16 for b in boxes.tolist()]
    assert found.chance == pytest.approx(100 * sum(inside) / 3)


def test_padded_multi_box_layout():
    boxes = torch.tensor([[[0.0, 0.0, 8.0, 8.0], [24.0, 24.0, 32.0, 32.0]], [[0.0, 0.0, 8.0, 8.0],
                                                                             [float("nan")] * 4]])
    inside = centres_in_boxes(boxes, (4, 4), 8)
    assert inside[0].nonzero().flatten().tolist() == [0, 15] and inside[1].nonzero().flatten().tolist() == [0]


def test_attention_scores_match_an_independent_recomputation():
    torch.manual_seed(0)
    scenes = synthetic_scenes("eval", num_images=6)
    model = create("vit-micro", num_registers=1).eval()
    got = attention_scores(model, scenes, [1, 3], batch_size=4)
    with torch.no_grad():
        x = (scenes.images.float() / 255 - torch.tensor(scenes.mean).view(1, 3, 1, 1)) \
            / torch.tensor(scenes.std).view(1, 3, 1, 1)
        tokens = model.embed(x)
        for i, block in enumerate(model.blocks[:3]):
            if i == 2:
                attn, h = block.attn, block.norm1(tokens)  # softmax(q k^T / sqrt(d)) from the weights alone
                q, k, _ = attn.qkv(h).reshape(*h.shape[:2], 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
                probs = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(dim=-1)
                torch.testing.assert_close(got[3], probs[:, :, 0, 2:].mean(1), atol=1e-5, rtol=1e-5)
            tokens = block(tokens)


def test_planted_high_norm_token_on_the_object_is_found_at_its_layer():
    torch.manual_seed(1)
    scenes = synthetic_scenes("eval", num_images=10)
    model = create("vit-micro").eval()
    boxes = scenes.extras["boxes"]
    centre = ((boxes[:, 1] + boxes[:, 3]) / 2 // 4 * 8 + (boxes[:, 0] + boxes[:, 2]) / 2 // 4).long()

    def plant(_module, _inputs, output):
        output = output.clone()
        output[torch.arange(len(output)), 1 + centre] *= 100.0
        return output

    model.blocks[1].register_forward_hook(plant)
    result = pib_probe(model, scenes, "1,2", score="norm", batch_size=10, cache=False, progress=False)
    assert result.value(2, "norm", "pib") == 100.0
    assert result.value(1, "norm", "pib") < 100.0
    assert 0 < result.value(2, "norm", "pib", model="chance") < 100
    with pytest.raises(ValueError, match="no boxes"):
        pib_probe(model, synthetic_scenes("eval", num_images=2).__class__(
            "x", "eval", scenes.images[:2], scenes.labels[:2], scenes.classes, scenes.mean, scenes.std),
            cache=False, progress=False)
