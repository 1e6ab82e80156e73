"""``python -m loopdock.benchmarks [--quick] [--out DIR]``: the same as ``loopdock bench``."""

import sys

from ._run import main

sys.exit(main())
