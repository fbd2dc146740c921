"""Environments (loop 2): chat personas, terminal sandbox, tool calls, GUI browser.

Every environment follows one contract (:class:`~openclaw_rl.envs.base.Env`); ``loop`` runs them
as clients of the policy service. Scoring a policy on the held-out split (it needs a policy service
of its own) lives above the loops, in :mod:`openclaw_rl.launcher.evaluate`.
"""

from openclaw_rl.envs.base import Env, EnvUnavailable, import_env_modules, make, register, registered

__all__ = ["Env", "EnvUnavailable", "import_env_modules", "make", "register", "registered"]
