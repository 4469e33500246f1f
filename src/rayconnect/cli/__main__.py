"""``python -m rayconnect.cli``: the same as the ``rayconnect`` command."""

import sys

from rayconnect.cli.main import main

sys.exit(main())
