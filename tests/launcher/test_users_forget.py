"""The right to be forgotten, and taking one's data along: ``openclaw-rl users export`` / ``delete``
against a live policy service (real HTTP, the official ``openai`` SDK, the real CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from openclaw_rl.config import load_config
from openclaw_rl.policy.server import PolicyService
from openclaw_rl.runtime.metrics import MetricsWriter
from openclaw_rl.runtime.rundir import RunDir

NAME = "zoe-forget-7"  # a name no other text in the run contains by chance
OTHER = "ben-stays-3"


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_rl.cli", "users", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=180,
    )


def _adapter(directory: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    from tests.helpers import tiny_model

    base, _ = tiny_model(seed=0)
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(directory)
    return directory


@pytest.fixture
def live(tiny_model_dir, tmp_path):
    config = tmp_path / "config.toml"
    log_dir = tmp_path / "logs"
    config.write_text(
        f"""
[global]
log_dir = "{log_dir}"
[policy_service]
model = "{tiny_model_dir}"
port = 0
max_tokens_default = 4
[env_service]
enabled = false
[users]
mode = "per_user"
"""
    )
    keys = {}
    for name in (NAME, OTHER):
        out = _cli(config, "add", name)
        assert out.returncode == 0, out.stderr
        keys[name] = next(line for line in out.stdout.splitlines() if line.startswith("ocu-"))
    cfg = load_config(config)
    run = RunDir.of(cfg)
    for name in (NAME, OTHER):  # what per-user training leaves: a published adapter, a checkpoint
        path = _adapter(run.policy_dir(name) / "v000001")
        run.publish_policy(1, path, step=1, user=name)
        (run.checkpoints / "users" / name / "step_00000001").mkdir(parents=True)
        (run.checkpoints / "users" / name / "step_00000001" / "optimizer.pt").write_bytes(b"x")
    metrics = MetricsWriter(cfg.log_dir)
    metrics.write(1, {"loss": 0.5}, user=NAME)
    metrics.write(2, {"loss": 0.4}, user=OTHER)
    metrics.close()
    svc = PolicyService(cfg)
    url = svc.start()
    yield svc, url, config, keys
    svc.stop()


def _chat(url: str, key: str, text: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    first = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=3
    )
    convo = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": f"{text} -- thanks, and one more thing"},
    ]
    client.chat.completions.create(model="m", messages=convo, max_tokens=3)
    return first.id


def test_export_then_delete_leaves_nothing_that_names_them(live, tmp_path, tiny_model_dir):
    svc, url, config, keys = live
    mine = _chat(url, keys[NAME], "zoe's secret question about tulips")
    _chat(url, keys[OTHER], "ben asks about the weather")
    r = httpx.post(
        f"{url}/v1/feedback",
        json={"response_id": mine, "rating": 1, "comment": "zoe liked it"},
        headers={"Authorization": f"Bearer {keys[NAME]}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text

    out_dir = tmp_path / "export"
    out = _cli(config, "export", NAME, "--out", str(out_dir))
    assert out.returncode == 0, out.stderr
    turns = [json.loads(line) for line in (out_dir / "turns.jsonl").read_text().splitlines()]
    assert len(turns) == 2 and all(t["user"] == NAME for t in turns)
    assert "tulips" in turns[0]["messages"][0]["content"] and turns[0]["next_state"]["rating"] == 1
    from peft import PeftModel

    from tests.helpers import tiny_model

    base, _ = tiny_model(seed=0)
    PeftModel.from_pretrained(base, out_dir / "adapter")  # their adapter, loadable by peft
    # every file of it the owner's alone: an adapter is trained on one person's words
    exported = [out_dir, *out_dir.rglob("*")]
    loose = [str(p) for p in exported if p.stat().st_mode & 0o077]
    assert not loose, loose

    assert svc.engine._adapters is not None and NAME in svc.engine._adapters.slot_of  # resident
    out = _cli(config, "delete", NAME)
    assert out.returncode == 0, out.stderr
    said = out.stdout
    # the service listens on a random port (the config says 0): the CLI found it where it recorded
    # itself, and it dropped the adapter from memory
    assert "dropped their adapter from memory" in said
    assert NAME not in svc.engine._adapters.slot_of and NAME not in svc.engine._adapters.sources
    assert f"user {NAME} deleted" in said and "turns=2" in said and "feedback=1" in said and "key=1" in said
    assert "metrics_rows=1" in said and "files=" in said
    # their key is refused at once, by the service that is still running
    from openai import AuthenticationError, OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=keys[NAME], max_retries=0, timeout=30)
    with pytest.raises(AuthenticationError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    # nothing under log_dir names them: not the store (rows, free pages, WAL), not a file, not a folder
    log_dir = Path(load_config(config).log_dir)
    needles = [NAME.encode(), b"tulips", b"zoe liked it", mine.encode(), keys[NAME].split("-")[1].encode()]
    for path in log_dir.rglob("*"):
        assert NAME not in str(path.relative_to(log_dir)), path
        if path.is_file():
            data = path.read_bytes()
            for needle in needles:
                assert needle not in data, (path, needle)
    # the other user is untouched
    listed = _cli(config, "list")
    assert OTHER in listed.stdout and NAME not in listed.stdout
    assert RunDir.of(load_config(config)).read_published_policy(OTHER) is not None
    assert any(OTHER in line for line in (log_dir / "metrics.jsonl").read_text().splitlines())
    assert svc.store.user_stats(OTHER, "x").turns == 2
    from openclaw_rl.runtime.policy_admin import forget_user

    assert forget_user(load_config(config), url, "../../x") is not None  # no user is named so: a 400
    # a gateway naming the same name again gets a new user: the base, not the deleted adapter
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "user": NAME}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)  # loopback without a key: trusted
    assert r.status_code == 200 and r.json()["policy_version"] == 0, r.text
    assert svc.engine._adapters is not None and NAME not in svc.engine._adapters.slot_of


def _long_stream(url: str, key: str, text: str):
    """A streamed reply long enough to still be generating while the test acts (tiny model: it
    never stops on its own before ``max_tokens``)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=400, stream=True
    )


