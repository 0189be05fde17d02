"""The training loop: determinism, checkpoint/resume, learning, schedule."""
import pytest
import torch

import posenc
from posenc.tasks import SyntheticTask
from posenc.runs.train import TrainConfig, amp_dtype, lr_factor, step_generator, train
from conftest import small_model

TASK = SyntheticTask("copy", train_length=6, n_symbols=8)


def fresh(seed=0):
    torch.manual_seed(seed)
    return small_model(vocab=TASK.vocab_size, causal=True)


def cfg(**kw):
    return TrainConfig(**{"steps": 30, "batch_size": 16, "warmup": 5, "log_every": 5, "progress": False, **kw})


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_reruns_are_bit_identical_on_cpu():
    a, b = fresh(), fresh()
    ra, rb = train(a, TASK, cfg()), train(b, TASK, cfg())
    assert ra.history == rb.history
    assert torch.equal(params(a), params(b))


def test_different_seeds_give_different_runs():
    ra, rb = train(fresh(), TASK, cfg(seed=0)), train(fresh(), TASK, cfg(seed=1))
    assert ra.history != rb.history


class Crash(Exception):
    pass


class CrashingTask:
    """Delegates to TASK but dies at a given step, like a Colab runtime."""

    def __init__(self, at):
        self.at, self.calls = at, 0

    def train_batch(self, *args):
        if self.calls == self.at:
            raise Crash
        self.calls += 1
        return TASK.train_batch(*args)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_resume_after_a_crash_reaches_the_same_numbers(tmp_path, dropout):
    torch.manual_seed(0)
    ref_model = small_model(vocab=TASK.vocab_size, causal=True, dropout=dropout)
    ref = train(ref_model, TASK, cfg())

    path = str(tmp_path / "ckpt.pt")
    torch.manual_seed(0)
    crashed = small_model(vocab=TASK.vocab_size, causal=True, dropout=dropout)
    with pytest.raises(Crash):
        train(crashed, CrashingTask(at=23), cfg(checkpoint_path=path, checkpoint_every=10))
    torch.manual_seed(123)  # a new runtime: different init, RNG restored from the checkpoint
    resumed = small_model(vocab=TASK.vocab_size, causal=True, dropout=dropout)
    out = train(resumed, TASK, cfg(checkpoint_path=path, checkpoint_every=10))
    assert out.history == ref.history
    assert torch.equal(params(resumed), params(ref_model))


def test_a_checkpoint_between_two_log_points_keeps_the_losses_of_the_window(tmp_path):
    """Checkpoints every 7 steps, logs every 5: the checkpoint at step 21 holds a partial window (steps 20, 21),
    which the resumed run must average with the rest, so its history equals the uninterrupted run's."""
    ref = train(fresh(), TASK, cfg())
    path = str(tmp_path / "ckpt.pt")
    with pytest.raises(Crash):
        train(fresh(), CrashingTask(at=23), cfg(checkpoint_path=path, checkpoint_every=7))
    out = train(fresh(123), TASK, cfg(checkpoint_path=path, checkpoint_every=7))
    assert out.history == ref.history


def test_a_finished_checkpoint_is_not_trained_again(tmp_path):
    path = str(tmp_path / "done.pt")
    model = fresh()
    first = train(model, TASK, cfg(checkpoint_path=path))
    again = fresh(7)
    second = train(again, CrashingTask(at=0), cfg(checkpoint_path=path))
    assert second.history == first.history and torch.equal(params(again), params(model))


def test_training_learns_the_copy_task():
    task = SyntheticTask("copy", train_length=4, n_symbols=6)
    torch.manual_seed(0)
    model = small_model(vocab=task.vocab_size, causal=True)
    before = task.evaluate(model, 3)["accuracy"]
    train(model, task, TrainConfig(steps=300, batch_size=32, lr=3e-3, warmup=30, progress=False))
    after = task.evaluate(model, 3)["accuracy"]
    assert before < 0.4 and after > 0.95


def test_learning_rate_schedule():
    c = TrainConfig(steps=100, warmup=10, min_lr_ratio=0.1)
    assert lr_factor(0, c) == pytest.approx(0.1) and lr_factor(9, c) == pytest.approx(1.0)
    assert lr_factor(10, c) == pytest.approx(1.0)
    assert lr_factor(100, c) == pytest.approx(0.1)
    assert all(lr_factor(s, c) >= lr_factor(s + 1, c) for s in range(10, 100))


def test_precision_choice():
    assert amp_dtype("auto", torch.device("cpu")) is None
    with pytest.raises(ValueError, match="amp must be"):
        TrainConfig(amp="fp8")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        TrainConfig(steps=0)


