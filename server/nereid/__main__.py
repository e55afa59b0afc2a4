"""``python -m nereid serve ...``: the same as the ``nereid`` command."""

import sys

from nereid.cli import main

if __name__ == "__main__":  # not when a spawned helper process imports this module
    sys.exit(main())
