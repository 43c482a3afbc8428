"""Run Hydra sweep jobs as Ray jobs through the Ray Jobs API (``ray.job_submission``).

The Hydra side (``launch``) turns each job's overrides into a :class:`JobSpec`: the command
``python train.py <overrides> hydra.run.dir=<sweep_dir>/<subdir> hydra.job.num=<n> hydra.job.id=<id>``
plus a runtime_env. :class:`RayJobsRunner` submits the specs with ``JobSubmissionClient.submit_job``,
keeps at most ``max_concurrent_jobs`` of them active, polls ``get_job_info`` every
``poll_interval_s`` seconds, prints new lines of ``get_job_logs`` prefixed with the job number
(plain HTTP requests like every other Jobs API call, so they pass wherever those do, e.g. the
sagemaker_ray endpoint; the websocket ``tail_job_logs`` is not used; a log past 1 MB is fetched
less often, about 1 MB per poll),
stops jobs that stay PENDING longer than ``pending_timeout_s`` seconds, and turns every job into an
:class:`Outcome` (the parsed ``result.json``, or the reason it failed with the tail of its log).

Where results come from: the job writes ``result.json`` into its own folder (``hydra.run.dir``).
When that folder is readable here (a local cluster, or a filesystem both sides mount) it is read
directly; otherwise the entrypoint prints the file after a marker line and it is taken from the
job's log. Either way a copy lands in the submitting side's ``hydra.sweep.dir/<subdir>`` together
with ``.hydra/overrides.yaml``, ``ray_job.json`` (submission id, status, timings) and
``ray_job.log``, so the sweep summary (``rlkit.sweep``), which reads ``<hydra.sweep.dir>/*/``,
works the same for a local cluster and for HyperPod.

Upstream behaviour followed (Ray 2.60 Jobs API):
- ``JobSubmissionClient(address)``: ``http(s)://`` is the dashboard; ``<module>://rest`` imports
  ``<module>`` and calls its ``get_job_submission_client_cluster_info(rest, ...)``, which is how
  ``sagemaker_ray://`` reaches the toolkit-for-ray-on-sagemaker-ai package. Ray lets the
  ``RAY_API_SERVER_ADDRESS`` / ``RAY_ADDRESS`` variables override the address it is given; here an
  explicit address wins (they are hidden while the client is built) and ``address=None`` keeps
  Ray's resolution.
- The entrypoint runs under ``/bin/sh`` (``subprocess.Popen(shell=True)``) in the job's working_dir.
- ``stop_job`` on a PENDING job is only a request: Ray keeps it PENDING until its supervisor can be
  scheduled or ``RAY_JOB_START_TIMEOUT_SECONDS`` (cluster side, default 900 s) marks it FAILED.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import logging
import os
import re
import shlex
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence
from urllib.parse import urlsplit

from rlkit.run_folder import ERROR_FILE

log = logging.getLogger(__name__)

RESULT_MARKER = "==> rlkit result.json <=="
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./+@%-]+")
_MARKER_LINE = re.compile(r"^" + re.escape(RESULT_MARKER) + r"[ \t]*\r?$", re.MULTILINE)
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
LOG_BYTES_PER_POLL = 1_000_000
#: A job log that shows a refused config or checkpoint, or an error raised in a worker that was not a lost worker (a
#: bug, rlkit.recipes.heal.WorkerError): resubmitting it would fail the same way (no retry).
REFUSED = re.compile(r"\[rlkit\] (config|checkpoint|worker) error"
                     r"|\b(ConfigError|CheckpointError|ConfigCompositionException|WorkerError)\b")
SCHEME_PACKAGES = {"sagemaker_ray": "toolkit-for-ray-on-sagemaker-ai"}
_ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")


class LauncherError(RuntimeError):
    """The sweep cannot be launched or followed (bad config, unreachable cluster); names the fix."""


class RayJobFailed(RuntimeError):
    """A sweep job did not complete; the message holds its status, Ray's message and its log tail."""


# ----------------------------------------------------------------------------------------------
# settings, specs, outcomes


