"""EnvLoop: real HTTP clients against a real server — headers, episodes, outages, e2e with PolicyService."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from openclaw_rl.config import build_config
from openclaw_rl.envs import make
from openclaw_rl.envs.loop import EnvLoop
from openclaw_rl.policy.protocol import APIError
from openclaw_rl.runtime.ports import free_port
from openclaw_rl.types import DEFAULT_USER, Sample

from ..helpers import one_token_sample
from ._server import ChatServer

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model


def _cfg(tmp_path, port: int, types=("terminal",), num_envs=2, state_capture=True, api_key=None, **env: Any):
    pol: dict[str, Any] = {"port": port, "host": "127.0.0.1", "request_timeout_sec": 30, "model": "m"}
    if api_key:
        pol["api_key"] = api_key
    return build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": pol,
            "env_service": {
                "num_envs": num_envs,
                "interaction_types": list(types),
                "state_capture": state_capture,
                "max_turns": 2,
                **env,
            },
        },
        environ={},
    )


def _terminal_agent(body: dict[str, Any]) -> str:
    """Solves the count_lines task on the second try, so episodes have two acting turns."""
    acted = sum(m["role"] == "assistant" for m in body["messages"])
    return "```bash\nls\n```" if acted == 0 else "```bash\nwc -l < access.log\n```"


def _by_session(requests):
    out: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        out.setdefault(r["headers"]["x-session-id"], []).append(r)
    return out


def test_workers_speak_the_session_protocol(tmp_path, capsys):
    with ChatServer(_terminal_agent, api_key="sekret") as srv:
        cfg = _cfg(tmp_path, srv.port, api_key="sekret")
        got = []
        svc = EnvLoop(
            cfg, on_episode=got.append, max_episodes=3, env_overrides={"terminal": {"task": "count_lines"}}
        )
        svc.start()
        stats = svc.wait_episodes(3, timeout=60)
        svc.stop()
    assert capsys.readouterr().out.splitlines()[0] == "[env_service] mode=local, num_envs=2, types=[terminal]"
    assert len(stats) == 3 and got == stats
    assert all(s.success and s.turns == 2 and s.reward == 1.0 and s.error is None for s in stats)
    sessions = _by_session(srv.requests)
    assert len(sessions) == 3
    for sid, reqs in sessions.items():
        assert sid.startswith("env-terminal-")
        # two acting turns, then the closing request carrying the last next state
        assert [r["headers"]["x-session-done"] for r in reqs] == ["false", "false", "true"]
        assert all(r["headers"]["x-turn-type"] == "main" for r in reqs)
        assert all(r["headers"]["authorization"] == "Bearer sekret" for r in reqs)
        last = reqs[-1]["body"]["messages"]
        assert last[-1]["role"] == "user" and last[-1]["content"].startswith("exit code: 0\nstdout:\n7")
        assert reqs[1]["body"]["messages"][-1]["content"].startswith("exit code: 0")  # ls output came back


def test_state_capture_off_sends_no_next_state(tmp_path, caplog):
    with ChatServer(_terminal_agent) as srv:
        cfg = _cfg(tmp_path, srv.port, state_capture=False, num_envs=1)
        assert any("state_capture = false" in w for w in cfg.warnings)
        svc = EnvLoop(cfg, max_episodes=2, env_overrides={"terminal": {"task": "count_lines"}})
        with caplog.at_level(logging.WARNING, logger="openclaw_rl.env_service"):
            svc.start()
            stats = svc.wait_episodes(2, timeout=60)
            svc.stop()
    assert len(stats) == 2 and all(s.turns == 1 and s.details["state_captured"] is False for s in stats)
    assert all(r["headers"]["x-session-done"] == "true" for r in srv.requests)
    assert all(m["role"] != "assistant" for r in srv.requests for m in r["body"]["messages"])
    assert "nothing is learned" in caplog.text


def test_policy_down_workers_wait_and_retry(tmp_path, caplog):
    port = free_port()
    cfg = _cfg(tmp_path, port, num_envs=2)
    svc = EnvLoop(
        cfg, max_episodes=2, backoff_max_sec=0.5, env_overrides={"terminal": {"task": "count_lines"}}
    )
    with caplog.at_level(logging.WARNING, logger="openclaw_rl.env_service"):
        svc.start()
        time.sleep(2.0)  # nobody listens: workers back off and retry
        assert all(t.is_alive() for t in svc.threads)
        assert sum(c.retries for c in svc.clients) >= 2 and svc.finished_episodes == 0
        with ChatServer(_terminal_agent, port=port):
            stats = svc.wait_episodes(2, timeout=60)
        svc.stop()
    assert len(stats) == 2 and all(s.success for s in stats)
    assert "not available" in caplog.text


def test_refused_request_ends_episode_not_worker(tmp_path, caplog):
    # The server quotes the refused key back, as some do: it reaches neither the stats nor the log.
    with ChatServer(_terminal_agent, api_key="right") as srv:
        cfg = _cfg(tmp_path, srv.port, api_key="wrong-run-key", num_envs=1)
        svc = EnvLoop(
            cfg, max_episodes=2, backoff_max_sec=0.5, env_overrides={"terminal": {"task": "count_lines"}}
        )
        with caplog.at_level(logging.WARNING, logger="openclaw_rl.env_service"):
            began = time.monotonic()
            svc.start()
            stats = svc.wait_episodes(2, timeout=30)
            waited = time.monotonic() - began
            svc.stop()
    assert len(stats) == 2 and all(not s.success and "401" in (s.error or "") for s in stats)
    assert all("wrong-run-key" not in (s.error or "") for s in stats)
    assert "wrong-run-key" not in caplog.text
    # a refused key is waited on like a service that is down, not met by a burst of episodes
    assert "refuses this run's key" in caplog.text and waited >= 0.5  # backoff_max before episode 2


def test_an_episode_longer_than_the_window_goes_on_without_its_oldest_steps(tmp_path):
    # A stand-in whose window holds the task and one exchange: the worker leaves older steps out
    # (as an agent compacts) instead of ending the episode on the 400. The refusal is the policy
    # service's own, worded in full (its code comes after a message of 300+ characters).
    seen: list[int] = []
    refusal = APIError(
        400,
        "This model's maximum context length is 2048 tokens. However, you requested 2417 tokens "
        "(2161 in the messages, 256 in the completion). Please reduce the length of the messages or "
        "completion (ask for at most max_tokens = 0).",
        param="max_tokens",
        code="context_length_exceeded",
    ).body()["error"]

    def agent(body: dict[str, Any]):
        seen.append(len(body["messages"]))
        if len(body["messages"]) > 4:
            return 400, refusal
        return "```bash\nls\n```"

    with ChatServer(agent) as srv:
        cfg = _cfg(tmp_path, srv.port, num_envs=1, max_turns=8)
        svc = EnvLoop(cfg, max_episodes=1, env_overrides={"terminal": {"task": "count_lines"}})
        svc.start()
        (stats,) = svc.wait_episodes(1, timeout=60)
        svc.stop()
    assert stats.error is None and stats.turns == 8, stats
    # refused once when the window first fills; after that each step leaves one exchange out first
    assert sum(n > 4 for n in seen) == 1 and seen[-1] <= 4, seen


def test_unavailable_type_is_skipped_with_one_error_line(tmp_path, caplog):
    """gui without its browser: found when the environment is built, so the type is dropped once,
    not failed at every reset."""
    with ChatServer(_terminal_agent) as srv:
        cfg = _cfg(tmp_path, srv.port, types=("gui", "terminal"), num_envs=1)
        svc = EnvLoop(
            cfg,
            max_episodes=2,
            env_overrides={
                "terminal": {"task": "count_lines"},
                "gui": {"chromium_path": "/nonexistent/chromium"},
            },
        )
        svc.start()
        stats = svc.wait_episodes(2, timeout=60)
        svc.stop()
    assert len(stats) == 2 and {s.interaction_type for s in stats} == {"terminal"}
    assert svc.disabled_types == {"gui"}
    said = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(said) == 1 and "Chromium not found at '/nonexistent/chromium'" in said[0]


ECHO_ENV = """
from openclaw_rl.envs import Env, register


