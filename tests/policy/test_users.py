"""Who is talking, and explicit feedback, over real HTTP with the official ``openai`` SDK.

A real policy service (tiny random model, real tokenizer) with a service ``api_key`` (so a request
with that key is a trusted gateway) and ``[users] header``; user keys are made by the real
``openclaw-rl users add`` command.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openclaw_rl.config import load_config
from openclaw_rl.policy.server import PolicyService
from openclaw_rl.runtime.users import split_key

KEY = "not-a-real-gateway-key"
HEADER = "X-End-User"
HI = [{"role": "user", "content": "hi there"}]


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_rl.cli", "users", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def users_run(tiny_model_dir, tmp_path_factory) -> Iterator[tuple[PolicyService, str, Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("users")
    config = root / "config.toml"
    config.write_text(
        f"""
[global]
log_dir = "{root / "logs"}"

[policy_service]
model = "{tiny_model_dir}"
port = 0
api_key = "{KEY}"
max_tokens_default = 4
batch_wait_ms = 2.0

[env_service]
enabled = false

[users]
header = "{HEADER}"
"""
    )
    keys = {}
    for name in ("alice", "bob"):
        out = _cli(config, "add", name)
        assert out.returncode == 0, out.stderr
        keys[name] = next(line for line in out.stdout.splitlines() if line.startswith("ocu-"))
    svc = PolicyService(load_config(config))
    url = svc.start()
    yield svc, url, config, keys
    svc.stop()


def _sdk(url: str, key: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def _owner(svc: PolicyService, response_id: str) -> str:
    found = svc.store.turn_by_response(response_id)
    assert found is not None, f"{response_id} was not recorded"
    return found[1]


def test_a_user_key_makes_the_request_theirs_whatever_the_body_says(users_run, caplog):
    svc, url, config, keys = users_run
    with caplog.at_level(logging.DEBUG):
        reply = _sdk(url, keys["alice"]).chat.completions.create(
            model="m", messages=HI, max_tokens=3, user="bob", extra_headers={HEADER: "bob"}
        )
    assert _owner(svc, reply.id) == "alice"
    # the key is shown once by `users add` and is nowhere in the run afterwards
    parts = split_key(keys["alice"])  # the secret may itself hold "-": split as the service does
    assert parts is not None
    secret = parts[1]
    assert keys["alice"] not in caplog.text
    assert secret not in caplog.text
    # searched by another process: reading the live store's files here and closing them would drop
    # this process's POSIX locks on them, which the in-process server's SQLite connection holds
    found = subprocess.run(
        ["grep", "-r", "-l", "-F", "-a", "-e", secret, str(load_config(config).log_dir)],
        capture_output=True,
        text=True,
    )
    # status 2 with only "No such file": a file the run replaced while grep walked the folder
    vanished = found.returncode == 2 and all("No such file" in line for line in found.stderr.splitlines())
    assert found.stdout == "" and (found.returncode == 1 or vanished), (found.stdout, found.stderr)


def test_an_unknown_user_key_is_refused_not_served_as_someone_else(users_run):
    from openai import AuthenticationError

    _, url, _, keys = users_run
    forged = keys["alice"][:-4] + ("AAAA" if not keys["alice"].endswith("AAAA") else "BBBB")
    for key in (forged, "ocu-00000000-" + "x" * 43):
        with pytest.raises(AuthenticationError) as info:
            _sdk(url, key).chat.completions.create(model="m", messages=HI, max_tokens=2)
        assert info.value.status_code == 401


def test_a_trusted_gateway_names_its_users_by_field_or_header(users_run):
    svc, url, _, _ = users_run
    gateway = _sdk(url, KEY)
    by_field = gateway.chat.completions.create(model="m", messages=HI, max_tokens=2, user="carol@example.org")
    assert _owner(svc, by_field.id) == "carol@example.org"
    by_header = gateway.chat.completions.create(
        model="m", messages=HI, max_tokens=2, user="carol@example.org", extra_headers={HEADER: "dave"}
    )
    assert _owner(svc, by_header.id) == "dave"  # the configured header wins over the body
    anonymous = gateway.chat.completions.create(model="m", messages=HI, max_tokens=2)
    assert _owner(svc, anonymous.id) == "default"
    # OpenAI's field is opaque: an identity provider's id is a user of its own, the same each time,
    # never another's (an identity provider's id and a name with spaces are no user names as they stand)
    owners = {}
    for value in ("idp|example-user-1", "idp|example-user-2", "John Doe", "idp|example-user-1"):
        reply = gateway.chat.completions.create(model="m", messages=HI, max_tokens=2, user=value)
        owners.setdefault(value, set()).add(_owner(svc, reply.id))
    assert all(len(o) == 1 for o in owners.values()) and len(set.union(*owners.values())) == 3
    assert next(iter(owners["idp|example-user-1"])).startswith("idp_example-user-1-")
    trailing = gateway.chat.completions.create(
        model="m", messages=HI, max_tokens=2, user="carol@example.org\n"
    )
    assert _owner(svc, trailing.id).startswith("carol@example.org_-")  # not carol with a line break
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        r = c.post("/v1/chat/completions", json={"messages": HI}, headers={HEADER: ""})
        assert r.status_code == 400 and r.json()["error"]["param"] == f"header {HEADER}"  # not default
        r = c.post("/v1/chat/completions", json={"messages": HI}, headers={HEADER: "../etc"})
        assert r.status_code == 400 and r.json()["error"]["param"] == f"header {HEADER}"


def test_a_gateway_name_differing_only_in_case_from_a_known_user_is_refused(users_run):
    """`users add` refuses Alice beside alice (their folders would be one on a case-insensitive file
    system); a gateway naming Alice must not make that user either, nor `users add` one beside a
    user the traffic named."""
    from openai import BadRequestError

    svc, url, config, keys = users_run
    gateway = _sdk(url, KEY)
    gateway.chat.completions.create(model="m", messages=HI, max_tokens=2, user="erin")
    for name in ("Alice", "ERIN"):  # alice was added with a key; erin is known from her traffic
        with pytest.raises(BadRequestError, match="differs only in case"):
            gateway.chat.completions.create(model="m", messages=HI, max_tokens=2, user=name)
    with pytest.raises(BadRequestError, match=f"header {HEADER}"):
        gateway.chat.completions.create(model="m", messages=HI, max_tokens=2, extra_headers={HEADER: "Erin"})
    added = _cli(config, "add", "Erin")
    assert added.returncode != 0 and "differ only in case" in added.stderr
    assert (
        _owner(svc, gateway.chat.completions.create(model="m", messages=HI, max_tokens=2, user="erin").id)
        == "erin"
    )


def test_two_users_never_share_a_session(users_run):
    svc, url, _, keys = users_run
    alice, bob = _sdk(url, keys["alice"]), _sdk(url, keys["bob"])
    first = alice.chat.completions.create(model="m", messages=HI, max_tokens=3)
    convo = [*HI, {"role": "assistant", "content": first.choices[0].message.content}]
    convo.append({"role": "user", "content": "and then?"})
    raw = alice.chat.completions.with_raw_response.create(model="m", messages=convo, max_tokens=2)
    alice_sid = svc.store.turn_by_response(first.id)[0].session_id
    assert alice_sid.startswith("alice/")  # stored under her name; her client sees the id without it
    assert raw.headers["X-Session-Id"] == alice_sid.removeprefix("alice/")  # her continuation is stitched
    # bob sending the very same conversation is a session of his own, and alice's turn keeps her reply
    raw = bob.chat.completions.with_raw_response.create(model="m", messages=convo, max_tokens=2)
    assert svc.store.turn_by_response(raw.parse().id)[0].session_id.startswith("bob/")
    assert svc.store.session_turns(alice_sid)[0].next_state.content == "and then?"
    # naming her session, by the id she sees or the stored one, gives bob a session of his own
    for named in (alice_sid.removeprefix("alice/"), alice_sid):
        raw = bob.chat.completions.with_raw_response.create(
            model="m", messages=HI, max_tokens=2, extra_headers={"X-Session-Id": named}
        )
        assert raw.headers["X-Session-Id"] == named
        assert svc.store.turn_by_response(raw.parse().id)[0].session_id == f"bob/{named}"
    assert len(svc.store.session_turns(alice_sid)) == 2
    # the gateway's own key (the user "default") cannot write into it either: an id with a "/" is
    # one of its own, kept as default/...; nor take one of hers before she opens it
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        for named in (alice_sid, "alice/later"):
            r = c.post(
                "/v1/chat/completions",
                json={"messages": HI, "max_tokens": 2},
                headers={"X-Session-Id": named},
            )
            assert r.status_code == 200 and r.headers["X-Session-Id"] == named, r.text
            assert svc.store.turn_by_response(r.json()["id"])[0].session_id == f"default/{named}"
    assert len(svc.store.session_turns(alice_sid)) == 2
    raw = alice.chat.completions.with_raw_response.create(
        model="m", messages=HI, max_tokens=2, extra_headers={"X-Session-Id": "later"}
    )
    assert svc.store.turn_by_response(raw.parse().id)[0].session_id == "alice/later"
    # nor join her episode group (its rewards are compared with each other) with an outcome of his own
    group = {"X-Episode-Group": "grp-1", "X-Episode-Group-Size": "2"}
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post(
            "/v1/chat/completions",
            json={"messages": HI, "max_tokens": 2},
            headers={**group, "Authorization": f"Bearer {keys['alice']}"},
        )
        assert r.status_code == 200, r.text
        r = c.post(
            "/v1/chat/completions",
            json={"messages": HI, "max_tokens": 2},
            headers={**group, "X-Episode-Outcome": "-1", "Authorization": f"Bearer {keys['bob']}"},
        )
    assert r.status_code == 403 and r.json()["error"]["code"] == "group_of_another_user"
    assert svc.store.group_users("grp-1") == {"alice"}


def test_each_user_names_their_sessions_freely(users_run):
    """Session ids are the client's: alice and bob may both call theirs "work", and each continues
    their own (before, the second user to pick a name got a 403 on every request)."""
    svc, url, _, keys = users_run
    turns = {}
    for name in ("alice", "bob", "alice"):
        raw = _sdk(url, keys[name]).chat.completions.with_raw_response.create(
            model="m", messages=HI, max_tokens=2, extra_body={"session_id": "work"}
        )
        assert raw.headers["X-Session-Id"] == "work"
        reply = raw.parse()
        assert reply.model_extra["session_id"] == "work"
        turns.setdefault(name, []).append(svc.store.turn_by_response(reply.id)[0])
    assert {t.session_id for t in turns["alice"]} == {"alice/work"}
    assert [t.turn_index for t in turns["alice"]] == [0, 1]  # her second request continues her session
    assert turns["bob"][0].session_id == "bob/work" and turns["bob"][0].turn_index == 0
    assert svc.store.session_user("alice/work") == "alice" and svc.store.session_user("bob/work") == "bob"


def _feedback_rows(svc: PolicyService) -> int:
    return svc.store._db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0]


def test_feedback_on_ones_own_response_is_its_explicit_next_state(users_run):
    svc, url, config, keys = users_run
    reply = _sdk(url, keys["alice"]).chat.completions.create(model="m", messages=HI, max_tokens=3)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['alice']}"}, timeout=60) as c:
        r = c.post(
            "/v1/feedback", json={"response_id": reply.id, "rating": -1, "comment": " shorter please "}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rating"] == -1 and body["will_train"] is True and body["response_id"] == reply.id
    turn, owner = svc.store.turn_by_response(reply.id)
    assert owner == "alice" and svc.store.turn_status(turn.session_id, turn.turn_index) == "ready"
    assert turn.next_state.rating == -1 and turn.next_state.content == "shorter please"
    listed = _cli(config, "list")
    assert listed.returncode == 0, listed.stderr
    [row] = [line.split() for line in listed.stdout.splitlines() if line.startswith("alice ")]
    assert row[1] == "yes" and int(row[2]) >= 1 and row[-1].endswith("/-1"), listed.stdout


def test_feedback_errors_name_the_problem_and_record_nothing(users_run):
    svc, url, _, keys = users_run
    reply = _sdk(url, keys["alice"]).chat.completions.create(model="m", messages=HI, max_tokens=3)
    before = _feedback_rows(svc)
    status = svc.store.turn_status(*svc.store.turn_by_response(reply.id)[0].key.split(":"))
    with httpx.Client(base_url=url, timeout=60) as c:
        bob = {"Authorization": f"Bearer {keys['bob']}"}
        r = c.post("/v1/feedback", json={"response_id": reply.id, "rating": 1}, headers=bob)
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_your_response"
        alice = {"Authorization": f"Bearer {keys['alice']}"}
        r = c.post("/v1/feedback", json={"response_id": "chatcmpl-nope", "rating": 1}, headers=alice)
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
        for body, field in (
            ({"response_id": reply.id, "rating": 2}, "rating"),
            ({"response_id": reply.id, "rating": "1"}, "rating"),
            ({"response_id": reply.id, "rating": True}, "rating"),
            ({"rating": 1}, "response_id"),
            ({"response_id": reply.id, "rating": 1, "comment": 5}, "comment"),
            ({"response_id": reply.id, "rating": 1, "stars": 5}, "stars"),
        ):
            r = c.post("/v1/feedback", json=body, headers=alice)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]
        r = c.post("/v1/feedback", content=b"{not json", headers=alice)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = c.post("/v1/feedback", json={"response_id": reply.id, "rating": 1})
        assert r.status_code == 401  # no key at all
    assert _feedback_rows(svc) == before
    turn = svc.store.turn_by_response(reply.id)[0]
    assert svc.store.turn_status(turn.session_id, turn.turn_index) == status and turn.next_state is None


def test_a_stored_response_is_read_and_deleted_only_by_its_user_or_the_gateway(users_run):
    from openai import NotFoundError

    svc, url, _, keys = users_run
    alice, bob, gateway = _sdk(url, keys["alice"]), _sdk(url, keys["bob"]), _sdk(url, KEY)
    mine = alice.responses.create(model="m", input="hi", max_output_tokens=2)
    assert alice.responses.retrieve(mine.id).id == mine.id
    for call in (
        lambda: bob.responses.retrieve(mine.id),
        lambda: bob.responses.input_items.list(mine.id),
        lambda: bob.responses.delete(mine.id),
    ):
        with pytest.raises(NotFoundError):  # the same answer as for an id that does not exist
            call()
    assert gateway.responses.retrieve(mine.id).output_text == mine.output_text  # it acts for alice anyway
    # ... but a gateway request that names another user acts as that user alone
    for call in (
        lambda: gateway.responses.retrieve(mine.id, extra_headers={HEADER: "carol"}),
        lambda: gateway.responses.delete(mine.id, extra_headers={HEADER: "carol"}),
    ):
        with pytest.raises(NotFoundError):
            call()
    assert gateway.responses.retrieve(mine.id, extra_headers={HEADER: "alice"}).id == mine.id
    alice.responses.delete(mine.id)
    with pytest.raises(NotFoundError):
        alice.responses.retrieve(mine.id)


def test_a_lost_key_is_replaced_and_the_old_one_stops_working(users_run):
    """`users add NAME --new-key`: the user's key was lost or leaked; their turns stay theirs."""
    svc, url, config, _ = users_run
    added = _cli(config, "add", "carol")
    old = next(line for line in added.stdout.splitlines() if line.startswith("ocu-"))
    first = _sdk(url, old).chat.completions.create(model="m", messages=HI, max_tokens=2)
    again = _cli(config, "add", "carol")
    assert again.returncode != 0 and "--new-key" in again.stderr  # the way out is named, not `delete`
    replaced = _cli(config, "add", "carol", "--new-key")
    assert replaced.returncode == 0, replaced.stderr
    new = next(line for line in replaced.stdout.splitlines() if line.startswith("ocu-"))
    assert new != old
    from openai import AuthenticationError

    with pytest.raises(AuthenticationError):
        _sdk(url, old).chat.completions.create(model="m", messages=HI, max_tokens=2)
    second = _sdk(url, new).chat.completions.create(model="m", messages=HI, max_tokens=2)
    assert _owner(svc, first.id) == _owner(svc, second.id) == "carol"  # her earlier turn is still hers
    unknown = _cli(config, "add", "nobody", "--new-key")
    assert unknown.returncode != 0 and "no key to replace" in unknown.stderr