@dataclass
class Settings:
    """Plain (resolved) launcher settings; fields as in ``launchers.config.RayJobsLauncherConf``."""

    address: Optional[str] = "http://127.0.0.1:8265"
    verify: Any = True
    local_cluster: Optional[bool] = None
    sweep_dir: Optional[str] = None
    working_dir: str = "auto"
    code_dir: Optional[str] = None
    excludes: list[str] = field(default_factory=list)
    python: Optional[str] = None
    entrypoint_num_cpus: float = 1.0
    entrypoint_num_gpus: float = 0.0
    entrypoint_memory: Optional[int] = None
    entrypoint_resources: dict[str, float] = field(default_factory=dict)
    runtime_env: dict[str, Any] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    pass_env: list[str] = field(default_factory=list)
    max_concurrent_jobs: int = 2
    poll_interval_s: float = 5.0
    pending_timeout_s: float = 600.0
    unreachable_timeout_s: float = 300.0
    stream_logs: bool = True
    log_tail_lines: int = 40
    max_retries: int = 1
    retry_stopped: bool = False

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


@dataclass
class JobSpec:
    """One sweep job, ready to submit. ``job_dir`` is cluster-side, ``local_dir`` submitter-side."""

    num: int
    overrides: list[str]
    job_dir: str
    local_dir: Path
    entrypoint: str
    runtime_env: dict[str, Any]
    submission_id: str
    metadata: dict[str, str]


@dataclass
class Outcome:
    """How one job ended: ``result`` (parsed result.json) when ``ok``, else ``error``; ``attempts``: submissions."""

    spec: JobSpec
    ok: bool
    status: str
    result: Optional[dict] = None
    error: Optional[str] = None
    logs: str = ""
    attempts: int = 1


@dataclass
class _Active:
    spec: JobSpec
    submitted_at: float
    status: str = "PENDING"
    started_at: Optional[float] = None
    printed: int = 0          # characters of the log already echoed
    partial: str = ""         # an unterminated last line, held back until it completes
    muted: bool = False       # past the result marker: the result JSON is not echoed
    next_log_at: float = 0.0  # clock time of the next log fetch while RUNNING
    attempt: int = 1          # submissions of this job so far (hydra.launcher.max_retries)


# ----------------------------------------------------------------------------------------------
# client


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


def _is_auth_error(e: BaseException) -> bool:
    text = str(e)
    return type(e).__name__ == "AuthenticationError" or "status code 401" in text or "status code 403" in text


def _is_connection_error(e: BaseException) -> bool:
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    try:
        import requests

        return isinstance(e, (requests.ConnectionError, requests.Timeout))
    except ImportError:
        return False


# ----------------------------------------------------------------------------------------------
# entrypoint, runtime_env, results


def hydra_quote(value: str) -> str:
    """``value`` as a Hydra override value: as is when it only has path-safe characters, else
    single-quoted with quotes and backslashes escaped (Hydra's override grammar)."""
    if _HYDRA_PLAIN.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_entrypoint(python: str, script: str, overrides: Sequence[str], job_dir: str, num: int,
                     job_id: str, cd: Optional[str] = None, threads: Optional[int] = None) -> str:
    """The shell command of one job.

    ``<python> <script> <overrides...> hydra.run.dir='<job_dir>' hydra.job.num=<num>
    hydra.job.id=<job_id> && echo <marker> && cat <job_dir>/result.json``, each argument quoted
    with shlex so ``/bin/sh`` passes the overrides to Hydra unchanged, prefixed with
    ``cd <cd> &&`` when the job runs in place. With ``threads``, the program runs with
    ``OMP_NUM_THREADS=${OMP_NUM_THREADS:-<threads>}``: the entrypoint's CPUs unless the job's env sets
    it, for the entrypoint process only (the job's Ray tasks and actors keep their own), so an rlkit
    job's one-time builds (``trainer.build_threads=null``) take its share of a node other jobs share.
    """
    argv = [python, script, *overrides, f"hydra.run.dir={hydra_quote(job_dir)}",
            f"hydra.job.num={num}", f"hydra.job.id={job_id}"]
    cmd = shlex.join(argv)
    if threads is not None:
        cmd = f"OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{int(threads)}}} {cmd}"
    # The marker is echoed as two words so that the command text itself, which Ray writes into the
    # log ("Running entrypoint for job ..."), never contains the marker line.
    head, tail = RESULT_MARKER.split(" ", 1)
    cmd += (f" && echo {shlex.quote(head)} {shlex.quote(tail)}"
            f" && cat {shlex.quote(job_dir.rstrip('/') + '/result.json')}")
    if cd:
        cmd = f"cd {shlex.quote(cd)} && {cmd}"
    return cmd


