"""The errors rlkit raises for things a user fixes: each message names the problem and the fix.

train.py prints them as one ``[rlkit] <kind>: <message>`` line instead of a traceback (the run folder's
error.txt keeps the traceback). Checkpoint problems are rlkit.checkpoint.CheckpointError.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting that cannot run: a bad value, an option a backend or env cannot honour, a missing capability.
    The message names the key and the override that fixes it."""


class DiskFullError(OSError):
    """A write failed because its filesystem is full; the message names the path."""


class EnvContractError(ConfigError):
    """An env broke rlkit.types' contract (docs/adding-an-env.md, section 1): refused before any work by
    rlkit.env_check.check_env, or raised from the env's own exception when its ``step`` raised during training.
    The message names the env class, the contract and the fix."""
