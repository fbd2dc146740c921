"""The launcher, above the four loops: validate and check a config, start the loops, stop them.

Modules: ``launch`` (``openclaw-rl run``: validation, the services' checks, then the run),
``wiring`` (the loops as child processes on one machine), ``cluster`` (the same loops on a Ray
cluster), ``external`` (an SGLang / vLLM server process the launcher starts), ``status``
(``openclaw-rl status`` and the progress line), ``evaluate`` (``openclaw-rl eval``: a private policy
service and the environments' held-out split) and ``eval_loop`` (the live evaluator child that scores
each published policy the same way).
"""
