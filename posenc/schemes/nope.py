"""NoPE: no positional encoding at all (the baseline every chapter compares with).

Without position, a bidirectional Transformer is permutation-equivariant:
f(P X) = P f(X) for every permutation matrix P. A causal mask breaks that symmetry,
which is how causal NoPE models still learn position (Haviv et al., 2022;
Kazemnejad et al., 2023). Every hook of `Scheme` is already the identity.
"""
from ..scheme import Scheme, register


@register("nope")
class NoPE(Scheme):
    """No position information; attention stays fully fused."""

    shift_invariant = True
    supports_memory = True
