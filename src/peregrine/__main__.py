"""`python -m peregrine ...` is the `peregrine` command (torchrun starts ranks with
`torchrun ... -m peregrine train ENV`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