def test_run_builds_trains_and_tabulates():
    out = posenc.run("nope", TASK, cfg(steps=5), causal=False, lengths=[2, 12],
                     model_kwargs={"d_model": 16, "n_heads": 2, "n_layers": 1})
    table = out["table"]
    assert table.column("length") == [2, 12] and table.column("x_train") == [0.333, 2.0]
    assert set(table.columns) >= {"scheme", "causal", "seed", "accuracy", "seq_accuracy"}


def test_profiles():
    assert posenc.resolve("ci") == "ci"
    assert posenc.resolve("auto") == ("full" if torch.cuda.is_available() else "ci")
    with pytest.raises(ValueError, match="profile must be one of"):
        posenc.resolve("huge")


def test_results_round_trip(tmp_path):
    assert posenc.load_results("x", tmp_path) is None
    posenc.save_results("x", {"a": [1, 2]}, tmp_path)
    stored = posenc.load_results("x", tmp_path)
    assert stored["a"] == [1, 2]
    assert stored["machine"].startswith(("cpu: ", "cuda: ")) and "torch " in stored["machine"]


def test_a_causal_model_learns_the_shipped_corpus():
    from posenc.tasks import CharCorpus
    corpus = CharCorpus.stdlib(train_length=32)
    torch.manual_seed(0)
    model = small_model(vocab=corpus.vocab_size, causal=True)
    before = corpus.evaluate(model, 32, max_tokens=4096)["bpc"]
    train(model, corpus, TrainConfig(steps=300, batch_size=16, lr=3e-3, warmup=20, progress=False))
    after = corpus.evaluate(model, 32, max_tokens=4096)["bpc"]
    freq = torch.bincount(corpus.train_ids).float()
    freq = freq[freq > 0] / freq.sum()
    unigram_bits = -(freq * freq.log2()).sum().item()   # what character frequencies alone give
    assert before > 6.0                                 # log2(99) = 6.6 bits: chance at init
    assert after < unigram_bits - 0.2                   # the model uses context


def test_claims_are_recorded_per_chapter_and_read_back(tmp_path):
    posenc.save_claim("05_shaw", "ci", "k >= 2 suffices", "k=2: 0.99", True, results_dir=tmp_path)
    posenc.save_claim("05_shaw", "ci", "k >= 2 suffices", "k=2: 0.98", True, results_dir=tmp_path)  # replaces
    posenc.save_claim("02_sinusoidal", "ci", "sinusoidal extrapolates", "8x: +20%", False, "why", results_dir=tmp_path)
    rows = posenc.load_claims("ci", results_dir=tmp_path)
    assert [(r["chapter"], r["measured"], r["verdict"]) for r in rows] == [
        ("02_sinusoidal", "8x: +20%", "not reproduced"), ("05_shaw", "k=2: 0.98", "reproduced")]
    assert posenc.load_claims("full", results_dir=tmp_path) == []
    with pytest.raises(ValueError, match="profile must be"):
        posenc.save_claim("x", "auto", "c", "m", True, results_dir=tmp_path)
    with pytest.raises(ValueError, match="holds must be"):
        posenc.save_claim("x", "ci", "c", "m", "yes", results_dir=tmp_path)


def test_record_claim_applies_the_one_rule_and_stores_the_evidence(tmp_path):
    from posenc.analysis import Band
    band = Band(0.05, None)
    out = {}
    for name, values in (("in band", [0.10, 0.11, 0.12]), ("other side", [-0.3, -0.31, -0.29]),
                         ("straddles", [-0.2, 0.0, 0.3]), ("two seeds", [0.2, 0.2])):
        out[name] = posenc.record_claim("99_test", "ci", name, values, band, effect="gain", results_dir=tmp_path)
    assert {k: v["verdict"] for k, v in out.items()} == {"in band": "reproduced", "other side": "contradicted",
                                                         "straddles": "not resolved", "two seeds": "not resolved"}
    rows = {r["claim"]: r for r in posenc.load_claims("ci", results_dir=tmp_path)}
    assert rows["in band"]["verdict"] == "reproduced" and rows["in band"]["band"] == "[0.05, inf]"
    assert rows["in band"]["seeds"] == 3 and rows["in band"]["interval"][0] >= 0.10
    assert rows["in band"]["measured"].startswith("gain: +0.110 [")
    assert rows["other side"]["verdict"] == "contradicted"
    assert "unit" not in rows["in band"]                      # seeds: the records written before `unit` existed
    timed = posenc.record_claim("99_test", "ci", "timed", [1.6, 1.7, 1.65, 1.62], Band(1.5, None, null=1.0),
                                effect="step ratio", unit="interleaved rounds", results_dir=tmp_path)
    assert timed["verdict"] == "reproduced" and "over 4 interleaved rounds;" in timed["measured"]
    stored = {r["claim"]: r for r in posenc.load_claims("ci", results_dir=tmp_path)}["timed"]
    assert stored["unit"] == "interleaved rounds" and stored["seeds"] == 4
    with pytest.raises(ValueError, match="unit must be"):
        posenc.record_claim("99_test", "ci", "x", [1.0] * 3, band, effect="e", unit="", results_dir=tmp_path)


