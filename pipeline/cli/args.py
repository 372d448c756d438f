"""argparse for the command lines: a mistake is one line and exit code 2, like every other."""
from __future__ import annotations

import argparse

from pipeline.core.errors import ConfigError


class Parser(argparse.ArgumentParser):
    """argparse's own error prints the usage and exits 2 itself; this raises the project's
    ``ConfigError`` (one line naming the command, exit 2) instead."""

    def error(self, message):
        raise ConfigError(f"{self.prog}: {message}")
