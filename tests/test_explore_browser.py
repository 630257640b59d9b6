"""The explorer page in a real browser: Debian's Chromium driven by Playwright (never a downloaded browser).

Skips when playwright or /usr/bin/chromium is missing. Screenshots go to pytest's tmp dir; their paths are printed
to the terminal, also when output is captured.
"""

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import vitscope
from explore_models import (
    PLANTED_PATCH,
    page_payload,
    pictures,
    planted_attention_model,
    qk_case,
    sharpened,
    stored,
    tiny_swin,
)
from vitscope.attention import entmax, entmax15, softmax, sparsemax
from vitscope.explorer import model_inputs
from vitscope.metrics.visible_keys import swin_window_keys
from vitscope.models import create, load
from vitscope.models.own.planted import plant_outliers
from vitscope.record import record_attention, record_tokens

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists() and shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium")),
                                     args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def announce(record_property):
    """Keep a screenshot's path without printing it into `pytest -q`: logged at INFO (shown with
    `pytest -o log_cli=true --log-cli-level=INFO`, and in a failed test's report) and recorded as the test's
    property (in `--junitxml` reports, for CI)."""

    def write(name: str, path: Path) -> None:
        logging.getLogger(__name__).info("%s: %s", name, path)
        record_property(name.replace(" ", "_"), str(path))

    return write


def open_page(browser, explorer, path: Path):
    """The saved page opened from disk, ready (its data decoded and drawn); page errors fail the test."""
    explorer.save(path)
    page = browser.new_page(viewport={"width": 1400, "height": 1200}, accept_downloads=True)
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.ready", timeout=30_000)
    assert page.evaluate("document.body.dataset.ready") == "1", errors
    page.errors = errors
    return page


