"""Passkey retrieval: the text is what the docstring says, only the digits are asked, depths and scores are right."""
import pytest
import torch

from posenc.runs import RunSpec
from posenc.tasks import BUILDERS, IGNORE, CharCorpus, make_task, task_defaults
from posenc.tasks.corpus import MASK_ID
from posenc.tasks.passkey import DEPTHS, KEY_SENTENCE, QUESTION, REPEAT_FILLER, PasskeyTask, shipped_corpus

TASK = PasskeyTask(train_length=100, digits=5, filler="corpus")      # 5 digits: the key is unambiguous in checks


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def texts(task, x):
    return [task.decode(row) for row in x]


def key_of(text):
    """The digits stated in the key sentence of a decoded text."""
    start = text.index(KEY_SENTENCE[0]) + len(KEY_SENTENCE[0])
    return text[start: text.index(KEY_SENTENCE[1], start)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [81, 100, 300])
def test_shapes_ids_and_only_the_digits_are_asked(causal, n):
    x, y = TASK.batch(16, n, gen(), causal)
    assert x.shape == y.shape == (16, n) and x.dtype == y.dtype == torch.long
    assert 0 <= x.min() and x.max() < TASK.vocab_size
    asked = y != IGNORE
    assert (asked.sum(1) == 5).all() and asked[:, -5:].all()            # the answer closes the text
    for text, row in zip(texts(TASK, x), y):
        key = key_of(text)
        assert len(key) == 5 and key.isdigit()
        assert TASK.decode(row[-5:]) == key                             # the targets are the stated key
        question_end = n - 5 + int(causal)                              # causal inputs hold all but the last digit
        assert text[:question_end].endswith(QUESTION)
        assert text.count(KEY_SENTENCE[0]) == 2                         # the key sentence and the question
    if not causal:
        assert (x[:, -5:] == MASK_ID).all()


def test_the_causal_format_is_the_bidirectional_one_shifted():
    xc, yc = TASK.batch(8, 90, gen(3), causal=True)
    xb, yb = TASK.batch(8, 91, gen(3), causal=False)                    # the same text of 91 characters
    seq = torch.where(yb != IGNORE, yb, xb)
    assert torch.equal(xc, seq[:, :-1]) and torch.equal(yc, yb[:, 1:])


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_depth_places_the_key_sentence_at_that_fraction_of_the_filler(depth):
    n = 265
    F = TASK.filler_length(n, causal=True)
    x, _ = TASK.batch(4, n, gen(), True, depth=depth)
    for text in texts(TASK, x):
        k = text.index(KEY_SENTENCE[0])
        assert k == round(depth * F)
    if depth == 1.0:                                                    # the key sentence just before the question
        assert texts(TASK, x)[0][:-4].endswith(KEY_SENTENCE[1] + QUESTION)


def test_training_depths_and_lengths_vary_and_batches_are_deterministic():
    task = PasskeyTask(train_length=128)
    (x1, y1), (x2, y2) = task.train_batch(32, gen(5), True), task.train_batch(32, gen(5), True)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    starts = {text.index(KEY_SENTENCE[0]) for text in texts(task, x1)}
    assert len(starts) > 10                                             # a depth per sample
    lengths = {task.train_batch(2, gen(s), True)[0].shape[1] for s in range(40)}
    assert min(lengths) >= task.min_length and max(lengths) <= 128 and len(lengths) > 10


def test_filler_comes_from_the_shipped_corpus_split_by_use_or_repeats_landmarks_sentences():
    corpus = shipped_corpus()
    train_text, valid_text = corpus.decode(corpus.train_ids), corpus.decode(corpus.valid_ids)
    for split, source in (("train", train_text), ("valid", valid_text)):
        x, _ = TASK.batch(4, 200, gen(), True, depth=0.0, split=split)
        for text in texts(TASK, x):
            after = text.index(KEY_SENTENCE[1]) + len(KEY_SENTENCE[1])
            assert text[after: text.index(QUESTION)] in source         # a window of that split's text
    repeat = PasskeyTask(filler="repeat")
    x, _ = repeat.batch(4, 300, gen(), True, depth=0.0)
    for text in texts(repeat, x):
        after = text.index(KEY_SENTENCE[1]) + len(KEY_SENTENCE[1])
        assert text[after: text.index(QUESTION)] in REPEAT_FILLER * 5
    assert TASK.vocab_size == CharCorpus.stdlib(train_length=8).vocab_size    # the corpus LM's vocabulary


