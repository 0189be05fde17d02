"""Synthetic tasks and the shipped corpus: answers right by construction, splits clean."""
import hashlib
import math

import pytest
import torch
import torch.nn.functional as F

from posenc.tasks import BOS, IGNORE, MASK, SEP, TASKS, CharCorpus, SyntheticTask, stdlib_text
from posenc.tasks.corpus import DOC_SEP, STDLIB_SHA256
from conftest import small_model


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def source_and_answer(task, n, causal=False):
    """Split a bidirectional seq2seq batch back into (source items, answers)."""
    x, y = task.batch(64, n, gen(), causal)
    return x, y


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 5, 32])
def test_shapes_match_seq_len_and_ids_fit_vocab(name, causal, n):
    task = SyntheticTask(name, train_length=8, k=2)
    if n <= 2 and name in ("kback", "index"):
        with pytest.raises(ValueError, match=r"length must be in \[3, 32\]"):
            task.batch(8, n, gen(), causal)
        return
    x, y = task.batch(8, n, gen(), causal)
    assert x.shape == y.shape == (8, task.seq_len(n, causal))
    assert x.dtype == y.dtype == torch.long
    assert 0 <= x.min() and x.max() < task.vocab_size
    asked = y[y != IGNORE]
    assert asked.numel() > 0 and asked.min() >= 0 and asked.max() < task.vocab_size


@pytest.mark.parametrize("name, answer", [
    ("copy", lambda src: src),
    ("reverse", lambda src: src.flip(1)),
])
def test_copy_and_reverse_answers(name, answer):
    n = 7
    x, y = SyntheticTask(name).batch(16, n, gen(), causal=False)
    assert (x[:, 0] == BOS).all() and (x[:, n + 1] == SEP).all() and (x[:, n + 2:] == MASK).all()
    assert torch.equal(y[:, n + 2:], answer(x[:, 1:n + 1]))
    assert (y[:, : n + 2] == IGNORE).all()


@pytest.mark.parametrize("name", ["copy", "reverse", "recall"])
def test_causal_format_is_the_bidirectional_one_shifted(name):
    task = SyntheticTask(name)
    xc, yc = task.batch(8, 6, gen(3), causal=True)
    xb, yb = task.batch(8, 6, gen(3), causal=False)
    asked = yb != IGNORE
    seq = torch.where(asked, yb, xb)            # the full sequence with answers filled in
    assert torch.equal(xc, seq[:, :-1])
    assert torch.equal(yc, yb[:, 1:])


def test_recall_answers_the_value_stored_with_the_query_key():
    n = 9
    x, y = SyntheticTask("recall", train_length=16).batch(64, n, gen(), causal=False)
    pairs = x[:, 1:2 * n + 1].view(64, n, 2)
    keys, values, query = pairs[..., 0], pairs[..., 1], x[:, 2 * n + 1]
    assert all(len(set(k.tolist())) == n for k in keys)            # keys distinct
    hit = keys == query[:, None]
    assert (hit.sum(1) == 1).all()
    assert torch.equal(values[hit], y[:, -1])


def test_labelling_tasks():
    n = 10
    x, y = SyntheticTask("kback", k=3).batch(16, n, gen(), causal=True)
    items, labels = x[:, 1:], y[:, 1:]
    assert (labels[:, :3] == IGNORE).all() and torch.equal(labels[:, 3:], items[:, :-3])
    x, y = SyntheticTask("index", k=2).batch(16, n, gen(), causal=True)
    items, labels = x[:, 1:], y[:, 1:]
    assert (labels[:, :2] == IGNORE).all() and (labels[:, 2:] == items[:, 2:3]).all()
    x, y = SyntheticTask("position").batch(4, n, gen(), causal=True)
    assert (y[:, 1:] - y[:, 1:2] == torch.arange(n)).all()