def test_a_gateway_continues_a_users_response_without_naming_them_again(users_run):
    """As reading it back: the gateway acts for all its users, so previous_response_id alone goes on
    as the user whose response it continues (OpenAI's continuation never depends on ``user``); a
    request naming another user, or another user's own key, gets a 404 and records nothing."""
    import openai

    svc, url, _, keys = users_run
    gateway = _sdk(url, KEY)
    first = gateway.responses.create(model="m", input="hi", user="carol", max_output_tokens=2)
    more = gateway.responses.create(
        model="m", input="more", previous_response_id=first.id, max_output_tokens=2
    )
    before = svc.store.counters().turns
    turn, owner = svc.store.turn_by_response(more.id)
    assert owner == "carol" and turn.session_id == svc.store.turn_by_response(first.id)[0].session_id
    for client, extra in ((gateway, {"user": "dave"}), (_sdk(url, keys["alice"]), {})):
        with pytest.raises(openai.NotFoundError):
            client.responses.create(
                model="m", input="x", previous_response_id=first.id, max_output_tokens=2, **extra
            )
    assert svc.store.counters().turns == before


def test_one_users_words_are_never_another_users_prefix_cache_hit(users_run):
    """Shared mode: one policy, but a prompt's cached keys/values are its user's. Shared, the cache's
    hit counts (in /healthz) told bob which PIN alice had written, by which of his guesses hit."""
    svc, url, _, keys = users_run
    if svc.pcfg.prefix_cache_mb == 0:
        pytest.skip("no prefix cache in this config")
    alice, bob = _sdk(url, keys["alice"]), _sdk(url, keys["bob"])
    secret = [{"role": "user", "content": "My bank PIN is 7395. " + "Please keep it safe for me. " * 30}]

    def hits() -> int:
        return int(svc.engine.stats()["prefix_cache_hit_tokens"])

    alice.chat.completions.create(model="m", messages=secret, max_tokens=1)
    before = hits()
    bob.chat.completions.create(model="m", messages=secret, max_tokens=1)
    assert hits() == before  # bob's guess finds nothing of hers
    alice.chat.completions.create(
        model="m", messages=secret, max_tokens=1, extra_headers={"X-Session-Id": "again"}
    )
    assert hits() > before  # her own next turn still reuses what she sent