def _recorded_mentions(svc: PolicyService, needle: str) -> int:
    return sum(needle in (t.messages[0].get("content") or "") for t, _, _ in svc.store.user_turns(NAME))


def test_deleting_a_user_mid_reply_stops_it_and_keeps_nothing_of_it(live):
    """``users delete`` while their reply is still streaming: the service, told by the CLI, ends the
    stream with a 401 error, and the turn is never written."""
    from openai import APIError as OpenAIError

    svc, url, config, keys = live
    stream = _long_stream(url, keys[NAME], "zoe asks about quixlor dragons")
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    import threading

    done: dict[str, subprocess.CompletedProcess[str]] = {}
    # the config says port 0 (the service took a random one, as `serve --port` moves it): the CLI
    # finds the service where it recorded itself, not at the config's port
    cfg = load_config(config)
    worker = threading.Thread(target=lambda: done.setdefault("out", _cli(config, "delete", NAME)))
    worker.start()
    with pytest.raises(OpenAIError) as err:
        for _ in chunks:
            pass
    assert "deleted" in str(err.value)
    worker.join(120)
    out = done["out"]
    assert out.returncode == 0, out.stderr
    assert "stopped any request of theirs in flight" in out.stdout
    assert NAME not in svc.store.user_names()
    log_dir = Path(cfg.log_dir)
    for path in log_dir.rglob("*"):
        if path.is_file():
            assert b"quixlor" not in path.read_bytes(), path


def test_a_reply_finishing_after_the_delete_is_not_recorded_even_by_a_service_not_told(live):
    """A service the CLI cannot reach (another port, another machine) still checks, when it records
    a turn, that the key it was authenticated with exists: the late reply is not kept."""
    svc, url, config, keys = live
    stream = _long_stream(url, keys[NAME], "zoe asks about quixlor dragons again")
    chunks = iter(stream)
    next(chunks)
    svc.store.delete_user(NAME)  # what `users delete` does to the store; the service is not told
    for _ in chunks:  # the reply runs to its end; the client read it, but the user is gone
        pass
    assert NAME not in svc.store.user_names()
    assert _recorded_mentions(svc, "quixlor") == 0
    from openai import AuthenticationError

    with pytest.raises(AuthenticationError):
        _chat(url, keys[NAME], "still there?")