def test_a_claims_reason_can_depend_on_its_verdict(tmp_path):
    """why={verdict: reason} stores the reason for the verdict the rule gives; a dict without that verdict, or
    with a key that is no verdict, is refused by name before anything is written."""
    from posenc.analysis import Band
    why = {"reproduced": "it holds because A", "contradicted": "it fails because B"}
    for name, values, reason in (("holds", [0.10, 0.11, 0.12], "it holds because A"),
                                 ("fails", [-0.3, -0.31, -0.29], "it fails because B")):
        posenc.record_claim("99_test", "ci", name, values, Band(0.05, None), effect="gain", why=why,
                            results_dir=tmp_path)
        assert {r["claim"]: r for r in posenc.load_claims("ci", results_dir=tmp_path)}[name]["why"] == reason
    with pytest.raises(ValueError, match="no reason for the verdict 'not resolved'"):
        posenc.record_claim("99_test", "ci", "open", [-0.2, 0.0, 0.3], Band(0.05, None), effect="gain", why=why,
                            results_dir=tmp_path)
    with pytest.raises(ValueError, match="why's keys must be verdicts"):
        posenc.record_claim("99_test", "ci", "typo", [0.1] * 3, Band(0.05, None), effect="gain",
                            why={"reproduce": "x"}, results_dir=tmp_path)
    with pytest.raises(TypeError, match="why must be"):
        posenc.record_claim("99_test", "ci", "list", [0.1] * 3, Band(0.05, None), effect="gain", why=["x"],
                            results_dir=tmp_path)
    assert "open" not in {r["claim"] for r in posenc.load_claims("ci", results_dir=tmp_path)}


def test_a_recorded_claim_can_be_judged_again_from_its_file_alone(tmp_path):
    """record_claim stores the band's edges, its null, the mean and the profile; `rejudge` gives every stored
    verdict back, equivalence and one-sided bands with their null at the edge included, and a record from
    save_claim (no band numbers) is refused by name rather than judged on a guessed null."""
    from posenc.analysis import Band
    from posenc.runs.profiles import rejudge
    cases = [(Band(0.05, None), [0.10, 0.11, 0.12]), (Band(0.05, None), [-0.3, -0.31, -0.29]),
             (Band(None, 0.02, null=0.02), [0.01, 0.02, 0.03, 0.015, 0.025]),
             (Band(None, 0.02, null=0.02), [0.05, 0.06, 0.055]), (Band(-0.02, 0.02), [0.05, 0.06, 0.055]),
             (Band(None, 0.5, null=1.0), [0.6, 1.4, 0.7, 1.3]), (Band(1.1, None, null=1.0), [1.2, 1.3]),
             (Band(0.05, None), [])]
    words = []
    for i, (band, values) in enumerate(cases):
        words.append(posenc.record_claim("99_test", "paper", f"claim {i}", values, band, effect="e",
                                         results_dir=tmp_path)["verdict"])
    rows = posenc.load_claims("paper", results_dir=tmp_path)
    assert [rejudge(r) for r in rows] == [r["verdict"] for r in rows] == words
    assert words == ["reproduced", "contradicted", "not resolved", "contradicted", "contradicted", "not resolved",
                     "not resolved", "not resolved"]
    assert rows[2]["null"] == 0.02 and rows[2]["low"] is None and rows[2]["profile"] == "paper"
    assert rows[0]["mean"] == pytest.approx(0.11)
    posenc.save_claim("99_test", "paper", "old", "m", True, results_dir=tmp_path)
    old = [r for r in posenc.load_claims("paper", results_dir=tmp_path) if r["claim"] == "old"][0]
    with pytest.raises(ValueError, match="lacks"):
        rejudge(old)


def test_run_and_length_table_refuse_bad_lengths_and_a_config_that_is_a_dict():
    """`lengths=8` gave "'int' object is not iterable", (8.0,) a manual_seed error after training, and a dict
    for cfg "'dict' object has no attribute 'seed'"; a generator of lengths is still read once, whole."""
    task = posenc.tasks.SyntheticTask(name="copy", train_length=8)
    model = posenc.build_model("nope", task.vocab_size, causal=True, d_model=16, n_heads=2)
    for bad in (8, (8.0,), "8", (0,)):
        with pytest.raises(TypeError, match="lengths must be a sequence of positive ints"):
            posenc.length_table(model, task, bad)
    with pytest.raises(TypeError, match="cfg must be a posenc.TrainConfig; got dict"):
        posenc.run("nope", task, {"steps": 1}, causal=True, lengths=(8,))
    assert [r["length"] for r in posenc.length_table(model, task, (n for n in (8, 16)), n_samples=4)] == [8, 16]


