"""Randomized positional encodings (Ruoss et al. 2023): the draw, the training option, the spec and the recipe."""
import pytest
import torch

import posenc
from posenc.runs import RunSpec
from posenc.runs.recipes import build_untrained, sequence
from posenc.runs.train import (RandomPositions, TrainConfig, positions_seen, random_positions, step_generator, train,
                               training_batch)
from posenc.tasks import SyntheticTask
from conftest import small_model

TASK = SyntheticTask("copy", train_length=6, n_symbols=8)           # causal sequences of up to 13 tokens


def cfg(**kw):
    return TrainConfig(**{"steps": 30, "batch_size": 16, "lr": 3e-3, "warmup": 5, "log_every": 5,
                          "progress": False, "random_positions": 64, **kw})


@pytest.mark.parametrize("n, m", [(1, 1), (5, 5), (7, 64), (40, 1000)])
def test_positions_are_sorted_distinct_and_in_range(n, m):
    for seed in range(20):
        p = random_positions(n, m, torch.Generator().manual_seed(seed))
        assert p.dtype == torch.long and p.shape == (n,)
        assert (p[1:] > p[:-1]).all()                                  # sorted and distinct
        assert p.min() >= 0 and p.max() < m
    assert torch.equal(random_positions(n, m, torch.Generator().manual_seed(0)), torch.arange(n)) == (n == m)


def test_positions_are_deterministic_for_a_seed_and_cover_the_range():
    draw = lambda seed: random_positions(7, 64, torch.Generator().manual_seed(seed))
    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))
    seen = torch.cat([draw(s) for s in range(300)])
    assert seen.min() == 0 and seen.max() == 63                        # the whole [0, M) is used
    counts = torch.bincount(seen, minlength=64).float()
    assert counts.min() > 0.5 * counts.mean()                          # every position about equally often


def test_a_length_beyond_the_range_is_refused():
    with pytest.raises(ValueError, match="random_positions"):
        random_positions(9, 8, torch.Generator())
    with pytest.raises(TypeError, match="max_position"):
        random_positions(3, 8.0, torch.Generator())
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        random_positions(5, 10, 3)                      # a seed where the generator goes
    from posenc.runs.train import RandomPositions
    for bad in ("a", -1, 1.5):
        with pytest.raises(ValueError, match="seed must be an int >= 0"):
            RandomPositions(posenc.build_model("rope", 8, causal=True, d_model=16, n_heads=2, n_layers=1), 10,
                            seed=bad)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-4, ValueError), (2.5, TypeError), ("64", TypeError),
                                        (True, TypeError)])
def test_bad_values_are_rejected_by_name(bad, error):
    with pytest.raises(error, match="random_positions"):
        TrainConfig(random_positions=bad)
    with pytest.raises(error, match="random_positions"):
        RunSpec(scheme="rope", task="synthetic", task_kwargs={"name": "copy"}, model={"causal": True},
                train={"random_positions": bad})
    assert TrainConfig(random_positions=None).random_positions is None and TrainConfig(random_positions=1)


class Spy(torch.nn.Module):
    """Records the positions every training forward receives."""

    def __init__(self, model):
        super().__init__()
        self.model, self.seen, self.causal = model, [], model.causal

    def forward(self, tokens, positions=None):
        self.seen.append((tokens.shape[1], positions))
        return self.model(tokens, positions=positions)


def test_training_draws_each_steps_positions_from_its_generator_after_the_batch(monkeypatch):
    torch.manual_seed(0)
    model = small_model("rope", vocab=TASK.vocab_size)
    seen = []
    original = posenc.Transformer.forward
    monkeypatch.setattr(posenc.Transformer, "forward",
                        lambda self, tokens, positions=None: seen.append(positions) or original(self, tokens, positions))
    train(model, TASK, cfg(steps=6, seed=3))
    seen = seen[1:]                                                    # the first call is the max_len check
    for step, positions in enumerate(seen):
        g = step_generator(3, step)
        x, _ = TASK.train_batch(16, g, True)                           # the batch is drawn first, as without the option
        assert torch.equal(positions, random_positions(x.shape[1], 64, g))
    assert len(seen) == 6
    for step, positions in enumerate(seen):                            # training_batch replays the same draws
        assert torch.equal(training_batch(TASK, cfg(steps=6, seed=3), step, True)[2]["positions"], positions)


def test_positions_seen_replays_what_training_shows_the_model():
    plain = positions_seen(TASK, cfg(steps=5, random_positions=None), True)
    n = max(plain["positions"]) + 1
    assert plain["positions"] == set(range(n)) and plain["distances"] == set(range(n)) and plain["mean_gap"] == 1
    randomized = positions_seen(TASK, cfg(steps=5), True)
    assert max(randomized["positions"]) < 64 and randomized["mean_gap"] > 1
    assert len(randomized["positions"]) > n                            # positions far beyond any length trained on


@pytest.mark.parametrize("scheme", ["rope", "nope"])
def test_a_model_trains_with_randomized_positions_and_reruns_are_identical(scheme):
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = small_model(scheme, vocab=TASK.vocab_size)
        runs.append((train(model, TASK, cfg()), torch.cat([p.detach().flatten() for p in model.parameters()])))
    (a, pa), (b, pb) = runs
    assert a.history == b.history and torch.equal(pa, pb)
    losses = [h["loss"] for h in a.history]
    assert losses[-1] < 0.85 * losses[0]                               # it learns over 30 steps
    torch.manual_seed(0)
    plain = train(small_model(scheme, vocab=TASK.vocab_size), TASK, cfg(random_positions=None))
    # RoPE reads the positions; NoPE never does, so the same batches give the very same run
    assert (plain.history != a.history) == (scheme == "rope")


