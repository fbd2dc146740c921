"""``python -m openclaw_rl.launch --config config.toml [--dry-run]``: the walk-through's command.

The name users type is a contract, so it stays here whatever the launcher package looks like
inside; it is the same as ``openclaw-rl run`` (see :mod:`openclaw_rl.launcher.launch`).
"""

from __future__ import annotations

import sys

from openclaw_rl.launcher.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
