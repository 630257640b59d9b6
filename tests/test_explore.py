"""The explorer's data: quantisation, geometry, the page's payload against record_attention, the CLI (no browser)."""

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vitscope
from explore_models import (
    PLANTED_PATCH,
    page_payload,
    pictures,
    planted_attention_model,
    qk_case,
    sharpened,
    stored,
    stored_rows,
    tiny_swin,
)
from vitscope import explorer
from vitscope.cli import main
from vitscope.explorer.blob import binary_text, text_bytes
from vitscope.explorer.budget import check_page_size
from vitscope.explorer.geometry import layer_geometry
from vitscope.explorer.measure import matched_layers
from vitscope.explorer.quantize import dequantize, max_error_bound, quantize_rows
from vitscope.explorer.rows import ARITHMETIC, TOLERANCE, stored_form
from vitscope.metrics import grid_distances
from vitscope.models import attention_sites, create, load
from vitscope.record import record_attention

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_quantised_rows_keep_exact_zeros_and_stay_within_the_stated_bound():
    torch.manual_seed(0)
    probs = torch.rand(3, 2, 5, 40) ** 6
    probs[..., ::3] = 0.0  # exact zeros (entmax)
    probs[0, 0, 0, 1] = 1e-30  # a tiny positive value must not become a zero
    probs = probs / probs.sum(-1, keepdim=True)
    for levels, floor in ((255, 0.0), (31, 0.0), (255, 0.01), (7, 1e-4)):
        codes, steps = quantize_rows(probs, levels, floor)
        back = dequantize(codes, steps)
        assert torch.equal(codes == 0, probs == 0)
        assert int(codes.max()) <= levels
        bound = max_error_bound(steps)
        assert bound == pytest.approx(max(float(probs.amax()) / (2 * levels), floor))
        rounding = 2e-7 * float(probs.amax())  # float32 decoding
        error = (back - probs).abs()
        assert float(error.max()) <= bound + rounding
        row_bound = torch.maximum(probs.amax(-1) / (2 * levels), torch.tensor(floor))
        assert bool((error.amax(-1) <= row_bound + rounding).all())
        assert float(error.max()) > 0.5 * bound  # the bound is tight, not a loose guess
    with pytest.raises(ValueError, match="levels=256"):
        quantize_rows(probs, 256)


def test_layers_are_matched_by_relative_depth():
    assert matched_layers([0, 1, 2, 3], 4, 12) == [2, 5, 8, 11]
    assert matched_layers([0, 5, 11], 12, 4) == [0, 1, 3]  # 1/12 -> 0.33 rounds to 0, kept at layer 1
    assert matched_layers([0, 1], 2, 2) == [0, 1]


