"""``python -m openclaw_rl.launcher``: kept for those who used it; ``python -m openclaw_rl.launch``
is the documented command (see :mod:`openclaw_rl.launch`)."""

import sys

from openclaw_rl.launcher.launch import main

sys.exit(main())
