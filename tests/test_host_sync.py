"""No training step waits for the GPU (`posenc.host`), checked for every scheme on the CPU.

On a GPU the host queues step t + 1 while step t runs, unless something in the step reads a
device tensor's value on the host. Such reads cost nothing on the CPU, so this test records
them instead of timing them: `HostReads` (a TorchFunctionMode) logs every call that would read
a value (`.item()`, `bool()`, `int()`, `float()`, `.tolist()`, `.numpy()`, `.cpu()`,
`torch.nonzero`, `torch.unique`, `torch.equal`, `masked_select`, boolean-mask indexing)
inside `posenc.runs.train.optimizer_step`, with the function it came from (the innermost
caller outside torch). Reads of tensors that live on the host by design are allowed by where they happen
(`HOST_SIDE`); anything else fails the test with its place.
"""
import traceback
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

import posenc
import posenc.runs.train as training
from posenc.model import classification_loss
from posenc.vision import VISION_SCHEMES, build_vit

from conftest import small_model

READS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "numpy", "cpu", "nonzero", "argwhere",
         "masked_select", "unique", "unique_consecutive", "equal", "allclose"}

#: Functions whose reads are of host tensors by design, not of the device's.
HOST_SIDE = {
    ("scheme.py", "summarise_positions"),      # positions passed from the CPU (randomized positions) are read there
    ("floater.py", "host_grid"),              # FLOATER's time grid is made from positions on the host
    ("floater.py", "rk4_on_host_grid"),       # and integrated over there
    ("relative.py", "distinct_distances"),    # Transformer-XL's distances, found from positions on the host
}