def test_default_cannot_be_added_and_exports_refuse_bad_folders(live, tmp_path):
    svc, url, config, keys = live
    out = _cli(config, "add", "default")
    assert out.returncode == 2 and "'default' is reserved" in out.stderr
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = _cli(config, "export", OTHER, "--out", str(afile))
    assert (
        out.returncode == 2 and "exists and is not a folder" in out.stderr and "Traceback" not in out.stderr
    )
    inside = Path(load_config(config).log_dir) / "exports"
    out = _cli(config, "export", OTHER, "--out", str(inside))
    assert out.returncode == 2 and "inside the run's log_dir" in out.stderr and not inside.exists()
    # a folder used before: the adapter in it is this export's, or none
    reused = tmp_path / "reused"
    (reused / "adapter").mkdir(parents=True)
    (reused / "adapter" / "adapter_config.json").write_text("{}")
    out = _cli(config, "export", OTHER, "--out", str(reused))
    assert out.returncode == 0, out.stderr
    assert json.loads((reused / "adapter" / "adapter_config.json").read_text()) != {}
    assert (reused / "turns.jsonl").stat().st_mode & 0o077 == 0  # their words: the owner's eyes only
    # a link planted where the export writes (a shared /tmp): refused, the file it names untouched
    planted = tmp_path / "planted"
    planted.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (planted / "turns.jsonl").symlink_to(victim)
    out = _cli(config, "export", OTHER, "--out", str(planted))
    assert out.returncode == 2 and "turns.jsonl there is a symbolic link" in out.stderr, out.stderr
    assert victim.read_text() == "keep me" and "Traceback" not in out.stderr


def test_a_user_key_cut_short_or_mistyped_is_refused_never_filed_under_default(live):
    """On an open loopback service (no api_key) an anonymous request is ``default``'s; a broken user
    key must not become one, or that user's words land where export and delete cannot reach them."""
    svc, url, _, keys = live
    key = keys[NAME]
    key_id = key.split("-")[1]
    hi = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
    turns_before = svc.store.counters().turns
    with httpx.Client(base_url=url, timeout=60) as c:
        for auth in (
            f"Bearer {key[:-5]}",
            f"Bearer ocu-{key_id}",
            "Bearer ocu-",
            "Bearer OCU-" + key[4:],
            key[:-1],
            f"Token {key[:-5]}",
        ):
            r = c.post("/v1/chat/completions", json=hi, headers={"Authorization": auth})
            assert r.status_code == 401, (auth[:16], r.status_code, r.text)
            assert key not in r.text and key[:-5] not in r.text  # the error never echoes the key
        # a client config's ${VAR} sent as is (OpenClaw does, when VAR is unset): refused, naming it
        r = c.post("/v1/chat/completions", json=hi, headers={"Authorization": "Bearer ${ALICE_KEY}"})
        assert r.status_code == 401 and "ALICE_KEY is not set" in r.json()["error"]["message"], r.text
        assert svc.store.counters().turns == turns_before  # nothing recorded, under anyone
        # the key itself, with a tab after the scheme or with no scheme at all, is hers
        for auth in (f"Bearer\t{key}", key):
            r = c.post("/v1/chat/completions", json=hi, headers={"Authorization": auth})
            assert r.status_code == 200, r.text
            assert svc.store.turn_by_response(r.json()["id"])[1] == NAME


def test_names_differing_only_in_case_and_deleting_default_are_refused(live):
    svc, url, config, _ = live
    out = _cli(config, "add", NAME.upper())
    assert out.returncode == 1 and "only in case" in out.stderr
    out = _cli(config, "add", "DEFAULT")
    assert out.returncode == 2 and "reserved" in out.stderr
    with httpx.Client(base_url=url, timeout=60) as c:  # an anonymous turn: the user default's
        r = c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        )
        assert r.status_code == 200
    out = _cli(config, "delete", "default")
    assert out.returncode == 2 and "--yes" in out.stderr
    assert svc.store.turn_by_response(r.json()["id"]) is not None  # nothing removed
    out = _cli(config, "delete", "default", "--yes")
    assert out.returncode == 0, out.stderr
    assert svc.store.turn_by_response(r.json()["id"]) is None
