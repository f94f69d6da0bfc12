"""`python -m peregrine.cli` is the `peregrine` command."""
import sys

from . import main

if __name__ == "__main__":   # spawned processes (train.overlap's actor) re-import this file
    sys.exit(main())
