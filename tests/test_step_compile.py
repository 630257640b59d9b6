"""The training step's compile switch: compiled equals eager, VITSCOPE_COMPILE=0 and the config key turn it off,
a failing compiler falls back to eager with one line and training proceeds, and checkpoints keep eager keys."""

import functools

import pytest
import torch
from safetensors.torch import load_file

from vitscope.models import create
from vitscope.models.own.packed import PackedViT
from vitscope.train.config import TrainConfig
from vitscope.train.packed.train import train_packed
from vitscope.train.step_compile import ENV, StepRunner, compile_wanted, step_runner
from vitscope.train.trainer import train

TINY = {"model": "vit-micro", "model_options": {"depth": 1, "embed_dim": 16, "num_heads": 2},
        "dataset": "synthetic", "dataset_options": {"num_images": 16, "num_classes": 4}, "eval_images": 8,
        "batch_size": 8, "epochs": 1, "warmup_epochs": 0, "progress": False, "log_every_steps": 1, "device": "cpu"}


@pytest.fixture
def compile_calls(monkeypatch):
    """torch.compile replaced by a spy that raises, as a compiler that is missing or broken does."""
    calls = []

    def broken(model, **kwargs):
        calls.append(model)
        raise RuntimeError("no working C++ compiler\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    return calls


@pytest.mark.parametrize(("env", "config", "wanted"), [("", True, True), ("", False, False), ("0", True, False),
                                                       ("1", False, True)])
def test_env_switch_and_config_key(monkeypatch, env, config, wanted):
    monkeypatch.setenv(ENV, env)
    assert compile_wanted(config)[0] is wanted


def test_bad_env_value_is_named(monkeypatch):
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(ValueError, match="VITSCOPE_COMPILE='maybe' must be 0"):
        compile_wanted(True)


def test_switched_off_never_calls_the_compiler(monkeypatch, compile_calls):
    monkeypatch.setenv(ENV, "0")
    lines = []
    runner = step_runner(torch.nn.Linear(3, 2), True, say=lines.append)
    assert runner.path == "eager" and not compile_calls
    assert lines == ["vitscope: training step runs eagerly (VITSCOPE_COMPILE=0)"]


def test_compiler_failing_at_wrap_time_falls_back(monkeypatch, compile_calls):
    monkeypatch.delenv(ENV, raising=False)
    model, lines = torch.nn.Linear(3, 2), []
    runner = step_runner(model, True, say=lines.append)
    x = torch.randn(4, 3)
    assert runner.path == "eager" and len(compile_calls) == 1 and torch.equal(runner(x), model(x))
    assert len(lines) == 1 and "torch.compile failed (RuntimeError: no working C++ compiler)" in lines[0]
    assert lines[0].endswith("runs eagerly")


def test_compiled_code_failing_at_first_call_falls_back(monkeypatch):
    def compiled_but_broken(model, **kwargs):
        def run(*args):
            raise RuntimeError("inductor: C++ compile error")
        return run

    monkeypatch.setattr(torch, "compile", compiled_but_broken)
    model, lines = torch.nn.Linear(3, 2), []
    runner = StepRunner(model, True, "test", say=lines.append)
    assert runner.path == "compiled" and "compiled with torch.compile" in lines[0]
    x = torch.randn(4, 3)
    assert torch.equal(runner(x), model(x)) and runner.path == "eager" and "failed" in lines[1]
    assert torch.equal(runner(x), model(x)) and len(lines) == 2  # stays eager, says it once


def test_engine_trains_eagerly_when_compiling_fails(tmp_path, monkeypatch, compile_calls, capsys):
    monkeypatch.delenv(ENV, raising=False)
    summary = train(TrainConfig.from_dict({**TINY, "compile": True, "out": str(tmp_path / "run")}))
    assert summary["steps"] == 2 and len(compile_calls) == 1
    assert "torch.compile failed (RuntimeError: no working C++ compiler); the training step runs eagerly" in \
        capsys.readouterr().err


def test_compiled_pack_step_equals_eager_and_checkpoints_keep_eager_keys(tmp_path, monkeypatch, capsys):
    """Inductor (C++ on this CPU) on a tiny pack: the forward and every gradient equal the eager ones within
    float tolerance; packed training compiled writes run folders whose weights have the eager keys."""
    monkeypatch.delenv(ENV, raising=False)
    torch.manual_seed(0)
    models = [create("vit-micro", depth=1, embed_dim=16, num_heads=2) for _ in range(2)]
    images, labels = torch.randn(2, 4, 3, 32, 32), torch.randint(0, 10, (2, 4))
    grads = {}
    for path in ("eager", "compiled"):
        packed = PackedViT(models)
        runner = StepRunner(packed, path == "compiled", "test", say=lambda line: None)
        logits = runner(images)
        sum(torch.nn.functional.cross_entropy(logits[k], labels[k]) for k in range(2)).backward()
        assert runner.path == path
        grads[path] = (logits.detach(), {n: p.grad for n, p in packed.named_parameters()})
    torch.testing.assert_close(grads["compiled"][0], grads["eager"][0], atol=1e-5, rtol=1e-4)
    for name, grad in grads["eager"][1].items():
        torch.testing.assert_close(grads["compiled"][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # run folders: the compiled wrapper is no module, so saved keys are the eager model's (no "_orig_mod.")
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    configs = [TrainConfig.from_dict({**TINY, "compile": True, "seed": s, "out": str(tmp_path / f"m{s}")})
               for s in range(2)]
    train_packed(configs)
    assert capsys.readouterr().err.count("training step compiled with torch.compile") == 1
    expected = set(create("vit-micro", depth=1, embed_dim=16, num_heads=2, num_classes=4).state_dict())
    for c in configs:
        assert set(load_file(str(tmp_path / c.out / "model.safetensors"))) == expected
        step = sorted((tmp_path / c.out / "checkpoints").glob("step-*"))[-1]
        assert set(load_file(str(step / "model.safetensors"))) == expected



def test_eager_by_the_configs_default_says_nothing(monkeypatch, compile_calls):
    """Every run (and every one-line refusal) printed 'runs eagerly' when nobody asked to compile."""
    monkeypatch.delenv(ENV, raising=False)
    lines = []
    runner = step_runner(torch.nn.Linear(3, 2), False, say=lines.append)
    assert runner.path == "eager" and not compile_calls and lines == []
