"""``python -m detens``: the ``detens`` command."""

import sys

from detens.cli import main

sys.exit(main())
