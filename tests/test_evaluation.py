"""How a trained model becomes the book's numbers: each evaluation path and model read-out against its
definition (what is scored, on which text, at which length and seed, in which unit).

A mutation audit (2026-12-05) found these paths untested: a changed metric, a model scored at the
training length for every length, or the masked LM scored on its training text left every other test
green. `tests/test_runs.py::test_stored_weights_evaluate_to_their_records` pins the same paths against
the stored records; these tests pin the ones no stored run covers.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import posenc
from posenc.model import IGNORE, Transformer, lm_loss
from posenc.runs.train import TrainConfig, TrainResult, train
from posenc.tasks import CharCorpus, SyntheticTask

from conftest import small_model

_CORPUS = {}


def corpus(train_length=16):
    if train_length not in _CORPUS:
        _CORPUS[train_length] = CharCorpus.stdlib(train_length=train_length)
    return _CORPUS[train_length]


# -- corpus evaluation -------------------------------------------------------------------------------
def test_bidirectional_corpus_eval_averages_over_masked_characters_only():
    """A bidirectional model is scored on the masked characters; `tokens` counts them, not every slot."""
    c = corpus()
    torch.manual_seed(0)
    model = small_model(vocab=c.vocab_size, causal=False)
    out = c.evaluate(model, 32, max_tokens=640, batch_size=7, seed=3)
    x, y = c.eval_chunks(32, 640)
    x, y = c.mask(x, torch.Generator().manual_seed(3))
    asked = int((y != IGNORE).sum())
    nll = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE).item()
    assert 0 < asked < 640 and out["tokens"] == asked
    assert math.isclose(out["nll"], nll, rel_tol=1e-5)


def test_corpus_perplexity_is_exp_of_the_nll_in_nats():
    """Ppl = exp(nll) (nats), not 2 ** nll."""
    c = corpus()
    model = small_model(vocab=c.vocab_size, causal=True)
    out = c.evaluate(model, 32, max_tokens=320)
    assert math.isclose(out["ppl"], math.exp(out["nll"]), rel_tol=1e-12)


# -- length evaluation and model building ------------------------------------------------------------
class LengthProbe:
    """A task whose metric is the length it was asked to score."""
    train_length = 4
    vocab_size = 8

    def evaluate(self, model, n, device=None, **kw):
        return {"scored_at": n}


def test_length_table_scores_every_length_it_reports():
    """The row for length n holds the metric measured at n (not at the training length)."""
    from posenc.runs.evaluate import length_table
    rows = length_table(small_model(vocab=8), LengthProbe(), [4, 8, 32])
    assert rows.column("scored_at") == [4, 8, 32] == rows.column("length")
    assert rows.column("x_train") == [1.0, 2.0, 8.0]


def test_seeded_model_keeps_a_max_len_the_caller_gives():
    """Lengths only default max_len; an explicit model_kwargs max_len is kept."""
    from posenc.runs.evaluate import seeded_model
    task = SyntheticTask("copy", train_length=6, n_symbols=8)
    cfg = TrainConfig(steps=1, progress=False, device="cpu")
    model = seeded_model("learned", task, cfg, causal=True, lengths=[6],
                         model_kwargs={"max_len": 100, "d_model": 16, "n_heads": 2, "n_layers": 1})
    assert model.scheme.max_len == 100
    default = seeded_model("learned", task, cfg, causal=True, lengths=[6, 12],
                           model_kwargs={"d_model": 16, "n_heads": 2, "n_layers": 1})
    assert default.scheme.max_len == task.seq_len(12, True)


def test_pretraining_row_is_scored_on_the_runs_seed():
    """The pre-training row's held-out numbers come from batches drawn with the run's seed."""
    from posenc.runs.evaluate import pretraining_model, pretraining_row
    from posenc.tasks import MaskedLMWithCLS
    task = MaskedLMWithCLS(corpus())
    cfg = TrainConfig(seed=3, steps=1, progress=False, device="cpu")
    model = pretraining_model("nope", task, cfg, d_model=16, n_heads=2, n_layers=1)
    row = pretraining_row(model, TrainResult(final_loss=1.0), "nope", task, cfg, None)["row"]
    want = task.evaluate(model, seed=3)
    assert task.evaluate(model, seed=0)["mlm"] != want["mlm"]          # the seed matters, so the check bites
    assert (row["mlm"], row["cls"], row["cls_acc"]) == (want["mlm"], want["cls"], want["cls_acc"])


# -- training result ---------------------------------------------------------------------------------
def test_final_loss_is_the_last_logged_window():
    task = SyntheticTask("copy", train_length=6, n_symbols=8)
    torch.manual_seed(0)
    model = small_model(vocab=task.vocab_size, causal=True)
    result = train(model, task, TrainConfig(steps=12, batch_size=8, warmup=2, log_every=4, lr=3e-3, progress=False))
    assert len(result.history) == 3 and result.history[0]["loss"] != result.history[-1]["loss"]
    assert result.final_loss == result.history[-1]["loss"]


# -- Transformer-XL memory ---------------------------------------------------------------------------
def test_new_memory_is_the_most_recent_block_inputs():
    """With mem_len < segment the memory keeps the last mem_len rows of each block's input."""
    model = small_model("xl", causal=True)
    tokens = torch.randint(0, 23, (2, 6))
    _, mem = model.forward_segment(tokens, mem_len=4)
    _, _, inputs = model._run(tokens)
    for m, x in zip(mem, inputs):
        torch.testing.assert_close(m, x[:, 2:])


