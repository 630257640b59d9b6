"""Progress block by block: an instrument asked for progress shows its memory plan, then an image bar that moves
after every block (fractions of a batch) and says which block finished; asked for none, it prints nothing. Also the
recorders' memory options: tokens kept after the final norm only, or none of its output, and attention handed to
accumulators with nothing kept."""

import re
import time

import pytest
import torch

from vitscope.analyze.norms import measure_norms
from vitscope.data import synthetic_scenes
from vitscope.models import create
from vitscope.probes.features import extract_features
from vitscope.record import block_progress, record_attention, record_tokens


def slow_blocks(model, seconds=0.15):
    """Each block takes longer than tqdm's 0.1 s between redraws, as a ViT-g's blocks do: every update is drawn."""
    return [block.register_forward_hook(lambda *_: time.sleep(seconds)) for block in model.blocks]


def shown_counts(text: str, total: int) -> list[str]:
    return re.findall(rf"\| ([0-9.]+)/{total} img", text)


def test_an_instrument_asked_for_progress_moves_block_by_block(capsys):
    model = create("vit-micro").eval()
    depth = len(model.blocks)
    hooks = slow_blocks(model)
    measure_norms(model, synthetic_scenes("eval", num_images=6), batch_size=3, progress=True)
    for hook in hooks:
        hook.remove()
    err = capsys.readouterr().err
    assert re.search(r"^norms: batch 3, memory about .* within ", err, flags=re.MULTILINE)
    counts = shown_counts(err, 6)
    within_first = [f"{3 * b / depth:.2f}".rstrip("0").rstrip(".") for b in range(1, depth)]
    within_second = [f"{3 + 3 * b / depth:.2f}".rstrip("0").rstrip(".") for b in range(1, depth)]
    for count in within_first + ["3"] + within_second + ["6"]:
        assert count in counts, (count, counts)
    assert counts.index(within_first[0]) < counts.index("3") < counts.index(within_second[-1]) < counts.index("6")
    assert f"block {depth - 1}/{depth}" in err
    assert not any(h for m in model.modules() for h in (m._forward_hooks, m._forward_pre_hooks))


def test_no_progress_asked_prints_nothing(capsys):
    model = create("vit-micro").eval()
    extract_features(model, synthetic_scenes("eval", num_images=4), "last", batch_size=2, cache=False,
                     progress=False)
    assert capsys.readouterr().err == ""


def test_batches_without_blocks_still_count(capsys):
    progress_model = torch.nn.Linear(3, 3)  # no blocks: the bar moves by batches only
    with block_progress(progress_model, total=4, desc="plain") as progress:
        for _ in range(2):
            progress_model(torch.zeros(2, 3))
            progress.batch_done(2)
    assert shown_counts(capsys.readouterr().err, 4)[-1] == "4"


def test_token_recording_keeps_only_what_is_asked():
    model = create("vit-micro").eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), record_tokens(model, layers=[1], keep="tokens") as both:
        model(images)
    with torch.no_grad(), record_tokens(model, layers=[1], keep="normed") as normed:
        model(images)
    with torch.no_grad(), record_tokens(model, layers=[1], keep="tokens", final_norm=False) as raw:
        model(images)
    assert torch.equal(normed.normed[0], model.norm(both.tokens[0]))
    assert torch.equal(raw.tokens[0], both.tokens[0]) and raw.normed == [None]
    assert normed._raw == [[]] and raw._normed == [[]]  # what was not asked is not kept
    with pytest.raises(ValueError, match="keep='tokens'"):
        normed.tokens  # noqa: B018


def test_attention_handed_to_accumulators_only():
    model = create("vit-micro").eval()
    seen = []

    class Count:
        def update(self, layer, batch):
            seen.append((layer, tuple(batch.probs().shape)))

    with torch.no_grad(), record_attention(model, keep=None, accumulators=[Count()]) as rec:
        model(torch.randn(2, 3, 32, 32))
    assert [layer for layer, _ in seen] == list(range(len(model.blocks)))
    with pytest.raises(ValueError, match="keep='maps'"):
        rec.maps  # noqa: B018
    with pytest.raises(ValueError, match="keep='stats'"):
        rec.stats  # noqa: B018
