"""config.toml: the canonical file loads, ${VAR} expands, every known mistake has its message."""

from __future__ import annotations

from pathlib import Path

import pytest

from openclaw_rl.config import ConfigError, build_config, load_config

ROOT = Path(__file__).resolve().parents[1]
FAKE_KEY = "not-a-real-key"  # the environment variable a config names; nothing real


def test_canonical_example_loads_with_env_var():
    cfg = load_config(ROOT / "configs/example.toml", environ={"TAOTOKEN_API_KEY": FAKE_KEY})
    assert cfg.global_.run_name == "openclaw_rl_async_ppo"
    assert cfg.api.api_key.get_secret_value() == FAKE_KEY
    assert cfg.api.v1_url == "https://taotoken.net/api/v1"
    assert cfg.prm_service.backend == "taotoken" and cfg.prm_service.uses_api
    assert cfg.training.eps_high == 0.28
    assert cfg.env_service.interaction_types == ["chat", "terminal", "gui", "tool_call"]
    assert cfg.training.backend == "megatron"  # accepted; the dry run says what this machine lacks


def test_cluster_example_loads_with_its_keys():
    cfg = load_config(
        ROOT / "configs/cluster.toml",
        environ={"TAOTOKEN_API_KEY": FAKE_KEY, "OPENCLAW_RL_API_KEY": "client-key"},
    )
    assert cfg.training.backend == "fsdp" and cfg.prm_service.backend == "api:gateway"
    assert cfg.policy_service.api_key is not None


def test_local_default_loads_clean():
    cfg = load_config(ROOT / "configs/local.toml", environ={})
    assert cfg.policy_service.backend == "transformers"
    assert cfg.training.lora and cfg.training.backend == "torch"
    assert cfg.warnings == []


def test_sglang_with_a_lora_adapter_is_warned_before_its_first_publish_is_refused():
    text = "\n".join(build_config({"policy_service": {"backend": "sglang"}}, environ={}).warnings)
    assert 'backend = "sglang" with [training] lora = true (its default)' in text
    assert "set [training] lora = false" in text
    full = build_config({"policy_service": {"backend": "sglang"}, "training": {"lora": False}}, environ={})
    assert not any("lora = true" in w for w in full.warnings)
    vllm = build_config({"policy_service": {"backend": "vllm"}}, environ={})
    assert not any("lora = true" in w for w in vllm.warnings)


def test_unset_variable_is_named_and_value_never_shown():
    with pytest.raises(ConfigError) as exc:
        load_config(ROOT / "configs/example.toml", environ={})
    assert "TAOTOKEN_API_KEY is not set" in str(exc.value)
    assert "[api] api_key" in str(exc.value)


def test_an_unset_variable_in_a_number_is_one_problem_not_two():
    with pytest.raises(ConfigError) as exc:
        build_config({"policy_service": {"port": "${NO_SUCH_PORT}"}, "training": {"lr": 0}}, environ={})
    said = str(exc.value)
    assert "NO_SUCH_PORT is not set" in said and "[policy_service] port" in said
    assert "valid integer" not in said and "got ''" not in said, said
    assert "[training] lr" in said  # the file's other problems are still all listed


def test_secret_never_in_error_messages():
    raw = {"api": {"api_key": "not-a-real-secret", "timeout_sec": -1}}
    with pytest.raises(ConfigError) as exc:
        build_config(raw, environ={})
    assert "not-a-real-secret" not in str(exc.value)
    assert "[api] timeout_sec" in str(exc.value)


