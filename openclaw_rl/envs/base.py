"""The one contract every environment follows, and the registry that creates them by name.

Gymnasium-style, with text (or chat-message) observations::

    env = make("terminal", seed=0)
    observation, info = env.reset(seed=0)
    while True:
        observation, reward, terminated, truncated, info = env.step(action_text)
        if terminated or truncated:
            break

``observation`` is what the agent sees next — the *next state* of its previous action.
``reward`` is the environment's own outcome (task solved = 1.0) and is used for evaluation only;
training signal comes from the judge reading the next state. ``info`` carries at least
``next_state_role`` (``"user"`` / ``"tool"`` / ``"environment"``) and, at the end, ``success``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

Observation = str | list[dict[str, Any]]
StepResult = tuple[Observation, float, bool, bool, dict[str, Any]]


class Env(ABC):
    """Base class of all environments; subclasses register with :func:`register`."""

    name: str = "env"

    @abstractmethod
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start a new episode; return the first observation and info."""

    @abstractmethod
    def step(self, action: str | dict[str, Any]) -> StepResult:
        """Apply the agent's action (text, or a tool call dict); return the next state."""

    def close(self) -> None:  # noqa: B027 - optional hook: environments without resources need not override it
        """Release processes, browsers, temp dirs. Safe to call twice."""


class EnvContractError(TypeError):
    """An environment's ``reset`` / ``step`` returned something the contract does not allow; the
    message names the environment, the method and the value (the episode ends, the worker goes on)."""


def _check_observation(where: str, observation: Any) -> None:
    if isinstance(observation, str):
        return
    if isinstance(observation, list) and all(isinstance(m, dict) for m in observation):
        return
    raise EnvContractError(
        f"{where}: the observation must be a str or a list of chat-message dicts, "
        f"got {type(observation).__name__}"
    )


def _check_info(where: str, info: Any) -> None:
    if not isinstance(info, dict):
        raise EnvContractError(f"{where}: info must be a dict, got {info!r:.80}")


def checked_reset(env_name: str, result: Any) -> tuple[Observation, dict[str, Any]]:
    """``env.reset(...)``'s result, refused with an :class:`EnvContractError` naming ``env_name``
    unless it is ``(observation, info)`` as the contract above says."""
    where = f"environment {env_name!r}: reset()"
    if not isinstance(result, tuple) or len(result) != 2:
        raise EnvContractError(f"{where} must return (observation, info), got {result!r:.80}")
    _check_observation(where, result[0])
    _check_info(where, result[1])
    return result[0], result[1]


def checked_step(env_name: str, result: Any) -> StepResult:
    """``env.step(...)``'s result, refused with an :class:`EnvContractError` naming ``env_name``
    unless it is ``(observation, reward, terminated, truncated, info)`` with those types."""
    where = f"environment {env_name!r}: step()"
    if not isinstance(result, tuple) or len(result) != 5:
        raise EnvContractError(
            f"{where} must return (observation, reward, terminated, truncated, info), got {result!r:.80}"
        )
    observation, reward, terminated, truncated, info = result
    _check_observation(where, observation)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise EnvContractError(f"{where}: reward must be a number, got {reward!r:.40}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            raise EnvContractError(f"{where}: {name} must be a bool, got {flag!r:.40}")
    _check_info(where, info)
    return observation, float(reward), terminated, truncated, info


def check_turns(name: str, value: int) -> int:
    """An episode's turn budget, refused unless it allows at least one step (every env type)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class EnvUnavailable(RuntimeError):
    """An environment type cannot run here (no browser, no sandbox), raised when it is built or
    reset: the environment service skips the type with one error line instead of failing every
    episode. :func:`import_env_modules` raises it for a module that does not import."""


_REGISTRY: dict[str, Callable[..., Env]] = {}


def register(name: str) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    """Class decorator: ``@register("terminal")`` makes ``make("terminal")`` build it."""

    def deco(factory: Callable[..., Env]) -> Callable[..., Env]:
        _REGISTRY[name] = factory
        return factory

    return deco


def make(name: str, **kwargs: Any) -> Env:
    """Create a registered environment by name; unknown names list the known ones."""
    if name not in _REGISTRY:
        _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown environment {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**kwargs)


def registered() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    """Import the built-in environment modules so their ``@register`` lines run."""
    import importlib

    for module in ("chat", "terminal", "tool_call", "gui"):
        try:
            importlib.import_module(f"openclaw_rl.envs.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"openclaw_rl.envs.{module}":
                raise


def import_env_modules(modules: list[str], config_source: str | None = None) -> None:
    """Import ``[env_service] env_modules`` so the environments they register can be made by name.

    A module is looked for beside the config file first, then in the working folder, then among the
    installed packages: the same order in every process (the launcher's dry run, the environment
    service, a Ray actor). Those two folders are on ``sys.path`` only while the modules import, so
    nothing later picks up a file from them by accident. The built-in environments register first,
    so a module that registers one of their names replaces it everywhere.
    :class:`EnvUnavailable` names a module that does not import."""
    import importlib
    import sys
    from pathlib import Path

    _load_builtin()
    folders = [str(Path(config_source).resolve().parent)] if config_source else []
    folders += [str(Path.cwd())] if str(Path.cwd()) not in folders else []
    sys.path[:0] = folders
    try:
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any error in the user's module: name it, and what it raised
                raise EnvUnavailable(
                    f"[env_service] env_modules: {module!r} does not import: {type(exc).__name__}: {exc}"
                ) from exc
    finally:
        for folder in folders:
            sys.path.remove(folder)  # the first of its name: the one put in front above
