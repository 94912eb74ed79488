"""``python -m minigrpo``: the same as the ``minigrpo`` command."""

import sys

from minigrpo.cli import main

sys.exit(main())
