"""The ``gui`` environment: web tasks in a real headless Chromium against apps served on loopback.

``openclaw_rl.envs.make("gui", ...)`` builds a :class:`GuiEnv`. See docs/gui.md for the
observation format, the command language, the tasks and the fault behaviour.
"""

from openclaw_rl.envs.gui.actions import GRAMMAR, TOOLS, Action, ActionError, parse_action
from openclaw_rl.envs.gui.apps import AppServer, AppState
from openclaw_rl.envs.gui.browser import BrowserError, BrowserHost, shared_host
from openclaw_rl.envs.gui.env import GuiEnv
from openclaw_rl.envs.gui.tasks import TASK_BY_ID, TASKS, GuiTask, get_task

__all__ = [
    "GRAMMAR",
    "TOOLS",
    "Action",
    "ActionError",
    "parse_action",
    "AppServer",
    "AppState",
    "BrowserError",
    "BrowserHost",
    "shared_host",
    "GuiEnv",
    "TASK_BY_ID",
    "TASKS",
    "GuiTask",
    "get_task",
]
