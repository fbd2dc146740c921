"""``MetricsWriter``: rows in metrics.jsonl, TensorBoard events in the run's own folder."""

from __future__ import annotations

from openclaw_rl.runtime.metrics import MetricsWriter, read_metrics


def test_tensorboard_events_go_to_the_run_named_folder(tmp_path):
    writer = MetricsWriter(tmp_path, run_name="openclaw_rl_async_ppo")
    writer.write(1, {"loss": 0.5})
    writer.close()
    run_folder = tmp_path / "tensorboard" / "openclaw_rl_async_ppo"
    assert [p.name for p in run_folder.iterdir() if p.name.startswith("events.out.tfevents")]
    assert [r["loss"] for r in read_metrics(tmp_path, kind="train")] == [0.5]
