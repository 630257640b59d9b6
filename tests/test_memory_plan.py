"""Memory plans: the budget variable, the batch that fits a budget, the estimate against a measured forward, and a
job that cannot fit refused in one line (estimate and flag) that leaves nothing behind."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vitscope.analyze.memory_plan import forward_shape, plan_batch
from vitscope.cli import main
from vitscope.data import synthetic_scenes
from vitscope.memory import BUDGET_VARIABLE, MemoryBudget, memory_budget, parse_size
from vitscope.models import create
from vitscope.probes.features import extract_features

GB = 2**30
IN_USE = 1 * GB  # a fake process size: the plans below depend on the budgets given, not on this test process


def fake_budget(limit: int, plan: int | None = None) -> MemoryBudget:
    return MemoryBudget(plan if plan is not None else limit, limit, IN_USE, "a test's budget")


def test_budget_variable_is_read_and_checked(monkeypatch):
    assert parse_size("12G") == 12 * GB and parse_size("1.5 GiB") == int(1.5 * GB)
    assert parse_size("800M") == 800 * 2**20 and parse_size("4096") == 4096
    monkeypatch.setenv(BUDGET_VARIABLE, "6G")
    budget = memory_budget()
    assert budget.limit == budget.plan == 6 * GB and BUDGET_VARIABLE in budget.source
    monkeypatch.setenv(BUDGET_VARIABLE, "lots")
    with pytest.raises(ValueError, match=f"{BUDGET_VARIABLE}='lots'.*12G"):
        memory_budget()
    monkeypatch.delenv(BUDGET_VARIABLE)
    unset = memory_budget()  # the process plus part of what the system has available
    assert unset is None or unset.in_use < unset.plan < unset.limit


def test_a_smaller_budget_picks_a_smaller_batch():
    model = create("vit-micro", img_size=256)
    roomy = plan_batch(model, "locality", 64, budget=fake_budget(64 * GB))
    assert roomy.batch_size == 64  # everything fits: capped by the images
    estimate = roomy.estimate
    for batch in (9, 3, 1):  # room for `batch` images and half of one more
        budget = fake_budget(estimate.at(batch) + estimate.per_batch_image // 2)
        assert plan_batch(model, "locality", 64, budget=budget).batch_size == batch
    # the plan's share of the budget sets the batch; the limit lets batch 1 run when the plan has no room
    squeezed = fake_budget(estimate.at(2), plan=estimate.at(0))
    assert plan_batch(model, "locality", 64, budget=squeezed).batch_size == 1
    assert plan_batch(model, "locality", 64, batch_size=2, budget=squeezed).batch_size == 2  # asked, and it fits


def test_refusals_name_the_estimate_and_the_flag_that_fixes_it():
    model = create("vit-micro", img_size=256)
    estimate = plan_batch(model, "norms", 8, budget=fake_budget(64 * GB)).estimate
    with pytest.raises(ValueError, match=r"would need about .* more than the .* --batch-size 3$"):
        plan_batch(model, "norms", 8, batch_size=8, budget=fake_budget(estimate.at(3)))
    side = forward_shape(model).side
    with pytest.raises(ValueError, match=r"--img-size (\d+)") as refused:
        plan_batch(model, "norms", 8, budget=fake_budget(estimate.at(1) - estimate.per_batch_image // 2))
    smaller = int(refused.value.args[0].rsplit("--img-size ", 1)[1])
    assert smaller < side and smaller % forward_shape(model).patch == 0
    many = plan_batch(model, "norms", 10**6, budget=fake_budget(2**50)).estimate  # norms kept for every image
    with pytest.raises(ValueError, match=r"--num-images \d+"):
        plan_batch(model, "norms", 10**6, budget=fake_budget(many.at(1) // 2 + IN_USE // 2))
    with pytest.raises(ValueError, match="use a smaller model"):  # not even the model and one image at any size
        plan_batch(model, "norms", 8, budget=fake_budget(IN_USE))


def test_refused_analysis_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("vitscope.analyze.memory_plan.memory_budget", lambda device: fake_budget(IN_USE + 2**20))
    out = tmp_path / "norms"
    code = main(["analyze", "norms", "--model", "vit-micro", "--img-size", "256", "--num-images", "4",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "norms of this model at 256 px would need about" in err[0] and "more than the 1.0 GB" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("command", ["locality", "norms"])
def test_refused_command_names_the_flag_that_fits_and_runs_no_image(command, tmp_path, monkeypatch, capsys):
    # a budget below one image at 256 px but above one at a smaller side: the line names --img-size and its value
    model = create("vit-micro", img_size=256)
    estimate = plan_batch(model, command, 4, budget=fake_budget(64 * GB)).estimate
    budget = fake_budget(estimate.at(1) - estimate.per_batch_image // 2)
    monkeypatch.setattr("vitscope.analyze.memory_plan.memory_budget", lambda device: budget)
    ran = []
    monkeypatch.setattr(f"vitscope.analyze.{command}.model_batches", lambda *a, **k: ran.append(1) or iter(()))
    out = tmp_path / command
    code = main(["analyze", command, "--model", "vit-micro", "--img-size", "256", "--num-images", "4",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert f"{command} of this model at 256 px would need about" in err[0]
    side = int(err[0].rsplit("pass --img-size ", 1)[1])
    assert side < 256 and plan_batch(create("vit-micro", img_size=side), command, 4, budget=budget).batch_size >= 1
    assert not out.exists() and not ran


def test_refused_feature_extraction_writes_no_cache(tmp_path, monkeypatch):
    monkeypatch.setattr("vitscope.analyze.memory_plan.memory_budget", lambda device: fake_budget(IN_USE + 2**20))
    data = synthetic_scenes("eval", num_images=4)
    with pytest.raises(ValueError, match="features of this model at 256 px would need"):
        extract_features(create("vit-micro", img_size=256), data, "all", cache=tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()


MEASURE = textwrap.dedent("""
    import json, sys, threading, time
    from vitscope.analyze.memory_plan import plan_batch
    from vitscope.data import synthetic_scenes
    from vitscope.memory import MemoryBudget
    from vitscope.models import load

    work = sys.argv[1]
    model = load("timm:vit_small_patch14_dinov2", img_size=336).eval()
    data = synthetic_scenes("eval", num_images=6, image_size=64)

    def run(batch):
        if work == "norms":
            from vitscope.analyze.norms import measure_norms
            measure_norms(model, data, batch_size=batch, progress=False)
        else:
            from vitscope.studies.registers.census import CensusSettings, run_census
            run_census(model, data, "m", CensusSettings(batch_size=batch), progress=False)

    def anonymous_rss():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))

    def peak_while(call):
        # the anonymous resident set's peak, sampled every millisecond: unlike getrusage's maxrss it leaves out
        # the libraries' file pages, which the kernel may reclaim (and fault back) while the process runs, so a
        # reclaim between two runs cannot hide what the second one adds (it did in a full test run)
        peak, done = [anonymous_rss()], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], anonymous_rss())
                time.sleep(0.001)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            call()
        finally:
            done.set()
            sampler.join()
        return max(peak[0], anonymous_rss())

    base = peak_while(lambda: run(1))  # every image seen once, one at a time: what all batch sizes share
    grown = peak_while(lambda: run(6)) - base
    plan = plan_batch(model, work, 6, budget=MemoryBudget(2**40, 2**40, 0, "unbounded"))
    print(json.dumps({"grown": grown, "per_image": plan.estimate.per_batch_image}))
""")


def grown_and_estimate(work: str) -> dict:
    src = str(Path(__file__).resolve().parents[1] / "src")
    run = subprocess.run([sys.executable, "-c", MEASURE, work], capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2",
                              # every block over 64 KB mapped on its own and unmapped when freed: the peak RSS is
                              # the live set, not what glibc's heap happened to keep of earlier batches
                              "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("work", ["norms", "census"])
def test_the_estimate_covers_a_measured_batch_without_wasting_much(work):
    # a fresh process (peak RSS is per process): what a batch of 6 adds over batches of 1, against 5 images' estimate
    measured = grown_and_estimate(work)
    grown, estimated = measured["grown"], 5 * measured["per_image"]
    assert grown <= estimated <= 2.5 * grown, (grown / 2**20, estimated / 2**20)


def test_sizes_in_messages_never_read_zero():
    """vit-micro's per-image share of a batch (a few hundred KB) was printed as '128 x 0 MB per image'."""
    from vitscope.memory.budget import gigabytes

    assert [gigabytes(b) for b in (4.4 * 2**30, 310 * 2**20, 0.38 * 2**20)] == ["4.4 GB", "310 MB", "0.38 MB"]
