"""``python -m softprobe.gym.cli``: the same as the ``softprobe-gym`` command."""

import sys

from softprobe.gym.cli.main import main

sys.exit(main())
