"""Step metrics as Ray metrics, so Prometheus scraping a Ray cluster (and Grafana) shows training curves.

Ray's metrics API (``ray.util.metrics``) records application metrics in the worker or driver that
sets them; each node's metrics agent serves them on its Prometheus endpoint
(``http://<node>:<metrics-export-port>/metrics``), next to Ray's own node and GPU metrics, which is
what the HyperPod observability stack (and any Prometheus scraping the Ray cluster) collects.
Ray exports a custom metric named ``X`` as ``ray_X``.

Mapping: every finite numeric step metric ``key`` becomes a ``ray.util.metrics.Gauge`` named
``metric_name(key)`` = ``rlkit_`` + the key with ``@`` -> ``_at_`` and any other character outside
``[A-Za-z0-9_]`` -> ``_``; e.g. ``eval/success_rate`` -> ``rlkit_eval_success_rate``, scraped as
``ray_rlkit_eval_success_rate``; ``timing/rollout`` (seconds) -> ``ray_rlkit_timing_rollout``.
A gauge keeps the last value set (Prometheus' gauge semantics), so a scrape shows the latest step.

Tags (Prometheus labels) on every gauge: ``run`` (the job's output folder, its last two path
parts: ``<date>/<time>`` for a single run, ``<sweep time>/<job number>`` in a sweep), ``group``
(the sweep group, ``sweep-<date>_<time>`` from ``rlkit.run_folder.sweep_group_name``, or ``none``) and
``overrides`` (the job's Hydra overrides).
There is no ``job`` label on purpose: Prometheus reserves ``job`` for the scrape job and would
rename ours to ``exported_job``.

When it is active (``mode``):
- ``auto`` (the default, and what every logger gets automatically, ``with_cluster_metrics``):
  only when this process is already part of a Ray cluster: Ray is initialized here (a Ray worker,
  actor or a driver that called ``ray.init``), or the process is the entrypoint of a Ray Job
  (Ray's job supervisor sets ``RAY_JOB_CONFIG_JSON_ENV_VAR``), in which case it connects to that
  cluster with ``ray.init(address="auto")``. It never starts Ray: the default CPU run exports nothing.
- ``on``: required; connects to ``address`` when Ray is not initialized and raises if no cluster
  is reachable there.
- ``off``: never.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from rlkit.loggers import MultiLogger, scalars

log = logging.getLogger(__name__)

PREFIX = "rlkit"
TAG_KEYS = ("run", "group", "overrides")
MODES = ("auto", "on", "off")
#: Set by Ray's job supervisor in the environment of a Ray Job's entrypoint.
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: Environment override of ``linger_s`` for the automatically added exporter (seconds).
LINGER_ENV = "RLKIT_RAY_METRICS_LINGER_S"
DEFAULT_LINGER_S = 12.0


def metric_name(key: str, prefix: str = PREFIX) -> str:
    """The Ray metric name of a step metric key (see the module docstring); Prometheus adds ``ray_``."""
    body = re.sub(r"[^A-Za-z0-9_]", "_", key.replace("@", "_at_"))
    return f"{prefix}_{body}"


class RayMetricsUnavailable(ConnectionError):
    """``logger=ray_metrics`` with ``mode=on`` found no Ray cluster to join; the message names the fixes."""


def ray_active() -> bool:
    """True when Ray is initialized in this process (checked without importing Ray)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def in_ray_job() -> bool:
    """True when this process is a Ray Job entrypoint (the supervisor's environment variable is set)."""
    return RAY_JOB_ENV in os.environ


def run_tags(output_dir: Path, run_name: str, group: str | None) -> dict[str, str]:
    """The label values of one job (see the module docstring)."""
    parts = Path(output_dir).resolve().parts
    return {"run": "/".join(parts[-2:]), "group": group or "none", "overrides": run_name}