def test_unknown_key_suggests_and_all_problems_gathered(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[training]\nclip_ratoi = 0.2\nlr = "fast"\n[polcy_service]\nport = 1\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    text = str(exc.value)
    assert str(path) in text
    assert "[training] clip_ratoi: unknown key (did you mean 'clip_ratio'?)" in text
    assert "[training] lr" in text
    assert "did you mean 'policy_service'" in text
    assert len(exc.value.problems) == 3


def test_base_url_web_page_rejected():
    with pytest.raises(ConfigError) as exc:
        build_config({"api": {"base_url": "https://gw.example/api?utm_source=newsletter"}}, environ={})
    assert "web page address" in str(exc.value) and "https://gw.example/api" in str(exc.value)
    assert "utm_source" not in str(exc.value)  # a query may hold a key (?key=...): never echoed
    for pasted in ("api.example.com/v1?key=not-a-real-key", "ftp://api.example.com/v1?key=not-a-real-key"):
        with pytest.raises(ConfigError) as exc:
            build_config({"api": {"base_url": pasted}}, environ={})
        assert "not an http(s) URL" in str(exc.value) and "not-a-real-key" not in str(exc.value)
    # the root suggested is the API root, not the page's path; a route pasted with the root is refused
    for pasted in (
        "https://gw.example/api/v1/chat?utm_source=x",
        "https://gw.example/api/v1/chat/completions/",
    ):
        with pytest.raises(ConfigError) as exc:
            build_config({"api": {"base_url": pasted}}, environ={})
        said = str(exc.value)
        root = any(f"instead{sep} https://gw.example/api/v1" in said for sep in (", e.g.", ":"))
        assert "give the API root instead" in said and root, said
    assert build_config({"api": {"base_url": "https://gw.example/api/v1"}}, environ={}).api.v1_url.endswith(
        "/api/v1"
    )


@pytest.mark.parametrize("votes, needle", [(1, "noisy"), (4, "even")])
def test_vote_count_warnings(votes, needle):
    cfg = build_config({"prm_service": {"vote_count": votes}}, environ={})
    assert any(needle in w and "vote_count" in w for w in cfg.warnings)


def test_soft_mistakes_warn():
    cfg = build_config(
        {
            "training": {"opd_weight": 20.0, "binary_rl_weight": 1.0},
            "policy_service": {"weight_sync_interval": 1},
            "env_service": {"state_capture": False},
        },
        environ={},
    )
    text = "\n".join(cfg.warnings)
    assert "drown the scalar reward" in text
    assert "weight_sync_interval = 1" in text
    assert "state_capture = false" in text and "nothing is learned" in text


def test_cloud_mode_fails_fast():
    with pytest.raises(ConfigError) as exc:
        build_config({"env_service": {"mode": "cloud"}}, environ={})
    assert 'mode = "cloud"' in str(exc.value)


def test_not_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[global\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_encodings_a_bom_and_keys_outside_sections(tmp_path):
    good = (ROOT / "configs" / "local.toml").read_bytes()
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + good)  # a Windows editor's UTF-8: accepted
    assert (
        load_config(bom).policy_service.port
        == load_config(ROOT / "configs" / "local.toml").policy_service.port
    )
    latin = tmp_path / "latin1.toml"
    latin.write_bytes(b"# caf\xe9 config\n" + good)
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xe9 on line 1\)"):
        load_config(latin)
    with pytest.raises(ConfigError, match=r"seed: a key outside any section.*did you mean \[global\] seed"):
        build_config({"seed": 1}, environ={})


def test_rules_across_keys_are_listed_with_the_other_problems():
    with pytest.raises(ConfigError) as info:
        build_config(
            {"training": {"mini_batch_size": 16, "batch_size": 8, "lr": -1}, "policy_service": {"prot": 1}},
            environ={},
        )
    text = str(info.value)
    assert "[training] lr" in text and "prot: unknown key" in text
    assert "mini_batch_size = 16 is larger than batch_size = 8" in text
    # a rule that would read a value which failed is not run on its default
    with pytest.raises(ConfigError) as info:
        build_config({"training": {"mini_batch_size": 16, "batch_size": -8}}, environ={})
    assert "larger than batch_size" not in str(info.value)


def test_engine_replicas_need_a_cluster_and_the_embedded_engine():
    with pytest.raises(ConfigError) as exc:
        build_config(
            {"policy_service": {"num_engines": 2, "backend": "vllm", "engine_url": "http://e:1"}}, environ={}
        )
    text = str(exc.value)
    assert "[policy_service] num_engines = 2" in text and 'mode = "cloud"' in text
    assert "own data parallelism" in text  # the vllm combination is refused with the alternative
    with pytest.raises(ConfigError) as exc:
        build_config({"policy_service": {"num_engines": 0}}, environ={})
    assert "[policy_service] num_engines" in str(exc.value)


@pytest.mark.parametrize(
    "section, message",
    [
        (
            {"env_service": {"num_envs": 2, "interaction_types": []}},
            "[env_service] interaction_types is empty",
        ),
        ({"env_service": {"user_mode": "llm"}}, '[env_service] user_mode = "llm"'),
    ],
)
def test_rules_a_loop_would_hit_at_start_are_config_errors(section, message):
    """A config that loads must start: these used to pass validation and fail inside a loop."""
    with pytest.raises(ConfigError) as exc:
        build_config(section, environ={})
    assert message in str(exc.value)


