"""Pretrained weights by name from local caches (vitscope.models.weights.hub), with the network blocked.

Each test writes a Hugging Face hub cache in a temporary folder with the layout huggingface_hub writes
(models--ORG--NAME/{blobs,refs/main,snapshots/COMMIT/FILE -> ../../blobs/SHA256}) holding a small random model, points
HF_HUB_CACHE or HF_HOME at it, and checks that the loaded weights are the cached file's.
"""

import hashlib
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cli_refusals import refused
from vitscope.cli import main
from vitscope.models import create, load, save_model
from vitscope.models.weights import hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"
DEIT = {"img_size": 32, "depth": 1, "embed_dim": 32, "num_heads": 2}  # a tiny deit3_small_patch16_224


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    return folder


def write_cached(cache: Path, repo_id: str, files: dict[str, Path], commit: str = COMMIT, ref: str = "main") -> Path:
    """Files into the hub cache as huggingface_hub stores them; returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    for name, source in files.items():
        blob = repo / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
        shutil.copyfile(source, blob)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_deit_file(tmp_path: Path, seed: int = 1) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = load("timm:deit3_small_patch16_224", **DEIT)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / f"deit{seed}.safetensors"
    save_file(state, str(path))
    return path, state


def assert_weights(model, state):
    own = model.state_dict()
    assert set(state) <= set(own)
    for key, value in state.items():
        assert torch.equal(own[key], value), key


@pytest.mark.parametrize("how", ["tag", "pretrained", "bin", "hf_home"])
def test_timm_names_load_the_cached_file_timm_would_read(tmp_path, cache, monkeypatch, capsys, how):
    from timm.models import get_pretrained_cfg

    file, state = tiny_deit_file(tmp_path)
    spec = "timm:deit3_small_patch16_224" + ("" if how == "pretrained" else ".fb_in1k")
    repo_id = get_pretrained_cfg(spec[5:]).hf_hub_id  # where timm.create_model(pretrained=True) looks
    if how == "bin":  # timm's fallback when the repository has no model.safetensors
        torch.save(state, tmp_path / "pytorch_model.bin")
        file = tmp_path / "pytorch_model.bin"
    if how == "hf_home":
        monkeypatch.delenv("HF_HUB_CACHE")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
        cache = tmp_path / "home" / "hub"
    snapshot = write_cached(cache, repo_id, {"pytorch_model.bin" if how == "bin" else "model.safetensors": file})
    model = load(spec, pretrained=True if how == "pretrained" else None, **DEIT)
    assert_weights(model, state)
    source = model.vitscope_load["source"]
    assert source["revision"] == COMMIT and source["repo"] == repo_id
    assert source["sha256"] == sha256(file) and Path(source["file"]).parent == snapshot
    line = capsys.readouterr().err
    assert f"from the cache, {repo_id}@{COMMIT[:12]}" in line and sha256(file)[:12] in line


def test_a_tag_with_random_weights_and_a_tag_with_a_file_are_told_apart(tmp_path, cache):
    torch.manual_seed(3)
    model = load("timm:deit3_small_patch16_224.fb_in1k", pretrained=False, **DEIT)  # nothing read
    assert "source" not in (getattr(model, "vitscope_load", None) or {})
    file, _ = tiny_deit_file(tmp_path)
    with pytest.raises(ValueError, match=r"the tag \.fb_in1k names timm's pretrained weights and weights="):
        load("timm:deit3_small_patch16_224.fb_in1k", weights=file, **DEIT)


def test_hub_names_load_the_cached_snapshot_at_a_revision_and_a_folder_wins(tmp_path, cache, monkeypatch, capsys):
    from transformers import Dinov2Config, Dinov2Model

    def saved(seed, folder):
        torch.manual_seed(seed)
        config = Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2, image_size=28,
                              patch_size=14)
        Dinov2Model(config).save_pretrained(folder)
        return folder

    first, second = saved(1, tmp_path / "v1"), saved(2, tmp_path / "v2")
    other = "fedcba9876543210fedcba9876543210fedcba98"
    write_cached(cache, "org/tiny-dinov2", {n: first / n for n in ("config.json", "model.safetensors")})
    write_cached(cache, "org/tiny-dinov2", {n: second / n for n in ("config.json", "model.safetensors")}, other, "v2")
    for spec, folder, commit in (("hf:org/tiny-dinov2", first, COMMIT), (f"hf:org/tiny-dinov2@{other}", second, other),
                                 ("hf:org/tiny-dinov2@v2", second, other)):
        model = load(spec)
        assert_weights(model.hf, Dinov2Model.from_pretrained(folder).state_dict())  # transformers' own reading
        assert model.vitscope_load["source"]["revision"] == commit
        assert model.vitscope_load["source"]["sha256"] == sha256(folder / "model.safetensors")
    assert "from the cache, org/tiny-dinov2@" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # a folder named like the hub id is the folder, not the cache
    saved(3, tmp_path / "org" / "tiny-dinov2")
    model = load("hf:org/tiny-dinov2")
    assert_weights(model.hf, Dinov2Model.from_pretrained(tmp_path / "org" / "tiny-dinov2").state_dict())
    assert model.vitscope_load["source"] is None


def test_open_clip_tags_load_the_file_of_openclips_registry(tmp_path, cache):
    from open_clip import pretrained as registry

    tower = {"layers": 1, "width": 64, "head_width": 32, "image_size": 64}
    torch.manual_seed(4)
    reference = load("open_clip:ViT-B-32", **tower)
    state = {f"visual.{k}": v.contiguous() for k, v in reference.visual.state_dict().items()}
    save_file(state, str(tmp_path / "clip.safetensors"))
    repo_id = registry.get_pretrained_cfg("ViT-B-32", "laion2b_s34b_b79k")["hf_hub"].strip("/")
    write_cached(cache, repo_id, {"open_clip_model.safetensors": tmp_path / "clip.safetensors"})
    model = load("open_clip:ViT-B-32/laion2b_s34b_b79k", **tower)
    assert_weights(model.visual, {k[len("visual."):]: v for k, v in state.items()})
    assert model.vitscope_load["source"]["sha256"] == sha256(tmp_path / "clip.safetensors")


@pytest.mark.parametrize("spec, searched, fetch", [
    ("timm:deit3_small_patch16_224.fb_in1k", "models--timm--deit3_small_patch16_224.fb_in1k",
     "hf download timm/deit3_small_patch16_224.fb_in1k model.safetensors"),
    ("hf:org/not-cached@v1", "models--org--not-cached", "hf download org/not-cached --revision v1"),
    ("open_clip:ViT-B-32/laion2b_s34b_b79k", "models--laion--CLIP-ViT-B-32-laion2B-s34B-b79K",
     "hf download laion/CLIP-ViT-B-32-laion2B-s34B-b79K open_clip_model.safetensors"),
])
def test_a_name_not_cached_is_one_line_exit_2_and_nothing_written(tmp_path, cache, capsys, spec, searched, fetch):
    out = tmp_path / "out"
    code = main(["probe", "knn", "--model", spec, "--dataset", "synthetic", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1 and spec in err and str(cache / searched) in err
    assert f"`{fetch}`" in err and "--download" in err


def test_download_is_asked_for_before_anything_is_fetched(tmp_path, cache, monkeypatch):
    import huggingface_hub

    file, state = tiny_deit_file(tmp_path)
    fetched = []

    def fake_download(repo_id, filename, revision=None, cache_dir=None, **kwargs):
        fetched.append((repo_id, filename))
        snapshot = write_cached(Path(cache_dir), repo_id, {filename: file})
        return str(snapshot / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(hub, "check_reachable", lambda *args: None)  # the hub answers, through fake_download
    with pytest.raises(ValueError, match="not in the local cache"):
        load("timm:deit3_small_patch16_224.fb_in1k", **DEIT)
    assert fetched == []
    model = load("timm:deit3_small_patch16_224.fb_in1k", download=True, **DEIT)
    assert fetched == [("timm/deit3_small_patch16_224.fb_in1k", "model.safetensors")]
    assert_weights(model, state)


def test_export_hf_loads_back_to_the_same_tokens(tmp_path):
    from vitscope.models.export.hf import export_hf

    torch.manual_seed(5)
    options = {"depth": 2, "embed_dim": 32, "num_heads": 2}
    model = load("timm:vit_small_patch14_reg4_dinov2", img_size=28, **options).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))  # LayerScale, registers and tokens all matter
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    # the file's 2x2 table is resampled to a 3x3 grid on load, and the exported config holds that grid
    resized = load("timm:vit_small_patch14_reg4_dinov2", weights=tmp_path / "w.safetensors", img_size=42,
                   **options).eval()
    assert export_hf(resized, tmp_path / "hf") == {"class": "Dinov2WithRegistersModel", "image_size": 42}
    twin = load(f"hf:{tmp_path / 'hf'}").eval()
    from vitscope.analyze.inputs import model_interpolation

    assert model_interpolation(twin) == model_interpolation(resized) == "bicubic"  # the same view, from its config
    images = torch.randn(2, 3, 42, 42)
    with torch.no_grad():
        want, got = resized.forward_features(images), twin.forward_features(images)
    torch.testing.assert_close(got["cls"], want[:, 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["registers"], want[:, 1:5], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["patches"], want[:, 5:], atol=1e-5, rtol=0)


def test_export_hf_cli_and_its_refusals_write_nothing(tmp_path, capsys):
    torch.manual_seed(6)
    model = create("vit-micro", depth=2, num_registers=2).eval()
    with torch.no_grad():
        model.reg_token.normal_()
        model.cls_token.normal_()
    save_model(model, tmp_path / "m.safetensors")
    out = tmp_path / "hf"
    assert main(["export", "--model", str(tmp_path / "m.safetensors"), "--format", "hf", "--out", str(out)]) == 0
    assert f"load it with --model hf:{out}" in capsys.readouterr().out
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want, got = model.forward_features(images), load(f"hf:{out}").eval().forward_features(images)
    for key in ("cls", "registers", "patches"):
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=0)
    capsys.readouterr()
    save_model(create("vit-micro", depth=1, attention="entmax15"), tmp_path / "entmax.safetensors")
    for spec, why in (("timm:pvt_v2_b0", "not a plain ViT"), (str(tmp_path / "entmax.safetensors"), "runs softmax"),
                      (str(tmp_path / "m.safetensors"), "is not an empty folder")):
        refused = out if "empty" in why else tmp_path / "refused"
        assert main(["export", "--model", spec, "--format", "hf", "--out", str(refused)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err
        assert refused == out or not refused.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entmax.safetensors", "hf", "m.safetensors"]


def test_a_study_model_entry_keeps_the_hub_revision_of_an_hf_name():
    from vitscope.studies.models import parse_model_entry

    entry = parse_model_entry("small=hf:facebook/dinov2-small@v2")
    assert (entry.spec, entry.weights) == ("hf:facebook/dinov2-small@v2", None)
    entry = parse_model_entry("deit=timm:deit3_small_patch16_224@w.safetensors")
    assert (entry.spec, entry.weights) == ("timm:deit3_small_patch16_224", "w.safetensors")


def test_has_random_weights_says_what_load_does(tmp_path, cache):
    """The rule reports label models by ("random weights"), checked against ``load`` itself: a spec has random
    weights exactly when two loads under different seeds differ."""
    from timm.models import get_pretrained_cfg
    from transformers import Dinov2Config, Dinov2Model

    from vitscope.models import has_random_weights

    file, _ = tiny_deit_file(tmp_path)
    write_cached(cache, get_pretrained_cfg("deit3_small_patch16_224.fb_in1k").hf_hub_id, {"model.safetensors": file})
    hf_small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "mlp_ratio": 2,
                "image_size": 28, "patch_size": 14}
    Dinov2Model(Dinov2Config(**hf_small)).save_pretrained(tmp_path / "dinov2-folder")
    write_cached(cache, "org/tiny-dinov2", {n: tmp_path / "dinov2-folder" / n for n in ("config.json",
                                                                                         "model.safetensors")})
    run = tmp_path / "micro.safetensors"
    save_model(create("vit-micro"), run)
    tower = {"layers": 1, "width": 64, "head_width": 32, "image_size": 64}
    cases = [  # spec, weights, pretrained, load options
        ("timm:deit3_small_patch16_224", None, None, DEIT),
        ("timm:deit3_small_patch16_224", file, None, DEIT),
        ("timm:deit3_small_patch16_224.fb_in1k", None, None, DEIT),
        ("timm:deit3_small_patch16_224.fb_in1k", None, False, DEIT),
        ("timm:deit3_small_patch16_224", None, True, DEIT),
        ("vit-micro", None, None, {}),
        ("vit-micro", run, None, {}),
        (str(run), None, None, {}),
        ("hf:dinov2", None, None, hf_small),
        (f"hf:{tmp_path / 'dinov2-folder'}", None, None, {}),
        ("hf:org/tiny-dinov2", None, None, {}),
        ("open_clip:ViT-B-32", None, None, tower),
    ]
    for spec, weights, pretrained, options in cases:
        states = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            states.append(load(spec, weights=weights, pretrained=pretrained, **options).state_dict())
        differs = any(not torch.equal(a, states[1][k]) for k, a in states[0].items() if a.is_floating_point())
        assert has_random_weights(spec, weights, pretrained) == differs, (spec, weights, pretrained)


# ---- what a user is told when the cache, the network or a name is wrong ----

NAMED = {  # spec -> (hub repository, file) of the cached weights it reads
    "timm:deit3_small_patch16_224.fb_in1k": ("timm/deit3_small_patch16_224.fb_in1k", "model.safetensors"),
    "open_clip:ViT-B-32/laion2b_s34b_b79k": ("laion/CLIP-ViT-B-32-laion2B-s34B-b79K", "open_clip_model.safetensors"),
    "hf:org/tiny-dinov2": ("org/tiny-dinov2", None),
}


@pytest.mark.parametrize("spec", NAMED)
def test_download_without_a_network_is_one_line_at_once(spec, tmp_path, cache, capsys, monkeypatch):
    """``--download`` with no network printed 12 lines over 50 s of huggingface_hub's retries (timm, OpenCLIP) or a
    bare "Got: ConnectError" (hf:); the hub's host is tried once, and nothing is asked of huggingface_hub."""
    import huggingface_hub

    def no_network(address, *args, **kwargs):
        raise OSError(-2, "Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("huggingface_hub asked to download without a network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", never)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _cache_only_snapshot)
    line = refused(["probe", "knn", "--model", spec, "--download", "--out", str(tmp_path / "out")], capsys)
    repo, file = NAMED[spec]
    assert f"--download cannot reach huggingface.co (Name or service not known) to fetch {spec}" in line
    assert f"`hf download {repo}{' ' + file if file else ''}`" in line and not (tmp_path / "out").exists()


def _cache_only_snapshot(repo_id, *args, local_files_only=False, **kwargs):
    """snapshot_download of an empty cache that must not be asked to download."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    if local_files_only:
        raise LocalEntryNotFoundError(f"{repo_id} is not in the cache")
    raise AssertionError("huggingface_hub asked to download without a network")


def test_a_download_that_fails_after_reaching_the_hub_is_one_line(tmp_path, cache, capsys, monkeypatch):
    import huggingface_hub

    def dropped(*args, **kwargs):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(hub, "check_reachable", lambda *args: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", dropped)
    line = refused(["probe", "knn", "--model", "timm:deit3_small_patch16_224.fb_in1k", "--download", "--out",
                    str(tmp_path / "out")], capsys)
    assert ("--download of timm:deit3_small_patch16_224.fb_in1k failed (ConnectionResetError: [Errno 104] Connection "
            "reset by peer); check the name, or fetch it with `hf download timm/deit3_small_patch16_224.fb_in1k "
            "model.safetensors`") in line


def _cache_for(spec: str, cache: Path, tmp_path: Path) -> Path:
    """``spec``'s weights written into the hub cache; returns the cached weights file."""
    repo, file = NAMED[spec]
    if spec.startswith("hf:"):
        from transformers import Dinov2Config, Dinov2Model

        config = Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)
        Dinov2Model(config).save_pretrained(tmp_path / "saved")
        snapshot = write_cached(cache, repo, {n: tmp_path / "saved" / n for n in ("config.json", "model.safetensors")})
        return snapshot / "model.safetensors"
    source, _ = tiny_deit_file(tmp_path)
    return write_cached(cache, repo, {file: source}) / file


