"""``openclaw-rl openclaw-config --config FILE``: the ``openclaw.json`` fragment that works with FILE.

OpenClaw talks to the policy service as a custom OpenAI-compatible provider. Three of its defaults
do not fit a small served model, and each fails in its own way (measured with OpenClaw 2026.9.6):

* the model entry's output limit: without ``maxTokens`` OpenClaw asks for 8,192 output tokens on
  every request (we clamp what the window cannot hold, but the entry should say the truth);
* the window: without ``contextWindow`` OpenClaw assumes a large one and never compacts in time;
* its default agent: a large system prompt, workspace bootstrap files, skills and tool schemas —
  about 18,000 tokens by OpenClaw's own estimate, twice the embedded model's whole window. The slim
  agent (``tools.profile = "minimal"``, ``skipBootstrap``, no skills in the prompt) is about 2,800;
* compaction keeps the newest 20,000 tokens verbatim, which in a small window is all of them, so
  a small window also lowers ``compaction.keepRecentTokens``.

How OpenClaw budgets, measured on its source: it estimates a prompt as characters / 4 × 1.25, asks
for at most the window minus that estimate, and compacts once the ``usage.prompt_tokens`` we report
plus the new turn pass the window minus a reserve of min(20,000, window / 4).

The fragment is JSON5 (OpenClaw reads its config as JSON5), so it carries its own comments.
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys

from openclaw_rl.config import ENV_VAR, Config, generates_client_key, url_host
from openclaw_rl.runtime.rundir import RunDir

#: The provider's name in openclaw.json; the model is addressed as ``openclaw-rl/<model id>``.
PROVIDER = "openclaw-rl"
#: Output budget for the embedded window; a model with a window of 32k or more gets more.
SMALL_OUTPUT = 512
LARGE_OUTPUT = 4096
#: Windows at or above this are a "large" model: the slim agent settings are optional there.
LARGE_WINDOW = 32_768


#: OpenClaw's provider ``api`` types this service speaks, and the path its ``baseUrl`` ends with
#: (OpenClaw's Anthropic provider appends ``/v1/messages`` itself; the OpenAI ones append to ``/v1``).
API_TYPES = {"openai-completions": "/v1", "openai-responses": "/v1", "anthropic-messages": ""}


def provider_url(cfg: Config, api: str = "openai-completions", host: str | None = None) -> str:
    """The URL OpenClaw should call: ``host`` (the address OpenClaw reaches this machine at) or, by
    default, the service's own host — loopback when it binds every address."""
    root = (
        cfg.policy_service.local_url if host is None else f"http://{url_host(host)}:{cfg.policy_service.port}"
    )
    return f"{root}{API_TYPES[api]}"


_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def _reachable_address(host: str) -> bool:
    """A host name or an IP address a client can connect to (not a wildcard such as 0.0.0.0)."""
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return bool(_HOST_NAME.match(host)) and not host.replace(".", "").isdigit()
    return not address.is_unspecified


def _api_key(cfg: Config, key_env: str | None = None) -> str:
    """What OpenClaw sends as its key: ``${key_env}`` when given (OpenClaw reads the variable: a
    user's own key), the ``api_key`` from the environment it was set from, the key the service
    generated for a public bind (read from ``<log_dir>/client.key``), or any string for an open
    loopback service."""
    pol = cfg.policy_service
    if key_env is not None:
        return f"${{{key_env}}}"
    if pol.api_key is not None and pol.api_key.get_secret_value():
        return "${OPENCLAW_RL_API_KEY}"
    return RunDir.of(cfg).client_key(pol) or _made_client_key(cfg) or "none"


def _made_client_key(cfg: Config) -> str | None:
    """The client key a service of this ``log_dir`` made when it was started on a public address
    by hand (``openclaw-rl serve --host 0.0.0.0``), which the config does not say: it requires it,
    and a loopback service ignores a key it was not given."""
    path = RunDir.of(cfg).client_key_file
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _api_key_note(cfg: Config, key_env: str | None = None) -> str:
    pol = cfg.policy_service
    if key_env is not None:
        return f"// OpenClaw reads the key from ${key_env} (a user's key from `openclaw-rl users add`, or the api_key)"
    if pol.api_key is not None and pol.api_key.get_secret_value():
        return "// [policy_service] api_key: export OPENCLAW_RL_API_KEY with the same value"
    if generates_client_key(pol):
        return f"// the client key the service requires on {pol.host}, from {RunDir.of(cfg).client_key_file}"
    if _made_client_key(cfg):
        return (
            "// the client key a service of this log_dir made when started on a public address "
            f"(serve --host), from {RunDir.of(cfg).client_key_file}"
        )
    return "// the service has no api_key; any string works (set one before exposing the port)"


