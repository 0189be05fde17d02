"""The FlexAttention path of the bias schemes: the same model output as the [H, N, N] bias through
SDPA, no bias tensor built, and the cases that must keep the tensor path. (CPU: forward only, as
PyTorch's FlexAttention has no CPU backward; the GPU run of `python -m posenc.bench` times it.)"""
import pytest
import torch

import posenc

pytest.importorskip("torch.nn.attention.flex_attention")


def _model(scheme, causal, **kw):
    torch.manual_seed(0)
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "max_len": 96, **kw}
    return posenc.build_model(scheme, 30, causal=causal, **kw).eval()


@pytest.mark.parametrize("d_model", [32, 128])     # heads of 8 (the CPU's eager kernel) and 32 (its compiled one)
@pytest.mark.parametrize("scheme", ["alibi", "t5"])
@pytest.mark.parametrize("causal", [True, False])
def test_flex_path_equals_the_bias_tensor_path(scheme, causal, d_model):
    model, x = _model(scheme, causal, d_model=d_model), torch.randint(0, 30, (2, 24))
    with torch.no_grad():
        model.attention_backend = "sdpa"
        want = model(x)
        model.attention_backend = "flex"
        got = model(x)
        shifted = model(x, torch.arange(24) + 50)           # ALiBi and T5 see distances only
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shifted, want, atol=1e-5, rtol=1e-5)


def test_narrow_heads_take_the_eager_kernel_on_the_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(posenc.attention, "_FLEX", lambda *a, **kw: calls.append("compiled"))
    q = torch.randn(1, 2, 8, posenc.attention.FLEX_CPU_MIN_HEAD_DIM // 2)
    y = posenc.attention.flex_attention(q, q, q, score_mod=None, block_mask=None, scale=None)
    assert not calls and torch.allclose(y, torch.nn.functional.scaled_dot_product_attention(q, q, q), atol=1e-6)
    wide = torch.randn(1, 2, 8, posenc.attention.FLEX_CPU_MIN_HEAD_DIM)
    posenc.attention.flex_attention(wide, wide, wide, score_mod=None, block_mask=None, scale=None)
    assert calls == ["compiled"]


def test_flex_context_holds_a_function_not_a_bias():
    model = _model("alibi", True)
    model.attention_backend = "flex"
    with torch.no_grad():
        ctx = model.context(16, None, "cpu")
    assert ctx.attn_mask is None and callable(ctx.score_mod) and ctx.block_mask is not None
    model.attention_backend = "auto"                        # on CPU, auto keeps the fused SDPA with a tensor
    ctx = model.context(16, None, "cpu")
    assert ctx.score_mod is None and ctx.attn_mask.shape == (4, 16, 16)


def test_cases_that_keep_the_tensor_path():
    t5 = _model("t5", True)
    t5.attention_backend = "flex"
    with torch.no_grad():
        odd = torch.tensor([0, 2, 3, 7, 8, 9, 20, 21])       # not consecutive: T5 has no distance table
        assert t5.context(8, odd, "cpu").score_mod is None
        assert t5.context(8, None, "cpu", need_weights=True).score_mod is None
        maps = t5.attention_maps(torch.randint(0, 30, (1, 8)))  # weights asked for: the explicit softmax
    assert maps[0].shape == (1, 4, 8, 8)
    shaw = _model("shaw", True)                              # per-layer terms: never FlexAttention here
    shaw.attention_backend = "flex"
    assert shaw.context(8, None, "cpu").score_mod is None


@pytest.mark.parametrize("backend, device, keys, want", [
    ("auto", "cuda", posenc.model.FLEX_MIN_KEYS, True), ("auto", "cuda", posenc.model.FLEX_MIN_KEYS - 1, False),
    ("auto", "cpu", 10 ** 6, False), ("flex", "cpu", 8, True), ("flex", "cuda", 8, True), ("sdpa", "cuda", 10 ** 6, False)])
def test_auto_takes_flex_on_cuda_for_long_sequences_only(backend, device, keys, want):
    assert posenc.model.flex_wanted(backend, device, keys) is want


def test_a_models_flex_choice_counts_keys_and_keeps_its_exclusions():
    alibi, shaw = _model("alibi", True), _model("shaw", True)
    n = posenc.model.FLEX_MIN_KEYS
    assert alibi._flex("cuda", n, 0, False) and not alibi._flex("cuda", n - 1, 0, False)
    assert not alibi._flex("cuda", n, 0, True)              # attention weights asked for: the explicit softmax
    assert not shaw._flex("cuda", n, 0, False)              # per-layer terms: never FlexAttention
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        posenc.model.flex_wanted("fast", "cuda", n)


def test_flex_backend_errors_are_clear():
    model = _model("alibi", True).train()
    model.attention_backend = "flex"
    with pytest.raises(ValueError, match="attention_backend='flex' trains on CUDA only"):
        model(torch.randint(0, 30, (1, 8)))
    model.attention_backend = "fast"
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        model(torch.randint(0, 30, (1, 8)))


def test_flex_falls_back_to_the_eager_kernel_when_it_cannot_compile(monkeypatch):
    import posenc.attention as attention

    def compiled_but_fails(*args, **kwargs):               # what torch.compile gives without a C++ compiler
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(attention._FLEX, "kernel", compiled_but_fails)
    monkeypatch.setattr(attention._FLEX, "fell_back", False)   # restored after the test, as the kernel is
    model, x = _model("alibi", True, d_model=128), torch.randint(0, 30, (2, 12))   # heads the CPU would compile
    with torch.no_grad():
        model.attention_backend = "sdpa"
        want = model(x)
        model.attention_backend = "flex"
        with pytest.warns(RuntimeWarning, match="could not be compiled"):
            got = model(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert attention._FLEX.fell_back                       # a benchmark row can say which kernel it timed


def test_running_out_of_memory_is_not_taken_for_a_failed_compile(monkeypatch):
    """An OOM in the compiled kernel propagates and leaves it in place: falling back to the eager kernel, which
    builds the whole [B, H, n, n] scores, would only need more memory and make every later row time it."""
    from posenc.compiled import CompiledOrEager
    kernel = CompiledOrEager(lambda: (lambda x: x + 1), "a test kernel")
    def too_big(x):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    kernel.kernel = too_big
    with pytest.raises(torch.OutOfMemoryError):
        kernel(torch.zeros(1))
    assert kernel.kernel is too_big and not kernel.fell_back


def test_the_causal_block_mask_is_built_once_per_shape_and_stays_right_aligned():
    from posenc.attention import causal_block_mask
    first = causal_block_mask(16, 24, "cpu")
    assert causal_block_mask(16, 24, torch.device("cpu")) is first          # reused, not rebuilt every forward
    assert causal_block_mask(16, 16, "cpu") is not first
    dense = first.to_dense()[0, 0]                                          # blocks of 128: one block here
    assert dense.shape == (1, 1) and bool(dense.all())
    q, kv = torch.arange(16)[:, None], torch.arange(24)[None, :]
    assert torch.equal(first.mask_mod(0, 0, q, kv), kv <= q + 8)            # key j visible to query i iff j <= i + 8
