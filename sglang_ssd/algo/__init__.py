"""The math of SSD / Saguaro, pure torch (no SGLang, no sockets); usable by the SGLang worker and by
the draft server alike.

- :mod:`.probs`: ``SparseProbs`` (compact exact q′), point masses, uniforms, inverse-CDF sampling.
- :mod:`.sampling_params`: ``SamplingBatch`` and the target's processed distribution p.
- :mod:`.saguaro`: σ_{F,C} draft sampling → (tokens, q′).
- :mod:`.verify`: exact chain verification ``verify_chain`` → ``ChainVerifyResult`` (k, tokens, bonus).
- :mod:`.cascade`: multi-level verification (a verified block as the next level's draft).
- :mod:`.fanout`: geometric fan-out plan, online α / (r, c) estimators.
- :mod:`.cache`: the speculation cache table and its batched lookup; wire bytes per round.
- :mod:`.policy`: speedup model (Theorem 7, Corollary 9, Theorem 17) and the backup choice.
"""

from .cache import CacheLookup, SpeculationCache, bytes_per_round
from .cascade import CascadeDraft, cascade_draft, verify_cascade, verify_level
from .fanout import (
    AcceptanceEstimator,
    AdaptiveFanoutPlanner,
    MissExponentEstimator,
    acceptance_pmf,
    geometric_fanout,
    hit_probability,
    uniform_fanout,
)
from .policy import (
    BackupOption,
    BackupPolicy,
    batch_ssd_speedup,
    crossover_batch,
    expected_tokens,
    ssd_over_sd_bound,
)
from .probs import SparseProbs, draw_uniforms, point_mass, sample_from_weights, sample_proposal
from .saguaro import saguaro_probs, saguaro_sample
from .sampling_params import SamplingBatch, apply_penalties, filter_probs, process_logits
from .verify import ChainVerifyResult, dense_proposal, verify_chain, verify_chain_probs

__all__ = [
    "AcceptanceEstimator",
    "BackupOption",
    "BackupPolicy",
    "CacheLookup",
    "CascadeDraft",
    "ChainVerifyResult",
    "AdaptiveFanoutPlanner",
    "MissExponentEstimator",
    "SamplingBatch",
    "SparseProbs",
    "SpeculationCache",
    "acceptance_pmf",
    "apply_penalties",
    "batch_ssd_speedup",
    "bytes_per_round",
    "cascade_draft",
    "crossover_batch",
    "dense_proposal",
    "draw_uniforms",
    "expected_tokens",
    "filter_probs",
    "geometric_fanout",
    "hit_probability",
    "point_mass",
    "process_logits",
    "sample_from_weights",
    "sample_proposal",
    "saguaro_probs",
    "saguaro_sample",
    "ssd_over_sd_bound",
    "uniform_fanout",
    "verify_cascade",
    "verify_chain",
    "verify_chain_probs",
    "verify_level",
]