def test_no_environments_needs_no_interaction_types():
    cfg = build_config({"env_service": {"num_envs": 0, "interaction_types": []}}, environ={})
    assert cfg.env_service.interaction_types == []


def test_a_greedy_member_without_a_group_is_named_as_doing_nothing():
    alone = build_config({"env_service": {"greedy_member": True}}, environ={})
    assert any("greedy_member = true has no effect with group_size = 1" in w for w in alone.warnings)
    grouped = build_config({"env_service": {"greedy_member": True, "group_size": 4}}, environ={})
    assert not any("greedy_member" in w for w in grouped.warnings)


def test_groups_and_outcome_rewards_are_checked():
    cfg = build_config(
        {
            "env_service": {"interaction_types": ["chat"], "reward": "outcome", "group_size": 4},
            "training": {"advantage_baseline": "none"},
        },
        environ={},
    )
    text = "\n".join(cfg.warnings)
    assert 'reward = "outcome" has no effect' in text and "never compared" in text
    clean = build_config(
        {"env_service": {"interaction_types": ["terminal"], "reward": "both", "group_size": 4}}, environ={}
    )
    assert clean.warnings == [] and clean.env_service.group_size == 4
    with pytest.raises(ConfigError) as err:
        build_config(
            {"env_service": {"group_size": 0, "reward": "win"}, "training": {"baseline_momentum": 1.0}},
            environ={},
        )
    message = str(err.value)
    for needle in ("[env_service] group_size", "[env_service] reward", "[training] baseline_momentum"):
        assert needle in message, message


def test_users_section_is_validated_with_the_other_sections():
    from openclaw_rl.config import ConfigError

    cfg = build_config({"users": {"header": "X-End-User"}}, environ={})
    assert cfg.users.mode == "shared" and cfg.users.header == "X-End-User"
    with pytest.raises(ConfigError) as info:
        build_config({"users": {"mode": "per-user", "header": "X End"}, "training": {"lr": -1}}, environ={})
    text = str(info.value)
    assert "[users] mode" in text and "did you mean 'per_user'?" in text
    assert "[users] header" in text and "[training] lr" in text  # every problem at once
    assert build_config({"users": {"mode": "per_user"}}, environ={}).users.mode == "per_user"
    # a header that already carries credentials or the session cannot name users: its value (a key)
    # would be taken for a user name and quoted back in errors and logs
    for taken in ("Authorization", "x-api-key", "X-Session-Id"):
        with pytest.raises(ConfigError, match=r"\[users\] header.*already means something"):
            build_config({"users": {"header": taken}}, environ={})
    with pytest.raises(ConfigError, match=r"per_user\" needs \[training\] lora = true"):
        build_config({"users": {"mode": "per_user"}, "training": {"lora": False}}, environ={})


def test_a_quoted_number_or_boolean_is_refused_but_a_variable_may_spell_one():
    # "8" in TOML is text: silently taking it as 8 (or "yes" as true) hides a typo'd config.
    with pytest.raises(ConfigError) as exc:
        build_config(
            {"env_service": {"num_envs": "8", "enabled": "yes", "personas": []}, "training": {"lr": "1e-6"}},
            environ={},
        )
    text = str(exc.value)
    assert "[env_service] num_envs" in text and "write it without quotes" in text
    assert "[env_service] enabled" in text and "write true or false" in text
    assert "[training] lr" in text and "personas: is empty" in text
    # ${VAR} can only be written inside a string: the variable's text is read as the number it spells
    cfg = build_config(
        {"policy_service": {"port": "${PORT}", "max_concurrent": "${MC}"}},
        environ={"PORT": "30123", "MC": "4"},
    )
    assert (cfg.policy_service.port, cfg.policy_service.max_concurrent) == (30123, 4)
    with pytest.raises(ConfigError, match="port: Input should be a valid integer"):
        build_config({"policy_service": {"port": "${PORT}"}}, environ={"PORT": "thirty"})


