"""Help conventions of the ``seqmem`` command line, applied to every sub-command by :func:`finish_parser`.

* every option's help line ends with ``(default: X)`` unless it already speaks of its default (``(default:
  none)`` for an option that is simply not set; on/off flags are off by default);
* every sub-command has a description (its one-line help when it has none of its own);
* one spelling per shared flag (``--vocab-size``, ``--batch-size``); an old spelling stays as a hidden alias that
  works and prints a deprecation note (:func:`add_deprecated_alias`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

__all__ = ["HelpFormatter", "add_deprecated_alias", "finish_parser", "walk_parsers"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``ArgumentDefaultsHelpFormatter`` that prints ``(default: none)`` for ``None``, nothing for an on/off flag,
    and leaves alone a help text that already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        if (
            "%(default)" in h
            or "default" in h.lower()
            or action.default is False
            or action.default is argparse.SUPPRESS
            or action.required
            or not action.option_strings
        ):
            return h
        if action.default is None:
            return h + " (default: none)"
        return h + " (default: %(default)s)"


class _DeprecatedAlias(argparse.Action):
    def __init__(self, option_strings, dest, new: str = "", **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: note: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, **kw) -> None:
    """Accept ``old`` (hidden from ``--help``) as a synonym of the option ``new`` already added to ``parser``.

    ``kw`` (e.g. ``type=``) must match how ``new`` parses its value."""
    target = next(a for a in parser._actions if new in a.option_strings)
    parser.add_argument(old, dest=target.dest, action=_DeprecatedAlias, new=new, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, type=kw.pop("type", target.type), **kw)


def walk_parsers(parser: argparse.ArgumentParser, prog: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command path, parser)`` of ``parser`` and every sub-command below it, depth first."""
    yield prog or parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk_parsers(sub, f"{prog or parser.prog} {name}")


def finish_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Apply the conventions above to ``parser`` and all its sub-commands (in place); returns ``parser``."""
    for _, p in walk_parsers(parser):
        p.formatter_class = HelpFormatter
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {ca.dest: ca.help for ca in action._choices_actions}
                for name, sub in action.choices.items():
                    if not sub.description and helps.get(name):
                        h = helps[name]
                        sub.description = h[0].upper() + h[1:] + ("" if h.endswith(".") else ".")
    return parser
