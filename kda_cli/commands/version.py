"""``kda version``: the versions that matter for reproducing a result."""

from __future__ import annotations

import typer

from kda_cli.options import check_format
from kda_cli.output import emit


def version(format: str = typer.Option("human", "--format", help="human or json.")) -> None:
    """Print kda, torch and triton versions and the device in use."""
    check_format(format)
    from traces.format.provenance import environment

    def human(env: dict) -> None:
        for key, value in env.items():
            print(f"{key}: {value}")

    emit(environment(), format, human)
