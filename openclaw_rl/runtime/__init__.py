"""What every loop stands on: the durable store, the run directory, model loading, metrics, the
per-token log-probs the trainer and the judge's teacher both compute, and the client of the policy
service's admin routes that the trainer and the launchers call.

Nothing here imports a loop (``policy``, ``envs``, ``judge``, ``trainer``) or the launcher above
them; they import this.
"""
