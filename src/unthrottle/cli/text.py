"""User text is text: the one way the CLI prints what it did not write itself.

Names, namespaces, selectors, paths, URLs and scenario fields reach the terminal through
Rich, which reads ``[...]`` as markup (``[/x]`` crashes it) and ``:name:`` as an emoji,
and through a terminal, which obeys escape sequences. So every message goes through
:func:`plain` (escape sequences removed, other control characters shown as ``\\xNN``,
known secrets replaced by ``***``) and reaches Rich as a :class:`~rich.text.Text`
(:func:`styled`, :func:`cell`), never as markup.

The secrets are a process-wide set, filled by the options that carry one (a token, a
password, a header value, a kubeconfig's credentials) before anything else runs: a safety
net under the rule that no message quotes a secret, so that even a bug's message cannot
print one.
"""

from __future__ import annotations

import re

from rich.text import Text

_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erase
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks
    r"|\x1b[P^_][^\x1b]*(?:\x1b\\)?"  # DCS, PM, APC strings
    r"|\x1b[ -/]*[0-~]"  # two-character escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROLS_AND_LINES = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SECRETS: set[str] = set()
MIN_SECRET = 8
"""Shorter values are not hidden: ``***`` in place of every ``test`` in a path would hide
the message, and credentials that short are not what this net is for."""


def hide(*secrets: str | None) -> None:
    """Never print these (tokens, passwords, header values) from now on."""
    _SECRETS.update(s for s in secrets if s and len(s) >= MIN_SECRET)


def _visible(found: re.Match[str]) -> str:
    return f"\\x{ord(found.group(0)):02x}"


def plain(text: object, *, one_line: bool = False) -> str:
    """``text`` safe for a terminal: escape sequences removed, other control characters
    written as ``\\xNN`` (newlines and tabs kept, unless ``one_line``), secrets as ``***``."""
    out = _SEQUENCES.sub("", str(text))
    out = (_CONTROLS_AND_LINES if one_line else _CONTROLS).sub(_visible, out)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        out = out.replace(secret, "***")
    return out


def styled(text: object, style: str = "", *, one_line: bool = False) -> Text:
    """``text`` as :func:`plain`, for Rich: it prints as itself, in ``style``."""
    return Text(plain(text, one_line=one_line), style=style)


def cell(text: object) -> Text:
    """A table cell of user text: never markup, one line."""
    return Text(plain(text, one_line=True))
