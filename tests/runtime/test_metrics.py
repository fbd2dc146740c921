"""``MetricsWriter``: rows in metrics.jsonl, TensorBoard events in the run's own folder."""

from __future__ import annotations

import pytest

from openclaw_rl.runtime.metrics import MetricsWriter, read_metrics


def test_tensorboard_events_go_to_the_run_named_folder(tmp_path):
    writer = MetricsWriter(tmp_path, run_name="openclaw_rl_async_ppo")
    writer.write(1, {"loss": 0.5})
    writer.close()
    run_folder = tmp_path / "tensorboard" / "openclaw_rl_async_ppo"
    assert [p.name for p in run_folder.iterdir() if p.name.startswith("events.out.tfevents")]
    assert [r["loss"] for r in read_metrics(tmp_path, kind="train")] == [0.5]


def test_repeat_share_tells_a_reply_that_loops_from_prose():
    from openclaw_rl.runtime.metrics import repeat_share

    prose = list(range(40))  # no run of 8 comes twice
    loop = [7, 8, 9, 10, 11] * 8  # one short sentence over and over
    assert repeat_share(prose, 8) == 0.0
    # 33 runs of 8; the first five are new, every later one a repeat
    assert repeat_share(loop, 8) == pytest.approx(28 / 33)
    # a reply that loops only at its end scores in between
    assert 0.0 < repeat_share(prose[:20] + loop[:20], 8) < repeat_share(loop, 8)
    assert repeat_share([1, 1, 1], 8) == 0.0  # shorter than two runs: not judged
    words = "the answer is not available".split() * 4
    assert repeat_share(words, 5) == pytest.approx(11 / 16)  # 16 runs; the first 5 are new
    with pytest.raises(ValueError, match="window"):
        repeat_share(prose, 0)
