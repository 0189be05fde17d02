"""Bad input gets a clear error naming the argument; checkpoints are safe to load and resume exactly."""
import os
import pickle
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posenc
from posenc.runs.train import TrainConfig, train
from posenc.tasks import CharCorpus, SyntheticTask
from conftest import skip_bidirectional_if_causal_only, small_model

TASK = SyntheticTask("copy", train_length=6, n_symbols=8)


def cfg(**kw):
    return TrainConfig(**{"steps": 30, "batch_size": 16, "warmup": 5, "log_every": 5, "progress": False, **kw})


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


# -- checkpoints ------------------------------------------------------------------------------
class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_crafted_checkpoint_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"step": 1, "history": [], "payload": _Evil()}, path)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=str(path)):
        train(small_model(vocab=TASK.vocab_size), TASK, cfg(checkpoint_path=str(path)))
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("content", [b"", b"garbage", pickle.dumps({"step": 3})])
def test_a_corrupt_checkpoint_names_its_file(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="bad.pt"):
        train(small_model(vocab=TASK.vocab_size), TASK, cfg(checkpoint_path=str(path)))


@pytest.mark.parametrize("change", [dict(lr=2e-3), dict(seed=1), dict(batch_size=8), dict(steps=40)])
def test_resuming_with_other_settings_is_refused_naming_them(tmp_path, change):
    path = str(tmp_path / "ck.pt")
    torch.manual_seed(0)
    train(small_model(vocab=TASK.vocab_size), TASK, cfg(checkpoint_path=path, steps=10, checkpoint_every=5))
    name = next(iter(change))
    base = {"steps": 10} if name != "steps" else {}
    with pytest.raises(ValueError, match=name):
        train(small_model(vocab=TASK.vocab_size), TASK, cfg(checkpoint_path=path, checkpoint_every=5, **base, **change))
    # explicitly overriding is allowed
    train(small_model(vocab=TASK.vocab_size), TASK, cfg(checkpoint_path=path, checkpoint_every=5, **base, **change),
          resume="override")


def test_resuming_another_scheme_is_refused(tmp_path):
    path = str(tmp_path / "ck.pt")
    train(small_model("nope", vocab=TASK.vocab_size), TASK, cfg(checkpoint_path=path, steps=10, checkpoint_every=5))
    with pytest.raises(ValueError, match="model"):
        train(small_model("alibi", vocab=TASK.vocab_size), TASK, cfg(checkpoint_path=path, steps=10, checkpoint_every=5))


KILLED = """
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from conftest import small_model
from posenc.runs.train import TrainConfig, train
from posenc.tasks import SyntheticTask


class Dies(SyntheticTask):
    calls = 0

    def train_batch(self, *args):           # SIGKILL this process when batch number `kill_at` is drawn
        if Dies.calls == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)
        Dies.calls += 1
        return super().train_batch(*args)


task = Dies("copy", train_length=6, n_symbols=8)
torch.manual_seed(0)
model = small_model(vocab=task.vocab_size, causal=True, dropout={dropout})
cfg = TrainConfig(steps={steps}, batch_size=16, warmup=5, log_every={log_every}, checkpoint_every={every},
                  checkpoint_path={path!r}, progress=False)
out = train(model, task, cfg)
torch.save({{"history": out.history, "params": torch.cat([p.detach().flatten() for p in model.parameters()])}},
           {result!r})
"""