class HostReads(TorchFunctionMode):
    """Records (call, file, function) of every host read of a tensor value made inside it."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else None
        masked = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                     for i in (index if isinstance(index, tuple) else (index,)))
        if name in READS or masked:
            stack = traceback.extract_stack()[:-1]
            if not any("/torch/optim/" in f.filename for f in stack):   # AdamW's step count: a host tensor
                ours = [f for f in stack if "/torch/" not in f.filename]            # the innermost caller outside torch
                where = (ours[-1].filename.rsplit("/", 1)[-1], ours[-1].name) if ours else ("?", "?")
                if where not in HOST_SIDE:
                    self.calls[(name, *where)] += 1
        return func(*args, **kwargs)


class RandomTokens:
    """A task: uniform random tokens, next-token targets (or class labels with `classes`)."""

    def __init__(self, vocab=23, n=16, classes=None):
        self.vocab, self.n, self.classes = vocab, n, classes

    def train_batch(self, batch_size, generator, causal):
        x = torch.randint(0, self.vocab, (batch_size, self.n), generator=generator)
        if self.classes:
            return x, torch.randint(0, self.classes, (batch_size,), generator=generator)
        return x, torch.roll(x, -1, 1)


class RandomImages(RandomTokens):
    def train_batch(self, batch_size, generator, causal):
        return torch.rand(batch_size, 1, 8, 8, generator=generator), torch.randint(0, 3, (batch_size,), generator=generator)


def host_reads(monkeypatch, model, task, loss_fn=None, **config):
    """Train 2 steps; the host reads made inside the steps."""
    seen = Counter()

    def step(*args, **kwargs):
        with HostReads() as mode:
            out = real(*args, **kwargs)
        seen.update(mode.calls)
        return out
    real = training.optimizer_step
    monkeypatch.setattr(training, "optimizer_step", step)
    cfg = posenc.TrainConfig(steps=2, batch_size=4, warmup=1, progress=False, device="cpu", **config)
    posenc.train(model, task, cfg, loss_fn=loss_fn)
    return dict(seen)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scheme", sorted(posenc.SCHEMES))
def test_no_scheme_reads_the_device_inside_a_training_step(monkeypatch, scheme, causal):
    if not causal and posenc.SCHEMES[scheme].causal_only:
        pytest.skip(f"{scheme} is causal only")
    assert host_reads(monkeypatch, small_model(scheme, causal=causal), RandomTokens()) == {}


@pytest.mark.parametrize("scheme", ["learned", "sinusoidal", "rope", "alibi", "t5", "floater", "tupe", "deberta", "xl"])
def test_randomized_positions_are_read_on_the_host_not_the_device(monkeypatch, scheme):
    model = small_model(scheme, causal=scheme != "deberta", max_len=64)
    assert host_reads(monkeypatch, model, RandomTokens(), random_positions=64) == {}


@pytest.mark.parametrize("scheme", ["tupe", "deberta", "learned", "t5"])
def test_a_cls_classifier_step_reads_nothing(monkeypatch, scheme):
    model = small_model(scheme, causal=False, cls_token=True, num_classes=3)
    assert host_reads(monkeypatch, model, RandomTokens(classes=3), loss_fn=classification_loss) == {}


@pytest.mark.parametrize("scaling", ["dynamic", "yarn"])
def test_a_length_dependent_rope_scaling_reads_nothing(monkeypatch, scaling):
    model = small_model("rope")
    model.scheme.set_scaling(scaling, 2.0, original_max_position_embeddings=8)
    assert host_reads(monkeypatch, model, RandomTokens()) == {}


@pytest.mark.parametrize("scheme", sorted(VISION_SCHEMES))
def test_no_vit_step_reads_the_device(monkeypatch, scheme):
    model = build_vit(scheme, image_size=8, patch_size=2, num_classes=3, d_model=32, n_heads=4)
    assert host_reads(monkeypatch, model, RandomImages(), loss_fn=classification_loss) == {}


def test_the_check_catches_a_scheme_that_reads_the_device(monkeypatch):
    class Reads(posenc.Scheme):
        def prepare(self, ctx):
            if ctx.positions.max() > 1000:                       # a host read of a device value
                raise ValueError("too long")
            return {}
    model = posenc.Transformer(Reads(d_model=32, n_heads=4, n_layers=2, max_len=64, causal=True), 23,
                               d_model=32, n_heads=4, n_layers=2, causal=True)
    reads = host_reads(monkeypatch, model, RandomTokens())
    assert reads == {("__bool__", "test_host_sync.py", "prepare"): 2}               # once per step


def test_the_trainer_still_rejects_tokens_outside_the_vocabulary_naming_it():
    """The step skips the model's token check (it would read the device); the trainer runs it on the host."""
    model = small_model("rope", vocab=23)
    with pytest.raises(ValueError, match=r"vocab_size=23"):
        posenc.train(model, RandomTokens(vocab=30), posenc.TrainConfig(steps=2, progress=False, device="cpu"))
    with pytest.raises(ValueError, match=r"vocab_size=23"):         # and a forward outside the trainer checks itself
        model(torch.tensor([[0, 29]]))


def test_the_model_summarises_its_own_positions_without_a_read_and_given_ones_where_they_are():
    """Default positions are summarised without a read; given ones in one read, where they are."""
    model = small_model("alibi")
    ctx = model.context(10, None, torch.device("cpu"))
    assert (ctx.start, ctx.extent) == (0, (0, 9))
    ctx = model.context(4, torch.tensor([3, 4, 5, 6]), torch.device("cpu"))
    assert (ctx.start, ctx.extent) == (3, (3, 6))
    ctx = model.context(4, torch.tensor([0, 2, 5, 9]), torch.device("cpu"))
    assert (ctx.start, ctx.extent) == (None, (0, 9))
    cls = small_model("learned", causal=False, cls_token=True, num_classes=2)
    ctx = cls.context(3, torch.tensor([4, 5, 6]), torch.device("cpu"))
    assert ctx.positions.tolist() == [4, 5, 6, 7] and (ctx.start, ctx.extent) == (4, (4, 7))
    with HostReads() as mode:
        small_model("t5").context(10, None, torch.device("cpu"))
    assert not mode.calls
