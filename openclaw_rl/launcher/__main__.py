"""``python -m openclaw_rl.launcher``: the same as ``openclaw-rl run`` (see :mod:`.launch`)."""

import sys

from openclaw_rl.launcher.launch import main

sys.exit(main())
