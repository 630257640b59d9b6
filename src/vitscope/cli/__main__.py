"""``python -m vitscope.cli``: the same as the ``vitscope`` command."""

import sys

from vitscope.cli import main

sys.exit(main())
