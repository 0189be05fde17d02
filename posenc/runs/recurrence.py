"""Transformer-XL's segment-level recurrence: training loss and evaluation with a memory.

Dai et al. (2019), section 3.2: segment tau+1 attends to the cached block inputs of
segment tau (stop-gradient), so the longest dependency grows with depth and memory,

    h^{n-1}_{tau+1}~ = [SG(m^{n-1}_tau) ; h^{n-1}_{tau+1}],   keys/values from h~, queries from h.

`Transformer.forward_segment` runs one segment; this module strings segments together.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..model import IGNORE, lm_loss


def segment_loss(model, inputs, targets, segment: int,
                 mem_len: int | None = None):
    """Mean next-token loss over [B, n*segment] windows read as n segments in
    order, memory carried."""
    if inputs.shape[1] % segment:
        raise ValueError(f"segment={segment} must divide the window length "
                         f"{inputs.shape[1]}")
    memory, losses = None, []
    for x, y in zip(inputs.split(segment, 1), targets.split(segment, 1)):
        logits, memory = model.forward_segment(
            x, memory, mem_len=segment if mem_len is None else mem_len)
        losses.append(lm_loss(logits, y))
    return torch.stack(losses).mean()


@torch.no_grad()
def evaluate_with_memory(model, corpus, segment: int, mem_len: int, *, max_tokens: int = 32768,
                         streams: int = 16, device=None) -> dict:
    """Per-character NLL of the validation text read as `streams` parallel streams of segments.

    Each segment is scored with a memory of the previous `mem_len` positions
    (`mem_len=0`: every segment alone, the chunked protocol of `CharCorpus.evaluate`).
    Returns nll, ppl, bpc and `nll_by_offset`: mean NLL at each offset 0..segment-1
    within a segment (how much the first characters of a segment gain from memory).
    """
    ids = corpus.valid_ids[: min(max_tokens, len(corpus.valid_ids) - 1) + 1]
    per_stream = (len(ids) - 1) // (streams * segment) * segment
    if per_stream < segment:
        raise ValueError(f"max_tokens={max_tokens} is too short for {streams} streams of segment={segment}")
    x = ids[: streams * per_stream].view(streams, per_stream).to(device)        # (S, N)
    y = ids[1: streams * per_stream + 1].view(streams, per_stream).to(device)
    model.eval()
    memory, total = None, torch.zeros(segment, device=device)
    for xs, ys in zip(x.split(segment, 1), y.split(segment, 1)):
        logits, memory = model.forward_segment(xs, memory, mem_len=mem_len)
        nll = F.cross_entropy(logits.float().transpose(1, 2), ys, ignore_index=IGNORE, reduction="none")  # (S, T)
        total += nll.sum(0)
    by_offset = (total / (x.shape[0] * x.shape[1] // segment)).tolist()
    nll = sum(by_offset) / segment
    return {"nll": nll, "ppl": math.exp(nll), "bpc": nll / math.log(2), "nll_by_offset": by_offset}