def test_table_schemes_need_max_len_at_least_random_positions():
    torch.manual_seed(0)
    small = small_model("learned", vocab=TASK.vocab_size, max_len=32)
    with pytest.raises(ValueError, match=r"random_positions=64.*max_len"):
        train(small, TASK, cfg(steps=1))
    clamped = small_model("learned", vocab=TASK.vocab_size, max_len=32, overflow="clamp")
    with pytest.raises(ValueError, match=r"random_positions=64.*max_len"):
        train(clamped, TASK, cfg(steps=1))                             # refused too: clamping would hide it
    with pytest.raises(ValueError, match=r"random_positions=64.*max_len"):
        train(small_model("tupe", vocab=TASK.vocab_size, max_len=32), TASK, cfg(steps=1))
    train(small_model("learned", vocab=TASK.vocab_size, max_len=64), TASK, cfg(steps=2))
    with pytest.raises(TypeError, match="random_positions needs a posenc.Transformer"):
        train(torch.nn.Linear(2, 2), TASK, cfg(steps=1))


def test_resuming_with_another_random_positions_is_refused(tmp_path):
    path = str(tmp_path / "ck.pt")
    torch.manual_seed(0)
    train(small_model("rope", vocab=TASK.vocab_size), TASK, cfg(steps=4, checkpoint_path=path))
    with pytest.raises(ValueError, match="random_positions"):
        train(small_model("rope", vocab=TASK.vocab_size), TASK, cfg(steps=4, random_positions=32, checkpoint_path=path))


def test_the_wrapper_evaluates_at_random_positions_deterministically():
    torch.manual_seed(0)
    model = small_model("rope", vocab=TASK.vocab_size)
    spy = Spy(model)
    wrapped = RandomPositions(spy, 64, seed=5)
    assert wrapped.causal is True and list(wrapped.parameters())
    a = TASK.evaluate(wrapped, 6, n_samples=32)
    assert a == TASK.evaluate(RandomPositions(model, 64, seed=5), 6, n_samples=32)
    (n, p), = spy.seen
    assert n == TASK.seq_len(6, True) and (p[1:] > p[:-1]).all() and p.max() < 64
    assert torch.equal(p, random_positions(n, 64, torch.Generator().manual_seed(5)))
    with pytest.raises(ValueError, match="max_position"):
        RandomPositions(model, 0)


def tiny_spec(scheme="nope", **train_kw):
    return RunSpec(scheme=scheme, task="synthetic", task_kwargs={"name": "copy", "train_length": 4, "n_symbols": 6},
                   model={"d_model": 16, "n_heads": 2, "n_layers": 1, "causal": True},
                   train={"steps": 4, "batch_size": 8, "warmup": 1, "log_every": 2, **train_kw},
                   lengths=(4, 8), eval={"n_samples": 16})


def test_run_specs_hash_differently_with_the_option_and_keep_their_keys_without_it():
    base = tiny_spec()
    assert "random_positions" not in base.train                        # specs made before the option keep their key
    assert tiny_spec(random_positions=None).key == base.key
    with_option = tiny_spec(random_positions=64)
    assert with_option.train["random_positions"] == 64
    assert len({base.key, with_option.key, tiny_spec(random_positions=128).key}) == 3
    assert RunSpec.from_dict(with_option.to_dict()) == with_option
    assert with_option.replace(train={"random_positions": None}) == base


def test_the_sequence_recipe_sizes_the_table_and_scores_both_ways():
    spec = tiny_spec("learned", random_positions=48).replace(options={"eval_positions": "both"})
    out = sequence(spec)
    assert out["model"].scheme.max_len == 48                           # >= M, not just the evaluation lengths (17)
    assert [(r["positions"], r["length"]) for r in out["table"]] == [("0..n-1", 4), ("0..n-1", 8),
                                                                     ("random", 4), ("random", 8)]
    assert build_untrained(spec).scheme.max_len == 48
    assert sequence(spec)["table"] == out["table"]                     # deterministic, random evaluation included
    only = sequence(spec.replace(options={"eval_positions": "random"}))["table"]
    assert only == out["table"][2:]
    with pytest.raises(ValueError, match="eval_positions"):
        sequence(tiny_spec().replace(options={"eval_positions": "random"}))     # no random_positions
    with pytest.raises(ValueError, match="eval_positions"):
        sequence(spec.replace(options={"eval_positions": "sometimes"}))


def test_every_subset_of_positions_is_equally_likely():
    """Ruoss et al. draw a uniform random subset: for n = 2 of M = 4 each of the six pairs comes about 1/6 of the
    time (a draw that picked one position from each half of [0, M), sorted, distinct and well spread too, would
    never give (0, 1) or (2, 3))."""
    g = torch.Generator().manual_seed(0)
    counts = {}
    for _ in range(6000):
        pair = tuple(random_positions(2, 4, g).tolist())
        counts[pair] = counts.get(pair, 0) + 1
    assert sorted(counts) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert all(abs(c / 6000 - 1 / 6) < 0.025 for c in counts.values()), counts

