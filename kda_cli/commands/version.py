"""``kda version``: the versions that matter for reproducing a result."""

from __future__ import annotations

import json

import typer

from kda_cli.app import app
from kda_cli.runtime import check_format


@app.command()
def version(format: str = typer.Option("human", "--format", help="human or json.")) -> None:
    """Print kda, torch and triton versions and the device in use."""
    check_format(format)
    from traces.provenance import environment

    env = environment()
    if format == "json":
        print(json.dumps(env))
    else:
        for key, value in env.items():
            print(f"{key}: {value}")
