"""A store that cannot be reached, as the commands report it: one line, not a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer


@contextlib.contextmanager
def store_errors(*urls: str | None) -> Iterator[None]:
    """End the command with one line, and status 1, where a store it uses (a URL; None: the
    default one) cannot be reached or used: the stores' URLs, passwords hidden, and the
    database's reason, in place of a traceback."""
    from sqlalchemy.exc import ArgumentError, InterfaceError, NoSuchModuleError, OperationalError

    try:
        yield
    except (OperationalError, InterfaceError, ArgumentError, NoSuchModuleError) as e:
        from kerneltune.storage import default_database_url, normalize_url

        shown = []
        for url in urls:
            text = url or default_database_url()
            with contextlib.suppress(ArgumentError, NoSuchModuleError):
                text = normalize_url(text).render_as_string(hide_password=True)
            shown.append(text)
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        typer.echo(f"store {' or '.join(shown)}: {reason}", err=True)
        raise typer.Exit(1) from None