def click_patch(page, model: int, cell: int, grid: tuple[int, int]):
    """Click the centre of grid ``cell`` (row-major) of model ``model``'s main view, in page pixels."""
    box = page.locator(f'canvas.vs-overlay[data-model="{model}"]').bounding_box()
    gh, gw = grid
    x = box["x"] + (cell % gw + 0.5) * box["width"] / gw
    y = box["y"] + (cell // gw + 0.5) * box["height"] / gh
    page.mouse.click(x, y)


def drawn_cells(page, model: int, grid: tuple[int, int]) -> np.ndarray:
    """The colour-map position (0..255) drawn at each cell centre of a model's heat canvas; -1 for the exact-zero
    colour, -2 for an undrawn (transparent) cell."""
    pixels = page.evaluate("""([model, gh, gw]) => {
        const c = document.querySelector(`canvas.vs-heat[data-model="${model}"]`), ctx = c.getContext('2d');
        const out = [];
        for (let r = 0; r < gh; r++) for (let q = 0; q < gw; q++) {
            const x = Math.floor((q + 0.5) * c.width / gw), y = Math.floor((r + 0.5) * c.height / gh);
            const d = ctx.getImageData(x, y, 1, 1).data;
            out.push([d[0], d[1], d[2], d[3]]);
        }
        return out;
    }""", [model, *grid])
    lut = np.array(page.evaluate("window.vitscope.colormap"), dtype=float)
    zero = np.array(page.evaluate("window.vitscope.zeroColour"), dtype=float)
    out = []
    for r, g, b, a in pixels:
        rgb = np.array([r, g, b], dtype=float)
        if a == 0:
            out.append(-2)
        elif np.abs(rgb - zero).max() < 1:
            out.append(-1)
        else:
            distances = np.abs(lut - rgb).sum(axis=1)
            assert distances.min() < 2, f"colour {rgb} is neither in the colour map nor the zero colour"
            out.append(int(distances.argmin()))
    return np.array(out)


def test_clicked_patch_shows_record_attentions_row(browser, tmp_path, announce):
    torch.manual_seed(0)
    model = create("vit-micro", num_registers=2).eval()
    images = pictures(3, 32)
    page = open_page(browser, vitscope.explore(model, images, labels=["vit-micro+reg2"]), tmp_path / "one.html")
    page.evaluate("window.vitscope.select({image: 2, layer: 3, head: 2})")
    click_patch(page, 0, 37, (8, 8))
    now = page.evaluate("window.vitscope.current()")
    shown = now["models"][0]
    assert (now["image"], now["layer"], now["head"], shown["query"]) == (2, 3, 2, 37)
    with torch.no_grad(), record_attention(model, layers=[2], keep="maps") as rec:
        model(model_inputs(model, images))
    expected = rec.maps[0][2, 1, 3 + 37].numpy()  # image 2, head 2, the query token after CLS and 2 registers
    assert len(shown["row"]) == expected.size
    assert np.abs(np.array(shown["row"]) - expected).max() <= now["maxError"] + 1e-7
    assert shown["labels"] == ["CLS", "reg1", "reg2"]
    np.testing.assert_allclose(shown["prefix"], expected[:3], atol=now["maxError"] + 1e-7)
    # CLS as query: the toggle shows CLS's row
    page.check("#vs-cls")
    cls = page.evaluate("window.vitscope.current()")["models"][0]
    assert cls["query"] == "cls"
    assert np.abs(np.array(cls["row"]) - rec.maps[0][2, 1, 0].numpy()).max() <= now["maxError"] + 1e-7
    with page.expect_download() as download:
        page.click("#vs-png")
    png = Path(download.value.path()).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    shot = tmp_path / "explorer-one.png"
    page.screenshot(path=str(shot), full_page=True)
    announce("explorer screenshot", shot)
    assert not page.errors


def test_planted_patch_is_the_hottest_cell_drawn(browser, tmp_path):
    page = open_page(browser, vitscope.explore(planted_attention_model(), pictures(2, 32)), tmp_path / "planted.html")
    for layer, head, query in ((1, "mean", 0), (4, 3, 63), (2, 1, "cls")):
        page.evaluate(f"window.vitscope.select({{layer: {layer}, head: {head!r}, query: {query!r}}})")
        cells = drawn_cells(page, 0, (8, 8))
        assert int(cells.argmax()) == PLANTED_PATCH
        assert cells[PLANTED_PATCH] == 255 and cells[np.arange(64) != PLANTED_PATCH].max() < 5
        assert page.evaluate("window.vitscope.current()")["models"][0]["hottest"] == PLANTED_PATCH
    assert not page.errors


def test_compare_shows_exact_zeros_only_on_the_entmax_side(browser, tmp_path, announce):
    torch.manual_seed(0)
    softmax = sharpened(create("vit-micro").eval(), 6.0)
    entmax = create("vit-micro", attention="entmax15").eval()
    entmax.load_state_dict(softmax.state_dict())  # the same weights; only the normaliser differs
    explorer = vitscope.explore([softmax, entmax], pictures(2, 32), labels=["softmax", "entmax-1.5"])
    page = open_page(browser, explorer, tmp_path / "compare.html")
    zeros = {"softmax": 0, "entmax-1.5": 0}
    for layer in (1, 2, 3, 4):
        for query in (0, 27, 63):
            now = page.evaluate(f"window.vitscope.select({{layer: {layer}, head: 1, query: {query}}})")
            for i, label in enumerate(zeros):
                cells = drawn_cells(page, i, (8, 8))
                assert (cells == -1).sum() == sum(v == 0 for v in now["models"][i]["cells"])
                zeros[label] += int((cells == -1).sum())
            assert now["models"][0]["exactZeros"] == 0
    assert zeros["softmax"] == 0 and zeros["entmax-1.5"] > 20
    page.select_option("#vs-scale", "shared")  # one colour scale for both: the larger row maximum
    now = page.evaluate("window.vitscope.current()")
    largest = max(max(v for v in m["cells"]) for m in now["models"])
    tops = [float(t) for t in page.locator(".vs-bar span:nth-child(3)").all_text_contents()]
    assert tops[0] == tops[1] == pytest.approx(largest, abs=1e-3)
    shot = tmp_path / "explorer-compare.png"
    page.screenshot(path=str(shot), full_page=True)
    announce("explorer compare screenshot", shot)
    assert not page.errors


def test_swin_attention_is_drawn_in_its_window(browser, tmp_path):
    model = tiny_swin()
    images = pictures(2, 24)
    page = open_page(browser, vitscope.explore(model, images, labels=["swin"]), tmp_path / "swin.html")
    with torch.no_grad(), record_attention(model, layers=[1], keep="maps") as rec:
        model(model_inputs(model, images))
    now = page.evaluate("window.vitscope.select({image: 1, layer: 2, head: 2, query: 14})")
    shown = now["models"][0]
    meta_layer = page.evaluate("window.vitscope.meta.models[0].layers[1]")
    assert meta_layer["geometry"]["kind"] == "window" and shown["grid"] == [6, 6]
    block = model.layers[0].blocks[1]  # shifted windows on a 6x6 grid padded to 8x8
    keys = swin_window_keys((6, 6), tuple(block.window_size), tuple(block.shift_size), block.attn_mask)
    row = int((keys.query == 14).nonzero())
    expected = rec.maps[0][1, 1, row].numpy()  # image 1, head 2
    assert np.abs(np.array(shown["row"]) - expected).max() <= now["maxError"] + 1e-7
    drawn = drawn_cells(page, 0, (6, 6))
    in_window = sorted(int(k) for k in keys.keys[row][keys.visible[row]])
    assert 0 < len(in_window) < 36 and 14 in in_window
    assert [cell for cell, v in enumerate(shown["cells"]) if v is not None] == in_window
    assert sorted(np.flatnonzero(drawn >= -1).tolist()) == in_window  # nothing drawn outside the query's window
    assert not page.errors


def test_norm_view_marks_the_planted_high_norm_tokens_and_shows_register_norms(browser, tmp_path):
    torch.manual_seed(0)
    model = create("vit-micro", num_registers=2).eval()
    # 8 images: the auto split leaves at least 5 tokens above it (vitscope.metrics.norms.MIN_COUNT), so one planted
    # token per image needs 5 images or more to be split off
    images = pictures(8, 32, seed=1)
    with plant_outliers(model, layer=1, count=1, scale=20.0) as planted:  # after block 2 (1-based)
        explorer = vitscope.explore(model, images, threshold="auto")
        with torch.no_grad(), record_tokens(model, keep="norms") as tokens:
            model(model_inputs(model, images))
    positions = planted.positions[:4, 0].tolist()
    page = open_page(browser, explorer, tmp_path / "norms.html")
    page.select_option("#vs-view", "norms")
    for image in range(4):
        for layer in (2, 3, 4):
            shown = page.evaluate(f"window.vitscope.select({{image: {image}, layer: {layer}}})")["models"][0]
            assert shown["highNorm"] == [positions[image]]
            expected = tokens.norms[layer - 1][image].numpy()
            np.testing.assert_allclose(shown["norms"], expected, rtol=1e-5)  # CLS, reg1, reg2, then patches
    assert page.locator(".vs-norm-list").first.text_content().startswith("high-norm (red): 1 tokens above auto")
    assert not page.errors


def test_pvt_reduced_keys_are_drawn_as_their_cells(browser, tmp_path):
    torch.manual_seed(0)
    model = load("timm:pvt_v2_b0").eval()
    images = pictures(1, 64)
    page = open_page(browser, vitscope.explore(model, images, layers=[0], labels=["pvt"]), tmp_path / "pvt.html")
    with torch.no_grad(), record_attention(model, layers=[0], keep="maps") as rec:
        model(model_inputs(model, images))
    grid = page.evaluate("window.vitscope.meta.models[0].layers[0].geometry.grid")
    click_patch(page, 0, 5 * grid[1] + 9, tuple(grid))
    shown = page.evaluate("window.vitscope.current()")
    row = shown["models"][0]
    assert row["kind"] == "reduced" and row["query"] == 5 * grid[1] + 9
    expected = rec.maps[0][0, :].mean(0)[row["query"]].numpy()  # mean over heads, the default
    assert np.abs(np.array(row["row"]) - expected).max() <= shown["maxError"] + 1e-7
    # each reduced key covers a block of stage cells; the colour drawn there is that key's value
    drawn = drawn_cells(page, 0, tuple(grid))
    side = int(round(np.sqrt(expected.size)))  # the stride-8 reduction of the stage grid: side x side keys
    r = grid[0] // side  # stage cells per key along each axis
    vmax = expected.max()
    for key, value in enumerate(expected):
        cell = (key // side) * r * grid[1] + (key % side) * r
        assert abs(drawn[cell] - int(value / vmax * 255.999)) <= 3
    assert not page.errors


def test_the_jupyter_view_runs_in_its_sandboxed_frame(browser):
    explorer = vitscope.explore(planted_attention_model(), pictures(1, 32))
    page = browser.new_page()
    page.set_content(f"<html><body>{explorer._repr_html_()}</body></html>")
    frame = page.frame_locator("iframe")
    frame.locator("body[data-ready='1']").wait_for(timeout=30_000)
    hottest = page.frames[1].evaluate("window.vitscope.select({layer: 2, query: 5}).models[0].hottest")
    assert hottest == PLANTED_PATCH


@pytest.mark.parametrize("name", ["softmax+registers", "entmax15", "rope+registers", "float32 heads"])
def test_rows_the_page_computes_from_queries_and_keys_are_record_attentions(browser, tmp_path, name):
    model, images = qk_case(name)
    explorer = vitscope.explore(model, images, rows="qk")
    with torch.no_grad(), record_attention(model, keep="maps") as rec:
        model(model_inputs(model, images))
    page = open_page(browser, explorer, tmp_path / "qk.html")
    layers = explorer.meta["models"][0]["layers"]
    grid = layers[0]["geometry"]["grid"]
    zeros = 0
    for number, layer in enumerate(layers, start=1):
        for image in range(len(images)) if number == 1 else [len(images) - 1]:
            for head in ["mean", *[h + 1 for h in layer["heads"]]]:
                for query in (grid[0] * grid[1] // 2 + 3, grid[0] * grid[1] - 1, "cls"):
                    now = page.evaluate(f"window.vitscope.select({{image: {image}, layer: {number}, head: {head!r}, "
                                        f"query: {query!r}}})")
                    shown = now["models"][0]
                    assert shown["form"] == "qk"
                    token = 0 if query == "cls" else layer["geometry"]["prefix"] + query
                    maps = rec.maps[number - 1][image]
                    truth = (maps.mean(0) if head == "mean" else maps[head - 1])[token].double().numpy()
                    row = np.array(shown["row"])
                    top = truth.max()
                    error = np.abs(row - truth).max()
                    assert error <= shown["maxError"] + 1e-7  # the page's own bound holds
                    assert error <= 0.02 * top or head == "mean"  # and a head's row is within 2 % of its maximum
                    assert not ((row == 0) & (truth > 1e-4 * top)).any()  # exact zeros where the recorder has them
                    assert not ((truth == 0) & (row > 1e-4 * top)).any()
                    zeros += int((row == 0).sum())
    assert (zeros > 0) == (name in ("entmax15", "float32 heads"))  # entmax zeros; softmax underflow at logits of 1e3
    assert not page.errors


def test_the_pages_normalisers_are_vitscopes_on_stored_rows(browser, tmp_path):
    """The page's JavaScript normalisers (float64) against vitscope's Python ones (float64) on rows of logits from a
    page's stored queries and keys, and on rows with ties, one key, and a wide spread."""
    model, images = qk_case("entmax15")
    explorer = vitscope.explore(model, images, rows="qk")
    meta, blobs = page_payload(explorer.html)
    logits = []
    for layer in meta["models"][0]["layers"]:
        part = layer["qk"]["heads"][0][1]
        q, k = (torch.from_numpy(stored(blobs, part[name]).astype(np.float64)) for name in ("q", "k"))
        logits += list(q[::9] @ k.T * layer["qk"]["scale"] * 4.0)  # sharper still: more exact zeros
    generator = torch.Generator().manual_seed(0)
    logits += [torch.tensor([0.3]), torch.zeros(7), torch.tensor([2.0, 2.0, -1.0, 2.0, 0.5]),
               torch.randn(300, generator=generator, dtype=torch.float64) * 40,
               torch.randn(50, generator=generator, dtype=torch.float64) * 1e-3]
    rows = [[float(v) for v in row] for row in logits]
    page = open_page(browser, explorer, tmp_path / "normalisers.html")
    cases = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15,
             **{f"alpha {a}": (lambda x, a=a: entmax(x, a)) for a in (1.25, 1.75, 2.5, 0.75)}}
    zeros = 0
    for name, python in cases.items():
        spec = {"kind": "alpha", "alpha": [float(name.split()[1])]} if name.startswith("alpha") else {"kind": name}
        shown = page.evaluate("([spec, rows]) => rows.map((row) => window.vitscope.normalize(spec, row))", [spec, rows])
        for row, js in zip(logits, shown, strict=True):
            expected, js = python(row.double()).numpy(), np.array(js)
            np.testing.assert_allclose(js, expected, rtol=0, atol=1e-9, err_msg=name)
            assert np.array_equal(js == 0, expected == 0), name  # the same exact zeros
            zeros += int((js == 0).sum())
    assert zeros > 1000
    assert not page.errors


def test_the_patch_share_is_never_shown_above_the_whole_row(browser, tmp_path):
    """Stored 8-bit maps round: a row's patch cells could sum to 1.002 and the page said 'patch mass 100.2 %' (issue
    46 item 22); the share is at most 1, and a share below 1 is kept as it is."""
    model = create("vit-micro", num_registers=1).eval()
    page = open_page(browser, vitscope.explore(model, pictures(1, 32)), tmp_path / "share.html")
    assert page.evaluate("window.vitscope.patchShare([0.5, 0.3, 0.202])") == 1
    assert page.evaluate("window.vitscope.patchShare([0.5, 0.3, 0.1])") == pytest.approx(0.9)
    assert page.locator(".vs-norm-list").first.text_content()  # the page drew its first row with the share


def test_page_labels_name_the_model_and_its_weights_and_captions_say_which_photo():
    """The label kept 'timm:' as 'timm-' and said nothing of --weights; a folder of photos captioned every thumbnail
    with the folder's name (issue 46 item 22)."""
    from vitscope.cli.explore import model_label
    from vitscope.data import ImageDataset
    from vitscope.explorer import dataset_captions

    assert model_label("timm:vit_small_patch14_dinov2", "/data/dinov2s_imgfocus_timm.safetensors") == \
        "timm:vit_small_patch14_dinov2 @ dinov2s_imgfocus_timm"
    assert model_label("hf:facebook/dinov2-small") == "hf:facebook/dinov2-small"
    assert model_label("runs/entmax15/seed-0") == "entmax15-seed-0"
    images = torch.zeros(3, 3, 8, 8, dtype=torch.uint8)
    flat = ImageDataset("imagefolder", "eval", images, torch.zeros(3, dtype=torch.long), ["camvid_street"],
                        (0.5,) * 3, (0.5,) * 3)
    assert dataset_captions(flat) == ["image 1", "image 2", "image 3"]
    two = ImageDataset("imagefolder", "eval", images, torch.tensor([0, 1, 0]), ["cat", "dog"], (0.5,) * 3,
                       (0.5,) * 3)
    assert dataset_captions(two) == ["image 1: cat", "image 2: dog", "image 3: cat"]
