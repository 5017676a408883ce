"""`python -m tools.gpu.hardware`: see this package's docstring."""

import sys

from . import main

sys.exit(main())
