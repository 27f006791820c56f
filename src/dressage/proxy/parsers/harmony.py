"""gpt-oss's harmony channels: ``analysis`` is reasoning, ``commentary to=functions.NAME`` a call,
``final`` (or commentary to nobody) the content.

A reply reads ``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>commentary
to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`` or ``...<|channel|>final<|message|>...<|return|>``;
the recipient may stand before the channel (``<|start|>assistant to=functions.NAME<|channel|>commentary``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from dressage.proxy.parsers.base import ParsedCall, ToolCallParser, held_tail, call_entry

__all__ = ["HarmonyParser"]

_MESSAGE = re.compile(r"(?:<\|start\|>\s*assistant)?(?P<header>(?:(?!<\|message\|>|<\|start\|>).)*?)<\|message\|>"
                      r"(?P<body>.*?)(?P<close><\|end\|>|<\|call\|>|<\|return\|>|$)", re.DOTALL)
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")


class HarmonyParser(ToolCallParser):
    name = "gpt-oss"
    markers = ("<|channel|>",)
    special_markers = True

    def _messages(self, text: str) -> list[tuple[str, str | None, str, bool, int, int]]:
        """(channel, recipient, body, closed, start, end) of each message in ``text``."""
        out = []
        for m in _MESSAGE.finditer(text):
            if m.end() == m.start():
                break
            channel = _CHANNEL.search(m.group("header"))
            recipient = _RECIPIENT.search(m.group("header"))
            out.append((channel.group(1) if channel else "final", recipient.group(1) if recipient else None,
                        m.group("body"), bool(m.group("close")), m.start(), m.end()))
        return out

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None, *,
                   closed_only: bool = False) -> list[ParsedCall]:
        # A whole reply's last message may end without its <|call|>: that is an end-of-turn token,
        # which reply texts leave out.
        out = []
        for channel, recipient, body, closed, start, end in self._messages(text):
            if recipient is None or not (closed or (end == len(text) and not closed_only)):
                continue
            try:
                ok = isinstance(json.loads(body), dict)
            except ValueError:
                ok = False
            if ok:
                out.append(ParsedCall(start, end, recipient, body.strip()))
        return out

    def _split(self, text: str) -> tuple[str | None, str, list[ParsedCall]]:
        if "<|message|>" not in text:
            return None, text, []
        reasoning, content, calls = [], [], []
        for channel, recipient, body, closed, start, end in self._messages(text):
            if recipient is not None:
                call = self.find_calls(text[start:end])
                if call:
                    calls.append(call[0])
                    continue
            (reasoning if channel == "analysis" else content).append(body)
        return ("\n".join(r.strip() for r in reasoning) if reasoning else None), "".join(content), calls

    def split_reasoning(self, text: str) -> tuple[str, str | None]:
        reasoning, content, _ = self._split(text)
        return content, reasoning

    def parse(self, text: str, *, call_id_prefix: str,
              tools: Sequence[dict[str, Any]] | None = None) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        reasoning, content, calls = self._split(text)
        entries = [call_entry(c, f"{call_id_prefix}_{i}") for i, c in enumerate(calls)]
        if not entries:
            return content, reasoning, []
        return content.strip() or None, reasoning, entries

    def stream_calls(self, text: str, *, call_id_prefix: str,
                     tools: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        found = self.find_calls(text, tools, closed_only=True)  # a call still arriving may read as JSON
        return [call_entry(c, f"{call_id_prefix}_{i}") for i, c in enumerate(found)]

    def stream_prefix(self, text: str) -> tuple[str | None, str]:
        # Nothing is certain before the final channel opens: until then any message may still be
        # reasoning or a call. The final message is the reply's last, so what precedes it is settled.
        messages = self._messages(text)
        at = next((i for i, m in enumerate(messages) if m[0] == "final" and m[1] is None), None)
        if at is None:
            return None, ""
        reasoning = [m[2] for m in messages[:at] if m[0] == "analysis"]
        content = [m[2] for m in messages[:at] if m[0] != "analysis" and m[1] is None]
        body, closed = messages[at][2], messages[at][3]
        content.append(body if closed else held_tail(body, _ENDS))
        text_out = "".join(content).rstrip().rstrip("\ufffd").rstrip()
        return ("\n".join(r.strip() for r in reasoning) if reasoning else None), text_out
