"""What an endpoint does with each request field, as data: used, accepted and ignored, or refused.

Each endpoint declares one :class:`ParamPolicy` beside its schema (chat completions, Responses, text
completions); the same rows check a request and render the tables of ``docs/parameters.md``, so the
documentation and the behaviour are one source. A field the policy does not list is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from dressage.errors import UnsupportedParameterError

__all__ = ["Param", "ParamPolicy", "USED", "IGNORED", "REFUSED", "request_fields"]

USED, IGNORED, REFUSED = "used", "ignored", "refused"
Action = Literal["used", "ignored", "refused"]


@dataclass(frozen=True, slots=True)
class Param:
    """One request field and what the Proxy does with it."""

    name: str
    action: Action
    """``used``: it shapes the call; ``ignored``: accepted, it cannot change what is sampled;
    ``refused``: its meaning would change the sample and the Proxy cannot serve it (400)."""
    doc: str
    """What the Proxy does with it, as ``docs/parameters.md`` says (one table cell)."""
    refuse: Callable[[Any], str | None] | None = None
    """For a used or ignored field some of whose values cannot be served: the reason a value is
    refused (a 400 naming the field), ``None`` when it is served."""


@dataclass(frozen=True, slots=True)
class ParamPolicy:
    """The rows of one endpoint, in the order the documentation lists them."""

    endpoint: str
    params: tuple[Param, ...]
    _by_name: dict[str, Param] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {p.name: p for p in self.params}
        if len(by_name) != len(self.params):
            raise ValueError(f"{self.endpoint}: a field is listed twice")
        object.__setattr__(self, "_by_name", by_name)

    def __getitem__(self, name: str) -> Param:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self, action: Action | None = None) -> frozenset[str]:
        return frozenset(p.name for p in self.params if action is None or p.action == action)

    def check(self, fields: Mapping[str, Any]) -> None:
        """Raise :class:`~dressage.errors.UnsupportedParameterError` for the first field (in request order)
        that is unknown, refused, or has a value the Proxy cannot serve; a null value is an absent field."""
        for name, value in fields.items():
            if value is None:
                continue
            param = self._by_name.get(name)
            if param is None:
                raise UnsupportedParameterError(name, f"not a {self.endpoint} parameter this Proxy serves")
            if param.action == REFUSED:
                raise UnsupportedParameterError(name, param.doc)
            why = param.refuse(value) if param.refuse is not None else None
            if why is not None:
                raise UnsupportedParameterError(name, why)

    def markdown(self) -> str:
        """The endpoint's table as ``docs/parameters.md`` holds it."""
        rows = ["| field | action | what the Proxy does |", "|---|---|---|"]
        rows += [f"| `{p.name}` | {p.action} | {p.doc} |" for p in self.params]
        return "\n".join(rows)


def request_fields(req: Any) -> dict[str, Any]:
    """The fields a client sent in a pydantic request (declared ones it set, then unknown ones), by name."""
    sent = [n for n in type(req).model_fields if n in req.model_fields_set]
    return {**{n: getattr(req, n) for n in sent}, **(req.model_extra or {})}
