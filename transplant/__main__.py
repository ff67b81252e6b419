"""``python -m transplant``: the same as the ``transplant`` console script."""

import sys

from .cli import main

sys.exit(main())
