"""`DefaultsHelpFormatter`: every option's default in `--help`."""

from __future__ import annotations

import argparse

import pytest

from dlrover.common import DefaultsHelpFormatter, default_text


@pytest.fixture
def parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    monkeypatch.setenv("COLUMNS", "10000")
    p = argparse.ArgumentParser(prog="x", formatter_class=DefaultsHelpFormatter)
    p.add_argument("--count", type=int, default=3, help="how many")
    p.add_argument("--bare", default="5")  # no help text: argparse alone would print no line for it
    p.add_argument("--flag", action="store_true", help="turn it on")
    p.add_argument("--unset", default=None, help="see %(prog)s")
    p.add_argument("--said", default=None, help="when (default: the master's choice)")
    p.add_argument("--rate", default="50%")
    p.add_argument("--signals", default=("SIGTERM", "SIGINT"))
    p.add_argument("script")
    return p


def test_every_option_shows_its_default_once(parser: argparse.ArgumentParser) -> None:
    lines = [" ".join(line.split()) for line in parser.format_help().splitlines()]
    assert "--count COUNT how many (default: 3)" in lines
    assert "--bare BARE (default: 5)" in lines
    assert "--flag turn it on (default: off)" in lines
    assert "--unset UNSET see x (default: not set)" in lines
    assert "--said SAID when (default: the master's choice)" in lines
    assert "--rate RATE (default: 50%)" in lines
    assert "--signals SIGNALS (default: SIGTERM,SIGINT)" in lines
    assert "script" in lines  # a positional argument shows no default
    assert "-h, --help show this help message and exit" in lines


def test_default_text() -> None:
    assert default_text(argparse.Action(["--x"], "x", default=0)) == "(default: 0)"
    assert default_text(argparse.Action(["--x"], "x", nargs=0, default=True)) == "(default: on)"
    assert default_text(argparse.Action(["--x"], "x", default="", help="y")) == "(default: not set)"
    assert default_text(argparse.Action(["--x"], "x", default=argparse.SUPPRESS)) is None
    assert default_text(argparse.Action([], "x", default="a")) is None