def test_digits_option_and_bad_arguments_are_refused_by_name():
    short = PasskeyTask(digits=3, train_length=80)
    assert short.min_length == TASK.min_length - 4 == 77
    x, y = short.batch(4, 80, gen(), True)
    assert ((y != IGNORE).sum(1) == 3).all()
    for kwargs, error, name in [({"digits": 0}, ValueError, "digits"), ({"digits": 2.0}, TypeError, "digits"),
                                ({"filler": "lorem"}, ValueError, "filler"),
                                ({"train_length": 40}, ValueError, "train_length"),
                                ({"min_train_length": 500}, ValueError, "min_train_length")]:
        with pytest.raises(error, match=name):
            PasskeyTask(**kwargs)
    with pytest.raises(ValueError, match="length"):
        TASK.batch(2, 64, gen(), True)
    with pytest.raises(ValueError, match="depth"):
        TASK.batch(2, 100, gen(), True, depth=1.5)
    with pytest.raises(ValueError, match="split"):
        TASK.batch(2, 100, gen(), True, split="test")
    with pytest.raises(ValueError, match="depths"):
        TASK.evaluate(Oracle(TASK), 100, depths=[])
    with pytest.raises(ValueError, match="n_samples"):
        TASK.evaluate(Oracle(TASK), 100, n_samples=0)


class Oracle(torch.nn.Module):
    """Reads the key from the text and predicts it at the answer slots; `wrong` digits are off by one."""

    def __init__(self, task, causal=True, wrong=()):
        super().__init__()
        self.task, self.causal, self.wrong = task, causal, set(wrong)

    def forward(self, x):
        logits = torch.zeros(*x.shape, self.task.vocab_size)
        for b, text in enumerate(texts(self.task, x)):
            for i, ch in enumerate(key_of(text)):
                ch = str((int(ch) + 1) % 10) if i in self.wrong else ch
                logits[b, x.shape[1] - self.task.digits + i, self.task.corpus.stoi[ch]] = 1.0
        return logits


@pytest.mark.parametrize("causal", [True, False])
def test_scores_count_the_digits_and_the_whole_key(causal):
    assert TASK.evaluate(Oracle(TASK, causal), 120, n_samples=16) == {"accuracy": 1.0, "digit_accuracy": 1.0}
    one_wrong = TASK.evaluate(Oracle(TASK, causal, wrong={2}), 120, n_samples=16)
    assert one_wrong == {"accuracy": 0.0, "digit_accuracy": 0.8}


def test_the_grid_has_a_row_per_length_and_depth_and_evaluate_is_its_mean():
    model = Oracle(TASK, wrong={0})
    rows = TASK.evaluate_grid(model, [100, 200], [0.0, 0.5, 1.0], n_samples=8)
    assert [(r["length"], r["x_train"], r["depth"]) for r in rows] == [
        (n, n / 100, d) for n in (100, 200) for d in (0.0, 0.5, 1.0)]
    assert set(rows.columns) == {"length", "x_train", "depth", "accuracy", "digit_accuracy"}
    assert all(r["digit_accuracy"] == 0.8 and r["accuracy"] == 0.0 for r in rows)
    assert TASK.evaluate(model, 100, n_samples=8) == {"accuracy": 0.0, "digit_accuracy": 0.8}
    assert len(DEPTHS) == 5 and DEPTHS[0] == 0.0 and DEPTHS[-1] == 1.0


def test_evaluation_is_deterministic_and_uses_held_out_filler():
    torch.manual_seed(0)
    from posenc import build_model
    model = build_model("rope", TASK.vocab_size, d_model=16, n_heads=2, n_layers=1, causal=True).eval()
    assert TASK.evaluate(model, 100, n_samples=8) == TASK.evaluate(model, 100, n_samples=8)
    a = TASK.evaluate_grid(model, [100], [0.5], n_samples=8)
    assert a == TASK.evaluate_grid(model, [100], [0.5], n_samples=8)


def test_registered_and_usable_in_a_run_spec():
    assert BUILDERS["passkey"] is PasskeyTask
    assert task_defaults("passkey") == {"train_length": 128, "digits": 2, "filler": "repeat", "min_train_length": 1}
    spec = RunSpec(scheme="rope", task="passkey", model={"causal": True}, lengths=(128, 256))
    assert spec.task_kwargs["digits"] == 2 and PasskeyTask().min_length == 75
    assert isinstance(make_task("passkey", digits=4), PasskeyTask)


def test_training_runs_and_first_learns_that_the_answer_is_a_digit():
    """Within 60 steps the digit loss falls from ln(vocab) to about ln(10): the slots hold digits. (Retrieval
    itself takes a few hundred steps: the numbers are in posenc.tasks.passkey's docstring.)"""
    import math
    from posenc import build_model
    from posenc.runs.train import TrainConfig, train
    task = PasskeyTask(train_length=96)
    torch.manual_seed(0)
    model = build_model("rope", task.vocab_size, d_model=32, n_heads=4, n_layers=2, causal=True, max_len=96)
    out = train(model, task, TrainConfig(steps=60, batch_size=16, lr=3e-3, warmup=10, log_every=20, progress=False))
    assert out.history[-1]["loss"] < math.log(10) + 0.15 < math.log(task.vocab_size)