@register("echo")
class EchoEnv(Env):
    \"\"\"Asks for a word back; solved when the reply holds it.\"\"\"

    def __init__(self, seed=None, max_turns=2, **_):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.turns = 0
        return "Say the word banana.", {"next_state_role": "user"}

    def step(self, action):
        self.turns += 1
        done = "banana" in str(action).lower()
        info = {"next_state_role": "user", "success": done}
        return ("thanks!" if done else "no, say banana"), float(done), done, self.turns >= self.max_turns, info
"""


def test_an_environment_of_your_own_runs_from_the_config(tmp_path):
    """docs/envs.md: a module beside config.toml registers it; env_modules names the module."""
    from openclaw_rl.config import ConfigError, load_config
    from openclaw_rl.launcher.launch import check_env

    (tmp_path / "my_envs.py").write_text(ECHO_ENV)
    with ChatServer(lambda body: "banana!") as srv:
        config = tmp_path / "config.toml"
        config.write_text(
            f'[global]\nlog_dir = "{tmp_path / "logs"}"\n'
            f'[policy_service]\nport = {srv.port}\nhost = "127.0.0.1"\nmodel = "m"\n'
            '[env_service]\nnum_envs = 1\nenv_modules = ["my_envs"]\ninteraction_types = ["echo"]\n'
        )
        cfg = load_config(config)
        assert check_env(cfg).ok, check_env(cfg).detail
        svc = EnvLoop(cfg, max_episodes=1)
        svc.start()
        stats = svc.wait_episodes(1, timeout=60)
        svc.stop()
    assert [(s.interaction_type, s.success) for s in stats] == [("echo", True)]
    # an environment that gives no info["messages"]: its observation is the user's message
    assert srv.requests[0]["body"]["messages"] == [{"role": "user", "content": "Say the word banana."}]
    # a mistyped built-in name is named with the one meant
    config.write_text(
        config.read_text().replace('env_modules = ["my_envs"]\n', "").replace('["echo"]', '["termnal"]')
    )
    with pytest.raises(ConfigError, match="did you mean 'terminal'"):
        load_config(config)
    config.write_text(
        config.read_text()
        .replace('["termnal"]', '["echo"]')
        .replace("[env_service]\n", '[env_service]\nenv_modules = ["my_envs"]\n')
    )
    # the dry run's check names what is wrong: an unregistered name, a module that does not import
    config.write_text(config.read_text().replace('["echo"]', '["echo", "ecco"]'))
    detail = check_env(load_config(config)).detail
    assert "interaction_types ['ecco'] registered by none of env_modules ['my_envs']" in detail
    (tmp_path / "broken_envs.py").write_text("raise RuntimeError('half-written')\n")
    config.write_text(config.read_text().replace('["my_envs"]', '["broken_envs"]'))
    detail = check_env(load_config(config)).detail
    assert "'broken_envs' does not import: RuntimeError: half-written" in detail
    # without env_modules, a name of one's own is a config error that says where it would come from
    config.write_text(config.read_text().replace('env_modules = ["broken_envs"]\n', ""))
    with pytest.raises(
        ConfigError, match="name the module that registers it in \\[env_service\\] env_modules"
    ):
        load_config(config)


FAULTY_ENVS = """
from openclaw_rl.envs import Env, register