def test_a_home_relative_log_dir_means_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = build_config({"global": {"log_dir": "~/runs/a"}}, environ={})
    assert cfg.log_dir == tmp_path / "runs" / "a"
    assert cfg.with_log_dir("~/replay").log_dir == tmp_path / "replay"
    assert build_config({"global": {"log_dir": "./x~"}}, environ={}).global_.log_dir == "./x~"


@pytest.mark.parametrize(
    "space, says",
    [
        ([], "at least two scores"),
        ([1], "at least two scores"),
        ([1, 1, -1], "names a score twice"),
        ([2, -1], "only scores from"),
        ([5, 5], "only scores from [1, -1, 0] (not [5]); names a score twice"),  # every problem at once
    ],
)
def test_a_reward_space_that_gives_no_signal_is_refused(space, says):
    with pytest.raises(ConfigError) as exc:
        build_config({"prm_service": {"reward_space": space}}, environ={})
    assert says in str(exc.value) and "[prm_service] reward_space" in str(exc.value)
    assert build_config({"prm_service": {"reward_space": [-1, 0]}}, environ={}).prm_service.reward_space == [
        -1,
        0,
    ]


def test_a_vote_count_that_would_flood_the_judge_is_refused():
    """Each vote is a judge request per turn (two with hints): 1000 sent 2,000 requests at once."""
    with pytest.raises(ConfigError) as exc:
        build_config({"prm_service": {"vote_count": 1000}}, environ={})
    assert "[prm_service] vote_count" in str(exc.value) and "32" in str(exc.value)
    assert build_config({"prm_service": {"vote_count": 5}}, environ={}).prm_service.vote_count == 5


def test_an_empty_config_file_loads_on_defaults_with_a_warning(tmp_path):
    empty = tmp_path / "config.toml"
    empty.write_text("# only a comment\n")
    cfg = load_config(empty)
    assert cfg.warnings[0] == f"{empty} sets nothing: every key takes its default"
    assert not any("sets nothing" in w for w in load_config(ROOT / "configs" / "local.toml").warnings)


def test_an_unknown_users_home_is_a_config_error_not_a_traceback():
    with pytest.raises(ConfigError) as exc:
        build_config({"global": {"log_dir": "~no-such-user-here/run"}}, environ={})
    assert "[global] log_dir" in str(exc.value) and "no such user's home folder" in str(exc.value)
    with pytest.raises(ConfigError, match="no such user's home folder"):
        build_config({}, environ={}).with_log_dir("~no-such-user-here/replay")


def test_an_engine_backend_on_any_free_port_needs_the_engines_address():
    with pytest.raises(ConfigError) as exc:
        build_config({"policy_service": {"backend": "sglang", "port": 0}}, environ={})
    assert "port = 0 needs engine_url" in str(exc.value)
    cfg = build_config(
        {"policy_service": {"backend": "vllm", "port": 0, "engine_url": "http://127.0.0.1:8000"}}, environ={}
    )
    assert cfg.policy_service.engine_root == "http://127.0.0.1:8000"


def test_a_key_given_twice_shows_the_line(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[policy_service]\nport = 30000\nhost = "127.0.0.1"\nport = 30001\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "not valid TOML" in str(exc.value) and "'port = 30001'" in str(exc.value), str(exc.value)


def test_a_full_finetuning_rate_on_a_lora_adapter_is_warned_about():
    """The walk-through's lr = 1e-6 is a full fine-tuning rate; on the default LoRA adapter it trains
    next to nothing, and the user is told so (not refused: it is their choice)."""
    lora = build_config({"training": {"lr": 1e-6}}, environ={})
    assert any("lr = 1e-06 with lora = true" in w for w in lora.warnings), lora.warnings
    full = build_config({"training": {"lr": 1e-6, "lora": False}}, environ={})
    assert not any("lr =" in w for w in full.warnings)
    assert not any("lr =" in w for w in build_config({"training": {"lr": 1e-4}}, environ={}).warnings)


def test_a_variable_that_spells_a_number_out_of_range_is_named_by_its_range():
    with pytest.raises(ConfigError) as exc:
        build_config(
            {"env_service": {"num_envs": "${N}"}, "policy_service": {"port": "${P}"}},
            environ={"N": "-1", "P": "99999"},
        )
    text = str(exc.value)
    assert "[env_service] num_envs: Input should be greater than or equal to 0" in text
    assert "[policy_service] port: Input should be less than or equal to 65535" in text
    assert "valid integer" not in text


def test_a_doubled_dollar_keeps_a_variable_reference_as_text():
    cfg = build_config({"api": {"api_key": "ab$${NOT_EXPANDED}cd"}}, environ={"NOT_EXPANDED": "x"})
    assert cfg.api.api_key.get_secret_value() == "ab${NOT_EXPANDED}cd"


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("", "is empty"),
        ("http://127.0.0.1", "is a URL"),
        ("localhost:31712", "carries a port"),
        ("[::1]:8000", "carries a port"),
        ("127.0.0.1 ", "holds white space"),
    ],
)
def test_a_host_that_is_no_host_is_named(host, says):
    with pytest.raises(ConfigError, match=rf"\[policy_service\] host: {says}"):
        build_config({"policy_service": {"host": host}})


