"""One module per command group; importing this package registers all of them."""

from kda_cli.commands import version  # noqa: F401
from kda_cli.commands import bench  # noqa: F401
from kda_cli.commands import info  # noqa: F401
from kda_cli.commands import replay  # noqa: F401
from kda_cli.commands import synth  # noqa: F401
from kda_cli.commands import record  # noqa: F401
from kda_cli.commands import repro  # noqa: F401
from kda_cli.commands import slice  # noqa: F401