def openclaw_fragment(
    cfg: Config, api: str = "openai-completions", *, host: str | None = None, key_env: str | None = None
) -> dict:
    """The fragment as data (what the command prints, minus comments); ``api``: the protocol OpenClaw
    speaks to the service (one of :data:`API_TYPES`); ``host``: the address OpenClaw reaches the
    service at (default: the service's own, loopback for a service on every address); ``key_env``:
    the environment variable OpenClaw reads its key from."""
    pol = cfg.policy_service
    window = pol.max_model_len
    output = LARGE_OUTPUT if window >= LARGE_WINDOW else min(SMALL_OUTPUT, window // 4)
    model_id = pol.model
    # OpenClaw keeps the newest 20,000 tokens verbatim when it compacts; in a small window that is
    # everything, so an overflow finds "nothing to compact" and the turn fails.
    # Its quality guard re-asks for a summary that misses required details and, after a few tries,
    # fails every later turn of the session; a small model's summaries rarely pass it.
    small_window = (
        {}
        if window >= LARGE_WINDOW
        else {"compaction": {"keepRecentTokens": window // 5, "qualityGuard": {"enabled": False}}}
    )
    return {
        "models": {
            "providers": {
                PROVIDER: {
                    "baseUrl": provider_url(cfg, api, host),
                    "apiKey": _api_key(cfg, key_env),
                    "api": api,
                    "models": [
                        {
                            "id": model_id,
                            "name": "openclaw-rl policy",
                            "reasoning": False,
                            "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": window,
                            "maxTokens": output,
                        }
                    ],
                }
            }
        },
        "agents": {
            "defaults": {
                "model": {"primary": f"{PROVIDER}/{model_id}"},
                "skipBootstrap": True,
                **small_window,
            }
        },
        "tools": {"profile": "minimal"},
        "skills": {"limits": {"maxSkillsInPrompt": 0}},
    }


def render(
    cfg: Config, api: str = "openai-completions", *, host: str | None = None, key_env: str | None = None
) -> str:
    """The fragment as JSON5 text with comments saying what each part is for."""
    frag = openclaw_fragment(cfg, api, host=host, key_env=key_env)
    window = cfg.policy_service.max_model_len
    body = json.dumps(frag, indent=2)
    pol = cfg.policy_service
    every_address = host is None and pol.connect_host != url_host(pol.host)  # a wildcard bind
    notes = {
        '"baseUrl"': (
            f"// the service binds {pol.host}: from another machine, use this machine's address "
            "(--host ADDRESS)"
            if every_address
            else "// where OpenClaw reaches the service (--host ADDRESS to change it)"
        ),
        '"apiKey"': _api_key_note(cfg, key_env),
        '"contextWindow"': "// = [policy_service] max_model_len; OpenClaw compacts its history before it fills",
        '"api"': "// the protocol: openai-completions, openai-responses or anthropic-messages (--api)",
        '"skipBootstrap"': "// no workspace bootstrap files in the prompt",
        '"profile"': "// three tools instead of the full set: the default agent alone is ~18k tokens",
        '"maxSkillsInPrompt"': "// no skill descriptions in the prompt",
        '"keepRecentTokens"': "// keep little verbatim when compacting, so a small window can recover from an overflow",
        '"qualityGuard"': "// a small model's summaries fail OpenClaw's audit, which then blocks the session",
    }
    lines = []
    for line in body.splitlines():
        key = line.strip().split(":")[0]
        if key in notes:
            lines.append(" " * (len(line) - len(line.lstrip())) + notes[key])
        lines.append(line)
    head = [
        f"// openclaw.json fragment for the policy service of {cfg.source} (window {window:,} tokens).",
        "// Merge it into ~/.openclaw/openclaw.json (or the file OPENCLAW_CONFIG_PATH names).",
        "// A large model (4B-8B on SGLang / vLLM, max_model_len 32k or more): set contextWindow to the",
        '// engine\'s window and maxTokens to 4096, and drop "tools" / "skills" / "skipBootstrap" to give',
        "// the agent its full toolset. See docs/openclaw.md.",
    ]
    return "\n".join(head + lines) + "\n"


def openclaw_config_command(
    cfg: Config,
    api: str = "openai-completions",
    host: str | None = None,
    key_env: str | None = None,
    port: int | None = None,
) -> int:
    """Print the fragment; exit 0 (2 for a ``key_env`` that is no variable name). ``port``: the
    port the service was started on when not the config's (``openclaw-rl serve --port``)."""
    if port is not None:
        cfg.policy_service.port = port
    if key_env is not None and not ENV_VAR.fullmatch(f"${{{key_env}}}"):
        print(f"error: --api-key-env {key_env!r} is not an environment variable name", file=sys.stderr)
        return 2
    if host is not None and not _reachable_address(host):
        print(
            f"error: --host {host!r}: give the address OpenClaw reaches this machine at, alone (a host "
            "name, an IPv4 or IPv6 address; the port is [policy_service] port)",
            file=sys.stderr,
        )
        return 2
    print(render(cfg, api, host=host, key_env=key_env), end="")
    return 0