@pytest.mark.parametrize("spec", NAMED)
def test_a_damaged_cache_entry_names_the_re_download(spec, tmp_path, cache, capsys):
    """A cut-short cached file was told to "save the model again" (hf:) or met a reader's error; the fix is a fresh
    download, with the exact command."""
    cached = _cache_for(spec, cache, tmp_path)
    blob = cached.resolve()
    blob.write_bytes(blob.read_bytes()[:200])
    line = refused(["probe", "knn", "--model", spec, "--out", str(tmp_path / "out")], capsys)
    repo, file = NAMED[spec]
    fetch = (f"hf download {repo} model.safetensors --revision {COMMIT} --force-download" if file is None else
             f"hf download {repo} {file} --force-download")
    assert f"the cached file {cached} of {repo} is damaged" in line and f"fetch it afresh with `{fetch}`" in line
    assert "save the model again" not in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_cache_variable_pointing_at_a_file_is_named(variable, tmp_path, cache, capsys, monkeypatch):
    file = tmp_path / "not-a-folder"
    file.write_text("x")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv(variable, str(file))
    line = refused(["probe", "knn", "--model", "timm:deit3_small_patch16_224.fb_in1k", "--out",
                    str(tmp_path / "out")], capsys)
    assert f"{variable}={file} points at a file, not a folder; set {variable} to the Hugging Face cache folder" in line


