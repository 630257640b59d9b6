"""``refused``: run ``vitscope ARGV`` in-process and return its one-line error (shared by the bad-input tests)."""

from vitscope.cli import main


def refused(argv: list[str], capsys, only_line: bool = True) -> str:
    """The error line of ``vitscope ARGV``, which must exit 2 (argparse errors exit through SystemExit) with no
    traceback. ``only_line``: stderr holds nothing else (else notices may come before the error, which is last)."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    assert code == 2, (argv, captured.err[-2000:])
    lines = captured.err.strip().splitlines()
    assert lines and lines[-1].startswith("vitscope: error: "), captured.err
    assert not only_line or len(lines) == 1, captured.err
    assert "usage:" not in captured.err and "Traceback" not in captured.err
    return lines[-1]
