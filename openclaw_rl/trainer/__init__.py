"""The training engine (SPEC §2, §3.4): losses, memory-lean log-probs, the PPO Trainer, offline replay.

Modules: ``logprobs`` (chunked per-token log-probs), ``losses`` (the one PPO loss and its terms),
``engine`` (:class:`~openclaw_rl.trainer.engine.Trainer`: updates, checkpoints, policy export),
``samples`` (``samples.jsonl`` I/O), ``cli`` (``openclaw-rl train``). Nothing heavy is imported here,
so ``openclaw_rl.trainer.samples`` stays usable without loading torch.
"""
