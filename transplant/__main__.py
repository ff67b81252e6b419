"""``python -m transplant``: the same as the ``transplant`` console script."""

import sys

from transplant.cli import main

sys.exit(main())
