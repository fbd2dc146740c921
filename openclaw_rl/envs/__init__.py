"""Environments: chat personas, terminal sandbox, tool calls, GUI browser (SPEC §3 loop 2)."""

from openclaw_rl.envs.base import Env, make, register, registered

__all__ = ["Env", "make", "register", "registered"]
