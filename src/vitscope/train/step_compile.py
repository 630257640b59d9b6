"""Which path a training step's forward runs: ``torch.compile`` (inductor: C++ on CPU, Triton on GPU) or eager.

``step_runner(model, wanted)`` wraps the module the engine and packed training step. Compiling is asked for by the
config key ``compile`` and switched off by ``VITSCOPE_COMPILE=0`` (read when a run starts, never at import);
``VITSCOPE_COMPILE=1`` asks for it whatever the config says. When ``torch.compile`` is missing or fails (at wrap
time or at the first call, where inductor compiles), the step runs eagerly and training proceeds. One line on
stderr says which path runs, and why, whenever compiling was asked for or switched off by hand (eager by the
config's default is silent).

The wrapper is no module: checkpoints save the wrapped model itself, so their state-dict keys are the eager ones
(a compiled module would prefix them with ``_orig_mod.``) and runs resume across both paths. Compiling costs a
warm-up (tens of seconds on a CPU) and is off by default: docs/benchmarks.md says where it pays.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ENV = "VITSCOPE_COMPILE"


def compile_wanted(config_value: bool) -> tuple[bool, str]:
    """(compile or not, why) from the config key and ``VITSCOPE_COMPILE`` (0 wins, 1 asks for it)."""
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("0", "false", "off", "no"):
        return False, f"{ENV}={env}"
    if env in ("1", "true", "on", "yes"):
        return True, f"{ENV}={env}"
    if env:
        raise ValueError(f"{ENV}={env!r} must be 0 (eager) or 1 (compile)")
    return bool(config_value), f"compile: {str(bool(config_value)).lower()} in the config"


class StepRunner:
    """Calls ``model`` compiled, or eagerly where compiling is off or fails (``path`` says which: "compiled" or
    "eager"). ``say`` prints the one line (stderr by default)."""

    def __init__(self, model: nn.Module, wanted: bool, why: str, say: Callable[[str], None] | None = None):
        self.model, self.say = model, say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.compiled: Callable[..., Any] | None = None
        if wanted:
            try:
                self.compiled = torch.compile(model)
            except Exception as err:  # noqa: BLE001 (any failure of the compiler means: run eagerly)
                self._fall_back(err)
                return
            self.say(f"vitscope: training step compiled with torch.compile ({why}; {ENV}=0 runs it eagerly)")
        elif why.startswith(ENV):  # switched off by hand: say so; eager by the config's default is the quiet case
            self.say(f"vitscope: training step runs eagerly ({why})")

    @property
    def path(self) -> str:
        return "compiled" if self.compiled is not None else "eager"

    def _fall_back(self, err: Exception) -> None:
        self.compiled = None
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        self.say(f"vitscope: torch.compile failed ({type(err).__name__}: {reason}); the training step runs "
                 "eagerly")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 (the eager call below raises the model's own errors)
                self._fall_back(err)
        return self.model(*args, **kwargs)

    def train(self, mode: bool = True) -> StepRunner:
        self.model.train(mode)
        return self


def step_runner(model: nn.Module, config_value: bool, say: Callable[[str], None] | None = None) -> StepRunner:
    """``model``'s training-step runner: compiled when the config (or ``VITSCOPE_COMPILE``) asks, else eager."""
    wanted, why = compile_wanted(config_value)
    return StepRunner(model, wanted, why, say)
