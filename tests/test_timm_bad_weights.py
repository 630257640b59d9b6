"""Bad weights files for ``timm:`` specs (issue 27): one line naming the file and listing the keys that do not fit
(missing, unexpected, mismatched with their shapes, each capped with a count of the rest), or saying the file is not
a valid checkpoint; and a refused command leaves no empty ``--out`` folder behind."""

import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import save_file

from vitscope.cli import main
from vitscope.models import load

SPEC = "timm:vit_tiny_patch16_224"  # width 192, 12 blocks; built here at 32 px (a 2 x 2 grid) and 1 block
SMALL = {"img_size": 32, "depth": 1}


def timm_state(**overrides) -> dict[str, torch.Tensor]:
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**SMALL, **overrides})
    return {k: v.contiguous() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timm_weights")
    save_file(timm_state(embed_dim=96, num_heads=3), folder / "narrow.safetensors")  # another width
    torch.save(timm_state(depth=2), folder / "deeper.pth")  # another depth
    odd = timm_state()
    odd["pos_embed"] = torch.zeros(1, 1 + 50, 192)  # a CLS entry and 50 patch entries: no square grid
    save_file(odd, folder / "odd_grid.safetensors")
    good = folder / "good.safetensors"
    save_file(timm_state(), good)
    torch.save(timm_state(), folder / "good.pth")
    (folder / "empty.safetensors").write_bytes(b"")
    (folder / "text.safetensors").write_text("these are not weights\n")
    (folder / "truncated.safetensors").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (folder / "header.safetensors").write_bytes(good.read_bytes()[:20])
    (folder / "empty.pth").write_bytes(b"")
    (folder / "text.pth").write_text("hello")
    (folder / "truncated.pth").write_bytes((folder / "good.pth").read_bytes()[:4096])
    return folder


def refusal(path) -> str:
    with pytest.raises(ValueError) as info:
        load(SPEC, weights=path, **SMALL)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"weights in {path} do not fit the model {SPEC}"), message
    return message


def listed(kind: str, keys: list[str], message: str) -> None:
    """``message`` lists the first five ``keys`` after ``kind`` and counts the rest."""
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    assert f"{kind} {keys[:5]}{more}" in message, (kind, keys[:5], message)


def test_a_width_mismatch_lists_every_mismatched_key_with_shapes(files):
    model, narrow = timm_state(), timm_state(embed_dim=96, num_heads=3)
    expected = [f"{k} {list(v.shape)} vs {list(model[k].shape)}" for k, v in sorted(narrow.items())
                if v.shape != model[k].shape]  # safetensors stores keys sorted
    assert len(expected) > 5
    message = refusal(files / "narrow.safetensors")
    listed("mismatched (file vs model)", expected, message)
    assert "missing [" not in message and "unexpected [" not in message


def test_another_depth_lists_the_unexpected_keys(files):
    unexpected = [k for k in timm_state(depth=2) if k.startswith("blocks.1.")]
    message = refusal(files / "deeper.pth")
    listed("unexpected", unexpected, message)
    assert "use the architecture the file was saved from (origin timm)" in message


def test_an_odd_position_grid_is_named_not_reshaped(files):
    message = refusal(files / "odd_grid.safetensors")
    assert "mismatched (file vs model) ['pos_embed [1, 51, 192] vs [1, 5, 192]']" in message
    assert "converting them failed: shape '[1, 7, 7, -1]' is invalid" in message  # timm's own error, as the detail


@pytest.mark.parametrize("name", ["empty.safetensors", "text.safetensors", "truncated.safetensors",
                                  "header.safetensors", "empty.pth", "text.pth", "truncated.pth"])
def test_a_file_that_is_not_a_checkpoint_is_named(files, name):
    with pytest.raises(ValueError, match=rf"^{files / name} is not a valid checkpoint \(.*\); it may be truncated"):
        load(SPEC, weights=files / name, **SMALL)


def test_the_real_entry_point_gives_one_line_and_makes_no_folder(files, tmp_path):
    out = tmp_path / "never-made"
    bad = files / "narrow.safetensors"
    result = subprocess.run([sys.executable, "-m", "vitscope.cli", "analyze", "locality", "--model", SPEC,
                             "--img-size", "32", "--weights", str(bad), "--dataset", "synthetic", "--num-images", "2",
                             "--device", "cpu", "--out", str(out)], capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"vitscope: error: weights in {bad} do not fit the model {SPEC}: ")
    assert "mismatched (file vs model) ['blocks.0.attn.proj.bias [96] vs [192]'," in lines[0]
    assert "missing ['blocks.1." in lines[0]  # the full-depth model's blocks 1..11
    assert " more" in lines[0] and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("argv", [["study", "locality", "--seeds", "0,0"], ["study", "registers", "--seeds", "0,x"],
                                  ["study", "registers", "--detect-layer", "0"]])
def test_a_refused_study_leaves_no_out_folder(argv, tmp_path, capsys):
    out = tmp_path / "study"
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("vitscope: error: --")
    assert not out.exists()
