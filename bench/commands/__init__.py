"""The `disagg-sim` subcommands, one module each (`main` builds the parser
from them and runs the chosen one); `bench/cli.py` is the entry point."""