class RayMetricsLogger:
    """A logger that sets one Ray ``Gauge`` per step metric (see the module docstring).

    Args (a ``logger.loggers.<name>`` entry with ``_target_: rlkit.metrics_export.RayMetricsLogger``):
        mode: ``auto`` | ``on`` | ``off``.
        address: Ray address for ``ray.init`` when this process must connect (``auto``: RAY_ADDRESS
            or the local node's cluster; a ``ray://`` client address does not carry metrics).
        prefix: metric name prefix (``rlkit``).
        linger_s: seconds ``finish`` waits after the last value so that Ray's metrics report
            (every ``metrics_report_interval_ms``, 10 s by default) carries the final values to the
            node's exporter before a driver that connected only for this disconnects.

    Tables and artifacts are not metrics: ignored.

    Raises:
        ValueError: an unknown mode.
        ConnectionError: mode ``on`` and no Ray cluster at ``address`` (at ``start``; in ``auto`` mode
            a failed connection of a Ray Job entrypoint is a warning and nothing is exported).
    """

    def __init__(self, mode: str = "auto", address: str = "auto", prefix: str = PREFIX,
                 linger_s: float = DEFAULT_LINGER_S):
        if mode not in MODES:
            raise ValueError(f"logger mode={mode!r} is not one of {', '.join(MODES)}")
        self.mode, self.address, self.prefix, self.linger_s = mode, address, prefix, float(linger_s)
        self.run_id: str | None = None
        self.active = False
        self.tags: dict[str, str] = {}
        self._gauges: dict[str, Any] = {}
        self._connected_here = False
        self._last_set = 0.0

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None,
              resume_id: str | None, resume_step: int = 0) -> str | None:
        self.tags = run_tags(output_dir, run_name, group)
        if self.mode == "off":
            return None
        if ray_active():
            self.active = True
        elif self.mode == "on" or in_ray_job():
            import ray

            try:
                ray.init(address=self.address, log_to_driver=False, configure_logging=False)
            except Exception as e:  # auto: metrics are an extra, the job goes on without them (warned)
                if self.mode == "on":
                    raise RayMetricsUnavailable(
                        f"logger ray_metrics (mode=on) could not connect to a Ray cluster at address="
                        f"{self.address!r}: {str(e).rstrip('. ')}. Start one (ray start --head "
                        f"--metrics-export-port=...), set RAY_ADDRESS or the logger's address (logger.address; "
                        f"logger.loggers.<name>.address under logger=multi), or its mode to auto (export only when "
                        f"the job runs inside Ray)"
                    ) from e
                log.warning("Ray metrics not exported: this Ray Job could not connect to its cluster (%s)", e)
                return None
            self._connected_here = self.active = True
        if self.active:
            log.info("exporting step metrics as Ray metrics %s_* with tags %s", self.prefix, self.tags)
        return None

    def gauge(self, key: str) -> Any:
        """The Gauge of metric ``key`` (created on first use)."""
        g = self._gauges.get(key)
        if g is None:
            from ray.util.metrics import Gauge

            g = Gauge(metric_name(key, self.prefix), description=f"rlkit step metric {key}", tag_keys=TAG_KEYS)
            g.set_default_tags(self.tags)
            self._gauges[key] = g
        return g

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.active:
            return
        for k, v in scalars(metrics).items():
            self.gauge(k).set(v)
        self.gauge("trainer/step").set(float(step))
        self._last_set = time.time()

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        pass

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        pass

    def finish(self) -> None:
        if self.active and self._connected_here:
            wait = self.linger_s - (time.time() - self._last_set)
            if wait > 0:
                time.sleep(wait)
            import ray

            ray.shutdown()
        self.active = self._connected_here = False


def with_cluster_metrics(logger: Any) -> Any:
    """``logger``, plus a ``RayMetricsLogger(mode="auto")`` when this process is in a Ray cluster
    (``ray_active()`` or ``in_ray_job()``) and the configured loggers hold no RayMetricsLogger yet.

    This is how every ``logger=`` option exports to Ray on a cluster without a config change, while
    the default CPU run (no Ray) gets ``logger`` back unchanged and never imports Ray. Its
    ``linger_s`` is ``RLKIT_RAY_METRICS_LINGER_S`` when set (e.g. 0 for short test jobs under Ray),
    else 12 s.

    Raises: ValueError when RLKIT_RAY_METRICS_LINGER_S is not a number.
    """
    if isinstance(logger, RayMetricsLogger):
        return logger
    if isinstance(logger, MultiLogger) and logger.find(RayMetricsLogger):
        return logger
    if not (ray_active() or in_ray_job()):
        return logger
    linger = float(os.environ.get(LINGER_ENV, DEFAULT_LINGER_S))
    return MultiLogger({"main": logger, "ray_metrics": RayMetricsLogger(mode="auto", linger_s=linger)})
