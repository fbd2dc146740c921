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


def test_repeated_items_mark_the_second_saying_from_its_first_token_and_nothing_of_prose():
    from openclaw_rl.runtime.metrics import repeat_share, repeated_items

    said = ["so", "the", "answer", "is", "five"]
    assert repeated_items([*said, "and", *said], 5) == [False] * 6 + [True] * 5
    loop = said * 3
    marks = repeated_items(loop, 5)
    assert marks == [False] * 5 + [True] * 10  # every token from where the repetition began
    assert repeat_share(loop, 5) > 0
    prose = "each of these words comes once in this short line of prose".split()
    assert not any(repeated_items(prose, 3)) and repeated_items([], 3) == []


def _drawn_axes(tmp_path, rows: list[dict]) -> list:
    """Plot ``rows`` as a run's metrics.jsonl and return the figure's axes as they were drawn."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from openclaw_rl.runtime.metrics import plot_metrics

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn: list = []
    real_savefig = plt.Figure.savefig

    def keep(fig, *args, **kwargs):  # read the axes as drawn, then save as usual
        drawn.extend(fig.axes)
        return real_savefig(fig, *args, **kwargs)

    plt.Figure.savefig = keep
    try:
        assert plot_metrics(tmp_path).is_file()
    finally:
        plt.Figure.savefig = real_savefig
    return drawn


def test_the_curves_mark_updates_that_had_no_rl_reward(tmp_path):
    """An update whose groups all scored alike trains no RL part and logs no reward: the reward panel
    marks it (a dotted line, "no RL reward") instead of leaving a silent gap; steps are whole."""
    rows = [
        {"kind": "train", "step": i, "kl": 0.01, "clip_frac": 0.0, **({"reward_mean": -1.0} if i % 2 else {})}
        for i in range(1, 7)
    ]
    ax = _drawn_axes(tmp_path, rows)[0]
    marked = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":")
    assert marked == [2, 4, 6] and [t.get_text() for t in ax.get_legend().get_texts()] == ["no RL reward"]
    assert all(float(t).is_integer() for t in ax.get_xticks() if 1 <= t <= 6)


def test_the_curves_after_one_update_have_whole_step_ticks(tmp_path):
    """A run stopped after its first update: matplotlib spans 0.945-1.055 around one point, and the
    integer locator gave up on fractions there (0.960, 0.975 ... under "training step")."""
    rows = [
        {"kind": "train", "step": 1, "kl": 0.01, "clip_frac": 0.0, "reward_mean": -1.0},
        {"kind": "eval", "step": 0, "policy_version": 0, "score": 0.4},
    ]
    axes = _drawn_axes(tmp_path, rows)
    ticks = [[t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]] for ax in axes]
    assert len(ticks) == 4 and all(t and all(float(x).is_integer() for x in t) for t in ticks), ticks