def test_swin_window_cells_reproduce_the_recorders_distances():
    model = tiny_swin()
    sites = attention_sites(model)
    with torch.no_grad(), record_attention(model, keep="maps") as rec:
        model(torch.randn(1, 3, 24, 24))
    checked = 0
    for slot, site in enumerate(sites):
        layout = rec.layouts[slot]
        meta, arrays = layer_geometry(model, site, layout)
        assert meta["kind"] == "window"
        h, w = meta["grid"]
        coords = torch.stack([torch.arange(h * w) // w, torch.arange(h * w) % w], 1).float()
        query_of_row = torch.empty(h * w, dtype=torch.long)
        query_of_row[arrays["row_of_cell"].long()] = torch.arange(h * w)
        keys = arrays["key_cells"].long()
        visible = keys >= 0
        assert rec.maps[slot].shape[2:] == keys.shape
        mine = (coords[query_of_row][:, None] - coords[keys.clamp(min=0)]).norm(dim=-1)
        torch.testing.assert_close(mine[visible], layout.distances[visible], atol=1e-5, rtol=0)
        # keys the shift mask hides or padding carry no probability
        assert float(rec.maps[slot][..., ~visible].abs().sum()) < 1e-6
        checked += int(visible.sum())
    assert checked > 0


def test_pvt_key_boxes_are_where_the_recorders_keys_are():
    model = load("timm:pvt_v2_b0").eval()
    with torch.no_grad(), record_attention(model, layers=[0, 2], keep="maps") as rec:
        model(torch.randn(1, 3, 64, 64))
    for slot, index in enumerate([0, 2]):
        layout = rec.layouts[slot]
        meta, arrays = layer_geometry(model, attention_sites(model)[index], layout)
        h, w = meta["grid"]
        s = meta["stride"]
        boxes = arrays["key_boxes"]
        assert boxes.shape[0] == rec.maps[slot].shape[-1]
        keys = torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2 * h * s, (boxes[:, 1] + boxes[:, 3]) / 2 * w * s], 1)
        cells = torch.arange(h * w)
        queries = torch.stack([(cells // w + 0.5) * s, (cells % w + 0.5) * s], 1).float()
        torch.testing.assert_close(torch.cdist(queries, keys), layout.distances, atol=1e-4, rtol=0)


def test_the_payload_holds_record_attentions_maps_within_the_stated_error():
    torch.manual_seed(0)
    model = create("vit-micro", num_registers=2).eval()
    images = pictures(3, 32)
    page = vitscope.explore(model, images, layers=[0, 3], heads=[1, 2], rows="maps")
    meta, blob = page_payload(page.html)
    inputs = vitscope.explorer.model_inputs(model, images)
    with torch.no_grad(), record_attention(model, layers=[0, 3], keep="maps") as rec:
        model(inputs)
    bound = meta["quantization"]["bound"]
    assert 0 < bound <= 1 / 510 and meta["quantization"]["floor"] == 0  # a small page: no floor needed
    assert f"off by at most {bound:.2g}" in page.html  # the page states it
    for layer, reference in zip(meta["models"][0]["layers"], rec.maps, strict=True):
        assert layer["heads"] == [1, 2] and layer["geometry"]["labels"] == ["CLS", "reg1", "reg2"]
        codes, steps = stored(blob, layer["codes"]), stored(blob, layer["steps"])
        back = dequantize(torch.from_numpy(codes.copy()), torch.from_numpy(steps.copy()))
        assert float((back - reference[:, [1, 2]]).abs().max()) <= bound + 1e-7
        norms = stored(blob, layer["norms"])
        assert norms.shape == (3, 3 + 64)


def test_captions_cannot_break_out_of_the_page():
    caption = "</script><script>alert(1)</script><!--"
    page = vitscope.explore(create("vit-micro"), pictures(1, 32), captions=[caption], labels=["<b>m</b>"])
    meta, _ = page_payload(page.html)
    assert meta["captions"] == [caption] and meta["models"][0]["label"] == "<b>m</b>"
    assert "alert(1)</script>" not in page.html


def test_planted_attention_gives_the_analytic_mad_and_zero_entropy():
    model = planted_attention_model()
    page = vitscope.explore(model, pictures(2, 32))
    meta, _ = page_payload(page.html)
    d = grid_distances((8, 8))
    expected = float(d[:, PLANTED_PATCH].mean() / d.max())  # every patch query's row is one-hot on the patch
    for layer in meta["models"][0]["layers"]:
        assert np.allclose(layer["mad_image"], expected, atol=1e-5)
        assert np.allclose(layer["mad_set"], expected, atol=1e-5)
        assert np.allclose(layer["entropy_set"], 0.0, atol=1e-4)


def test_cli_writes_one_offline_page(tmp_path, capsys):
    out = tmp_path / "exp"
    code = main(["explore", "--model", "vit-micro", "--attention", "entmax15", "--compare", "softmax=vit-micro",
                 "--num-images", "3", "--layers", "1,4", "--heads", "2", "--out", str(out), "--device", "cpu"])
    assert code == 0
    html = (out / "explorer.html").read_text(encoding="latin-1")
    assert "explorer.html" in capsys.readouterr().out
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched from the network
    assert "https://" not in html and "http://" not in html
    meta, _ = page_payload(html)
    # presets carry random weights, and the page says so (as analyze figures do)
    assert [m["label"] for m in meta["models"]] == ["vit-micro +entmax15 (random weights)", "softmax (random weights)"]
    assert "vit-micro +entmax15 (random weights) vs softmax (random weights)" in html
    assert [layer["number"] for layer in meta["models"][0]["layers"]] == [1, 4]
    assert meta["models"][0]["layers"][0]["heads"] == [1] and len(meta["images"]) == 3


def test_python_api_refuses_layers_and_heads_the_model_lacks():
    model = create("vit-micro")
    with pytest.raises(ValueError, match="reach past the 4 attention layers"):
        vitscope.explore(model, pictures(1, 32), layers=[4])
    with pytest.raises(ValueError, match="reach past the 4 heads"):
        vitscope.explore(model, pictures(1, 32), heads=[0, 4])


@pytest.mark.parametrize(("argv", "message"), [
    (["--layers", "0"], "numbers start at 1"), (["--heads", "x"], "comma-separated"),
    (["--threshold", "median"], "threshold 'median' is unknown"), (["--max-mb", "0"], "--max-mb 0"),
    (["--compare", "a=b=c"], "unknown model spec"),
    (["--layers", "2,9"], "--layers 2,9: vit-micro has 4 attention layers; use numbers 1..4"),
    (["--heads", "5"], "--heads 5: vit-micro has at most 4 heads per layer; use numbers 1..4"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    code = main(["explore", "--model", "vit-micro", "--num-images", "2", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_demo_builds_its_explorer_page_from_the_sparse_runs_in_seconds(tmp_path):
    import time

    from vitscope.explorer.demo import explorer_demo
    from vitscope.models import save_model
    from vitscope.report.index import write_index

    assert explorer_demo(tmp_path) is None  # no sparse demo yet: no page, no error
    for name, attention in (("softmax", "softmax"), ("entmax15", "entmax15")):
        run = tmp_path / "sparse" / "runs" / name / "seed-0"
        run.mkdir(parents=True)
        save_model(create("vit-micro", attention=attention, num_classes=0), run / "model.safetensors")
    started = time.perf_counter()
    page = explorer_demo(tmp_path)
    seconds = time.perf_counter() - started
    meta, _ = page_payload(page.read_text(encoding="latin-1"))
    assert [m["label"] for m in meta["models"]] == ["softmax, before training", "softmax, trained",
                                                     "entmax-1.5, trained"]
    assert len(meta["images"]) == 8 and seconds < 30, seconds
    index = write_index(tmp_path, {"sparse": "Sparse"}).read_text()
    assert 'href="explorer/explorer.html"' in index


def test_a_tight_size_budget_raises_the_error_floor_and_the_page_says_so(monkeypatch):
    torch.manual_seed(0)
    model = create("vit-micro").eval()
    images = pictures(6, 32)
    free = vitscope.explore(model, images, rows="maps")
    tight = vitscope.explore(model, images, max_bytes=int(free.size_bytes * 0.6), rows="maps")
    q = tight.meta["quantization"]
    assert free.meta["quantization"]["floor"] == 0 and q["floor"] > 0
    assert tight.size_bytes <= free.size_bytes * 0.6
    assert q["bound"] >= q["floor"] and q["measured"] <= q["bound"] + 1e-7
    assert f"no finer than an error of {q['floor']:.2g}" in tight.html
    # room for 200 bytes of maps and norms; with the estimate skipped, the build itself refuses
    main = re.search(r'id="vitscope-blob-main" type="application/octet-stream">(.*?)</script>', free.html, re.S)
    monkeypatch.setattr(explorer, "check_page_size", lambda *args, **kwargs: 0)
    with pytest.raises(ValueError, match="do not fit"):
        vitscope.explore(model, images, max_bytes=free.size_bytes - len(main.group(1)) + 200, rows="maps")


def test_a_timm_vit_with_fused_attention_and_registers_and_the_jupyter_view():
    torch.manual_seed(0)
    model = load("timm:vit_small_patch14_reg4_dinov2", img_size=56, depth=2).eval()
    assert all(block.attn.fused_attn for block in model.blocks)  # recorded without leaving the fused path
    images = pictures(2, 56)
    page = vitscope.explore(model, images, heads=[0], rows="maps")
    meta, blob = page_payload(page.html)
    with torch.no_grad(), record_attention(model, keep="maps") as rec:
        model(vitscope.explorer.model_inputs(model, images))
    for layer, reference in zip(meta["models"][0]["layers"], rec.maps, strict=True):
        assert layer["geometry"]["labels"] == ["CLS", "reg1", "reg2", "reg3", "reg4"]
        codes, steps = stored(blob, layer["codes"]), stored(blob, layer["steps"])
        back = dequantize(torch.from_numpy(codes.copy()), torch.from_numpy(steps.copy()))
        assert float((back - reference[:, :1]).abs().max()) <= meta["quantization"]["bound"] + 1e-7
    inline = page._repr_html_()
    assert inline.startswith("<iframe srcdoc=") and "<script" not in inline  # the page is escaped into the frame


@pytest.mark.parametrize("name", ["softmax+registers", "entmax15", "entmax:1.3", "entmax:learned", "rope+registers"])
def test_rows_from_stored_queries_and_keys_are_record_attentions_rows(name):
    model, images = qk_case(name)
    page = vitscope.explore(model, images, rows="qk")
    meta, blobs = page_payload(page.html)
    with torch.no_grad(), record_attention(model, keep="maps") as rec:
        model(vitscope.explorer.model_inputs(model, images))
    zeros = 0
    for layer, reference in zip(meta["models"][0]["layers"], rec.maps, strict=True):
        assert layer["form"] == "qk" and "codes" not in layer
        for slot, head in enumerate(layer["heads"]):
            for image in range(len(images)):
                rows, truth = stored_rows(blobs, layer, image, slot), reference[image, head].double()
                top = truth.amax(-1, keepdim=True)
                error = float(((rows - truth).abs() / top).max())
                stated = layer["qk"]["heads"][slot][image]["error"]
                assert error <= stated + ARITHMETIC and stated <= TOLERANCE  # the page's stated error holds
                # exact zeros where the recorder has them, but for keys within rounding of the threshold
                assert not bool(((rows == 0) & (truth > 1e-4 * top)).any())
                assert not bool(((truth == 0) & (rows > 1e-4 * top)).any())
                zeros += int((rows == 0).sum())
    assert (zeros > 0) == name.startswith("entmax")
    if name.endswith("registers"):
        labels = meta["models"][0]["layers"][0]["geometry"]["labels"]
        assert labels[0] == "CLS" and labels[1:] == [f"reg{i + 1}" for i in range(len(labels) - 1)] and len(labels) > 2


def test_heads_whose_float16_rows_would_err_keep_float32():
    torch.manual_seed(0)
    model = sharpened(create("vit-micro").eval(), 100.0)  # logits of thousands: float16 rounding moves them by > 1
    images = pictures(2, 32)
    page = vitscope.explore(model, images, rows="qk")
    meta, blobs = page_payload(page.html)
    precision = meta["precision"]
    assert precision["half"] > 0 and precision["full"] > 0 and precision["measured"] <= TOLERANCE
    assert f"{precision['full']} in float32" in page.html
    with torch.no_grad(), record_attention(model, keep="maps") as rec:
        model(vitscope.explorer.model_inputs(model, images))
    for layer, reference in zip(meta["models"][0]["layers"], rec.maps, strict=True):
        for slot, head in enumerate(layer["heads"]):
            for image in range(2):
                part = layer["qk"]["heads"][slot][image]
                truth = reference[image, head].double()
                top = truth.amax(-1, keepdim=True)
                rows = stored_rows(blobs, layer, image, slot)
                assert float(((rows - truth).abs() / top).max()) <= part["error"] + ARITHMETIC <= TOLERANCE
                if part["q"]["dtype"] == "float32":  # and in float16 these rows would have erred too much
                    q = torch.from_numpy(stored(blobs, part["q"]).astype(np.float16).astype(np.float64))
                    k = torch.from_numpy(stored(blobs, part["k"]).astype(np.float16).astype(np.float64))
                    rounded = torch.softmax(q @ k.T * layer["qk"]["scale"], -1)
                    assert float(((rounded - truth).abs() / top).max()) > TOLERANCE - ARITHMETIC


def test_each_layer_is_stored_in_the_smaller_form():
    # ViT-S/14 at 224 px: 257 tokens, head_dim 64 -> 8-bit maps (67 kB a head, 41 % once compressed) beat float16
    # queries and keys (66 kB, 86 %); at 518 px, 1,370 tokens: 1.89 MB of maps against 0.35 MB of queries and keys
    assert stored_form("auto", True, 257, 257, 64) == "maps"
    assert stored_form("auto", True, 1370, 1370, 64) == "qk"
    assert stored_form("auto", True, 577, 577, 64) == "qk"  # ViT-S/16 at 384 px
    assert stored_form("auto", False, 1370, 1370, 64) == "maps"  # no logit inputs (Swin, masked, unknown normaliser)
    assert stored_form("qk", True, 197, 197, 64) == "qk" and stored_form("maps", True, 1370, 1370, 64) == "maps"
    with pytest.raises(ValueError, match="rows='all' is unknown"):
        stored_form("all", True, 10, 10, 4)
    swin = vitscope.explore(tiny_swin(), pictures(1, 24), rows="qk")  # window attention keeps its maps
    assert {layer["form"] for layer in swin.meta["models"][0]["layers"]} == {"maps"}


def test_a_page_above_the_budget_is_refused_before_the_model_runs(tmp_path, capsys):
    model = create("vit-micro").eval()
    runs = []
    model.blocks[0].register_forward_hook(lambda *_: runs.append(1))
    images = pictures(6, 32)
    page = vitscope.explore(model, images, rows="qk")
    estimate = check_page_size([model], [range(4)], [32], 6, None, "qk", 10**9, fixed=0)
    assert 0.6 < estimate / page.size_bytes < 1.4  # the estimate is about the page (tiny: less compressible)
    runs.clear()
    with pytest.raises(ValueError, match=r"the page would take about .* MB \(6 images at .* MB each\), above the "
                                         r"0.2 MB budget \(--max-mb\); use --num-images [1-5] or fewer"):
        vitscope.explore(model, images, rows="qk", max_bytes=200_000)
    assert not runs  # refused before the model ran
    code = main(["explore", "--model", "vit-micro", "--num-images", "16", "--max-mb", "0.2", "--rows", "qk",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "16 images at" in err and "--num-images" in err
    assert not (tmp_path / "explorer.html").exists()


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000))
def test_blob_text_round_trips_any_bytes(data):
    text = binary_text(data)
    assert not any(byte in text for byte in (b"\0", b"\r", b"<"))  # what a <script> element cannot hold
    assert text_bytes(text.decode("latin-1")) == data  # as a string (a Jupyter srcdoc)
    assert text_bytes(text.decode("latin-1").translate(WINDOWS_1252_TEXT)) == data  # as a browser reads the file


# windows-1252 as WHATWG reads it: bytes 0x80-0x9F as these characters; the five it leaves undefined as themselves
WINDOWS_1252_TEXT = {b: bytes([b]).decode("cp1252") for b in range(0x80, 0xA0)
                     if b not in (0x81, 0x8D, 0x8F, 0x90, 0x9D)}


@pytest.mark.parametrize("attention", ["softmax", "entmax15", "entmax:1.3"])
def test_a_capture_gives_the_logit_inputs_of_any_unmasked_normaliser(attention):
    model = create("vit-micro", attention=attention).eval()
    seen = []
    detach = attention_sites(model)[1].attach(seen.append)
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    detach()
    logits = seen[0].logit_inputs
    assert logits is not None and logits.normalizer.name == attention
    rebuilt = logits.normalizer((logits.q * logits.scale) @ logits.k.transpose(-1, -2))
    torch.testing.assert_close(rebuilt, seen[0].probs(), rtol=0, atol=1e-6)
    assert (seen[0].softmax_qk is not None) == (attention == "softmax")


def test_refusal_sizes_read_as_plain_megabytes():
    """ViT-g/14 at 518 px asked for a page of about 1,160 MB; the refusal printed it as '1.16e+03 MB'."""
    from vitscope.explorer.budget import _mb

    assert [_mb(b) for b in (1.1604e9, 174.2e6, 0.2e6)] == ["1,160", "174", "0.2"]
