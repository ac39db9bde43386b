"""A store that cannot be reached, as the commands report it: one line, not a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer


def store_reason(error: BaseException) -> str | None:
    """The database's reason, in one line, where `error` is a store that cannot be reached or
    used (an unsupported database's URL among them), or wraps one (Optuna's storage raises its
    own error from the driver's); else None."""
    from sqlalchemy.exc import ArgumentError, InterfaceError, NoSuchModuleError, OperationalError

    from kerneltune.storage import StoreGoneError

    reasons = OperationalError | InterfaceError | ArgumentError | NoSuchModuleError | StoreGoneError
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, reasons):
            lines = str(getattr(seen, "orig", None) or seen).strip().splitlines()
            return lines[0] if lines else type(seen).__name__
        seen = seen.__cause__
    return None


@contextlib.contextmanager
def store_errors(*urls: str | None, then: str = "") -> Iterator[None]:
    """End the command with one line, and status 1, where a store it uses (a URL; None: the
    default one) cannot be reached or used: the stores' URLs, passwords hidden, the database's
    reason and `then` (what the user may do next), in place of a traceback."""
    try:
        yield
    except Exception as e:
        reason = store_reason(e)
        if reason is None:
            raise
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        from kerneltune.storage import default_database_url, normalize_url

        shown = []
        for url in urls:
            text = url or default_database_url()
            with contextlib.suppress(ArgumentError, NoSuchModuleError):
                text = normalize_url(text).render_as_string(hide_password=True)
            shown.append(text)
        typer.echo(f"store {' or '.join(shown)}: {reason}{then}", err=True)
        raise typer.Exit(1) from None
