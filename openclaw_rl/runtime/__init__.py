"""What every loop stands on: the durable store, the run directory, model loading, metrics.

Nothing here imports a loop (``policy``, ``envs``, ``judge``, ``trainer``) or the launcher above
them; they import this.
"""