def test_hosts_and_devices_that_are_fine_load():
    for host in ("0.0.0.0", "::", "::1", "localhost", "my-box.lan"):
        assert build_config({"policy_service": {"host": host}}).policy_service.host == host
    for device in ("cpu", "cuda", "cuda:3", "mps"):
        assert build_config({"training": {"device": device}}).training.device == device


def test_a_device_torch_does_not_know_is_refused_in_both_sections():
    with pytest.raises(ConfigError) as exc:
        build_config({"policy_service": {"device": "tpu"}, "training": {"device": "gpu"}})
    text = str(exc.value)
    assert "[policy_service] device: not a device" in text and "[training] device: not a device" in text


def test_an_upper_clip_below_the_lower_one_is_refused():
    with pytest.raises(
        ConfigError, match=r"clip_ratio_high = 0.28 \(its default\) is below clip_ratio = 0.3"
    ):
        build_config({"training": {"clip_ratio": 0.3}})
    with pytest.raises(ConfigError, match="clip_ratio_high = 0.1 is below"):
        build_config({"training": {"clip_ratio_high": 0.1}})
    # without asymmetric clipping clip_ratio_high is not read
    build_config({"training": {"clip_ratio": 0.3, "asymmetric_clip": False}})


def test_keeping_one_policy_version_is_refused_and_negative_counts_named():
    with pytest.raises(ConfigError, match=r"keep_policies = 1: serving may still be loading"):
        build_config({"training": {"keep_policies": 1}})
    with pytest.raises(ConfigError, match=r"\[training\] keep_policies"):
        build_config({"training": {"keep_policies": -1}})
    assert build_config({"training": {"keep_policies": 0}}).training.keep_policies == 0


def test_an_api_teacher_needs_the_api_channel():
    with pytest.raises(
        ConfigError, match=r'\[api\] base_url: required because \[prm_service\] teacher = "api"'
    ):
        build_config({"prm_service": {"teacher": "api"}})
    build_config({"prm_service": {"teacher": "api"}, "training": {"opd_enabled": False}})


def test_keys_the_chosen_backend_does_not_read_are_warned_about():
    warned = build_config({"training": {"num_processes": 4}, "policy_service": {"engine_url": "http://e:1"}})
    text = " ".join(warned.warnings)
    assert 'num_processes = 4 is read by backend = "fsdp" only' in text
    assert 'engine_url is read by backend = "sglang" or "vllm" only' in text


def test_a_missing_data_file_lists_each_place_looked_once(tmp_path, monkeypatch):
    from openclaw_rl.config import DataPathError, resolve_data_path

    config = tmp_path / "c.toml"
    config.write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataPathError) as exc:
        resolve_data_path("mine.json", str(config))
    assert str(exc.value).count(str(tmp_path / "mine.json")) == 1


def test_an_eval_interval_between_publishes_is_said_to_round_up():
    """The live evaluation scores published versions: with a version every 4 updates, eval_interval
    = 2 evaluates every 4, and the evaluator's line said "every 2"."""
    from openclaw_rl.config import build_config, live_eval_every

    cfg = build_config({"training": {"eval_interval": 2}, "policy_service": {"weight_sync_interval": 4}})
    assert live_eval_every(cfg) == 4
    assert any("eval_interval = 2 is not a multiple" in w and "every 4 updates" in w for w in cfg.warnings)
    cfg = build_config({"training": {"eval_interval": 8}, "policy_service": {"weight_sync_interval": 4}})
    assert live_eval_every(cfg) == 8 and not any("eval_interval" in w for w in cfg.warnings)
