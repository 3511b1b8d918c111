"""`--help` that shows every option's default, for DLRover's commands.

argparse's `ArgumentDefaultsHelpFormatter` appends ``(default: X)`` only to options that have help
text, and prints ``False`` and ``None`` as they are. `DefaultsHelpFormatter` appends it to every
option, says ``off``/``on`` for a flag and ``not set`` for an option without a value, and leaves
alone a help text that already says its default in words (``(default: the master's choice)``),
the way to describe a default that is computed at run time.
"""

from __future__ import annotations

import argparse
import copy

__all__ = ["DefaultsHelpFormatter", "default_text"]

_SAYS_DEFAULT = "(default"


def default_text(action: argparse.Action) -> str | None:
    """How `--help` shows `action`'s default: ``(default: X)``; None for an action that shows none
    (a positional argument, ``--help``) or whose help text already says its default."""
    if not action.option_strings or action.default is argparse.SUPPRESS:
        return None
    if _SAYS_DEFAULT in (action.help or ""):
        return None
    value = action.default
    if action.nargs == 0:  # a flag: store_true and its kind
        shown = "on" if value else "off"
    elif value is None or value == "":
        shown = "not set"
    elif isinstance(value, (list, tuple)):
        shown = ",".join(str(v) for v in value) or "not set"
    else:
        shown = str(value)
    return f"(default: {shown})"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """A help formatter that shows every option's default (see the module docstring)."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and default_text(action) is not None:
            # argparse prints no help line at all for an option without help text.
            action = copy.copy(action)
            action.help = self._get_help_string(action)
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = default_text(action)
        if shown is None:
            return action.help
        # argparse %-formats help texts: a default holding '%' must not be read as a directive.
        shown = shown.replace("%", "%%")
        return f"{text} {shown}" if text else shown
