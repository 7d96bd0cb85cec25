"""Griffe extension for the API reference: our docstrings are reStructuredText-flavoured
(``:class:`X``` roles, ``>>>`` examples); the site renders Markdown. Roles become code
spans and doctest lines become Python code blocks, so neither shows up as raw markup."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):`~?([^`]+)`")
DOCTEST_BLOCK = re.compile(r"(?m)^(?P<indent>[ \t]*)>>> .*(?:\n(?P=indent)(?:>>> |\.\.\. ).*)*")


def _as_markdown(text: str) -> str:
    text = ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return DOCTEST_BLOCK.sub(lambda m: f"```pycon\n{m.group(0).strip()}\n```", text)


class ReSTRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, loader: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _as_markdown(obj.docstring.value)
