"""The training loop (loop 4): judged samples in, PPO updates out, new policy versions to serving.

Modules: ``loop`` (:class:`~openclaw_rl.trainer.loop.TrainingLoop`, the process the launcher
starts), ``ppo`` (:class:`~openclaw_rl.trainer.ppo.Trainer`: one update, checkpoints, policy export),
``fsdp`` (the same trainer sharded over processes), ``losses`` (the one PPO loss and its terms),
``logprobs`` (chunked per-token log-probs), ``sample_file`` (``samples.jsonl`` I/O), ``cli``
(``openclaw-rl train``). Nothing heavy is imported here, so ``openclaw_rl.trainer.sample_file``
stays usable without loading torch.
"""
