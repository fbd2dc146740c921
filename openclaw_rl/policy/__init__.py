"""The policy service (loop 1): an OpenAI-compatible server that records every turn.

Where a request goes: ``api_router`` (routes, auth) → ``protocol`` (wire format, typed errors) →
``serving`` (chat-completion logic, recording into the store) → ``sessions`` (session identity,
prefix stitching) → an ``engine``. Modules: ``engine`` (the engine interface and its types),
``transformers_engine`` (the embedded policy, continuous batching), ``weights`` (loading exported
weights, LoRA merge), ``forward`` (SGLang / vLLM / API forwarding), ``replicas`` (embedded engines
as Ray actors behind the one endpoint), ``tools`` (tool rendering and parsing), ``server``
(:class:`~openclaw_rl.policy.server.PolicyService`, the process host, and the choice of engine),
``admin`` (the other loops' client of the admin routes). See docs/serving.md.
"""
