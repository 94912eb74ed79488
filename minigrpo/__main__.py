"""``python -m minigrpo``: the library's command line (``train``); the course's ``minigrpo`` command is
``python -m minigrpo_course``."""

import sys

from minigrpo.cli import main

sys.exit(main())
