"""Metric sinks: Weights & Biases (default), TensorBoard, console-only, and several at once.

Every run also writes ``metrics.jsonl`` in its output folder (one JSON object per logged step) no
matter which logger is chosen: reports (``scripts/report.py``) and the sweep summary read it.

The logger interface the training loop uses (``Logger``):
    start(output_dir, config, run_name, group, resume_id, resume_step=0) -> run id or None
    log(metrics, step)                       scalars, once per step (and per evaluation)
    log_table(key, columns, rows, step)      sample tables; PIL images in cells are images
    log_artifact(path, name, kind)           a folder (the LoRA adapter) as a versioned artifact
    finish()
``run_name`` is the job's Hydra overrides joined by commas (``rlkit.recipes.common.run_name``;
``default`` without any): a label for the sinks, not W&B's run name (``default_run_name``).

Options (conf/logger/*.yaml, ``logger=<name>``): ``wandb`` (default), ``console``, ``tensorboard``,
``multi`` (W&B + TensorBoard; its ``loggers`` mapping takes any logger configs). When the job runs
inside a Ray cluster, the step metrics are also exported as Ray metrics (``rlkit.metrics_export``).

W&B mode ``auto`` follows wandb's documented offline behaviour: ``WANDB_MODE`` when it is set,
otherwise online when wandb has credentials (``WANDB_API_KEY``, or the netrc entry ``wandb login``
writes; ``wandb_credentials``), otherwise offline (files under
``<output_dir>/wandb/offline-run-*``, uploadable later with ``wandb sync <that folder>``). A resumed
run passes the stored run id with ``resume="allow"`` (wandb's resume docs: continue the run with
that id if it exists, create it otherwise), so W&B continues the same run; offline, each segment is
its own ``offline-run-*`` folder with the same run id and ``wandb sync`` appends them to one run.

A logger may also have ``resume_history(lines, resume_step)``: called once after ``start`` when a
run resumes from a checkpoint, with the metrics.jsonl lines up to that checkpoint, so the sink can
add what it lost in the crash (``WandbLogger.resume_history``). Loggers without it are left alone.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Protocol

log = logging.getLogger(__name__)


class MetricsFile:
    """Appends ``{"step": s, **metrics}`` lines to ``path`` (flushed each call)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, metrics: dict[str, Any], step: int) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **_plain(metrics)}) + "\n")

    def read(self) -> list[dict[str, Any]]:
        """The complete lines as dicts, in order (a line torn by a crash mid-write is left out)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            return [json.loads(ln) for ln in f if ln.endswith(b"\n")]

    def num_lines(self) -> int:
        """Complete lines written so far (a checkpoint records it)."""
        if not self.path.exists():
            return 0
        with open(self.path, "rb") as f:
            return sum(1 for ln in f if ln.endswith(b"\n"))

    def truncate_lines(self, n: int) -> None:
        """Keep the first ``n`` complete lines (on resume: drop what was logged after the checkpoint,
        and a line torn by a crash mid-write); atomic (temp file + os.replace)."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            lines = [ln for ln in f if ln.endswith(b"\n")][:n]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(b"".join(lines))
        os.replace(tmp, self.path)


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v
    return out


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numeric entries of ``metrics`` as floats (bools count as 0/1; strings are dropped)."""
    out = {}
    for k, v in _plain(metrics).items():
        if isinstance(v, (bool, int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


class Logger(Protocol):
    """What the training loop calls; see the module docstring. ``run_id`` is set by ``start``."""

    run_id: str | None

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None,
              resume_id: str | None, resume_step: int = 0) -> str | None: ...

    def log(self, metrics: dict[str, Any], step: int) -> None: ...

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None: ...

    def log_artifact(self, path: Path, name: str, kind: str) -> None: ...

    def finish(self) -> None: ...


class ConsoleLogger:
    """No external service: metrics go to metrics.jsonl and the console progress only."""

    run_id: str | None = None

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None,
              resume_id: str | None, resume_step: int = 0) -> str | None:
        return None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        pass

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        pass

    def finish(self) -> None:
        pass


WANDB_MODES = ("auto", "online", "offline", "disabled")


def wandb_credentials() -> str | None:
    """Where wandb would find an API key for its server without asking: ``"WANDB_API_KEY"``,
    ``"WANDB_IDENTITY_TOKEN_FILE"``, or the path of the netrc file holding the key ``wandb login``
    wrote; None when there is none. Reads no network.

    Follows wandb's own lookup (``wandb.sdk.lib.wbauth``, wandb 0.31: the environment first, then
    ``wbauth.read_netrc_auth``): the netrc file is ``$NETRC``, else ``~/.netrc`` (``~/_netrc``),
    and its entry is the one for the host of ``$WANDB_BASE_URL`` (default ``https://api.wandb.ai``).
    A netrc entry wandb would reject (a malformed key, an invalid ``WANDB_BASE_URL``) counts as none,
    with a warning naming why; wandb's global settings file is not read.

    Raises: nothing (an unreadable netrc file is wandb's warning and counts as none).
    """
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return "WANDB_IDENTITY_TOKEN_FILE"
    from wandb.errors import AuthenticationError
    from wandb.sdk.lib import urls
    from wandb.sdk.lib.wbauth import wbnetrc

    host = os.environ.get("WANDB_BASE_URL") or urls.DEFAULT_BASE_URL
    try:
        found = wbnetrc.read_netrc_auth_with_source(host=wbnetrc.HostUrl(host))
    except (AuthenticationError, ValueError) as e:
        log.warning("W&B: ignoring the netrc credentials for %s (%s); logging offline", host, e)
        return None
    return found.source if found is not None else None


def check_wandb_mode(mode: str) -> None:
    """Raises: ValueError on a mode that is not one of ``WANDB_MODES``."""
    if mode not in WANDB_MODES:
        raise ValueError(f"logger.mode={mode!r} is not one of {', '.join(WANDB_MODES)}")


def resolve_wandb_mode(mode: str) -> str:
    """``auto`` -> ``WANDB_MODE`` if set, else online when wandb has credentials
    (``wandb_credentials``: ``WANDB_API_KEY`` or the netrc entry of ``wandb login``), else offline;
    the other modes unchanged. This is what ``wandb.init`` itself would do online, minus its
    interactive login prompt: a run never stops to ask for a key.

    Raises: ValueError on a mode that is not one of ``WANDB_MODES``.
    """
    check_wandb_mode(mode)
    if mode != "auto":
        return mode
    env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if env_mode in ("online", "offline", "disabled"):
        return env_mode
    if env_mode == "dryrun":  # wandb's old spelling of offline
        return "offline"
    return "online" if wandb_credentials() else "offline"


_DATE_DIR = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME_DIR = re.compile(r"\d{2}-\d{2}-\d{2}")
MAX_TAG_LEN = 64  # W&B refuses longer tags


def default_run_name(output_dir: str | Path, label: str) -> str:
    """The W&B run name when ``logger.name`` is null: ``<label>-<stamp>``, readable and one per run.

    ``stamp`` comes from the run's output folder, so a resumed run keeps its name:
    Hydra's default ``outputs/<YYYY-mm-dd>/<HH-MM-SS>`` -> ``YYYYmmdd-HHMMSS``; a sweep job's
    ``multirun/<YYYY-mm-dd>/<HH-MM-SS>/<n>`` -> ``YYYYmmdd-HHMMSS-<n>``; any other folder -> its last
    part (``<parent>-<n>`` for a sweep job numbered ``n``). Two runs started in different seconds
    get different names; the overrides are not in the name (the run's config and tags hold them).

    Raises: ValueError for an output folder without a name.
    """
    parts = Path(output_dir).parts
    if not parts or not Path(output_dir).name:
        raise ValueError(f"output folder {str(output_dir)!r} has no name to make a run name of")
    leaf = parts[-1]
    job = leaf if leaf.isdigit() else None
    head = parts[:-1] if job is not None else parts
    if len(head) >= 2 and _DATE_DIR.fullmatch(head[-2]) and _TIME_DIR.fullmatch(head[-1]):
        stamp = head[-2].replace("-", "") + "-" + head[-1].replace("-", "")
    else:
        stamp = head[-1] if head else leaf
    return "-".join(p for p in (label, stamp, job) if p)


def hydra_job() -> tuple[str, list[str]]:
    """(label, overrides) of the running Hydra job: the label is the chosen ``experiment``, else the
    ``env`` config's name, else ``rlkit`` (``/`` -> ``-``); the overrides are the job's task
    overrides (``hydra.overrides.task``). Outside a Hydra job: ``("rlkit", [])``."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except ValueError:
        return "rlkit", []
    choices = dict(hc.runtime.choices)
    label = choices.get("experiment") or choices.get("env") or "rlkit"
    return str(label).replace("/", "-"), [str(o) for o in hc.overrides.task]


class WandbLogger:
    """One Weights & Biases run per job; see the module docstring for modes and resume.

    Args (conf/logger/wandb.yaml): project, entity, group (None: the sweep's group in a multirun,
    ``rlkit.run_folder.sweep_group_name``), tags (the job's Hydra overrides are added, each one up to
    W&B's 64 characters), name (None: ``default_run_name``, e.g. ``smoke-20260101-120000``), mode
    (auto|online|offline|disabled), job_type (W&B's job type, "train").

    What a run holds: the resolved config (``wandb.config``) plus ``hydra_overrides`` (the job's
    override list, ``[]`` without any), every step's metrics with the step as
    W&B's ``_step``, ``eval/success_rate`` summarised as its maximum and its last value
    (``define_metric(summary="max,last")``), the ``eval/samples`` table at each evaluation (maze images with
    the path taken, model outputs, rewards), and the adapter artifact (type ``lora_adapter``).

    Raises: ValueError on an unknown mode (at construction, i.e. when the config is instantiated).
    """

    def __init__(self, project: str = "rlkit", entity: str | None = None, group: str | None = None,
                 tags: list[str] | None = None, name: str | None = None, mode: str = "auto",
                 job_type: str = "train"):
        check_wandb_mode(mode)
        self.project, self.entity, self.group = project, entity, group
        self.tags, self.name, self.mode, self.job_type = list(tags or []), name, mode, job_type
        self._run = None
        self._mode = "disabled"  # resolved at start
        self.run_id: str | None = None
        self.run_dir: Path | None = None  # the run's folder (offline-run-* / run-* under <output_dir>/wandb)

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None,
              resume_id: str | None, resume_step: int = 0) -> str | None:
        import wandb

        mode = self._mode = resolve_wandb_mode(self.mode)
        label, overrides = hydra_job()
        tags = self.tags + [o for o in overrides if len(o) <= MAX_TAG_LEN and o not in self.tags]
        self._run = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group or group,
            job_type=self.job_type,
            tags=tags,
            name=self.name or default_run_name(output_dir, label),
            config={**config, "hydra_overrides": overrides},
            dir=str(output_dir),
            mode=mode,
            id=resume_id,
            resume="allow" if resume_id else None,
            settings=wandb.Settings(console="off", quiet=True),
        )
        self.run_id = self._run.id
        if mode != "disabled":
            self._run.define_metric("eval/success_rate", summary="max,last")
            self.run_dir = Path(self._run.dir).parent
            hint = f"; upload later with: wandb sync {self.run_dir}" if mode == "offline" else ""
            log.info("W&B run %s (%s) in %s%s", self.run_id, mode, self.run_dir, hint)
        return self.run_id

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._run is not None:
            self._run.log(_plain(metrics), step=step)

    def resume_history(self, lines: list[dict[str, Any]], resume_step: int) -> dict[str, Any]:
        """Make this W&B run's history hold every step of ``lines`` exactly once, before training
        goes on from ``resume_step``.

        Why: wandb-core buffers what it writes, so a SIGKILL loses the rows of the last seconds (a
        short run's segment can be the 7-byte header alone), while rows logged after the checkpoint
        may have reached the file and are about to be logged again by the resumed run.

        Args:
            lines: metrics.jsonl's lines up to the checkpoint (``{"step": s, **metrics}``, in order;
                several lines of one step make one W&B row, as in the run that logged them).
            resume_step: the checkpoint's step; the resumed run logs from it on (the final
                evaluation of a run killed after its last checkpoint logs at that step again).

        Offline (this run's earlier ``*run-*-<id>`` folders under ``<output_dir>/wandb``, in time
        order, are what ``wandb sync`` uploads): read in that order, a row is kept while it is the
        next step of metrics.jsonl, with equal values, below ``resume_step``; each segment file is
        cut (``rlkit.wandb_file.cut``, at a record boundary) at its first row that is not, so the
        kept rows are a prefix of metrics.jsonl's steps. A torn tail is cut off; a file that is not
        a W&B run file is renamed to ``*.wandb.unreadable`` (each with a log line). Then the steps of
        ``lines`` not kept are logged again, in order, into the new segment. Tables and images of
        the re-logged steps are not restored (metrics.jsonl holds the scalars).

        Online: W&B's server holds the rows up to ``run.starting_step - 1`` and refuses lower steps
        (rewinding a run is a W&B private preview), so the steps of ``lines`` from ``starting_step``
        to ``resume_step`` are logged again, and a warning names the rows after ``resume_step`` the
        server keeps from the killed attempt.

        Returns: {"kept": steps kept in earlier segments, "relogged": steps logged again,
        "cut": [(segment file, byte offset, why)]} ({} when the run is disabled or not started).
        """
        if self._run is None or self.run_dir is None:
            return {}
        resume_step = int(resume_step)
        rows: dict[int, dict[str, Any]] = {}
        for ln in lines:
            s = int(ln["step"])
            if s <= resume_step:
                rows.setdefault(s, {}).update({k: v for k, v in ln.items() if k != "step"})
        order = list(rows)  # metrics.jsonl's steps, in the order they were logged
        report: dict[str, Any] = {"kept": [], "relogged": [], "cut": []}
        if self._mode == "online":
            start = int(self._run.starting_step)
            relog = [s for s in order if s >= start]
            if start > resume_step + 1:
                log.warning("W&B run %s already holds steps %d..%d from before the crash; W&B refuses to log a "
                            "step twice, so those rows keep the killed attempt's values (metrics.jsonl holds the "
                            "resumed run's)", self.run_id, resume_step + 1, start - 1)
        else:
            kept = self._reconcile_segments(order, rows, resume_step, report)
            relog = order[len(kept):]
            report["kept"] = kept
        for s in relog:
            self._run.log(_plain(rows[s]), step=s)
        report["relogged"] = relog
        if relog:
            log.info("W&B run %s: logged step(s) %s again from metrics.jsonl (missing from the earlier W&B run "
                     "files, or re-done after the checkpoint of step %d)", self.run_id, _ranges(relog), resume_step)
        return report

    def _segments(self) -> list[Path]:
        """This run id's earlier run files under the output folder's wandb/, oldest first (the folder
        name carries the start time, ``[offline-]run-<YYYYmmdd_HHMMSS>-<id>``)."""
        assert self.run_dir is not None
        own = self.run_dir.resolve()
        found = [d for d in self.run_dir.parent.glob(f"*run-*-{self.run_id}") if d.is_dir() and d.resolve() != own]
        return [d / f"run-{self.run_id}.wandb" for d in sorted(found, key=lambda d: d.name.rsplit("-", 2)[-2])
                if (d / f"run-{self.run_id}.wandb").exists()]

    def _reconcile_segments(self, order: list[int], rows: dict[int, dict[str, Any]], resume_step: int,
                            report: dict[str, Any]) -> list[int]:
        """Cut the earlier segments so that together they hold a prefix of ``order`` (below
        ``resume_step``, values equal to ``rows``); returns that prefix. See ``resume_history``."""
        from rlkit.wandb_file import WandbFileError, cut, history_row, history_step, scan

        kept: list[int] = []  # a prefix of order: a row that is not the next step of order is cut, and so
        for path in self._segments():  # is every row after it (a later segment's first row is then "not next")
            try:
                found = scan(path)
            except WandbFileError as e:
                aside = path.with_name(path.name + ".unreadable")
                os.replace(path, aside)
                log.warning("W&B: %s; renamed to %s so wandb sync skips it, and its steps are logged again from "
                            "metrics.jsonl", e, aside.name)
                report["cut"].append((str(path), 0, str(e)))
                continue
            at, why = None, None
            for offset, rec in found.records:
                s = history_step(rec)
                if s is None:
                    continue
                n = len(kept)
                if s >= resume_step:
                    why = f"step {s} is at or after the checkpoint's step {resume_step}"
                elif n >= len(order) or s != order[n]:
                    why = f"step {s} where metrics.jsonl has {order[n] if n < len(order) else 'no more steps'}"
                elif not _same_values(history_row(rec), rows[s]):
                    why = f"step {s} differs from metrics.jsonl"
                if why is not None:
                    at = offset
                    break
                kept.append(s)
            if at is None and found.problem is not None:
                at, why = found.end, found.problem
            if at is not None:
                cut(path, at)
                report["cut"].append((str(path), at, why))
                log.info("W&B: cut %s at byte %d (%s)", path, at, why)
        return kept

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """Log ``rows`` as a ``wandb.Table`` under ``key``; PIL images in cells become ``wandb.Image``.

        wandb 0.31 writes the table under the run's ``files/media/table/`` and keeps the full table
        (with its images) in a run artifact, staged under ``WANDB_DATA_DIR`` until ``wandb sync``.
        The images are also logged as an image list ``<key>_images`` (one caption per row from its
        scalar cells), which lands in ``files/media/images/`` and gives W&B's image panel with a
        step slider.
        """
        if self._run is None:
            return
        import wandb
        from PIL import Image

        data = [[wandb.Image(c) if isinstance(c, Image.Image) else c for c in row] for row in rows]
        images = []
        for row in rows:
            caption = " · ".join(f"{c} {v:.3g}" if isinstance(v, float) else f"{c} {v}"
                                 for c, v in zip(columns, row) if isinstance(v, (bool, int, float)))
            images += [wandb.Image(c, caption=caption) for c in row if isinstance(c, Image.Image)]
        payload: dict[str, Any] = {key: wandb.Table(columns=columns, data=data)}
        if images:
            payload[f"{key}_images"] = images
        self._run.log(payload, step=step)

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        """Log the folder ``path`` as an artifact ``name`` of type ``kind`` (versioned by W&B;
        offline it is uploaded by ``wandb sync``)."""
        if self._run is None:
            return
        import wandb

        art = wandb.Artifact(name=_artifact_name(name), type=kind)
        art.add_dir(str(path))
        self._run.log_artifact(art)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def _same_values(row: dict[str, Any], metrics: dict[str, Any]) -> bool:
    """Whether a W&B history row holds ``metrics`` (NaN equals NaN; a None metric may be absent)."""
    for k, v in _plain(metrics).items():
        w = row.get(k)
        if v is None and w is None:
            continue
        if isinstance(v, float) and isinstance(w, (int, float)) and math.isnan(v) and math.isnan(w):
            continue
        if w != v:
            return False
    return True


def _ranges(steps: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    for s in steps:
        if out and s == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


def _artifact_name(name: str) -> str:
    """W&B artifact names allow letters, digits, dashes, underscores and dots."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)


class TensorBoardLogger:
    """TensorBoard event files via ``torch.utils.tensorboard.SummaryWriter`` (needs ``tensorboard``).

    Args (conf/logger/tensorboard.yaml): log_dir (None: ``<output_dir>/tensorboard``), flush_secs
    (seconds between flushes to disk), max_images (images per sample table).

    Scalars go to ``add_scalar(key, value, step)`` (the key's ``/`` groups them into sections),
    sample tables to ``add_text`` (a markdown table) plus ``add_image`` for the images (tag
    ``<key>/<row>``), artifacts to ``add_text`` (their path). On resume the writer is opened with
    ``purge_step = resume_step + 1``, so TensorBoard hides the events of the lost part of the run
    (SummaryWriter's documented crash-recovery behaviour).

    Raises: ImportError naming the package to install when tensorboard is missing (at ``start``).
    """

    def __init__(self, log_dir: str | None = None, flush_secs: int = 30, max_images: int = 8):
        self.log_dir, self.flush_secs, self.max_images = log_dir, int(flush_secs), int(max_images)
        self.run_id: str | None = None
        self._writer = None

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None,
              resume_id: str | None, resume_step: int = 0) -> str | None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(f"logger=tensorboard needs the tensorboard package (pip install tensorboard): {e}") from e
        path = Path(self.log_dir) if self.log_dir else Path(output_dir) / "tensorboard"
        self._writer = SummaryWriter(str(path), flush_secs=self.flush_secs,
                                     purge_step=resume_step + 1 if resume_step > 0 else None)
        if resume_step == 0:
            import yaml

            self._writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "\n```", 0)
        return None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._writer is None:
            return
        for k, v in scalars(metrics).items():
            self._writer.add_scalar(k, v, step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        if self._writer is None:
            return
        import numpy as np
        from PIL import Image

        text_cols = [i for i, c in enumerate(columns) if not any(isinstance(r[i], Image.Image) for r in rows)]
        head = "| " + " | ".join(columns[i] for i in text_cols) + " |"
        sep = "|" + "---|" * len(text_cols)
        body = ["| " + " | ".join(str(r[i]).replace("|", "\\|").replace("\n", " ") for i in text_cols) + " |"
                for r in rows]
        self._writer.add_text(key, "\n".join([head, sep, *body]), step)
        shown = 0
        for n, row in enumerate(rows):
            for cell in row:
                if isinstance(cell, Image.Image) and shown < self.max_images:
                    self._writer.add_image(f"{key}/{n}", np.asarray(cell.convert("RGB")), step, dataformats="HWC")
                    shown += 1

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        if self._writer is not None:
            self._writer.add_text(f"artifacts/{kind}", f"{name}: {path}")

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class MultiLogger:
    """Several loggers at once (``logger=multi``): every call goes to each, in the given order.

    Args:
        loggers: name -> logger (built by Hydra from the ``loggers`` mapping of conf/logger/multi.yaml,
            each entry a logger config with its own ``_target_``; an unknown key in an entry fails
            like it does for that logger alone), or a list of loggers.

    ``start`` returns the first run id a logger reports (W&B's), which the checkpoint stores for
    resume. ``finish`` finishes every logger even if one raises, then re-raises the first error.

    Raises: ValueError when ``loggers`` is empty or an entry is not a logger.
    """

    def __init__(self, loggers: Mapping[str, Any] | list[Any]):
        # Hydra passes the mapping as a DictConfig (a Mapping) holding the instantiated loggers
        items = ([(str(k), v) for k, v in loggers.items()] if isinstance(loggers, Mapping)
                 else [(type(x).__name__, x) for x in loggers])
        if not items:
            raise ValueError("logger=multi needs at least one entry under logger.loggers")
        for name, lg in items:
            missing = [m for m in ("start", "log", "log_table", "log_artifact", "finish") if not hasattr(lg, m)]
            if missing:
                raise ValueError(f"logger.loggers.{name} ({type(lg).__name__}) is not a logger: no {', '.join(missing)}")
        self.loggers: dict[str, Any] = dict(items)
        self.run_id: str | None = None

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None,
              resume_id: str | None, resume_step: int = 0) -> str | None:
        for lg in self.loggers.values():
            rid = lg.start(output_dir, config, run_name, group, resume_id, resume_step=resume_step)
            self.run_id = self.run_id or rid
        return self.run_id

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for lg in self.loggers.values():
            lg.log(metrics, step)

    def resume_history(self, lines: list[dict[str, Any]], resume_step: int) -> None:
        """``resume_history`` of each logger that has one (see the module docstring)."""
        for lg in self.loggers.values():
            if hasattr(lg, "resume_history"):
                lg.resume_history(lines, resume_step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        for lg in self.loggers.values():
            lg.log_table(key, columns, rows, step)

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        for lg in self.loggers.values():
            lg.log_artifact(path, name, kind)

    def finish(self) -> None:
        first: BaseException | None = None
        for lg in self.loggers.values():
            try:
                lg.finish()
            except BaseException as e:  # finish the others, then raise
                first = first or e
        if first is not None:
            raise first

    def find(self, cls: type) -> list[Any]:
        """The loggers of type ``cls`` (nested multis included)."""
        found = []
        for lg in self.loggers.values():
            if isinstance(lg, cls):
                found.append(lg)
            if isinstance(lg, MultiLogger):
                found += lg.find(cls)
        return found
