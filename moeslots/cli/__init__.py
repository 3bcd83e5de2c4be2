"""The `moeslots` command line, one module per command group (main.py assembles the parser). The top layer:
it may import tui/, engine/ and profiles/; nothing imports it."""

from .common import UserError
from .main import build_parser, main

__all__ = ["UserError", "build_parser", "main"]
