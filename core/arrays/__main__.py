"""``python -m core.arrays <array dir>``: an array's driver (see :mod:`core.arrays.driver`)."""

import sys

from core.arrays.driver import main

sys.exit(main())