def result_from_logs(logs: str) -> Optional[dict]:
    """The JSON object printed after the last result marker line of a job log, or None."""
    i = _marker_at(logs)
    if i < 0:
        return None
    text = logs[i + len(RESULT_MARKER):].lstrip()
    try:
        obj, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _marker_at(logs: str) -> int:
    """Offset of the last line that is exactly the result marker, or -1."""
    at = -1
    for m in _MARKER_LINE.finditer(logs):
        at = m.start()
    return at


def log_tail(logs: str, n: int) -> str:
    """The last ``n`` lines of a log, without the result block."""
    i = _marker_at(logs)
    if i >= 0:
        logs = logs[:i]
    lines = logs.rstrip("\n").splitlines()
    return "\n".join(lines[-n:])


def job_env_vars(settings: Settings, environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """``env_vars`` plus each ``pass_env`` name set in ``environ`` (values are never logged)."""
    environ = os.environ if environ is None else environ
    env = {str(k): str(v) for k, v in settings.env_vars.items()}
    for name in settings.pass_env:
        if name in environ and name not in env:
            env[name] = environ[name]
    return env


def runtime_env_for(settings: Settings, code_dir: Path, env_vars: dict[str, str]) -> dict[str, Any]:
    """The runtime_env of every job: ``runtime_env`` extras, working_dir per mode, env_vars."""
    renv: dict[str, Any] = copy.deepcopy(dict(settings.runtime_env))
    mode = resolved_mode(settings)
    if mode == "upload":
        renv["working_dir"] = str(code_dir)
        renv["excludes"] = list(settings.excludes) + list(renv.get("excludes", []))
    elif mode == "uri":
        renv["working_dir"] = settings.working_dir
    if env_vars:
        renv["env_vars"] = env_vars
    return renv


def resolved_mode(settings: Settings) -> str:
    """``in_place``, ``upload`` or ``uri`` (``auto`` decided by whether the cluster is local)."""
    if settings.working_dir == "auto":
        return "in_place" if settings.is_local() else "upload"
    if "://" in settings.working_dir:
        return "uri"
    return settings.working_dir


# ----------------------------------------------------------------------------------------------
# runner


class RayJobsRunner:
    """Submits, follows and collects a batch of :class:`JobSpec` on one Ray cluster.

    ``client_factory`` builds a ``JobSubmissionClient``; it is called again when the cluster
    rejects the session (HTTP 401/403), e.g. when a HyperPod session cookie expires after its six
    hours, so a long sweep re-authenticates through the sagemaker_ray toolkit and carries on.
    ``echo`` prints console lines (job logs and state changes); ``clock``/``sleep`` are seams for tests.
    """

    def __init__(self, settings: Settings, client_factory: Callable[[], Any],
                 echo: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.s = settings
        self._factory = client_factory
        self._client = None
        self.echo = echo
        self.clock = clock
        self.sleep = sleep
        self._down_since: Optional[float] = None

    # -- client calls with re-authentication and outage tolerance --------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        reauthed = False
        while True:
            try:
                out = fn(self.client)
                self._down_since = None
                return out
            except LauncherError:
                raise
            except Exception as e:  # noqa: BLE001 - classified below, re-raised otherwise
                if _is_auth_error(e) and not reauthed:
                    log.warning("Ray Jobs API rejected the session during %s (%s); reconnecting", what, e)
                    self._client = None
                    reauthed = True
                    continue
                if _is_connection_error(e):  # keep the client: a new one would fail to connect as well
                    now = self.clock()
                    if self._down_since is None:
                        self._down_since = now
                    if now - self._down_since > self.s.unreachable_timeout_s:
                        raise LauncherError(
                            f"The Ray Jobs API at {self.s.address} has been unreachable for "
                            f"{now - self._down_since:.0f} s (during {what}): {e}. Submitted jobs keep running "
                            "on the cluster; follow them with `ray job list/logs --address <address>`, or raise "
                            "hydra.launcher.unreachable_timeout_s.") from e
                    log.warning("Ray Jobs API unreachable during %s (%s); retrying", what, e)
                    self.sleep(min(self.s.poll_interval_s, 5.0))
                    continue
                raise

    # -- main loop -------------------------------------------------------------------------------
    def run(self, specs: Sequence[JobSpec]) -> list[Outcome]:
        """Run all ``specs`` (at most ``max_concurrent_jobs`` at a time); outcomes in spec order.

        Raises: LauncherError when the cluster cannot be reached; KeyboardInterrupt after asking
        the cluster to stop every job of this batch still active.
        """
        queue = list(specs)
        active: list[_Active] = []
        done: dict[int, Outcome] = {}
        try:
            while queue or active:
                while queue and len(active) < self.s.max_concurrent_jobs:
                    spec = queue.pop(0)
                    outcome = self._submit(spec)
                    if outcome is not None:
                        done[spec.num] = outcome
                    else:
                        active.append(_Active(spec, submitted_at=self.clock()))
                for a in list(active):
                    outcome = self._poll(a)
                    if outcome is not None:
                        active.remove(a)
                        done[a.spec.num] = outcome
                if active or queue:
                    self.sleep(self.s.poll_interval_s)
        except KeyboardInterrupt:
            for a in active:
                self.echo(f"[job {a.spec.num}] interrupted: stopping {a.spec.submission_id}")
                with contextlib.suppress(Exception):
                    self.client.stop_job(a.spec.submission_id)
            raise
        return [done[s.num] for s in specs]

    def _submit(self, spec: JobSpec, attempt: int = 1) -> Optional[Outcome]:
        s = self.s
        # an earlier attempt's error is not this attempt's: from here on error.txt is written by this job (rlkit.run,
        # in a shared folder) or by _record_failure, so the sweep summary never shows a stale one
        with contextlib.suppress(OSError):
            (spec.local_dir / ERROR_FILE).unlink(missing_ok=True)
        kwargs: dict[str, Any] = dict(
            entrypoint=spec.entrypoint, submission_id=spec.submission_id, runtime_env=spec.runtime_env,
            metadata=spec.metadata, entrypoint_num_cpus=s.entrypoint_num_cpus,
            entrypoint_num_gpus=s.entrypoint_num_gpus)
        if s.entrypoint_memory:
            kwargs["entrypoint_memory"] = int(s.entrypoint_memory)
        if s.entrypoint_resources:
            kwargs["entrypoint_resources"] = {k: float(v) for k, v in s.entrypoint_resources.items()}
        try:
            self._call("submit_job", lambda c: c.submit_job(**kwargs))
        except LauncherError:
            raise
        except Exception as e:  # noqa: BLE001 - the cluster refused this job: report it as FAILED
            msg = f"submission refused by the cluster: {type(e).__name__}: {e}"
            self.echo(f"[job {spec.num}] {msg}")
            _record_failure(spec, msg, ran=False)
            return Outcome(spec, ok=False, status="NOT_SUBMITTED", error=msg)
        self.echo(f"[job {spec.num}] submitted {spec.submission_id}: {' '.join(spec.overrides) or '(no overrides)'}")
        _write_json(spec.local_dir / "ray_job.json", {**_record(spec, self.s), "status": "PENDING", "attempts": attempt})
        return None

    def _poll(self, a: _Active) -> Optional[Outcome]:
        info = self._call("get_job_info", lambda c: c.get_job_info(a.spec.submission_id))
        status = str(info.status)
        terminal = status in ("SUCCEEDED", "FAILED", "STOPPED")
        if status != a.status and not terminal:
            self.echo(f"[job {a.spec.num}] {status}")
        if status == "RUNNING" and a.started_at is None:
            a.started_at = self.clock()
        a.status = status
        if status == "RUNNING" and self.s.stream_logs and self.clock() >= a.next_log_at:
            logs = self._logs(a)
            self._echo_new(a, logs)
            # get_job_logs returns the whole log: past 1 MB, fetch it less often (about 1 MB per poll).
            a.next_log_at = self.clock() + self.s.poll_interval_s * (len(logs) / LOG_BYTES_PER_POLL)
        if status == "PENDING":
            waited = self.clock() - a.submitted_at
            if waited > self.s.pending_timeout_s:
                return self._pending_timeout(a, waited, info)
            return None
        if not terminal:
            return None
        logs = self._logs(a)
        if self.s.stream_logs:
            self._echo_new(a, logs, final=True)
        self.echo(f"[job {a.spec.num}] {status}")
        outcome = self._finish(a, status, info, logs)
        if outcome.ok or not self._retry(a, outcome):
            return outcome
        return None

    def _retry(self, a: _Active, outcome: Outcome) -> bool:
        """Resubmit a FAILED job into its own folder (it resumes from its latest checkpoint) unless its config or
        checkpoint was refused, a worker raised a bug (``REFUSED``) or ``max_retries`` resubmissions are spent; a
        STOPPED one (stopped by someone: ``ray job stop``, the dashboard) only with ``retry_stopped``. True when it
        was resubmitted."""
        if outcome.status == "STOPPED" and not self.s.retry_stopped:
            if self.s.max_retries:
                self.echo(f"[job {a.spec.num}] STOPPED: not resubmitted (a stopped job stays stopped; "
                          "hydra.launcher.retry_stopped=true resubmits it)")
            return False
        if a.attempt > self.s.max_retries or REFUSED.search(outcome.logs or "") or _refused_in_folder(a.spec):
            return False
        spec = replace(a.spec, submission_id=f"{a.spec.submission_id.split('-retry')[0]}-retry{a.attempt}")
        self.echo(f"[job {spec.num}] {outcome.status} on attempt {a.attempt} of {self.s.max_retries + 1}: "
                  "resubmitting into the same folder, where it resumes from its latest checkpoint")
        if self._submit(spec, attempt=a.attempt + 1) is not None:
            return False  # the cluster refused the resubmission: the first failure stands
        a.spec, a.attempt, a.submitted_at, a.status = spec, a.attempt + 1, self.clock(), "PENDING"
        a.started_at, a.printed, a.partial, a.muted, a.next_log_at = None, 0, "", False, 0.0
        return True

    def _logs(self, a: _Active) -> str:
        try:
            return self._call("get_job_logs", lambda c: c.get_job_logs(a.spec.submission_id)) or ""
        except LauncherError:
            raise
        except Exception as e:  # noqa: BLE001 - logs are best effort; the status decides the outcome
            log.warning("could not read the log of job %d (%s): %s", a.spec.num, a.spec.submission_id, e)
            return ""

    def _echo_new(self, a: _Active, logs: str, final: bool = False) -> None:
        if len(logs) < a.printed:  # the log was rotated or truncated: start over
            a.printed, a.partial = 0, ""
        chunk = a.partial + logs[a.printed:]
        a.printed = len(logs)
        lines = chunk.split("\n")
        rest = lines.pop()  # text after the last newline ("" when the chunk ends with one)
        if final:
            a.partial = ""
            if rest:
                lines.append(rest)
        else:
            a.partial = rest
        for line in lines:
            if line.strip() == RESULT_MARKER:
                a.muted = True
            if not a.muted:
                self.echo(f"[job {a.spec.num}] {line}")

    def _pending_timeout(self, a: _Active, waited: float, info: Any) -> Outcome:
        s = self.s
        with contextlib.suppress(Exception):
            self._call("stop_job", lambda c: c.stop_job(a.spec.submission_id))
        wanted = (f"entrypoint_num_cpus={s.entrypoint_num_cpus}, entrypoint_num_gpus={s.entrypoint_num_gpus}"
                  + (f", entrypoint_memory={s.entrypoint_memory}" if s.entrypoint_memory else "")
                  + (f", entrypoint_resources={dict(s.entrypoint_resources)}" if s.entrypoint_resources else ""))
        msg = (f"job {a.spec.num} ({a.spec.submission_id}) stayed PENDING for {waited:.0f} s "
               f"(hydra.launcher.pending_timeout_s={s.pending_timeout_s:g}) and was stopped. It asked for "
               f"{wanted}: no node of the cluster had these free, or its runtime_env took that long to build. "
               "Fix: lower the hydra.launcher.entrypoint_* resources, add nodes (`ray status` shows what is "
               "free), lower max_concurrent_jobs, or raise pending_timeout_s. Ray said: "
               f"{getattr(info, 'message', '') or '-'}")
        self.echo(f"[job {a.spec.num}] {msg}")
        _write_json(a.spec.local_dir / "ray_job.json", {**_record(a.spec, s), "status": "PENDING_TIMEOUT",
                                                        "message": msg})
        _record_failure(a.spec, msg, ran=False)
        return Outcome(a.spec, ok=False, status="PENDING_TIMEOUT", error=msg)

    def _finish(self, a: _Active, status: str, info: Any, logs: str) -> Outcome:
        spec = a.spec
        spec.local_dir.mkdir(parents=True, exist_ok=True)
        (spec.local_dir / "ray_job.log").write_text(logs)
        record = {**_record(spec, self.s), "status": status, "attempts": a.attempt,
                  "message": getattr(info, "message", None),
                  "driver_exit_code": getattr(info, "driver_exit_code", None),
                  "run_time_s": None if a.started_at is None else round(self.clock() - a.started_at, 1)}
        _write_json(spec.local_dir / "ray_job.json", record)
        if status == "SUCCEEDED":
            result = _read_result(spec, logs)
            if result is not None:
                # this job's result, over an earlier run's copy too. Written even where the job's folder looks like
                # this one: with hydra.launcher.sweep_dir=null a remote cluster writes to the same path on its own
                # disk. In a folder the job shares with us it rewrites what the job wrote.
                _write_json(spec.local_dir / "result.json", result)
                return Outcome(spec, ok=True, status=status, result=result, logs=logs, attempts=a.attempt)
            error = (f"job {spec.num} ({spec.submission_id}) SUCCEEDED but wrote no result.json: not at "
                     f"{spec.job_dir}/result.json and not in its log.")
        else:
            # Ray appends the last 20,000 characters of the log to its message; the tail follows below.
            message = (getattr(info, "message", "") or "no message from Ray").split("\n")[0]
            message = re.sub(r",? last available logs.*$", "", message)
            error = f"job {spec.num} ({spec.submission_id}) {status}: {message}"
        tail = log_tail(logs, self.s.log_tail_lines)
        error += (f"\noverrides: {' '.join(spec.overrides) or '(none)'}"
                  f"\n--- last {self.s.log_tail_lines} log lines ---\n{tail or '(empty log)'}\n---"
                  f"\nfull log: {spec.local_dir / 'ray_job.log'}")
        _record_failure(spec, error, ran=True)
        return Outcome(spec, ok=False, status=status, error=error, logs=logs, attempts=a.attempt)


def _record_failure(spec: JobSpec, error: str, ran: bool) -> None:
    """Write ``error.txt`` (rlkit.run_folder.ERROR_FILE) into the job's local folder, which the sweep summary
    (rlkit.sweep) reads: without it, an earlier run's ``result.json`` there would list this failed job as
    completed, with that run's numbers. A job that ran in this very folder (a local cluster, a shared
    filesystem) and failed inside rlkit has written its own, with the traceback: that one is kept (an earlier
    attempt's was removed at submission, ``RayJobsRunner._submit``)."""
    path = spec.local_dir / ERROR_FILE
    if ran and path.is_file() and _same_folder(spec.local_dir, Path(spec.job_dir)):
        return
    try:
        _write_text(path, f"RayJobFailed: {error}\n")
    except OSError as e:  # the outcome still reaches Hydra as FAILED
        log.warning("could not write %s: %s", path, e)


def _refused_in_folder(spec: JobSpec) -> bool:
    """Whether the job, in a folder this machine shares with it, wrote an error.txt (rlkit.run) saying its config or
    checkpoint was refused."""
    path = spec.local_dir / ERROR_FILE
    if not _same_folder(spec.local_dir, Path(spec.job_dir)) or not path.is_file():
        return False
    try:
        return bool(REFUSED.search(path.read_text(errors="replace").split("\n", 1)[0]))
    except OSError:
        return False


def _read_result(spec: JobSpec, logs: str) -> Optional[dict]:
    """The job's result: the ``result.json`` its entrypoint printed into its log (on the cluster, after the job),
    else the file at its ``job_dir`` as this machine sees it (a shared folder; on a remote cluster's own disk that
    path may hold an earlier run's file, so the log comes first)."""
    result = result_from_logs(logs)
    if result is not None:
        return result
    path = Path(spec.job_dir) / "result.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            log.warning("could not read %s (%s)", path, e)
    return None


def _record(spec: JobSpec, s: Settings) -> dict[str, Any]:
    renv = dict(spec.runtime_env)
    if "env_vars" in renv:  # names only: values may be secrets
        renv["env_vars"] = sorted(renv["env_vars"])
    return {"job": spec.num, "submission_id": spec.submission_id, "address": s.address,
            "overrides": spec.overrides, "job_dir": spec.job_dir, "entrypoint": spec.entrypoint,
            "runtime_env": renv}


def _write_json(path: Path, obj: Any) -> None:
    _write_text(path, json.dumps(obj, indent=2, default=str))


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _same_folder(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` are one folder (a local cluster, or the sweep on a shared filesystem)."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------
# Hydra side


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
    """Hydra ``Launcher.launch`` for the Ray Jobs launchers; returns one ``JobReturn`` per job.

    ``launcher`` carries ``settings`` (:class:`Settings`), ``config``, ``hydra_context`` and
    ``task_function`` as Hydra's ``Launcher.setup`` stored them. COMPLETED JobReturns hold the
    parsed result.json as ``return_value``; FAILED ones hold a :class:`RayJobFailed`.

    Hydra's BasicSweeper raises the first failed job's error right after ``launch`` returns, which
    skips ``on_multirun_end``; so with that sweeper, when a job failed, the ``on_multirun_end``
    callbacks (the sweep summary) run here before returning.

    Raises: LauncherError for a bad config or an unreachable cluster.
    """
    from hydra.core.utils import JobReturn, JobStatus, setup_globals
    from omegaconf import OmegaConf, open_dict, read_write

    from rlkit.run_folder import SWEPT_KEYS_ENV, sweep_group_name, swept_keys_of

    setup_globals()
    s: Settings = launcher.settings
    s.validate()
    config = launcher.config
    hydra_context = launcher.hydra_context

    local_sweep = Path(str(config.hydra.sweep.dir)).absolute()
    cluster_sweep = launcher.cluster_sweep_dir
    if cluster_sweep is None:  # resolved once per sweep, on this side
        cluster_sweep = os.path.normpath(s.sweep_dir) if s.sweep_dir else str(local_sweep)
        launcher.cluster_sweep_dir = cluster_sweep
    local_sweep.mkdir(parents=True, exist_ok=True)

    code_dir = Path(s.code_dir or os.path.dirname(os.path.abspath(sys.argv[0]))).resolve()
    script = Path(os.path.abspath(sys.argv[0])).resolve()
    try:
        script_rel = script.relative_to(code_dir).as_posix()
    except ValueError:
        raise LauncherError(f"The task script {script} is not under hydra.launcher.code_dir={code_dir}; "
                            "set code_dir to a folder that holds it.") from None
    mode = resolved_mode(s)
    python = s.python or (sys.executable if s.is_local() else "python")
    env_vars = job_env_vars(s)
    if "WANDB_RUN_GROUP" not in env_vars:  # the local launcher's W&B group for the sweep (rlkit.backends)
        env_vars["WANDB_RUN_GROUP"] = sweep_group_name(local_sweep)
    # each job is a single run on the cluster: tell it which keys this sweep sweeps, so that a sweep rerun into
    # the same folders with other values is refused there as in a local multirun (rlkit.run_folder.SWEPT_KEYS_ENV)
    env_vars[SWEPT_KEYS_ENV] = ",".join(sorted(swept_keys_of(
        list(OmegaConf.select(config, "hydra.overrides.task", default=None) or []))))
    renv = runtime_env_for(s, code_dir, env_vars)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = uuid.uuid4().hex[:6]

    specs, sweep_cfgs = [], {}
    log.info("Launching %d jobs on Ray at %s (code: %s %s, jobs write to %s)", len(job_overrides),
             s.address or "Ray's default address", mode, code_dir if mode != "uri" else s.working_dir, cluster_sweep)
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"rlkit-{stamp}-{tag}-{num}"
            sweep_config.hydra.job.num = num
        subdir = str(OmegaConf.select(sweep_config, "hydra.sweep.subdir"))
        job_dir = os.path.normpath(os.path.join(cluster_sweep, subdir))
        local_dir = local_sweep / subdir
        with read_write(sweep_config.hydra.runtime), open_dict(sweep_config.hydra.runtime):
            sweep_config.hydra.runtime.output_dir = job_dir
        sub_id = str(sweep_config.hydra.job.id)
        entry = build_entrypoint(python, script_rel, list(overrides), job_dir, num, sub_id,
                                 cd=str(code_dir) if mode == "in_place" else None,
                                 threads=max(1, int(s.entrypoint_num_cpus)))
        (local_dir / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(list(overrides)), local_dir / ".hydra" / "overrides.yaml")
        log.info("\t#%d : %s", num, " ".join(overrides))
        specs.append(JobSpec(num=num, overrides=list(overrides), job_dir=job_dir, local_dir=local_dir,
                             entrypoint=entry, runtime_env=renv, submission_id=sub_id,
                             metadata={"rlkit_sweep": str(local_sweep), "rlkit_job_num": str(num),
                                       "rlkit_overrides": " ".join(overrides)[:1000]}))
        sweep_cfgs[num] = sweep_config

    def factory() -> Any:
        return connect(s.address, s.verify)

    runner = RayJobsRunner(s, factory, echo=_echo)
    _ = runner.client  # connect first: an unreachable cluster fails before anything is submitted
    outcomes = runner.run(specs)

    returns = []
    for o in outcomes:
        sweep_config = sweep_cfgs[o.spec.num]
        ret = JobReturn()
        ret.overrides = list(o.spec.overrides)
        task_cfg = copy.deepcopy(sweep_config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        ret.cfg = task_cfg
        hydra_cfg = copy.deepcopy(sweep_config)
        with read_write(hydra_cfg), open_dict(hydra_cfg):
            for key in [k for k in hydra_cfg.keys() if k != "hydra"]:
                del hydra_cfg[key]
        ret.hydra_cfg = hydra_cfg
        ret.working_dir = o.spec.job_dir
        ret.task_name = str(OmegaConf.select(sweep_config, "hydra.job.name", default="task"))
        if o.ok:
            ret.status = JobStatus.COMPLETED
            ret.return_value = o.result
        else:
            ret.status = JobStatus.FAILED
            ret.return_value = RayJobFailed(o.error)
        returns.append(ret)

    failed = [o for o in outcomes if not o.ok]
    if failed:
        # Hydra reports the first failure with its full message; the others would be lost.
        log.error("%d of %d jobs failed: %s", len(failed), len(outcomes),
                  ", ".join(f"#{o.spec.num} {o.status}" for o in failed))
        for o in failed[1:]:
            log.error("%s", o.error)
        if str(OmegaConf.select(config, "hydra.sweeper._target_", default="")) == BASIC_SWEEPER:
            # BasicSweeper will raise the first failure and skip on_multirun_end: run it now.
            hydra_context.callbacks.on_multirun_end(
                config=config, config_name=OmegaConf.select(config, "hydra.job.config_name", default=None))
    return returns


def _echo(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
