"""The polling runner: submits a batch of :class:`~launchers.ray_jobs.entrypoint.JobSpec` through the Ray Jobs API,
follows them and turns each into an :class:`~launchers.ray_jobs.records.Outcome`.

:class:`RayJobsRunner` submits the specs with ``JobSubmissionClient.submit_job``, keeps at most ``max_concurrent_jobs``
of them active, polls ``get_job_info`` every ``poll_interval_s`` seconds, prints new lines of ``get_job_logs``
prefixed with the job number (plain HTTP requests like every other Jobs API call, so they pass wherever those do,
e.g. the sagemaker_ray endpoint; the websocket ``tail_job_logs`` is not used; a log past 1 MB is fetched less often,
about 1 MB per poll), stops jobs that stay PENDING longer than ``pending_timeout_s`` seconds, resubmits failed ones
(``max_retries``), and turns every job into an Outcome (the parsed ``result.json``, or the reason it failed with the
tail of its log).

Upstream behaviour followed (Ray 2.60 Jobs API): ``stop_job`` on a PENDING job is only a request: Ray keeps it PENDING
until its supervisor can be scheduled or ``RAY_JOB_START_TIMEOUT_SECONDS`` (cluster side, default 900 s) marks it
FAILED.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

from launchers.ray_jobs.connection import is_auth_error, is_connection_error
from launchers.ray_jobs.entrypoint import RESULT_MARKER, JobSpec
from launchers.ray_jobs.records import (
    REFUSED, Outcome, job_record, log_tail, read_result, record_failure, refused_in_folder, write_json,
)
from launchers.ray_jobs.settings import LauncherError, Settings
from rlkit.run_folder import ERROR_FILE

log = logging.getLogger(__package__)  # one logger for the launcher: its lines name the package, not the module

LOG_BYTES_PER_POLL = 1_000_000


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
                if is_auth_error(e) and not reauthed:
                    log.warning("Ray Jobs API rejected the session during %s (%s); reconnecting", what, e)
                    self._client = None
                    reauthed = True
                    continue
                if is_connection_error(e):  # keep the client: a new one would fail to connect as well
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
        # in a shared folder) or by record_failure, so the sweep summary never shows a stale one
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
            record_failure(spec, msg, ran=False)
            return Outcome(spec, ok=False, status="NOT_SUBMITTED", error=msg)
        self.echo(f"[job {spec.num}] submitted {spec.submission_id}: {' '.join(spec.overrides) or '(no overrides)'}")
        write_json(spec.local_dir / "ray_job.json",
                   {**job_record(spec, self.s), "status": "PENDING", "attempts": attempt})
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
        if a.attempt > self.s.max_retries or REFUSED.search(outcome.logs or "") or refused_in_folder(a.spec):
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
        write_json(a.spec.local_dir / "ray_job.json", {**job_record(a.spec, s), "status": "PENDING_TIMEOUT",
                                                       "message": msg})
        record_failure(a.spec, msg, ran=False)
        return Outcome(a.spec, ok=False, status="PENDING_TIMEOUT", error=msg)

    def _finish(self, a: _Active, status: str, info: Any, logs: str) -> Outcome:
        spec = a.spec
        spec.local_dir.mkdir(parents=True, exist_ok=True)
        (spec.local_dir / "ray_job.log").write_text(logs)
        record = {**job_record(spec, self.s), "status": status, "attempts": a.attempt,
                  "message": getattr(info, "message", None),
                  "driver_exit_code": getattr(info, "driver_exit_code", None),
                  "run_time_s": None if a.started_at is None else round(self.clock() - a.started_at, 1)}
        write_json(spec.local_dir / "ray_job.json", record)
        if status == "SUCCEEDED":
            result = read_result(spec, logs)
            if result is not None:
                # this job's result, over an earlier run's copy too. Written even where the job's folder looks like
                # this one: with hydra.launcher.sweep_dir=null a remote cluster writes to the same path on its own
                # disk. In a folder the job shares with us it rewrites what the job wrote.
                write_json(spec.local_dir / "result.json", result)
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
        record_failure(spec, error, ran=True)
        return Outcome(spec, ok=False, status=status, error=error, logs=logs, attempts=a.attempt)
