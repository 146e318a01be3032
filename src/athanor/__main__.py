"""`python -m athanor` is `athanor` (used where the console script is not installed, e.g. the GPU image)."""

import sys

from athanor.cli import main

sys.exit(main())
