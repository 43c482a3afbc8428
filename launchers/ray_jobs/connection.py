"""Reaching the Ray Jobs API: address checks and the ``JobSubmissionClient``, with errors that name the fix.

Upstream behaviour followed (Ray 2.60 Jobs API): ``JobSubmissionClient(address)``: ``http(s)://`` is the dashboard;
``<module>://rest`` imports ``<module>`` and calls its ``get_job_submission_client_cluster_info(rest, ...)``, which is
how ``sagemaker_ray://`` reaches the toolkit-for-ray-on-sagemaker-ai package. Ray lets the ``RAY_API_SERVER_ADDRESS``
/ ``RAY_ADDRESS`` variables override the address it is given; here an explicit address wins (they are hidden while
the client is built) and ``address=None`` keeps Ray's resolution.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from typing import Any, Iterator, Optional, Sequence

from launchers.ray_jobs.settings import LauncherError

log = logging.getLogger(__package__)  # one logger for the launcher: its lines name the package, not the module

SCHEME_PACKAGES = {"sagemaker_ray": "toolkit-for-ray-on-sagemaker-ai"}
_ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")


@contextlib.contextmanager
def _hidden_env(names: Sequence[str]) -> Iterator[dict[str, str]]:
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield saved
    finally:
        os.environ.update(saved)


def check_address(address: Optional[str]) -> Optional[str]:
    """Normalize a Jobs API address and check that its scheme can be resolved here.

    ``host:port`` becomes ``http://host:port`` (Ray would read a scheme-less address as a GCS
    address). For ``<module>://...`` the module must be importable, as Ray imports it by name.

    Raises: LauncherError naming the missing module and the package that provides it
    (``sagemaker_ray`` -> ``pip install toolkit-for-ray-on-sagemaker-ai``).
    """
    if address is None:
        return None
    address = address.strip().rstrip("/")
    if "://" not in address:
        return f"http://{address}"
    scheme = address.split("://", 1)[0]
    if scheme == "ray":
        raise LauncherError(
            f"hydra.launcher.address={address!r} is a Ray Client address; the Jobs API needs the dashboard "
            "address, e.g. http://<head>:8265.")
    if scheme not in ("http", "https") and importlib.util.find_spec(scheme) is None:
        pkg = SCHEME_PACKAGES.get(scheme)
        fix = (f"pip install {pkg}" if pkg else
               f"install the package that provides the `{scheme}` module, or use an http(s):// dashboard address")
        raise LauncherError(
            f"hydra.launcher.address={address!r}: Ray resolves '{scheme}://' addresses by importing a module "
            f"named '{scheme}', which is not installed in {sys.executable}. Fix: {fix}.")
    return address


def connect(address: Optional[str], verify: Any = True) -> Any:
    """A ``JobSubmissionClient`` for ``address``, with errors that say what to do.

    Raises: LauncherError when the dashboard cannot be reached, rejects the credentials, or the
    address module (e.g. the sagemaker_ray toolkit) cannot resolve the cluster.
    """
    from ray.job_submission import JobSubmissionClient

    address = check_address(address)
    hide = _ADDRESS_ENV if address is not None else ()
    with _hidden_env(hide) as hidden:
        if hidden:
            log.warning("hydra.launcher.address=%s is used; ignoring %s from the environment",
                        address, ", ".join(f"{k}={v}" for k, v in hidden.items()))
        try:
            return JobSubmissionClient(address, verify=verify)
        except ConnectionError as e:
            raise LauncherError(
                f"Cannot reach the Ray Jobs API at {address or 'the default address'}: {e}\n"
                "Start a cluster (`ray start --head --dashboard-host=127.0.0.1`), or set "
                "hydra.launcher.address to the dashboard address (http://<head>:8265).") from e
        except Exception as e:  # noqa: BLE001 - ray/toolkit raise many types; re-raised with context
            name = type(e).__name__
            if name == "AuthenticationError":
                hint = ("The cluster uses Ray token auth (`ray start` turns it on when ~/.ray/auth_token "
                        "exists and RAY_AUTH_MODE is unset): export RAY_AUTH_MODE=token, with the cluster's token "
                        "in RAY_AUTH_TOKEN or ~/.ray/auth_token, before launching; or start the cluster with "
                        "RAY_AUTH_MODE=disabled.")
            elif name in ("TokenAcquisitionError", "KubeconfigError"):
                hint = ("The sagemaker_ray toolkit could not authenticate: check `kubectl get rayclusters -n "
                        "<namespace>` works with the current kubeconfig context, that the RayCluster has the "
                        "HyperPod endpoint enabled, and that you created it (see docs/hyperpod.md).")
            else:
                hint = "Check hydra.launcher.address and that the cluster is running."
            raise LauncherError(f"Could not connect to the Ray Jobs API at {address}: {name}: {e}\n{hint}") from e


def is_auth_error(e: BaseException) -> bool:
    """Whether ``e`` says the cluster rejected the session (Ray's AuthenticationError, HTTP 401/403)."""
    text = str(e)
    return type(e).__name__ == "AuthenticationError" or "status code 401" in text or "status code 403" in text


def is_connection_error(e: BaseException) -> bool:
    """Whether ``e`` says the Jobs API could not be reached (a refused connection, a timeout)."""
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    try:
        import requests

        return isinstance(e, (requests.ConnectionError, requests.Timeout))
    except ImportError:
        return False