def test_an_unknown_timm_tag_lists_the_known_tags(tmp_path, cache, capsys):
    import timm

    line = refused(["probe", "knn", "--model", "timm:vit_small_patch16_224.nope", "--out", str(tmp_path / "out")],
                   capsys)
    tags = [name.partition(".")[2] for name in timm.list_pretrained("vit_small_patch16_224.*")]
    assert "augreg_in21k_ft_in1k" in tags
    assert f"timm has no pretrained tag 'nope' for vit_small_patch16_224; its tags: {', '.join(tags)}" in line


def test_open_clip_at_another_img_size_says_the_size_is_the_issue(tmp_path, capsys):
    tower = {"layers": 1, "width": 64, "head_width": 32, "image_size": 64}
    torch.manual_seed(4)
    reference = load("open_clip:ViT-B-32", **tower)
    save_file({f"visual.{k}": v.contiguous() for k, v in reference.visual.state_dict().items()},
              str(tmp_path / "clip.safetensors"))
    with pytest.raises(ValueError) as info:
        load(f"open_clip:ViT-B-32@{tmp_path / 'clip.safetensors'}", img_size=96, **tower)
    assert ("its position table holds 4 patches (64 px at patch 32) and --img-size 96 asks for 9; open_clip: towers "
            "load at their own input size: drop --img-size (or use --img-size 64)") in str(info.value)
    assert "architecture" not in str(info.value)