@register("no_info")
class NoInfo(Env):
    def __init__(self, **_):
        pass

    def reset(self, seed=None, options=None):
        return "Say anything.", {"next_state_role": "user"}

    def step(self, action):
        return "fine", 0.0, True, False, None


@register("endless")
class Endless(Env):
    def __init__(self, **_):
        pass

    def reset(self, seed=None, options=None):
        return "Keep talking.", {"next_state_role": "user"}

    def step(self, action):
        return "go on", 0.0, False, False, {"next_state_role": "user"}


@register("raw_names")
class RawNames(Env):
    # lists a file whose name is not UTF-8, as os.listdir spells it (a lone surrogate)

    def __init__(self, **_):
        pass

    def reset(self, seed=None, options=None):
        return "Files: bad\\udcff.txt", {"next_state_role": "user"}

    def step(self, action):
        return "removed bad\\udcff.txt", 1.0, True, False, {"next_state_role": "user", "success": True}
"""


def _faulty_config(tmp_path, port: int, itype: str) -> str:
    """One worker playing ``itype`` of FAULTY_ENVS against a stand-in service on ``port``."""
    return (
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n'
        f'[policy_service]\nport = {port}\nhost = "127.0.0.1"\nmodel = "m"\n'
        f'[env_service]\nnum_envs = 1\nenv_modules = ["faulty_envs"]\ninteraction_types = ["{itype}"]\n'
    )


def test_an_environment_breaking_the_contract_ends_its_episode_not_the_worker(tmp_path, monkeypatch, caplog):
    """docs/envs.md: what reset / step return is checked; the error names the environment; an
    episode never ended by its environment is ended by the loop."""
    from openclaw_rl.config import load_config
    from openclaw_rl.envs import loop

    monkeypatch.setattr(loop, "MAX_EPISODE_STEPS", 5)
    (tmp_path / "faulty_envs.py").write_text(FAULTY_ENVS)
    with ChatServer(lambda body: "ok") as srv:
        config = tmp_path / "config.toml"
        config.write_text(_faulty_config(tmp_path, srv.port, "no_info"))
        svc = EnvLoop(load_config(config), max_episodes=2)
        svc.start()
        stats = svc.wait_episodes(2, timeout=60)  # the worker plays the second after the first failed
        svc.stop()
        assert len(stats) == 2
        assert all(
            "environment 'no_info': step(): info must be a dict, got None" in (s.error or "") for s in stats
        ), [s.error for s in stats]
        # said in one line each, not a traceback per episode: the message is the whole story
        said = [r for r in caplog.records if "info must be a dict" in r.getMessage()]
        assert said and not any(r.exc_info for r in said)

        config.write_text(config.read_text().replace('["no_info"]', '["endless"]'))
        svc = EnvLoop(load_config(config), max_episodes=1)
        svc.start()
        (stats,) = svc.wait_episodes(1, timeout=60)
        svc.stop()
    assert stats.error == "environment 'endless' did not end its episode within 5 steps"

    # text no JSON request can carry (a lone surrogate) reaches the policy as U+FFFD, not a crash
    with ChatServer(lambda body: "ok") as srv:
        config.write_text(_faulty_config(tmp_path, srv.port, "raw_names"))
        svc = EnvLoop(load_config(config), max_episodes=1)
        svc.start()
        (stats,) = svc.wait_episodes(1, timeout=60)
        svc.stop()
    assert stats.error is None and stats.success, stats.error
    assert srv.requests[0]["body"]["messages"][0]["content"] == "Files: bad\ufffd.txt"
    assert srv.requests[1]["body"]["messages"][-1]["content"] == "removed bad\ufffd.txt"


def test_cloud_mode_is_rejected(tmp_path):
    from openclaw_rl.config import ConfigError

    with pytest.raises(ConfigError, match="cloud"):
        _cfg(tmp_path, 1, mode="cloud")


def test_end_to_end_with_the_policy_service(tmp_path, tiny_model_dir, gsm8k_path):
    policy = pytest.importorskip("openclaw_rl.policy.server")
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {
                "model": str(tiny_model_dir),
                "port": 0,
                "host": "127.0.0.1",
                "batch_wait_ms": 2.0,
                "max_tokens_default": 12,
                "api_key": "e2e-key",
            },
            "env_service": {
                "num_envs": 2,
                "interaction_types": ["chat", "terminal", "tool_call"],
                "max_turns": 2,
                "data_path": str(gsm8k_path),
            },
        },
        environ={},
    )
    ps = policy.PolicyService(cfg)
    url = ps.start()
    try:
        done: list[Any] = []
        lock = threading.Lock()

        def hook(s):
            with lock:
                done.append(s)

        svc = EnvLoop(cfg, base_url=url, on_episode=hook, max_episodes=4, max_tokens=12, final_max_tokens=4)
        svc.start()
        stats = svc.wait_episodes(4, timeout=240)
        svc.stop()
        assert len(stats) == 4, stats
        assert all(s.error is None and s.turns >= 1 for s in stats), stats
        # the policy service recorded each episode as one session whose first turn got its next state
        for s in stats:
            turns = ps.store.session_turns(s.session_id)
            assert len(turns) == s.turns + 1, (s, turns)
            assert turns[0].next_state is not None and turns[0].next_state.content
            assert all(t.turn_type == "main" for t in turns)
        # the llm user mode, driven through the same real OpenAI-compatible server
        from openclaw_rl.envs.chat import LLMUserWriter

        writer = LLMUserWriter(
            base_url=url + "/v1", api_key="e2e-key", model=str(tiny_model_dir), timeout_sec=60, max_retries=0
        )
        env = make("chat", persona="teacher", data_path=str(gsm8k_path), user_mode="llm", user_writer=writer)
        env.reset(seed=2)
        obs, reward, term, trunc, info = env.step("Wrong.")
        assert info["user_error"] is None and obs.strip() and reward < 0.5
    finally:
        ps.stop()


def test_chat_episodes_carry_the_users_feedback(tmp_path, gsm8k_path):
    def student_agent(body):
        acted = sum(m["role"] == "assistant" for m in body["messages"])
        if acted == 0:
            return "Sure! I'd be happy to help you. **Step 1:** let's add."
        # the style is right now; if the number is wrong the simulated student corrects it
        return "i added the numbers and checked it twice.\nso the answer is 7"

    with ChatServer(student_agent) as srv:
        cfg = _cfg(
            tmp_path,
            srv.port,
            types=("chat",),
            num_envs=1,
            personas=["student"],
            max_turns=4,
            data_path=str(gsm8k_path),
        )
        svc = EnvLoop(cfg, max_episodes=1)
        svc.start()
        (stats,) = svc.wait_episodes(1, timeout=30)
        svc.stop()
    assert stats.interaction_type == "chat" and stats.details["persona"] == "student"
    reqs = srv.requests
    # second request: the user's redo request is the newest message, in plain words
    feedback = reqs[1]["body"]["messages"][-1]
    assert feedback["role"] == "user" and "**" not in feedback["content"] and len(feedback["content"]) > 20
    assert reqs[-1]["headers"]["x-session-done"] == "true"
    assert all(r["headers"]["x-session-done"] == "false" for r in reqs[:-1])
    # each request after the first carries the persona's own score of the turn it answers
    assert "x-turn-truth" not in reqs[0]["headers"]
    truths = [float(r["headers"]["x-turn-truth"]) for r in reqs[1:]]
    assert truths and all(0.0 <= t <= 1.0 for t in truths)


def test_a_group_plays_one_task_several_times_and_reports_its_outcome(tmp_path):
    with ChatServer(_terminal_agent) as srv:
        cfg = _cfg(tmp_path, srv.port, num_envs=1, group_size=3, reward="outcome")
        svc = EnvLoop(cfg, max_episodes=6)
        svc.start()
        stats = svc.wait_episodes(6, timeout=120)
        svc.stop()
    assert len(stats) == 6 and all(s.error is None for s in stats)
    success = {s.session_id: s.success for s in stats}
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for reqs in _by_session(srv.requests).values():
        groups.setdefault(reqs[0]["headers"]["x-episode-group"], []).append(reqs)
    assert len(groups) == 2 and all(len(members) == 3 for members in groups.values())
    for members in groups.values():
        # the same task for every member, the group named on every request, the outcome on the last
        assert len({m[0]["body"]["messages"][-1]["content"] for m in members}) == 1
        for reqs in members:
            assert all(r["headers"]["x-episode-group-size"] == "3" for r in reqs)
            won = success[reqs[0]["headers"]["x-session-id"]]
            assert [r["headers"].get("x-episode-outcome") for r in reqs] == [None] * (len(reqs) - 1) + [
                "1.0" if won else "-1.0"
            ]
    assert {s.details["group"] for s in stats} == set(groups)


@pytest.mark.parametrize("greedy_member", [True, False])
def test_a_greedy_member_decodes_every_turn_at_temperature_0(tmp_path, greedy_member):
    with ChatServer(_terminal_agent) as srv:
        cfg = _cfg(tmp_path, srv.port, num_envs=1, group_size=3, greedy_member=greedy_member, temperature=0.7)
        svc = EnvLoop(cfg, max_episodes=6)
        svc.start()
        svc.wait_episodes(6, timeout=120)
        svc.stop()
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for reqs in _by_session(srv.requests).values():
        groups.setdefault(reqs[0]["headers"]["x-episode-group"], []).append(reqs)
    assert len(groups) == 2
    for members in groups.values():
        # each member keeps one temperature for all its requests (the closing one included)
        temps = sorted(tuple({r["body"]["temperature"] for r in reqs}) for reqs in members)
        want = [(0.0,), (0.7,), (0.7,)] if greedy_member else [(0.7,)] * 3
        assert temps == want


def test_judged_episodes_played_alone_carry_no_group(tmp_path):
    with ChatServer(_terminal_agent) as srv:
        svc = EnvLoop(
            _cfg(tmp_path, srv.port, num_envs=1),
            max_episodes=1,
            env_overrides={"terminal": {"task": "count_lines"}},
        )
        svc.start()
        svc.wait_episodes(1, timeout=60)
        svc.stop()
    assert srv.requests and not any("x-episode-group" in r["headers"] for r in srv.requests)


def test_workers_wait_while_the_trainer_has_enough_samples(tmp_path):
    waiting = {"n": 100}
    with ChatServer(_terminal_agent) as srv:
        cfg = _cfg(tmp_path, srv.port, num_envs=2, max_ready_samples=8)
        svc = EnvLoop(
            cfg,
            max_episodes=2,
            backlog=lambda: waiting["n"],
            env_overrides={"terminal": {"task": "count_lines"}},
        )
        svc.start()
        time.sleep(1.5)
        assert srv.requests == [] and svc.started_episodes == 0  # 100 samples wait: no new episode
        waiting["n"] = 7
        stats = svc.wait_episodes(2, timeout=60)
        svc.stop()
    assert len(stats) == 2 and all(s.error is None for s in stats) and svc.backlog_waits == 2
    unlimited = EnvLoop(_cfg(tmp_path, 1, max_ready_samples=0), backlog=lambda: 10**6)
    assert unlimited._wait_for_trainer(1)
    default = EnvLoop(_cfg(tmp_path, 1), backlog=lambda: 0)
    assert default.max_backlog == 2 * default.cfg.training.batch_size


def test_episodes_in_flight_count_towards_the_backlog(tmp_path):
    # a two-turn episode may add 2 samples: with a limit of 2, the second worker waits for the
    # first one's episode to finish even though the store holds nothing yet
    with ChatServer(_terminal_agent) as srv:
        cfg = _cfg(tmp_path, srv.port, num_envs=2, max_ready_samples=2)
        svc = EnvLoop(
            cfg, max_episodes=2, backlog=lambda: 0, env_overrides={"terminal": {"task": "count_lines"}}
        )
        svc.start()
        stats = svc.wait_episodes(2, timeout=60)
        svc.stop()
    assert len(stats) == 2 and all(s.error is None for s in stats)
    order = [r["headers"]["x-session-id"] for r in srv.requests]
    first = order[0]
    assert order == [first] * 3 + [order[3]] * 3 and order[3] != first  # one after the other
    assert svc.backlog_waits == 1 and svc.in_flight == 0


def _ready_sample(i: int, version: int, user: str = DEFAULT_USER) -> Sample:
    return one_token_sample(f"s{i}", f"sess{i}", version=version, user=user)


def test_the_launchers_backlog_counts_every_sample_waiting_for_the_trainer(tmp_path):
    from openclaw_rl.envs.loop import store_backlog
    from openclaw_rl.runtime.store import Store

    store = Store(tmp_path / "store.sqlite")
    store.add_samples([_ready_sample(i, 0) for i in range(4)])
    store.set_meta("policy_version", 1)  # older samples still hold rollouts back: they are still trained
    store.add_samples([_ready_sample(i, 1, "alice") for i in range(4, 7)])
    loop = EnvLoop(_cfg(tmp_path, 1, max_ready_samples=8), backlog=store_backlog(store))
    assert loop.backlog is not None and loop.backlog() == 7 and loop._wait_for_trainer(1)
    store.add_samples([_ready_sample(7, 1)])
    assert loop.backlog() == 8  # a full backlog: now the workers wait
    store.close()


def test_stopping_cancels_the_reply_a_worker_waits_for(tmp_path, tiny_model_dir, gsm8k_path):
    """A stop does not wait for a long reply nobody will read: the worker closes its stream, the
    service stops generating it and records nothing of it."""
    import httpx

    from openclaw_rl.policy.server import PolicyService

    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {
                "model": str(tiny_model_dir),
                "port": 0,
                "host": "127.0.0.1",
                "max_model_len": 8192,
                "request_timeout_sec": 300,
            },
            "env_service": {"num_envs": 1, "interaction_types": ["chat"], "data_path": str(gsm8k_path)},
        },
        environ={},
    )
    ps = PolicyService(cfg)
    url = ps.start()
    try:
        svc = EnvLoop(cfg, base_url=url, max_episodes=1, max_tokens=6000)
        svc.start()
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/healthz", timeout=10).json()["in_flight"] == 0:
            assert time.monotonic() < deadline, "the worker never sent its request"
            time.sleep(0.05)
        time.sleep(0.5)  # some tokens into the 6,000
        svc.stop()
        assert not svc.threads  # joined
        deadline = time.monotonic() + 120  # generous: it only bounds a failing test
        while httpx.get(f"{url}/healthz", timeout=10).json()["in_flight"] > 0:
            assert time.monotonic() < deadline, "the reply the stopped worker left is still being generated"
            time.sleep(0.1)
        assert not list(ps.store.user_turns(DEFAULT_USER))  # the unread reply is not recorded
    finally:
        ps.stop()


def test_an_environment_found_unavailable_at_reset_is_skipped_once(tmp_path, caplog):
    """A sandbox is made when an episode starts, so some environments learn only then that they
    cannot run here; the type is dropped with one error line, the others go on."""
    (tmp_path / "gpu_envs.py").write_text(
        "from openclaw_rl.envs import Env, EnvUnavailable, register\n\n"
        "@register('needs_gpu')\n"
        "class NeedsGpu(Env):\n"
        "    def __init__(self, **_):\n        pass\n"
        "    def reset(self, seed=None, options=None):\n        raise EnvUnavailable('no GPU on this machine')\n"
        "    def step(self, action):\n        raise AssertionError('never reached')\n"
    )
    with ChatServer(_terminal_agent) as srv:
        cfg = _cfg(tmp_path, srv.port, types=("needs_gpu", "terminal"), num_envs=1, env_modules=["gpu_envs"])
        cfg.source = str(tmp_path / "config.toml")  # modules are found beside the config file
        svc = EnvLoop(cfg, max_episodes=3, env_overrides={"terminal": {"task": "count_lines"}})
        svc.start()
        stats = svc.wait_episodes(3, timeout=60)
        svc.stop()
    assert svc.disabled_types == {"needs_gpu"}
    assert [s.interaction_type for s in stats].count("terminal") >= 2
    said = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(said) == 1 and "no GPU on this machine" in said[0]


def test_episodes_refused_at_their_first_request_back_off(tmp_path):
    """An environment whose requests the service refuses would otherwise start, and fail, episodes
    as fast as the CPU allows (thousands of log lines a minute)."""
    refuse = (
        400,
        {"error": {"message": "messages: List should have at least 1 item", "type": "invalid_request_error"}},
    )
    with ChatServer(lambda body: refuse) as srv:
        cfg = _cfg(tmp_path, srv.port, types=("terminal",), num_envs=1)
        svc = EnvLoop(cfg, env_overrides={"terminal": {"task": "count_lines"}})
        svc.start()
        time.sleep(4.0)
        svc.stop()
    # waits of 0, 0.5, 1, 2 s: a handful of requests in 4 s, not hundreds
    assert 2 <= len(srv.requests) <= 6, len(srv.requests)
