"""What the service refuses before it stores anything, as FastAPI's own 422 shape says it
(``{"detail": [{"loc": [...], "msg": ..., "type": ...}]}``).

Two layers, both all or nothing for a request:

- the body as text (`StrictJSONRoute`): UTF-8 JSON as RFC 8259 and I-JSON (RFC 7493) have it,
  with no NaN or Infinity (nor a number too large for a float, or of more than `MAX_DIGITS`
  digits), no lone surrogate, and no NUL character in any string (no store keeps one).
  Python's `json` reads all of these; echoed back in a validation error they made the answer
  itself fail (a 500 and a reset connection), or they reached the store (a 503 on
  PostgreSQL);
- each entry's config (`entry_errors`): a member of its kernel's space at its own key, by
  `kerneltune.resolution.entry_refusal`, the check the runtime, `import` and `merge` apply too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from kerneltune.kernels import REGISTRY, KernelSpec, Problem
from kerneltune.resolution import entry_named, refused_entries
from kerneltune.table import Table, TableError

Loc = tuple[str | int, ...]

#: Escapes behind which a NUL or a lone surrogate may hide: only a body holding one is walked.
_SUSPECT = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
#: The most digits an integer may have: far beyond any count or size the service stores.
MAX_DIGITS = 30
#: Where `kerneltune.table` names an entry in its errors.
_TABLE_ENTRY = re.compile(r"^entries\[(\d+)\]: ")


def error(loc: Loc, msg: str, kind: str = "value_error", **extra: Any) -> dict[str, Any]:
    """One item of FastAPI's 422 `detail` list."""
    return {"loc": list(loc), "msg": msg, "type": kind, **extra}


def refused(*errors: dict[str, Any]) -> RequestValidationError:
    """A 422 answered by FastAPI's own handler, in its documented shape."""
    return RequestValidationError(list(errors))


class _NotIJson(ValueError):
    """A value JSON's grammar or I-JSON leaves out, met while parsing."""


def _constant(name: str) -> float:
    raise _NotIJson(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotIJson(f"{text} is too large for a 64-bit float")
    return value


def _integer(text: str) -> int:
    if len(text) > MAX_DIGITS:
        raise _NotIJson(f"a number of {len(text)} digits")
    return int(text)


def body_refusal(body: bytes) -> RequestValidationError | None:
    """Why a request body is not JSON this service takes (see the module), or None."""
    if not body:
        return None  # FastAPI answers a missing body itself
    try:
        text = body.decode("utf-8-sig")  # strict: encoded surrogates are no UTF-8
    except UnicodeDecodeError as e:
        return refused(error(("body", e.start), f"the body is not UTF-8 ({e.reason})",
                             "json_invalid"))
    try:
        doc = json.loads(text, parse_constant=_constant, parse_float=_finite,
                         parse_int=_integer)
    except json.JSONDecodeError as e:
        return refused(error(("body", e.pos), "JSON decode error", "json_invalid",
                             ctx={"error": e.msg}))
    except (ValueError, RecursionError) as e:  # NaN, Infinity, 1e999, 10**100, deep nesting
        return refused(error(("body",), f"not JSON this service takes: {e}", "json_invalid"))
    if _SUSPECT.search(text):
        for loc, why in _bad_strings(doc, ("body",)):
            return refused(error(loc, f"a string holds {why}", "string_unicode"))
    return None


def _bad_strings(doc: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """Where a string (a key or a value) holds a NUL character or a lone surrogate, walked
    without recursion (a document may be nested as deep as the parser goes). The string itself
    is never named: echoed back, a lone surrogate could not be encoded."""
    stack: list[tuple[Any, Loc]] = [(doc, loc)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            why = _string_fault(value)
            if why:
                yield where, why
        elif isinstance(value, list):
            stack.extend(((item, (*where, i)) for i, item in enumerate(value)))
        elif isinstance(value, dict):
            for i, (key, item) in enumerate(value.items()):
                why = _string_fault(key)
                if why:
                    yield (*where, f"<key {i}>"), why
                else:
                    stack.append((item, (*where, key)))


def _string_fault(s: str) -> str | None:
    if "\x00" in s:
        return "a NUL character"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not Unicode text)"
    return None


class StrictJSONRoute(APIRoute):
    """A route whose JSON body is held to `body_refusal`, after authentication: the refusal
    waits in ``request.state.body_refusal`` for the endpoint (which runs after the route's
    dependencies) to raise (`raise_body_refusal`). It also stands in for what FastAPI's lenient
    parse of such a body ends in: a validation error whose echo of the body could not be
    encoded, or a 400 (both come before authentication, as any unparsable body's 422 does)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            refusal = body_refusal(await request.body())
            request.state.body_refusal = refusal
            try:
                return await handler(request)
            except (RequestValidationError, HTTPException) as e:
                # FastAPI's own parse of a body it reads leniently: a validation error echoing
                # it, or a 400 for what its parser gave up on (10**5000, deep nesting).
                if refusal is not None and getattr(e, "status_code", 400) == 400:
                    raise refusal from None
                raise

        return strict_handler


def raise_body_refusal(request: Request) -> None:
    """Raise what `StrictJSONRoute` found wrong with the body, if anything."""
    refusal = getattr(request.state, "body_refusal", None)
    if refusal is not None:
        raise refusal


def table_refusal(e: TableError) -> RequestValidationError:
    """`kerneltune.table`'s refusal of a posted document, placed at the entry it names."""
    text = str(e)
    found = _TABLE_ENTRY.match(text)
    loc: Loc = ("body", "entries", int(found[1])) if found else ("body",)
    return refused(error(loc, text[found.end():] if found else text))


def entry_errors(table: Table) -> list[dict[str, Any]]:
    """One error per entry the service may not store (`refused_entries`): an unknown kernel,
    or a config its kernel refuses at the entry's own key, placed at the parameter at fault
    where there is one. Entries are numbered as posted."""
    errors = []
    for i, e, why in refused_entries(table.entries, REGISTRY):
        named = f"entries[{i}] ({entry_named(e)})"
        spec = REGISTRY.get(e.kernel)
        if spec is None:
            known = ", ".join(sorted(REGISTRY))
            errors.append(error(("body", "entries", i, "kernel"),
                                f"{named}: {why}; known kernels: {known}", input=e.kernel))
            continue
        name = parameter_at_fault(spec, spec.problem(e.m, e.n, e.dtype), e.config)
        loc: Loc = ("body", "entries", i, "config", *((name,) if name else ()))
        errors.append(error(loc, f"{named}: {why}", input=e.config))
    return errors


def parameter_at_fault(spec: KernelSpec, problem: Problem, config: Mapping[str, Any]
                       ) -> str | None:
    """The parameter `KernelSpec.parse` refuses `config` for on `problem`, in the order it
    checks them (unknown, missing, of the wrong type, outside the space); None where the
    config as a whole is refused (the kernel's constraints, an older entry with no reading)."""
    try:
        data = spec.upgrade(problem, config)
    except ValueError:
        return None
    types = spec.config_type.field_types()
    unknown, missing = sorted(set(data) - set(types)), sorted(set(types) - set(data))
    if unknown or missing:
        return (unknown or missing)[0]
    for name, kind in types.items():
        if type(data[name]) is not kind:
            return name
    space = spec.space(problem)
    for name, value in data.items():
        if not any(type(value) is type(c) and value == c for c in space[name]):
            return name
    return None
