"""The reward guard (time limit, clear errors, on_error) lives in the core: rlkit.reward_guard.

Re-exported here for reward authors and older imports.
"""

from rlkit.reward_guard import (  # noqa: F401
    DEFAULT_TIMEOUT_S,
    GUARD_KEYS,
    ON_ERROR,
    FailureCounter,
    GuardedReward,
    RewardError,
    RewardTimeoutError,
    safe_call,
    split_guard_keys,
)
