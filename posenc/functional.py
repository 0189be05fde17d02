"""The public contract of design.md in one place: pure functions on tensors, no modules.

    from posenc.functional import apply_rope, apply_xpos, sinusoidal_table, t5_bucket

Each also lives in its scheme's module (`posenc.rotary.apply_rope`, ...), where its
derivation is documented; this module only gathers them.
"""
from .schemes.absolute import sinusoidal_table
from .schemes.alibi import alibi_slopes
from .schemes.bias import t5_bucket
from .schemes.cope import contextual_positions, cope_gates, cope_logits
from .schemes.deberta import relative_distance
from .schemes.learned_bias import fire_bias, fit_fire_to_bias, kerple_bias
from .schemes.relative import clipped_relative_positions, rel_shift
from .schemes.rope_scaling import rope_inv_freq
from .schemes.rotary import apply_rope
from .schemes.xpos import apply_xpos
from .vision import interpolate_pos_embed

__all__ = ["sinusoidal_table", "apply_rope", "t5_bucket", "alibi_slopes", "clipped_relative_positions", "rel_shift",
           "relative_distance", "interpolate_pos_embed", "rope_inv_freq",
           "cope_gates", "contextual_positions", "cope_logits", "apply_xpos",
           "kerple_bias", "fire_bias", "fit_fire_to_bias"]