def test_rejudge_reads_a_claims_file_straight_from_json(tmp_path):
    """A claim never reached stores an infinite interval edge as the string "inf": rejudge takes the raw file too."""
    import json
    from posenc.analysis import Band
    from posenc.runs.profiles import rejudge
    posenc.record_claim("99_test", "ci", "never", [0.3, float("inf"), 0.4, 0.35], Band(None, 0.45, null=1.0),
                        effect="share", results_dir=tmp_path)
    (raw,) = json.loads((tmp_path / "ci" / "claims" / "99_test.json").read_text()).values()
    assert raw["interval"][1] == "inf" and rejudge(raw) == raw["verdict"]


def test_results_and_claims_refuse_nan_by_its_place(tmp_path):
    """JSON has no NaN: save_results names where one (or an infinity) sits; a claim's evidence may hold an
    infinity (a target never reached, stored as "inf") but not a NaN."""
    import math
    with pytest.raises(ValueError, match=r"data\['a'\]\[1\] is nan"):
        posenc.save_results("x", {"a": [1.0, math.nan]}, tmp_path)
    with pytest.raises(ValueError, match=r"data\['b'\] is inf"):
        posenc.save_results("x", {"b": math.inf}, tmp_path)
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(ValueError, match=r"evidence\['mean'\] of claim 'c' is NaN"):
        posenc.save_claim("99_t", "ci", "c", "m", "reproduced", results_dir=tmp_path, mean=math.nan)
    posenc.save_claim("99_t", "ci", "c", "m", "reproduced", results_dir=tmp_path, interval=[0.0, math.inf])
    assert posenc.load_claims("ci", results_dir=tmp_path)[0]["interval"] == [0.0, math.inf]


def test_every_seed_reads_its_own_batches_for_as_many_steps_as_any_run_takes():
    """Batches depend on (seed, step) through seed * 1_000_003 + step: no two (seed, step) pairs of the book's
    runs (seeds below 10, at most a million steps) share a generator seed, so seeds stay independent; the
    constant is pinned because every stored record's batches depend on it."""
    steps = (0, 1, 999, 1000, 1001, 2400, 3000, 999_999)
    seeds = {step_generator(s, t).initial_seed() for s in range(10) for t in steps}
    assert len(seeds) == 10 * len(steps)
    assert step_generator(1, 0).initial_seed() == 1_000_003


@pytest.mark.parametrize("clip", [1e-3, 1e3])
def test_a_step_clips_the_gradient_norm_to_grad_clip_and_no_further(clip):
    """The optimizer sees min(|g|, grad_clip) as the gradient's global norm (clip_grad_norm_ in every step)."""
    from posenc.model import lm_loss
    from posenc.runs.train import optimizer_step
    model = fresh()
    x, y = TASK.train_batch(16, torch.Generator().manual_seed(0), True)
    loss_fn = lambda m, x, y: lm_loss(m(x), y)
    lm_loss(model(x), y).backward()
    raw = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    seen = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
            seen.append(torch.linalg.vector_norm(torch.stack(grads)).item())
            return super().step(closure)

    optimizer_step(model, loss_fn, (x, y, {}), Spy(model.parameters(), lr=0.0),
                   torch.amp.GradScaler("cuda", enabled=False), None, clip)
    assert seen[0] == pytest.approx(min(raw.item(), clip), rel=1e-4)


def test_a_logged_loss_is_the_mean_of_its_windows_step_losses_and_final_loss_the_last_windows():
    """history[k]["loss"] averages the log_every losses of steps (k - 1) * log_every + 1 .. k * log_every."""
    from posenc.model import lm_loss
    losses = []

    def loss_fn(m, x, y):
        loss = lm_loss(m(x), y)
        losses.append(loss.item())
        return loss

    out = train(fresh(), TASK, cfg(steps=12, log_every=4), loss_fn=loss_fn)
    assert [h["step"] for h in out.history] == [4, 8, 12] and len(losses) == 12
    for k, h in enumerate(out.history):
        assert h["loss"] == pytest.approx(sum(losses[4 * k: 4 * k + 4]) / 4, rel=1e-6)
    assert out.final_loss == pytest.approx(out.history[-1]["loss"])