def test_evaluate_with_memory_zero_is_the_chunked_protocol():
    """Mem_len=0 scores every segment alone: CharCorpus.evaluate's numbers on the same characters."""
    from posenc.runs.recurrence import evaluate_with_memory
    c = corpus()
    torch.manual_seed(0)
    model = small_model("xl", vocab=c.vocab_size, causal=True)
    ev = evaluate_with_memory(model, c, 8, 0, max_tokens=4 * 8 * 5, streams=4)
    ref = c.evaluate(model, 8, max_tokens=4 * 8 * 5)
    assert math.isclose(ev["nll"], ref["nll"], rel_tol=1e-5)
    assert math.isclose(ev["bpc"], ev["nll"] / math.log(2), rel_tol=1e-12)
    assert len(ev["nll_by_offset"]) == 8
    assert math.isclose(sum(ev["nll_by_offset"]) / 8, ev["nll"], rel_tol=1e-9)


def test_segment_loss_carries_the_memory_between_segments():
    """Two segments read in order with memory give the full causal pass's mean loss per segment."""
    from posenc.runs.recurrence import segment_loss
    model = small_model("xl", causal=True)
    tokens = torch.randint(0, 23, (2, 17))
    x, y = tokens[:, :-1], tokens[:, 1:]
    full = model(x)
    want = (lm_loss(full[:, :8], y[:, :8]) + lm_loss(full[:, 8:], y[:, 8:])) / 2
    torch.testing.assert_close(segment_loss(model, x, y, 8), want, rtol=1e-5, atol=1e-5)


def test_segment_positions_continue_after_the_memory():
    """A segment after M remembered tokens is at positions M..M+T-1 by default (forward_segment's contract)."""
    from posenc.schemes.nope import NoPE
    seen = []

    class Recorder(NoPE):
        def embed(self, x, ctx):
            seen.append((ctx.positions.clone(), getattr(ctx, "key_positions", None)))
            return x

    scheme = Recorder(d_model=16, n_heads=2, n_layers=1, max_len=64, causal=True)
    model = Transformer(scheme, 23, d_model=16, n_heads=2, n_layers=1, causal=True).eval()
    tokens = torch.randint(0, 23, (1, 8))
    _, mem = model.forward_segment(tokens[:, :4])
    model.forward_segment(tokens[:, 4:], mem)
    assert seen[0][0].tolist() == [0, 1, 2, 3]
    assert seen[1][0].tolist() == [4, 5, 6, 7] and seen[1][1].tolist() == list(range(8))


# -- replay ------------------------------------------------------------------------------------------
def test_a_zero_perturbation_replays_the_record(tmp_path):
    """Perturb=(seed, scale) multiplies each weight by 1 + scale * N(0, 1): scale 0 changes nothing."""
    from posenc.runs import Store, ensure
    from posenc.runs.replay import replay
    from test_runs import tiny
    store = Store("ci", tmp_path)
    spec = tiny(steps=30, lr=3e-3)
    ensure([spec], store=store)
    plain = replay(spec, store, 14)
    assert replay(spec, store, 14, perturb=(0, 0.0)).column("replayed") == plain.column("replayed")


# -- pre-training evaluation -------------------------------------------------------------------------
def test_mlm_cls_evaluation_reads_the_held_out_text():
    from posenc.tasks import MaskedLMWithCLS
    from posenc.tasks.pretraining import loss_parts
    task = MaskedLMWithCLS(corpus())
    torch.manual_seed(0)
    model = posenc.build_model("nope", task.vocab_size, causal=False, cls_token=True, num_classes=2,
                               d_model=16, n_heads=2, n_layers=1, max_len=16).eval()
    out = task.evaluate(model, n_batches=2, batch_size=8, seed=0)
    g, mlm = torch.Generator().manual_seed(0), 0.0
    with torch.no_grad():
        for _ in range(2):
            x, y = task.batch(task.corpus.valid_ids, 8, g)
            mlm += loss_parts(model, x, y)["mlm"].item()
    assert math.isclose(out["mlm"], mlm / 2, rel_tol=1e-6)


# -- digits ------------------------------------------------------------------------------------------
def test_digits_are_upsampled_bilinearly_without_aligned_corners():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits
    from posenc.tasks import DigitsTask
    task = DigitsTask(16)
    x = torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 16.0
    x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    n_test = int(round(0.25 * len(x)))
    train_x = x[order[n_test:]]
    torch.testing.assert_close(task.train_x, (train_x - train_x.mean()) / train_x.std())