def test_augreg_in21k_names_load_the_hubs_state_dict_as_timm_does(tmp_path, cache, monkeypatch):
    """timm's augreg in21k tags name an original .npz url and custom_load, but also an hf_hub_id, which timm's
    _resolve_pretrained_source prefers: the hub's ordinary state dict. Such names load from the cache like any
    other; only what timm itself reads with a custom loader (an .npz url with no hub id) is refused."""
    import dataclasses

    import timm
    from timm.models import get_pretrained_cfg

    from vitscope.models.weights import hub

    tiny = {"img_size": 32, "depth": 1, "embed_dim": 32, "num_heads": 2}
    torch.manual_seed(7)
    state = {k: v.contiguous() for k, v in load("timm:vit_base_patch16_224", num_classes=21843,  # the in21k head
                                                  **tiny).state_dict().items()}
    save_file(state, str(tmp_path / "augreg.safetensors"))
    cfg = get_pretrained_cfg("vit_base_patch16_224.augreg_in21k")
    assert cfg.custom_load and cfg.url.endswith(".npz") and cfg.hf_hub_id
    write_cached(cache, cfg.hf_hub_id, {"model.safetensors": tmp_path / "augreg.safetensors"})
    model = load("timm:vit_base_patch16_224.augreg_in21k", **tiny)
    assert_weights(model, state)
    assert model.vitscope_load["source"]["repo"] == "timm/vit_base_patch16_224.augreg_in21k"
    for name in timm.list_pretrained("*augreg_in21k"):  # every one of them is looked up on the hub, as timm does
        if name != "vit_base_patch16_224.augreg_in21k":
            with pytest.raises(ValueError, match=rf"not in the local cache .* `hf download timm/{name} model"):
                hub.timm_pretrained(name)
    npz_only = dataclasses.replace(cfg, hf_hub_id=None)  # what timm could only read with its .npz loader
    monkeypatch.setattr("timm.models.get_pretrained_cfg", lambda name: npz_only)
    with pytest.raises(ValueError, match=r"timm reads these weights with a custom loader \(the file https://.*\.npz\)"):
        hub.timm_pretrained("vit_base_patch16_224.augreg_in21k")