@pytest.mark.parametrize("causal, depth", [(True, 0.75), (False, 0.75), (True, 0.35)])
def test_depth_rounds_to_the_nearest_filler_character(causal, depth):
    """k = round(depth * F), not its floor: with F = 185, depth * F = 138.75 or 64.75, and the key sentence
    starts at character 139 or 65."""
    n = 265 + int(not causal)                                           # F = 185 either way
    F = TASK.filler_length(n, causal)
    assert F == 185
    x, y = TASK.batch(4, n, gen(), causal, depth=depth)
    seq = torch.where(y != IGNORE, y, x) if not causal else x
    for text in texts(TASK, seq):
        assert text.index(KEY_SENTENCE[0]) == round(depth * F)
    assert round(depth * F) == int(depth * F) + 1


class Recorder(Oracle):
    """The oracle that also keeps (key, filler) of every text it reads."""

    def __init__(self, task):
        super().__init__(task)
        self.seen = []

    def forward(self, x):
        for text in texts(self.task, x):
            key = key_of(text)
            body = text[: text.index(QUESTION)]
            sentence = KEY_SENTENCE[0] + key + KEY_SENTENCE[1]
            self.seen.append((key, body.replace(sentence, "", 1)))
        return super().forward(x)


def test_each_depth_is_scored_on_its_own_keys_and_filler():
    """`score`'s generator seed includes the depth: the cells of one length draw different keys and filler
    windows (the depth average of `evaluate` is over independent texts), and one cell is the same every call."""
    drawn = {}
    for depth in (0.25, 0.5):
        model = Recorder(TASK)
        assert TASK.score(model, 120, depth, n_samples=8) == {"accuracy": 1.0, "digit_accuracy": 1.0}
        drawn[depth] = model.seen
    keys = {d: [k for k, _ in seen] for d, seen in drawn.items()}
    fillers = {d: [f for _, f in seen] for d, seen in drawn.items()}
    assert keys[0.25] != keys[0.5] and fillers[0.25] != fillers[0.5]
    assert sum(a == b for a, b in zip(fillers[0.25], fillers[0.5])) == 0
    again = Recorder(TASK)
    TASK.score(again, 120, 0.25, n_samples=8)
    assert again.seen == drawn[0.25]


def test_repeat_filler_starts_at_a_random_offset_per_row():
    """The "repeat" filler is Landmark's sentences from a random offset, one per row: a batch of 64 texts
    starts at many different offsets of REPEAT_FILLER (not all at its first character)."""
    task = PasskeyTask(filler="repeat")
    x, _ = task.batch(64, 200, gen(1), True, depth=1.0)                 # the text opens with the filler
    cycle = REPEAT_FILLER * 2
    offsets = [cycle.index(text[:len(REPEAT_FILLER)]) for text in texts(task, x)]
    assert all(0 <= o < len(REPEAT_FILLER) for o in offsets)
    assert len(set(offsets)) > 20
    assert len({text[0] for text in texts(task, x)}) > 1


class FirstDepthOnly(Oracle):
    """The oracle, right only where the key sentence opens the text (depth 0); elsewhere it answers no digit."""

    def forward(self, x):
        logits = super().forward(x)
        for b, text in enumerate(texts(self.task, x)):
            if not text.startswith(KEY_SENTENCE[0]):
                logits[b] = 0.0                                          # argmax: id 0, which is no digit
        return logits


def test_evaluate_averages_the_depths_and_does_not_take_the_best_one():
    """A model that retrieves the key at depth 0 only scores 1/5 over DEPTHS' five depths, not 1."""
    model = FirstDepthOnly(TASK)
    assert TASK.score(model, 120, 0.0, n_samples=8) == {"accuracy": 1.0, "digit_accuracy": 1.0}
    assert TASK.score(model, 120, 0.5, n_samples=8) == {"accuracy": 0.0, "digit_accuracy": 0.0}
    share = 1 / len(DEPTHS)
    assert TASK.evaluate(model, 120, n_samples=8) == pytest.approx({"accuracy": share, "digit_accuracy": share})


def test_scoring_reads_its_filler_from_the_validation_text_only():
    """`score` (and so `evaluate`) draws the "corpus" filler from the held-out documents: every filler window a
    scored model reads lies in the validation text and in none of the training text."""
    corpus = shipped_corpus()
    train_text, valid_text = corpus.decode(corpus.train_ids), corpus.decode(corpus.valid_ids)
    model = Recorder(TASK)
    TASK.score(model, 200, 0.5, n_samples=8)                            # F = 120 filler characters a text
    fillers = [f for _, f in model.seen]
    assert len(fillers) == 8 and all(len(f) == TASK.filler_length(200, True) for f in fillers)
    assert all(f in valid_text for f in fillers), "a scored text's filler is not from the validation split"
    assert not any(f in train_text for f in fillers)
