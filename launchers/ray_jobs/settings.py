"""The Ray Jobs launchers' settings and errors.

:class:`Settings` is ``launchers.config.RayJobsLauncherConf`` itself (fields, defaults and their docs live there,
once), plus the checks and judgements the launcher makes on the resolved values.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from launchers.config import RayJobsLauncherConf

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


class LauncherError(RuntimeError):
    """The sweep cannot be launched or followed (bad config, unreachable cluster); names the fix."""


class RayJobFailed(RuntimeError):
    """A sweep job did not complete; the message holds its status, Ray's message and its log tail."""


@dataclass
class Settings(RayJobsLauncherConf):
    """Plain (resolved) launcher settings: the fields of ``launchers.config.RayJobsLauncherConf`` (``_target_``
    aside, which Hydra consumes), with plain values (no DictConfig)."""

    def validate(self) -> None:
        """Raises LauncherError naming the bad key and the fix."""
        if self.max_concurrent_jobs < 1:
            raise LauncherError(f"hydra.launcher.max_concurrent_jobs={self.max_concurrent_jobs}: must be >= 1.")
        if self.max_retries < 0:
            raise LauncherError(f"hydra.launcher.max_retries={self.max_retries}: must be >= 0 (0 = never resubmit).")
        for key in ("poll_interval_s", "pending_timeout_s", "unreachable_timeout_s"):
            if getattr(self, key) <= 0:
                raise LauncherError(f"hydra.launcher.{key}={getattr(self, key)}: must be > 0 seconds.")
        if self.working_dir not in ("auto", "in_place", "upload") and "://" not in self.working_dir:
            raise LauncherError(
                f"hydra.launcher.working_dir={self.working_dir!r}: use auto, in_place, upload, or a remote "
                "URI Ray accepts as runtime_env.working_dir (s3://..., gs://..., https://....zip).")
        if "working_dir" in self.runtime_env or "env_vars" in self.runtime_env:
            raise LauncherError(
                "hydra.launcher.runtime_env must not set working_dir or env_vars: use "
                "hydra.launcher.working_dir / hydra.launcher.env_vars, which the launcher merges.")

    def is_local(self) -> bool:
        """Whether the cluster runs on this machine (``local_cluster``, else judged from the address)."""
        if self.local_cluster is not None:
            return bool(self.local_cluster)
        if self.address is None:
            return True
        if "://" not in self.address:
            return False
        scheme, _ = self.address.split("://", 1)
        if scheme not in ("http", "https"):
            return False
        return (urlsplit(self.address).hostname or "") in LOCAL_HOSTS