def test_sigkill_at_random_moments_resumes_bit_identically(tmp_path):
    """SIGKILL at random steps, 7 times per setting, where checkpoint_every and log_every do not divide;
    every restart resumes from the last checkpoint and the run ends as an uninterrupted one."""
    rng = random.Random(0)
    kills = 0
    for setting, (steps, log_every, every, dropout) in enumerate([(60, 7, 3, 0.0), (50, 10, 3, 0.1), (45, 4, 5, 0.0)]):
        torch.manual_seed(0)
        ref_model = small_model(vocab=TASK.vocab_size, causal=True, dropout=dropout)
        ref = train(ref_model, TASK, cfg(steps=steps, log_every=log_every))
        path, result = tmp_path / f"ck{setting}.pt", tmp_path / f"out{setting}.pt"
        for attempt in range(8):
            kill_at = rng.randrange(0, every * 2 + 3) if attempt < 7 else -1      # batches drawn after a restart
            code = KILLED.format(tests=str(Path(__file__).parent), dropout=dropout, steps=steps, log_every=log_every,
                                 every=every, path=str(path), result=str(result), kill_at=kill_at)
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
            if proc.returncode == -signal.SIGKILL:
                kills += 1
            else:
                assert proc.returncode == 0, proc.stderr.decode()[-2000:]
            if result.exists():
                break
        out = torch.load(result, weights_only=True)
        assert out["history"] == ref.history
        assert torch.equal(out["params"], params(ref_model))
    assert kills >= 20


# -- settings and inputs --------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    (dict(grad_clip=-1.0), "grad_clip"), (dict(grad_clip=0.0), "grad_clip"), (dict(lr=0.0), "lr"),
    (dict(lr=float("nan")), "lr"), (dict(warmup=-1), "warmup"), (dict(min_lr_ratio=1.5), "min_lr_ratio"),
    (dict(weight_decay=-0.1), "weight_decay"), (dict(steps=2.5), "steps"), (dict(batch_size=True), "batch_size"),
])
def test_train_config_refuses_bad_settings(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        TrainConfig(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(vocab_size=True), "vocab_size"), (dict(d_ff=-5), "d_ff"), (dict(d_ff=0), "d_ff"),
    (dict(num_classes=-2), "num_classes"), (dict(num_classes=0), "num_classes"), (dict(dropout=1.5), "dropout"),
    (dict(cls_token="yes"), "cls_token"),
])
def test_build_model_refuses_bad_arguments(kwargs, name):
    args = {"vocab_size": 10, **kwargs}
    with pytest.raises((ValueError, TypeError), match=name):
        posenc.build_model("nope", args.pop("vocab_size"), causal=True, **args)


@pytest.mark.parametrize("kwargs, name", [
    (dict(cls_token="no"), "cls_token"), (dict(tie_weights="no"), "tie_weights"), (dict(d_ff=0), "d_ff"),
    (dict(vocab_size=0), "vocab_size"), (dict(num_classes=-1), "num_classes"), (dict(dropout=-0.5), "dropout"),
])
def test_the_transformer_refuses_what_build_model_refuses(kwargs, name):
    """posenc.Transformer is public too: a truthy "no" must not add a [CLS] token, nor d_ff=0 become 4 d_model."""
    scheme = posenc.SCHEMES["nope"](d_model=32, n_heads=2, n_layers=1, max_len=16, causal=True)
    args = {"vocab_size": 10, "d_model": 32, "n_heads": 2, "n_layers": 1, "causal": True, **kwargs}
    with pytest.raises((ValueError, TypeError), match=name):
        posenc.Transformer(scheme, args.pop("vocab_size"), **args)


def test_attention_refuses_a_scheme_built_for_other_heads_and_bad_sizes():
    """A RoPE built for 8-dim heads, in an attention with 16-dim ones, would rotate half of each head."""
    from posenc.scheme import PositionContext
    rope = posenc.SCHEMES["rope"](d_model=32, n_heads=4, n_layers=1, max_len=16, causal=True)
    ctx = PositionContext(torch.arange(5), True)
    ctx.tables = rope.prepare(ctx)
    with pytest.raises(ValueError, match="n_heads=4 but Attention n_heads=2"):
        posenc.Attention(32, 2, 0)(torch.randn(2, 5, 32), rope, ctx)
    out, _ = posenc.Attention(32, 4, 0)(torch.randn(2, 5, 32), rope, ctx)       # the heads it was built for
    assert out.shape == (2, 5, 32)
    for kwargs, name in ((dict(n_heads=0), "n_heads"), (dict(dropout=-0.5), "dropout"), (dict(d_model=30), "d_model")):
        with pytest.raises(ValueError, match=name):
            posenc.Attention(**{"d_model": 32, "n_heads": 4, "layer": 0, **kwargs})


