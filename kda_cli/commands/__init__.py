"""One module per command group; importing this package registers all of them."""

from kda_cli.commands import version  # noqa: F401
