"""``python -m nereid serve ...``: the same as the ``nereid`` command."""

import sys

from nereid.cli import main

sys.exit(main())
