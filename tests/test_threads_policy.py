"""The CPU wait policy and thread count: applied where runs start (the command, the training loops), never at
import; a bad VITSCOPE_THREADS or VITSCOPE_OMP_WAIT is one line naming the variable, the value and the forms."""

import os
import subprocess
import sys

import pytest
import torch

from vitscope.threads import CoreShare

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "VITSCOPE_OMP", "VITSCOPE_THR"))}


def test_import_leaves_the_environment_alone():
    first = ("import os, sys, json; before = dict(os.environ); import vitscope, vitscope.cli, vitscope.threads; "
             "print(json.dumps([sorted(set(os.environ.items()) ^ set(before.items())), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", first], env=CLEAN, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[[], false]"  # nothing set, and torch not loaded yet
    # the modules behind the public names too; torch's own import may set variables (TORCHINDUCTOR_CACHE_DIR),
    # so this snapshot is taken after it
    then = ("import os, json, torch, torch._inductor; before = dict(os.environ); import vitscope; "
            "vitscope.record_attention; vitscope.AttentionStats; import vitscope.train, vitscope.probes; "
            "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))")
    out = subprocess.run([sys.executable, "-c", then], env=CLEAN, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("env,expected", [
    ({}, "10000 None"),  # the short spin by default
    ({"VITSCOPE_OMP_WAIT": "passive"}, "None PASSIVE"),
    ({"VITSCOPE_OMP_WAIT": "default"}, "None None"),
    ({"VITSCOPE_OMP_PASSIVE": "0"}, "None None"),  # the older opt-out still means OpenMP's own policy
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "None ACTIVE"),  # a user's choice is kept
])
def test_the_command_sets_the_wait_policy_before_torch_loads(env, expected):
    code = """
import os, sys
import vitscope.cli as cli
seen = []
real = cli.apply_wait_policy
cli.apply_wait_policy = lambda: (seen.append("torch" in sys.modules), real())[1]
try:
    cli.main(["--version"])
except SystemExit:
    pass
print(seen, os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))
"""
    out = subprocess.run([sys.executable, "-c", code], env=CLEAN | env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == f"[False] {expected}"


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", "models"])
@pytest.mark.parametrize("omp", [None, "1"])
def test_a_bad_thread_setting_is_one_line_naming_it(value, omp):
    env = CLEAN | {"VITSCOPE_THREADS": value} | ({"OMP_NUM_THREADS": omp} if omp else {})
    out = subprocess.run([sys.executable, "-m", "vitscope.cli", "models"], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert f"VITSCOPE_THREADS={value!r}" in out.stderr and "'auto', 'fixed' or a positive integer" in out.stderr


def test_a_bad_wait_choice_names_the_value():
    out = subprocess.run([sys.executable, "-m", "vitscope.cli", "models"], env=CLEAN | {"VITSCOPE_OMP_WAIT": "spin"},
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "VITSCOPE_OMP_WAIT='spin'" in out.stderr and "'short', 'passive' or 'default'" in out.stderr


def test_a_loop_applies_an_explicit_thread_count_and_restores_it(monkeypatch):
    previous = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("VITSCOPE_THREADS", "1" if previous > 1 else "2")
    wanted = int(os.environ["VITSCOPE_THREADS"])
    with CoreShare() as cores:
        assert torch.get_num_threads() == wanted and not cores.enabled
    assert torch.get_num_threads() == previous
    monkeypatch.setenv("VITSCOPE_THREADS", "1.5")
    with pytest.raises(ValueError, match=r"VITSCOPE_THREADS='1.5'"):
        CoreShare()
