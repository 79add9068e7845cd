"""Every sub-command of ``seqmem`` has a description and every option a help line that shows its default."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from seqmem.cli import make_parser
from seqmem.clihelp import walk_parsers

PARSERS = list(walk_parsers(make_parser(), "seqmem"))


def _expanded(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return parser._get_formatter()._expand_help(action)


@pytest.mark.parametrize("path, parser", PARSERS[1:], ids=[p for p, _ in PARSERS[1:]])
def test_subcommand_has_description(path, parser):
    assert parser.description and len(parser.description) > 10, path
    assert "``" not in parser.description, f"{path}: raw markup in the description"


def _option_cases():
    for path, parser in PARSERS:
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            yield pytest.param(path, parser, action, id=f"{path} {'/'.join(action.option_strings) or action.dest}")


@pytest.mark.parametrize("path, parser, action", list(_option_cases()))
def test_option_help_shows_default(path, parser, action):
    assert action.help and action.help.strip(), f"{path} {action.option_strings}: no help"
    text = _expanded(parser, action)
    assert "``" not in text, f"{path} {action.option_strings}: raw markup"
    if action.required or not action.option_strings or action.default is False:
        return  # required, positional, or an on/off flag (off unless given)
    if action.default is None:
        assert "default" in text.lower(), f"{path} {action.option_strings}: says nothing of its default: {text!r}"
    else:
        assert str(action.default) in text, f"{path} {action.option_strings}: {action.default!r} not in {text!r}"


def test_every_help_renders():
    for path, parser in PARSERS:
        assert parser.format_help(), path


def test_deprecated_spellings_still_work(capsys):
    args = make_parser().parse_args(["train", "--task", "mqar", "--mixer", "attention", "--out", "x",
                                     "--vocab", "64", "--batch", "8"])
    assert args.vocab == 64 and args.batch_size == 8
    assert "deprecated" in capsys.readouterr().err
    helps = make_parser().parse_args(["train", "--task", "mqar", "--mixer", "attention", "--out", "x"])
    assert helps.batch_size == 32


def test_list_descriptions_are_not_cut():
    out = subprocess.run([sys.executable, "-m", "seqmem", "list", "--d-model", "32", "--heads", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines()[1:-1]:
        desc = line.split(None, 3)[-1]
        assert desc.count("(") == desc.count(")"), line
        assert not desc.rstrip().endswith((",", ":", ";", "—", "-", "(")), line
