"""Checks that answer back: run a learner's solution on cases with known answers and say what is wrong.

``harness`` calls the learner's code and reads what it gave back (how every check answers is told there).
Each notebook's checks live in the module named after it: ``next_character`` (1), ``sampling`` (2),
``constrained_decoding`` (3), ``kv_cache`` (4), ``timing_and_memory`` (5), ``batching_and_streaming`` (6),
``serving`` (7), ``speculative_decoding`` (8) and ``shrinking_the_cache`` (9); all are imported from here.
"""
from __future__ import annotations

from .batching_and_streaming import check_filler_share, check_one_token_characters, check_right_padding
from .constrained_decoding import check_no_repeat_hook, check_quatrain_hook
from .kv_cache import check_cached_greedy
from .next_character import check_followers, check_half_cover, check_rank
from .sampling import check_top_k, check_top_p
from .serving import check_memory_shares, check_prefix_hits
from .shrinking_the_cache import check_bytes_per_token
from .speculative_decoding import check_best_gamma, check_blocks_to_free, check_kept_share
from .timing_and_memory import check_sequences_that_fit, check_token_forwards, check_tokens_to_match_weights

__all__ = [
    "check_rank", "check_followers", "check_half_cover",                                 # notebook 1
    "check_top_k", "check_top_p",                                                        # notebook 2
    "check_quatrain_hook", "check_no_repeat_hook",                                       # notebook 3
    "check_cached_greedy",                                                               # notebook 4
    "check_tokens_to_match_weights", "check_sequences_that_fit", "check_token_forwards",  # notebook 5
    "check_right_padding", "check_one_token_characters", "check_filler_share",           # notebook 6
    "check_memory_shares", "check_prefix_hits",                                          # notebook 7
    "check_best_gamma", "check_kept_share", "check_blocks_to_free",                      # notebook 8
    "check_bytes_per_token",                                                             # notebook 9
]
