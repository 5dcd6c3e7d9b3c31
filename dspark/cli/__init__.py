"""The ``dspark`` command line, one module per stage (each command a thin wrapper over a
library function): setup -> data -> train -> decode -> formats -> serve, and `check`.

The modules register their commands on `app` in that order, the order of ``dspark --help``.
"""

# ruff: noqa: I001  (import order is command order)
from __future__ import annotations

import sys

import typer

from dspark.cli.app import app
from dspark.cli import setup, data, train, decode, formats, serve, check  # noqa: F401  (register commands)
from dspark.errors import DSparkError


def _register_groups() -> None:
    from dspark.corpus.cli import app as corpus_app

    app.add_typer(corpus_app, name="corpus")
    app.add_typer(check.check_app, name="check")


_register_groups()


def main() -> None:  # pragma: no cover - console entry point alias
    try:
        app()
    except DSparkError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


__all__ = ["app", "main"]
