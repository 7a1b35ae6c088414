"""The math of SSD / Saguaro, pure torch (no SGLang, no sockets).

- :mod:`.probs`: ``SparseProbs`` (compact exact q′), point masses, uniforms, inverse-CDF sampling.
- :mod:`.sampling_params`: ``SamplingBatch`` and the target's processed distribution p.
- :mod:`.saguaro`: σ_{F,C} draft sampling → (tokens, q′).
- :mod:`.verify`: exact chain verification ``verify_chain`` → ``ChainVerifyResult`` (k, tokens, bonus).
"""

from .probs import SparseProbs, draw_uniforms, point_mass, sample_from_weights, sample_proposal
from .saguaro import saguaro_probs, saguaro_sample
from .sampling_params import SamplingBatch, apply_penalties, filter_probs, process_logits
from .verify import ChainVerifyResult, dense_proposal, verify_chain, verify_chain_probs

__all__ = [
    "ChainVerifyResult",
    "SamplingBatch",
    "SparseProbs",
    "apply_penalties",
    "dense_proposal",
    "draw_uniforms",
    "filter_probs",
    "point_mass",
    "process_logits",
    "sample_from_weights",
    "sample_proposal",
    "saguaro_probs",
    "saguaro_sample",
    "verify_chain",
    "verify_chain_probs",
]
