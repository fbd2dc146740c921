"""``openclaw-rl openclaw-config``: the fragment matches the config, parses, and the README shows it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from openclaw_rl.cli import main
from openclaw_rl.config import build_config, load_config
from openclaw_rl.launcher.openclaw_config import openclaw_fragment, render

ROOT = Path(__file__).resolve().parents[2]


def _parse(text: str) -> dict:
    return json.loads("\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("//")))


def test_the_readme_shows_what_the_command_prints_for_the_local_config(capsys):
    assert main(["openclaw-config", "--config", "configs/local.toml"]) == 0
    printed = capsys.readouterr().out
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"```json5\n(.*?)```", readme, re.S)
    assert shown is not None and shown.group(1) == printed


def test_fragment_follows_the_config():
    cfg = load_config(ROOT / "configs/local.toml", environ={})
    frag = _parse(render(cfg))
    provider = frag["models"]["providers"]["openclaw-rl"]
    (model,) = provider["models"]
    assert provider["baseUrl"] == "http://127.0.0.1:30000/v1" and provider["api"] == "openai-completions"
    assert model["id"] == "smollm2-135m-instruct" and model["contextWindow"] == 8192
    assert 0 < model["maxTokens"] <= 8192 // 4  # room left for the prompt
    assert frag["agents"]["defaults"]["model"]["primary"] == "openclaw-rl/smollm2-135m-instruct"
    assert frag["tools"]["profile"] == "minimal" and frag["agents"]["defaults"]["skipBootstrap"] is True
    assert frag["agents"]["defaults"]["compaction"]["keepRecentTokens"] < 8192 // 4
    assert frag["agents"]["defaults"]["compaction"]["qualityGuard"] == {"enabled": False}
    assert frag == openclaw_fragment(cfg)

    keyed = build_config(
        {
            "policy_service": {
                "host": "0.0.0.0",
                "port": 31000,
                "api_key": "policy-secret-value",
                "max_model_len": 131072,
                "model": "my-8b",
            }
        },
        environ={},
    )
    text = render(keyed)
    assert "policy-secret-value" not in text  # the key itself is never printed
    frag = _parse(text)
    provider = frag["models"]["providers"]["openclaw-rl"]
    assert (
        provider["apiKey"] == "${OPENCLAW_RL_API_KEY}" and provider["baseUrl"] == "http://127.0.0.1:31000/v1"
    )
    assert provider["models"][0]["contextWindow"] == 131072 and provider["models"][0]["maxTokens"] == 4096
    assert "compaction" not in frag["agents"]["defaults"]  # a large window keeps OpenClaw's default


def test_fragment_carries_the_generated_client_key_of_a_public_bind(tmp_path):
    """A public bind without api_key: the service requires the key it generates, and the fragment
    reads that same key, so OpenClaw works against it unchanged."""
    from openclaw_rl.runtime.rundir import RunDir

    cfg = build_config(
        {"global": {"log_dir": str(tmp_path)}, "policy_service": {"host": "0.0.0.0"}}, environ={}
    )
    text = render(cfg)
    key = (tmp_path / "client.key").read_text()
    assert _parse(text)["models"]["providers"]["openclaw-rl"]["apiKey"] == key
    assert RunDir.of(cfg).client_key(cfg.policy_service) == key  # what the service will require
    assert str(tmp_path / "client.key") in text  # the comment says where it came from


def test_a_service_started_public_by_hand_gets_its_key_and_port_in_the_fragment(tmp_path, capsys):
    """`openclaw-rl serve --host 0.0.0.0 --port P --log-dir D` on a loopback config: the service made
    and requires a client key the config does not imply; `openclaw-config --log-dir D --port P` must
    hand OpenClaw that key and port (it said "any string works", and OpenClaw got 401)."""
    from openclaw_rl.runtime.rundir import RunDir

    config = tmp_path / "c.toml"
    config.write_text(f'[global]\nlog_dir = "{tmp_path / "cfg-logs"}"\n[policy_service]\nport = 30000\n')
    served = tmp_path / "served"
    public = build_config(
        {"global": {"log_dir": str(served)}, "policy_service": {"host": "0.0.0.0"}}, environ={}
    )
    key = RunDir.of(public).client_key(public.policy_service)  # what `serve --host 0.0.0.0` makes
    assert key
    args = ["openclaw-config", "--config", str(config), "--log-dir", str(served), "--port", "32123"]
    assert main(args) == 0
    text = capsys.readouterr().out
    provider = _parse(text)["models"]["providers"]["openclaw-rl"]
    assert provider["apiKey"] == key and provider["baseUrl"] == "http://127.0.0.1:32123/v1"
    assert "serve --host" in text
    assert main(["openclaw-config", "--config", str(config)]) == 0  # its own log_dir holds no key
    assert _parse(capsys.readouterr().out)["models"]["providers"]["openclaw-rl"]["apiKey"] == "none"


def test_a_gateway_elsewhere_and_a_users_own_key(capsys):
    """A service on every address: the fragment says to give OpenClaw this machine's address, and
    --host does; --api-key-env lets OpenClaw read a per-user key from its environment."""
    cfg = build_config({"policy_service": {"host": "0.0.0.0", "port": 31000, "api_key": "k"}}, environ={})
    text = render(cfg)
    assert "use this machine's address (--host ADDRESS)" in text
    frag = _parse(render(cfg, "anthropic-messages", host="10.1.2.3", key_env="ALICE_KEY"))
    provider = frag["models"]["providers"]["openclaw-rl"]
    assert provider["baseUrl"] == "http://10.1.2.3:31000" and provider["apiKey"] == "${ALICE_KEY}"
    assert _parse(render(cfg, host="fd00::7"))["models"]["providers"]["openclaw-rl"]["baseUrl"] == (
        "http://[fd00::7]:31000/v1"
    )
    assert main(["openclaw-config", "--config", "configs/local.toml", "--api-key-env", "MY KEY"]) == 2
    assert "not an environment variable name" in capsys.readouterr().err


def test_a_host_with_a_port_or_scheme_is_refused(capsys):
    for host in (
        "10.0.0.5:31000",
        "http://10.0.0.5",
        "10.0.0.5 x",
        "host?x",
        "a@b",
        "0.0.0.0",
        "::",
        "999.1.1.1",
    ):
        assert main(["openclaw-config", "--config", "configs/local.toml", "--host", host]) == 2
        assert "give the address OpenClaw reaches this machine at" in capsys.readouterr().err, host
    for host in ("gpu-box.lan", "10.0.0.5", "fd00::7", "[fd00::7]", "localhost"):
        assert main(["openclaw-config", "--config", "configs/local.toml", "--host", host]) == 0, host
        capsys.readouterr()
