"""The `dlrover-run` command."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `dlrover-run`. It is not built yet, and says so instead of pretending."""
    parser = argparse.ArgumentParser(prog="dlrover-run", description="Not built yet: see issue 9.")
    parser.parse_known_args(argv)
    print("dlrover-run is not built yet (issue 9); nothing was run.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
