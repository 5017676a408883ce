"""`python -m tools.gpu_hardware`: see this package's docstring."""

import sys

from . import main

sys.exit(main())