# -- order task --------------------------------------------------------------------------------------
def test_contrast_evaluation_is_not_drawn_from_the_training_set():
    from posenc.tasks import ContrastTask

    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.seen = nn.Parameter(torch.zeros(1)), []

        def classify(self, x):
            self.seen.append(x)
            return torch.zeros(len(x), 2)

    task = ContrastTask(length=12, n_train=64)
    model = Recorder()
    task.evaluate(model, n_samples=64)
    assert not torch.equal(model.seen[0], task.train_set()[0])


# -- CNN position error ------------------------------------------------------------------------------
def test_position_error_is_in_pixels():
    """Targets span [-1, 1] over size pixels, so an offset d (in target units) is d (size - 1) / 2 pixels."""
    from posenc.tasks.cnn_position import PositionTask, position_targets

    class Offset(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.d = nn.Parameter(torch.tensor(d))

        def forward(self, images):
            return position_targets(8).expand(len(images), -1, -1, -1) + self.d

    task = PositionTask(size=8)
    assert task.evaluate(Offset(0.0), n_samples=4)["error_px"] == 0.0
    assert task.evaluate(Offset(0.2), n_samples=4)["error_px"] == pytest.approx(0.2 * 7 / 2, rel=1e-5)


# -- the model's [CLS] and classifier read-outs ------------------------------------------------------
def test_cls_models_logits_are_the_tokens_rows():
    """With [CLS], forward's logits are the head on rows 1.. (the tokens), not rows ..-1."""
    model = small_model("learned", causal=False, cls_token=True)
    tokens = torch.randint(0, 23, (2, 9))
    h, _ = model.hidden_states(tokens)
    torch.testing.assert_close(model(tokens), model.head(h[:, 1:]))


@pytest.mark.parametrize("scheme", ["learned", "sinusoidal"])
def test_given_positions_with_cls_are_shifted_past_the_cls(scheme):
    """Given token positions 0..n-1 with [CLS] read as CLS 0, tokens 1..n: the default positions."""
    model = small_model(scheme, causal=False, cls_token=True)
    tokens = torch.randint(0, 23, (2, 10))
    torch.testing.assert_close(model(tokens, positions=torch.arange(10)), model(tokens))


def test_classify_without_cls_reads_the_mean_state():
    """Without [CLS] the classifier reads the mean of the final states."""
    model = small_model("learned", causal=False, num_classes=3)
    tokens = torch.randint(0, 23, (2, 9))
    h, _ = model.hidden_states(tokens)
    torch.testing.assert_close(model.classify(tokens), model.classifier(h.mean(1)))


# -- analysis helpers --------------------------------------------------------------------------------
def test_paired_refuses_an_arm_with_seeds_the_first_lacks():
    from posenc.analysis import paired
    with pytest.raises(ValueError, match="same seeds"):
        paired(lambda a, b: a - b, {0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0, 2: 3.0})


def test_mrr_bootstrap_scores_beyond_the_training_length_only():
    """The training length (x_train = 1) takes no part in the ranking."""
    from posenc.analysis import mrr_bootstrap
    rows = [{"scheme": s, "task": "t", "seed": k, "x_train": x, "accuracy": acc}
            for k in (0, 1) for s, x, acc in [("A", 1.0, 0.0), ("A", 2.0, 0.9), ("B", 1.0, 1.0), ("B", 2.0, 0.8)]]
    out = {r["scheme"]: r["MRR"] for r in mrr_bootstrap(rows, ["t"], n_boot=10)}
    assert out == {"A": 1.0, "B": 0.5}


# -- training batches and the pre-training loss ---------------------------------------------------------
def test_seeds_do_not_share_batches_at_shifted_steps():
    """Seed s at step t must not read seed s' at step t' (seed + step would give seed 1 step 0 = seed 0 step 1)."""
    from posenc.runs.train import training_batch
    task = SyntheticTask("copy", train_length=6, n_symbols=8)
    one = TrainConfig(seed=1, batch_size=8, progress=False)
    zero = TrainConfig(seed=0, batch_size=8, progress=False)
    for t in range(5):
        x1, _, _ = training_batch(task, one, t, True)
        x0, _, _ = training_batch(task, zero, t + 1, True)
        assert x1.shape != x0.shape or not torch.equal(x1, x0)


def test_pretraining_loss_parts_read_tokens_and_cls_rows():
    """L_MLM is the LM head on the token rows (model(x)), L_CLS the classifier on [CLS] (model.classify)."""
    from posenc.tasks import MaskedLMWithCLS
    from posenc.tasks.pretraining import loss_parts
    task = MaskedLMWithCLS(corpus())
    torch.manual_seed(0)
    model = posenc.build_model("learned", task.vocab_size, causal=False, cls_token=True, num_classes=2,
                               d_model=16, n_heads=2, n_layers=1, max_len=16).eval()
    with torch.no_grad():
        x, y = task.batch(task.corpus.valid_ids, 8, torch.Generator().manual_seed(0))
        parts = loss_parts(model, x, y)
        torch.testing.assert_close(parts["mlm"], lm_loss(model(x), y[:, 1:]))
        torch.testing.assert_close(parts["cls"], F.cross_entropy(model.classify(x), y[:, 0]))
