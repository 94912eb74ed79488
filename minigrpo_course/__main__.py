"""``python -m minigrpo_course``: the same as the ``minigrpo`` command."""

import sys

from minigrpo_course.cli import main

sys.exit(main())
