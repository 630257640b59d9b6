"""`--help` shows every option's default (or what decides it), and an unknown option points at its command's help."""

import argparse

import pytest

from vitscope.cli import build_parser, main


def options(parser: argparse.ArgumentParser):
    """(parser, action) for every option of ``parser`` and of every command below it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from options(sub)
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield parser, action


def rendered_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text ``parser --help`` prints for ``action`` (its help string with the defaults filled in)."""
    return " ".join(parser._get_formatter()._expand_help(action).split())


ALL_OPTIONS = list(options(build_parser()))


def test_the_tree_is_walked():
    progs = {parser.prog for parser, _ in ALL_OPTIONS}
    assert {"vitscope", "vitscope explore", "vitscope analyze norms", "vitscope study locality",
            "vitscope probe depth", "vitscope train", "vitscope demo", "vitscope export"} <= progs
    assert len(ALL_OPTIONS) > 150


@pytest.mark.parametrize(("parser", "action"), ALL_OPTIONS,
                         ids=[f"{p.prog}:{a.option_strings[-1]}" for p, a in ALL_OPTIONS])
def test_every_option_shows_its_default(parser, action):
    if action.nargs == 0 or action.required:  # flags (off unless given) and required options have none
        return
    text = rendered_help(parser, action)
    assert "default" in text.lower(), f"{parser.prog} {action.option_strings[-1]}: {text!r}"
    value = action.default
    if value not in (None, argparse.SUPPRESS, []) and not isinstance(value, bool):
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        assert shown in text.split("default", 1)[1], f"{parser.prog} {action.option_strings[-1]}: {text!r}"


@pytest.mark.parametrize(("prog", "flag", "value"), [
    ("vitscope study locality", "--epochs", None), ("vitscope study locality", "--preset", "demo"),
    ("vitscope analyze norms", "--threshold", "percentile:98"), ("vitscope explore", "--num-images", "16"),
    ("vitscope explore", "--out", "./vitscope-explore"),
])
def test_the_issue_s_options_say_their_default(prog, flag, value):
    parser, action = next((p, a) for p, a in ALL_OPTIONS if p.prog == prog and flag in a.option_strings)
    text = rendered_help(parser, action)
    assert "default" in text and (value is None or f"default: {value}" in text), text


@pytest.mark.parametrize("argv", [["analyze", "norms", "--bogus"], ["study", "locality", "--bogus", "1"],
                                  ["explore", "--epochs", "3"], ["demo", "--nope"]])
def test_an_unknown_option_points_at_its_command_s_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip()
    command = " ".join(a for a in argv if not a.startswith("-") and not a.isdigit())
    assert exit_info.value.code == 2
    assert err.startswith("vitscope: error: unrecognized arguments: ")
    assert err.endswith(f"see `vitscope {command} --help`"), err


def test_an_unknown_option_before_the_command_points_at_the_top_help(capsys):
    with pytest.raises(SystemExit):
        main(["--bogus", "demo"])
    assert capsys.readouterr().err.strip().endswith("see `vitscope --help`")


def test_demo_help_and_readme_state_the_same_measured_stage_times(capsys):
    """`vitscope demo --help` and the README give the same minutes per stage, both as measured idle (not estimated)."""
    import re
    from pathlib import Path

    from vitscope.cli.demo import DEMOS

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    stages = re.search(r"\(locality ([\d.]+), sparse ([\d.]+), registers ([\d.]+);", readme)
    assert stages, "the README's demo time line moved"
    for name, minutes in zip(("locality", "sparse", "registers"), stages.groups(), strict=True):
        assert DEMOS[name].minutes == float(minutes)
        assert f"{name} {DEMOS[name].minutes:g}" in shown
    assert "measured idle" in shown and "estimated" not in shown


def test_readme_times_say_they_assume_idle_cores():
    """The README's install and demo times held only on idle cores and did not say so."""
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    install = readme[readme.index("The first command installs"):readme.index("not part of the demo's time")]
    assert "about 2 minutes" in install and "2 idle cores" in install
    assert "about 9 minutes on 2 idle CPU cores" in readme
    assert "Both times assume cores that nothing else is using" in readme and "(`uptime`)" in readme
    assert "the index is written first and again as each demo finishes" in readme