@pytest.mark.parametrize("scheme", ["alibi", "t5", "shaw", "learned", "tupe", "deberta", "rope"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_small_integer_positions_are_widened_not_wrapped(scheme, dtype):
    model = small_model(scheme, causal=True, max_len=128)
    tokens = torch.randint(0, 23, (2, 10))
    start = 100 if dtype in (torch.uint8, torch.int16, torch.int32) else 20
    pos = torch.arange(10) + start
    torch.testing.assert_close(model(tokens, pos.to(dtype)), model(tokens, pos))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("scheme", sorted(posenc.SCHEMES))
def test_non_finite_positions_are_refused(scheme, bad):
    model = small_model(scheme, causal=True)
    pos = torch.arange(6.0)
    pos[2] = bad
    with pytest.raises(ValueError, match="positions"):
        model(torch.randint(0, 23, (1, 6)), pos)


@pytest.mark.parametrize("scheme", sorted(posenc.SCHEMES))
@pytest.mark.parametrize("causal", [True, False])
def test_the_empty_sequence_gives_empty_logits(scheme, causal):
    skip_bidirectional_if_causal_only(scheme, causal)
    out = small_model(scheme, causal)(torch.zeros(3, 0, dtype=torch.long))
    assert out.shape == (3, 0, 23)


def test_nan_pixels_are_refused_by_the_vit():
    vit = posenc.vision.build_vit("learned", image_size=8, patch_size=4, num_classes=3, d_model=16, n_heads=2)
    images = torch.zeros(1, 1, 8, 8)
    images[0, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="images"):
        vit(images)


# -- data -------------------------------------------------------------------------------------
def test_corpus_errors_are_clear():
    with pytest.raises(ValueError, match="text"):
        CharCorpus("")
    with pytest.raises(ValueError, match="train_length"):
        CharCorpus("ab\fcd\fef" * 3, train_length=500)


def test_the_last_window_of_a_corpus_can_be_drawn():
    corpus = CharCorpus("abcdefgh\f" * 20, train_length=8)
    n = len(corpus.train_ids)
    starts = set()
    for s in range(400):
        x, _ = corpus.train_batch(8, torch.Generator().manual_seed(s), True)
        starts |= {int(r[0]) for r in x}
    last = corpus.train_ids[n - 9]                      # the first token of the last full window of L+1
    assert int(last) in starts


@pytest.mark.parametrize("kwargs, name", [
    (dict(train_length=4, min_train_length=6), "min_train_length"), (dict(train_length=4.5), "train_length"),
    (dict(n_symbols=0), "n_symbols"),
])
def test_synthetic_task_settings_are_checked(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        SyntheticTask("copy", **kwargs)


def test_synthetic_evaluate_refuses_no_samples():
    model = small_model(vocab=TASK.vocab_size)
    with pytest.raises(ValueError, match="n_samples"):
        TASK.evaluate(model, 6, n_samples=0)


def test_flags_and_counts_refuse_look_alikes():
    """A string flag is truthy whatever it says, and True passed as a count is 1: each is now refused by name."""
    from posenc.absolute import sinusoidal_table
    from posenc.alibi import alibi_slopes
    from posenc.schemes.relative import clipped_relative_positions
    with pytest.raises(TypeError, match="word_frequencies must be True or False"):
        posenc.build_model("complex", 10, causal=True, d_model=16, n_heads=2, word_frequencies="no")
    with pytest.raises(TypeError, match="adjoint must be True or False"):
        posenc.build_model("floater", 10, causal=True, d_model=16, n_heads=2, adjoint="yes")
    for call, name in ((lambda: alibi_slopes(True), "num_heads"), (lambda: sinusoidal_table(True, 8), "num_positions"),
                       (lambda: clipped_relative_positions(True, 4, 2), "q_len")):
        with pytest.raises(ValueError, match=name):
            call()
