"""`posenc.runs.replay`: a stored run's start trained again beside its record's losses, and `train(stop=)`."""
import math

import pytest
import torch

import posenc
from posenc.runs import Store, ensure
from posenc.runs.replay import replay

from test_runs import tiny


def test_a_cpu_record_replays_bit_for_bit_and_a_nudged_one_does_not(tmp_path):
    store = Store("ci", tmp_path)
    spec = tiny(steps=30, lr=3e-3)
    ensure([spec], store=store)
    rows = replay(spec, store, 14)
    assert rows.column("step") == [7, 14]                                # stopped at 14 of 30, logging every 7
    assert rows.column("replayed") == rows.column("stored")              # same machine, float32: identical
    nudged = replay(spec, store, 14, perturb=(0, 1e-2))
    assert nudged.column("replayed") != rows.column("stored")
    assert all(math.isclose(a, b, rel_tol=0.05) for a, b in zip(nudged.column("replayed"), rows.column("stored")))
    # the nudge is drawn from its own seed, not the global generator: the same seed nudges the same way
    torch.manual_seed(123)
    assert replay(spec, store, 14, perturb=(0, 1e-2)).column("replayed") == nudged.column("replayed")
    assert replay(spec, store, 14, perturb=(1, 1e-2)).column("replayed") != nudged.column("replayed")


def test_stopping_early_keeps_the_whole_schedule():
    """train(stop=k) is the first k steps of the full run, not a run of k steps (whose schedule is shorter)."""
    task = posenc.tasks.make_task("synthetic", name="kback", train_length=6)
    def run(steps, stop=None):
        cfg = posenc.TrainConfig(steps=steps, batch_size=8, warmup=2, log_every=5, progress=False)
        import torch
        torch.manual_seed(0)
        model = posenc.build_model("nope", task.vocab_size, causal=True, d_model=16, n_heads=2, n_layers=1)
        return posenc.train(model, task, cfg, stop=stop).history
    full, first = run(20), run(20, stop=10)
    assert first == full[:2] and run(10) != first
    with pytest.raises(ValueError, match="stop must be"):
        run(20, stop=21)


def test_replay_refuses_what_it_cannot_replay(tmp_path):
    with pytest.raises(ValueError, match="holds no record"):
        replay(tiny(), Store("ci", tmp_path), 5)
    with pytest.raises(TypeError, match="RunSpec"):
        replay("abc", Store("ci", tmp_path), 5)
