"""The walk-through's contract: ``python -m openclaw_rl.launch --config config.toml [--dry-run]`` with
its canonical ``config.toml`` (``configs/example.toml``, key for key) pasted as it is.

The dry run of that file must report on the machine (one line per service, the file's pitfalls),
never on our code: no key of it is unknown, nothing of it is a validation error. Each of the
walk-through's pitfalls, made by changing one line of the file, gets its own message.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from openclaw_rl.config import ConfigError, build_config
from openclaw_rl.launch import main as launch_main
from openclaw_rl.runtime.ports import free_port
from openclaw_rl.trainer.sample_file import write_samples

from .helpers import one_token_sample

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "configs" / "example.toml"
SERVICES = ("policy_service", "env_service", "prm_service", "training")
ENV = {**os.environ, "TAOTOKEN_API_KEY": "contract-test-never-printed"}


def _start(config: Path, env: dict[str, str] = ENV) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "openclaw_rl.launch", "--config", str(config), "--dry-run"],
        cwd=config.parent,  # its log_dir is relative: keep it out of the repository
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out + err


def _variant(tmp_path: Path, name: str, section: str, key: str, value: str) -> Path:
    """The canonical file with one line changed (or added to its section): ``key = value``."""
    lines = CANONICAL.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split("#")[0].strip() == f"[{section}]")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    for i in range(start + 1, end):
        if re.match(rf"{key}\s*=", lines[i]):
            lines[i] = f"{key} = {value}"
            break
    else:
        lines.insert(start + 1, f"{key} = {value}")
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    assert tomllib.loads(path.read_text())[section][key] == tomllib.loads(f"v = {value}")["v"]
    return path


def test_help_works():
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_rl.launch", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "--config" in proc.stdout and "--dry-run" in proc.stdout and "openclaw_rl.launch" in proc.stdout


def test_the_canonical_file_dry_runs_to_one_line_per_service(tmp_path):
    (tmp_path / "paste").mkdir()
    config = tmp_path / "paste" / "config.toml"
    config.write_text(CANONICAL.read_text())
    code, out = _finish(_start(config))
    assert "unknown key" not in out and "problem(s)" not in out, out
    assert code == 1, out  # services unreachable on this machine, the file itself is fine
    lines = out.splitlines()
    for service in SERVICES:
        mine = [ln for ln in lines if ln.startswith(f"[dry-run] {service}: ")]
        assert len(mine) == 1, (service, out)
    assert "[dry-run] run=openclaw_rl_async_ppo" in out  # the file's run_name names the run
    training = next(ln for ln in lines if ln.startswith("[dry-run] training: "))
    assert "megatron" in training and "fsdp" in training and "GPU" in training
    policy = next(ln for ln in lines if ln.startswith("[dry-run] policy_service: "))
    assert "sglang" in policy and "client.key" in policy  # public bind, no key: a generated one
    assert "contract-test-never-printed" not in out


PITFALLS = [  # (name, section, key, new value, what the message must say)
    (
        "web_page_url",
        "api",
        "base_url",
        '"https://taotoken.net/api?utm_source=newsletter"',
        "web page address",
    ),
    ("single_vote", "prm_service", "vote_count", "1", "single judge vote gives noisy rewards"),
    ("even_votes", "prm_service", "vote_count", "4", "is even"),
    ("opd_drowns_rl", "training", "opd_weight", "20.0", "drown the scalar reward"),
    ("sync_every_step", "policy_service", "weight_sync_interval", "1", "nearly every training step"),
    ("cloud_without_cluster", "env_service", "mode", '"cloud"', "ray_address"),
    ("no_state_capture", "env_service", "state_capture", "false", "nothing is learned"),
]


def test_each_pitfall_has_its_message(tmp_path, monkeypatch, capsys):
    """Each pitfall through the module's own ``main`` (what ``python -m openclaw_rl.launch`` runs),
    in this process: eight interpreters importing torch at once would take half a minute."""
    results: dict[str, tuple[int, str]] = {}
    for name, section, key, value, _ in PITFALLS:
        config = _variant(tmp_path, name, section, key, value)
        monkeypatch.chdir(config.parent)
        monkeypatch.setenv("TAOTOKEN_API_KEY", "contract-test-never-printed")
        code = launch_main(["--config", str(config), "--dry-run"])
        captured = capsys.readouterr()
        results[name] = (code, captured.out + captured.err)
    for name, *_, needle in PITFALLS:
        code, out = results[name]
        assert needle in out and code != 0, (name, out)
        assert "unknown key" not in out, (name, out)
    monkeypatch.delenv("TAOTOKEN_API_KEY")
    code = launch_main(
        ["--config", str(_variant(tmp_path, "unset_variable", "api", "timeout_sec", "60")), "--dry-run"]
    )
    out = capsys.readouterr().err
    assert code == 2 and "TAOTOKEN_API_KEY is not set" in out and "[api] api_key" in out, out


@pytest.mark.parametrize(
    "section, typo, suggestion",
    [
        ("prm_service", "minlm", "did you mean 'minilm'?"),
        ("policy_service", "sglnag", "did you mean 'sglang'?"),
        ("training", "megatorn", "did you mean 'megatron'?"),
    ],
)
def test_a_typo_in_a_backend_name_gets_did_you_mean(section, typo, suggestion):
    raw = tomllib.loads(CANONICAL.read_text())
    raw[section]["backend"] = typo
    with pytest.raises(ConfigError) as exc:
        build_config(raw, environ={"TAOTOKEN_API_KEY": "k"})
    # a suggestion, not a misreading of the typo as the name of an API channel
    assert suggestion in str(exc.value) and "base_url" not in str(exc.value), str(exc.value)


def test_api_channels_are_named_explicitly_or_by_a_known_gateway():
    raw = tomllib.loads(CANONICAL.read_text())
    assert build_config(raw, environ={"TAOTOKEN_API_KEY": "k"}).prm_service.uses_api  # "taotoken"
    raw["prm_service"]["backend"] = "api:my-gateway"
    assert build_config(raw, environ={"TAOTOKEN_API_KEY": "k"}).prm_service.uses_api
    raw["prm_service"]["backend"] = "my-gateway"
    with pytest.raises(ConfigError) as exc:
        build_config(raw, environ={"TAOTOKEN_API_KEY": "k"})
    assert 'backend = "api:my-gateway"' in str(exc.value)


def test_a_log_dir_that_is_a_file_or_holds_no_store_is_caught_by_the_dry_run_and_every_command(tmp_path):
    """No traceback, one line naming the file; the dry run says so instead of "all services ready"."""
    afile = tmp_path / "afile"
    afile.write_text("hi")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "store.sqlite").write_text("garbage")
    damaged = tmp_path / "damaged"  # a sound header over damaged pages: it opens, then fails mid-run
    from openclaw_rl.runtime.store import Store

    store = Store(damaged / "store.sqlite")
    for i in range(400):
        store.set_meta(f"k{i}", "x" * 200)
    store.close()
    with (damaged / "store.sqlite").open("r+b") as fh:
        fh.seek((damaged / "store.sqlite").stat().st_size // 3)
        fh.write(b"\xff" * 20000)
    local = (ROOT / "configs" / "local.toml").read_text()
    samples = write_samples(tmp_path / "s.jsonl", [one_token_sample("s", "t")])
    for log_dir, says, verbs in (
        (afile, "is a file, not a directory", (["users", "add", "carl"], ["status"])),
        (corrupt, "is not a usable openclaw-rl store", (["users", "add", "carl"], ["status"])),
        (damaged, "is damaged", (["status"], ["turns", "--last", "2"])),
        # under a file: the message names the file, not the folder that cannot be made
        (afile / "sub", f"{afile} is a file, so [global] log_dir", (["users", "add", "carl"], ["status"])),
        # a folder the kernel refuses to create: found by the dry run too, not only by the run
        (
            Path("/proc/openclaw-rl-test"),
            "cannot be created",
            (["users", "add", "carl"], ["train", "--samples", str(samples)]),
        ),
    ):
        config = tmp_path / f"{log_dir.parent.name}-{log_dir.name}.toml"
        text = re.sub(r"(?m)^log_dir = .*$", f'log_dir = "{log_dir}"', local, count=1)
        # a free port: a run on this machine (make run) may hold 30000, which is not what is tested
        config.write_text(re.sub(r"(?m)^port = .*$", f"port = {free_port()}", text, count=1))
        dry = subprocess.run(
            [sys.executable, "-m", "openclaw_rl.launch", "--config", str(config), "--dry-run"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert dry.returncode == 1 and says in dry.stdout and "not ready: log_dir" in dry.stdout
        for verb in verbs:
            out = subprocess.run(
                [sys.executable, "-m", "openclaw_rl.cli", *verb, "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert "Traceback" not in out.stderr, out.stderr
            assert out.returncode == 2 and says in out.stderr, (verb, out.stdout, out.stderr)


def test_command_line_numbers_are_checked_before_anything_starts(tmp_path):
    config = str(ROOT / "configs" / "local.toml")
    for args, says in (
        (["serve", "--port", "99999"], "a TCP port is 0-65535"),
        (["eval", "--chat-n", "-1"], "must be 0 or more"),
        (["eval", "--max-tokens", "0"], "must be 1 or more"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "openclaw_rl.cli", *args, "--config", config],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "afile").write_text("x")
    for target, why in (
        (tmp_path / "afile" / "x", "a part of its path is a file"),
        (tmp_path, "it is a directory"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "openclaw_rl.cli", "eval", "--config", config, "--out", str(target)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and "[eval] policy=" not in out.stdout, out.stdout
        assert f"cannot write the summary to {target}: {why}" in out.stdout, out.stdout
