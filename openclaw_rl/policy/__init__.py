"""The policy service (SPEC §3, loop 1): an OpenAI-compatible server that records every turn.

Modules: ``protocol`` (wire format and errors), ``engine`` (engine interface, embedded transformers
engine with continuous batching, weight loading), ``forward`` (SGLang / vLLM / API forwarding),
``tools`` (tool rendering and parsing), ``sessions`` (session identity and prefix stitching),
``serving`` (chat-completion logic and recording), ``api_router`` (routes and auth), ``service``
(:class:`~openclaw_rl.policy.service.PolicyService` and ``serve_command``), ``replicas`` (engine
replicas on a Ray cluster behind the one endpoint), ``admin`` (the other loops' client of the admin
routes). See docs/serving.md.
"""
