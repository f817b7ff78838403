"""``python -m parplan``: the command line."""

import sys

from parplan.cli import main

sys.exit(main())
