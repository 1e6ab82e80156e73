"""``python -m loopdock``: the ``loopdock`` command."""

import sys

from ._cli import main

sys.exit(main())