@pytest.mark.parametrize("name", ["kback", "index", "position"])
def test_labels_only_depend_on_the_past(name):  # (parity and addition: by their tests above, prefix functions)
    """Label i is a function of items <= i, so a causal model can in principle answer it."""
    task = SyntheticTask(name, k=2)
    x, y = task.batch(256, 12, gen(), causal=True)
    for i in range(1, 13):
        asked = y[:, i] != IGNORE
        if asked.any():
            # the label equals one of the visible items, or is the position itself
            visible = x[asked, : i + 1]
            ok = (visible == y[asked, i, None]).any(1) | (name == "position")
            assert ok.all()


@pytest.mark.parametrize("name, answer", [
    ("sort", lambda src: src.sort(1).values),
    ("duplicate", lambda src: torch.cat([src, src], 1)),
])
def test_sort_and_duplicate_answers(name, answer):
    n = 9
    x, y = SyntheticTask(name).batch(32, n, gen(), causal=False)
    assert (x[:, n + 1] == SEP).all() and torch.equal(y[:, n + 2:], answer(x[:, 1:n + 1]))


def test_addition_labels_are_the_digits_of_the_sum():
    """Reading the columns back as two numbers, the labels spell their sum (its last carry aside)."""
    n = 7
    x, y = SyntheticTask("addition").batch(64, n, gen(), causal=True)
    cols = x[:, 1:] - 4                                          # 10 a_i + b_i, least significant first
    place = 10 ** torch.arange(n)
    a, b = ((cols // 10) * place).sum(1), ((cols % 10) * place).sum(1)
    assert torch.equal(((y[:, 1:] - 4) * place).sum(1), (a + b) % 10 ** n)
    assert (y[:, 0] == IGNORE).all()


def test_parity_labels_count_the_ones_so_far():
    x, y = SyntheticTask("parity").batch(64, 11, gen(), causal=True)
    bits = x[:, 1:] - 4
    for i in range(11):
        assert torch.equal(y[:, i + 1] - 4, bits[:, : i + 1].sum(1) % 2)


def test_scan_against_a_word_level_interpreter():
    """Decode the tokens to words and run an independent interpreter of the command language."""
    from posenc.tasks.synthetic import SCAN_ACTIONS, SCAN_COUNTS, SCAN_DIRECTIONS, SCAN_VERBS
    words = SCAN_VERBS + SCAN_DIRECTIONS + SCAN_COUNTS
    n = 5
    x, y = SyntheticTask("scan", train_length=8).batch(32, n, gen(), causal=False)
    for src, ans in zip(x[:, 1:3 * n + 1], y[:, 3 * n + 2:]):
        command = [words[t - 4] for t in src.tolist()]
        want = []
        for verb, direction, count in zip(command[0::3], command[1::3], command[2::3]):
            turn = {"forward": [], "left": ["LTURN"], "right": ["RTURN"]}[direction]
            want += (turn + [verb.upper()]) * {"once": 1, "twice": 2, "thrice": 3}[count]
        got = [SCAN_ACTIONS[t - 14] for t in ans.tolist() if t not in (0, IGNORE)]
        assert got == want
        if len(want) < 6 * n:                       # the answer's end is one PAD target; what follows is not scored
            assert ans[len(want)] == 0 and (ans[len(want) + 1:] == IGNORE).all()


def test_scan_scores_the_end_of_the_answer_not_its_padding():
    """A model that predicts PAD everywhere gets only the ends of the answers right: one target per sample, about
    1/(mean answer length + 1) of them, where scoring every PAD gave it 0.44."""
    task = SyntheticTask("scan", train_length=8)

    class OnlyPad(torch.nn.Module):
        causal = True

        def forward(self, x):
            out = torch.full((*x.shape, task.vocab_size), -1.0)
            out[..., 0] = 1.0                                                  # PAD everywhere
            return out
    acc = task.evaluate(OnlyPad(), 8)["accuracy"]
    x, y = task.batch(256, 8, gen(), causal=True)
    answers = (y != IGNORE).sum(1).float()                                    # actions + 1 end per sample
    assert (y == 0).sum(1).le(1).all() and 0.02 < acc < 0.1
    assert abs(acc - 1 / float(answers.mean())) < 0.02


def test_train_batches_draw_lengths_up_to_L_and_are_reproducible():
    task = SyntheticTask("copy", train_length=6, min_train_length=2)
    lengths = {task.train_batch(2, gen(s), True)[0].shape[1] for s in range(200)}
    assert lengths == {task.seq_len(n, True) for n in range(2, 7)}
    a, b = task.train_batch(4, gen(5), True), task.train_batch(4, gen(5), True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bad_task_arguments():
    with pytest.raises(ValueError, match="unknown task 'sorting'.*copy"):
        SyntheticTask("sorting")
    with pytest.raises(ValueError, match="n_symbols must be >= 16 for 'scan'"):
        SyntheticTask("scan", n_symbols=8)
    with pytest.raises(ValueError, match="train_length must be >= 1"):
        SyntheticTask("copy", train_length=0)
    with pytest.raises(ValueError, match=r"k must be in \[0, train_length\)"):
        SyntheticTask("kback", train_length=4, k=4)
    with pytest.raises(ValueError, match=r"length must be in \[1, 32\] for 'copy'"):
        SyntheticTask("copy", train_length=8).batch(2, 33, gen(), True)


def test_synthetic_evaluate_counts_an_oracle_as_perfect():
    task = SyntheticTask("reverse", train_length=4)

    class Oracle(torch.nn.Module):
        causal = False

        def forward(self, tokens):
            n = (tokens.shape[1] - 2) // 2
            logits = torch.zeros(*tokens.shape, task.vocab_size)
            answer = tokens[:, 1:n + 1].flip(1)
            logits[:, n + 2:].scatter_(-1, answer[..., None], 1.0)
            return logits

    assert task.evaluate(Oracle(), 5, n_samples=10) == {"accuracy": 1.0, "seq_accuracy": 1.0}


# -- corpus -----------------------------------------------------------------------
def test_shipped_corpus_matches_its_pinned_hash():
    text = stdlib_text()
    assert hashlib.sha256(text.encode("ascii")).hexdigest() == STDLIB_SHA256
    assert len(text) > 1_000_000 and text.count(DOC_SEP) > 300


def test_split_follows_document_boundaries():
    c = CharCorpus.stdlib(valid_every=10)
    docs = stdlib_text().split(DOC_SEP)
    assert c.decode(c.valid_ids).split(DOC_SEP) == docs[::10]
    assert len(c.train_ids) + len(c.valid_ids) + 1 == len(stdlib_text())  # one \f lost at the seam
    assert 0.05 < len(c.valid_ids) / len(c.train_ids) < 0.2


def test_eval_chunks_tile_the_validation_text_without_overlap():
    c = CharCorpus("ab\fcdefgh\fijklmnopqrstuvw\fxyz" * 5, valid_every=2, train_length=8)
    x, y = c.eval_chunks(4)
    assert torch.equal(x.flatten(), c.valid_ids[: x.numel()])
    assert torch.equal(y.flatten(), c.valid_ids[1: x.numel() + 1])
    x8, _ = c.eval_chunks(2, max_tokens=8)
    assert x8.shape == (4, 2)
    with pytest.raises(ValueError, match="shorter than length"):
        c.eval_chunks(10_000)


def test_corpus_evaluate_is_the_mean_nll_over_chunks():
    c = CharCorpus.stdlib(train_length=16)
    model = small_model(vocab=c.vocab_size, causal=True)
    out = c.evaluate(model, 32, max_tokens=640, batch_size=7)
    x, y = c.eval_chunks(32, 640)
    nll = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    assert out["tokens"] == 640
    assert math.isclose(out["nll"], nll, rel_tol=1e-5)
    assert math.isclose(out["bpc"], out["nll"] / math.log(2), rel_tol=1e-12)


def test_mlm_batches_mask_about_15_percent_and_hide_them():
    c = CharCorpus.stdlib(train_length=64)
    x, y = c.train_batch(64, gen(), causal=False)
    chosen = y != IGNORE
    assert 0.12 < chosen.float().mean() < 0.18
    assert (x[chosen] == 1).all() and (x[~chosen] != 1).all()


def test_corpus_path(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    c = CharCorpus.from_path(path, train_length=8)
    assert c.vocab_size == 2 + len(set("the quick brown fox jumps over the lazy dog.\f"))  # \f: document end
    with pytest.raises(ValueError, match="corpus_path"):
        CharCorpus.from_path(tmp_path / "missing.txt")


def test_unknown_characters_map_to_unk():
    c = CharCorpus("abc\fabd\fab", valid_every=2, train_length=1)
    assert c.encode("z").tolist() == [0]


def test_unigram_entropy_is_the_context_free_loss():
    from posenc.tasks import CharCorpus
    corpus = CharCorpus.stdlib(train_length=16)
    ids = corpus.valid_ids
    p = torch.bincount(ids).double() / len(ids)
    uniform_loss = -(p[ids].log()).mean().item()                 # a model predicting the frequencies
    assert abs(corpus.unigram_entropy() - uniform_loss) < 1e-9
    assert 0 < corpus.unigram_entropy("train") < math.log(corpus.vocab_size)
    with pytest.raises(ValueError, match="split must be"):
        corpus.unigram_entropy("test")


def test_every_registered_task_follows_the_protocol():
    from posenc.tasks import BUILDERS, Task, make_task
    small = {"synthetic": {"name": "copy"}, "corpus": {"train_length": 16}, "mlm_cls": {"train_length": 16},
             "digits": {"image_size": 8}}
    for name in BUILDERS:
        task = make_task(name, **small.get(name, {}))
        assert isinstance(task, Task), name
        x, y = task.train_batch(2, torch.Generator().manual_seed(0), name in ("synthetic", "corpus"))
        assert x.shape[0] == 2 and y.shape[0] == 2


def test_vocabulary_is_built_from_the_training_text_only():
    """The characters are those of the training documents: a character seen only in validation is not in
    `chars`, is out of the vocabulary, and encodes (there, in `valid_ids`) to UNK."""
    c = CharCorpus("abc\fabd\fab", valid_every=2, train_length=1)   # documents 0 and 2 validate: "abc", "ab"
    assert c.decode(c.train_ids) == "abd" and c.chars == ["a", "b", "d"] and c.vocab_size == 5
    assert "c" not in c.chars and "c" not in c.stoi
    assert c.encode("c").tolist() == [0]
    assert c.valid_ids.tolist() == [c.stoi["a"], c.stoi["b"], 0, 0, c.stoi["a"], c.stoi["b"]]   # c and \f: UNK


@pytest.mark.parametrize("task_name", ["kback", "corpus"])
def test_scoring_runs_in_eval_mode_and_gives_the_model_back_in_its_own_mode(task_name):
    """A task scores a model with its dropout off, whatever mode the model is in, and hands it back in the mode
    it had: a score taken between training steps equals the eval-mode score and changes nothing after it."""
    import posenc
    from posenc.tasks import make_task
    task = make_task("corpus", train_length=16) if task_name == "corpus" else SyntheticTask(task_name, train_length=6)
    torch.manual_seed(0)
    model = posenc.build_model("rope", task.vocab_size, d_model=16, n_heads=2, n_layers=1, causal=True, dropout=0.5)
    kw = {"max_tokens": 512} if task_name == "corpus" else {"n_samples": 32}
    model.train()
    in_training = task.evaluate(model, 12, **kw)
    assert model.training                                              # given back in training mode
    model.eval()
    assert task.evaluate(model, 12, **kw) == in_training and not model.training
    torch.manual_seed(1)
    with torch.no_grad():                                              # the dropout is real: training mode differs
        x = torch.randint(4, task.vocab_size, (2, 12))
        assert not torch.equal(model.train()(x), model.eval()(x))


def test_task_arguments_out_of_range_are_named_not_taken():
    """A test fraction outside (0, 1), a percentage given as a mask fraction, a fractional document stride,
    and a sentence length of 0 (which `or` would have read as the default) each raise, naming the argument."""
    from posenc.tasks.corpus import CharCorpus
    from posenc.tasks.digits import DigitsTask
    from posenc.tasks.order import ContrastTask
    for bad in (-0.25, 0, 1.5):
        with pytest.raises(ValueError, match="test_fraction"):
            DigitsTask(16, test_fraction=bad)
    with pytest.raises(ValueError, match="max_shift"):
        DigitsTask(16, max_shift=-1)
    text = "\f".join("abcdefgh" * 10 for _ in range(10))
    with pytest.raises(ValueError, match="mask_prob"):
        CharCorpus(text, mask_prob=15)
    with pytest.raises(ValueError, match="valid_every"):
        CharCorpus(text, valid_every=2.5)
    with pytest.raises(ValueError, match=r"max_tokens=100"):
        CharCorpus(text, valid_every=2).eval_chunks(128, max_tokens=100)
    task = ContrastTask()
    for bad in (0, 4):
        with pytest.raises(ValueError, match="length must be None or an int >= 5"):
            task.sentence(1, torch.Generator().manual_seed(0), length=bad)


def test_accuracy_by_position_keeps_entry_i_at_item_i():
    """kback asks nothing about its first k items: their entries are NaN, so entry i is still item i; an
    oracle scores 1 at every item it is asked about. A seq2seq task gives one entry per answer slot."""
    task = SyntheticTask("kback", train_length=8, k=2)

    class Oracle(torch.nn.Module):
        causal = True

        def forward(self, x):
            _, y = task.batch(x.shape[0], x.shape[1] - 1, torch.Generator().manual_seed(100003 * 0 + 8), True)
            return F.one_hot(y.clamp(min=0), task.vocab_size).float()
    acc = task.accuracy_by_position(Oracle(), 8)
    assert len(acc) == 8 and all(math.isnan(a) for a in acc[:2]) and acc[2:] == [1.0] * 6
    copy = SyntheticTask("copy", train_length=8)
    assert len(copy.accuracy_by_position(small_model("nope"), 5)) == 5


@pytest.mark.parametrize("causal", [True, False])
def test_position_labels_each_item_with_its_index(causal):
    """`position`'s label of the i-th item (counting from 0) is the token N_SPECIAL + i; [BOS] is not asked."""
    from posenc.tasks.synthetic import N_SPECIAL
    n = 12
    x, y = SyntheticTask("position").batch(4, n, gen(), causal=causal)
    assert (y[:, 0] == IGNORE).all()
    assert torch.equal(y[:, 1:], (N_SPECIAL + torch.arange(n)).expand(4, n))


def test_a_bad_count_to_a_task_is_an_error_naming_it():
    """batch_size 0 stacked an empty list, a negative one gave a negative-dimension error, a float one failed in
    randint; evaluate's length and batch_size failed in a slice or a split. Each now names its argument."""
    corpus, synthetic = CharCorpus(stdlib_text()[:20000], train_length=16), SyntheticTask("copy", train_length=8)
    model, g = small_model("nope", causal=True, vocab=corpus.vocab_size), torch.Generator().manual_seed(0)
    for task in (corpus, synthetic):
        for bad in (0, -1, 4.0, True):
            with pytest.raises(ValueError, match=f"batch_size must be a positive int; got {bad!r}"):
                task.train_batch(bad, g, True)
    with pytest.raises(ValueError, match="batch_size must be a positive int; got 0"):
        corpus.evaluate(model, 16, batch_size=0)
    with pytest.raises(ValueError, match="length must be a positive int; got 16.0"):
        corpus.evaluate(model, 16.0)
    with pytest.raises(ValueError, match="n_samples must be a positive int; got 0"):
        synthetic.evaluate(model, 8, n_samples=0)
