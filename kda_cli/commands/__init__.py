"""The command modules: each is parsing and rendering over the library; ``kda_cli.app``
registers them."""
