"""What the one-time builds cache holds: each grounding stage and warm start, what built it, and what is left over.

    python scripts/cache.py                      # every build in train.py's cache (rlkit/cache_dir.py), oldest first
    python scripts/cache.py --show 019029a8      # one build's record: the config its key hashes, where it started
    python scripts/cache.py --prune              # remove leftovers (see below); --dry-run says what it would remove
    python scripts/cache.py --prune --stopped-older-than 7   # also stopped builds untouched for 7 days

Every build is a folder ``<cache>/{grounding,sft}/<key>`` named by the hash of what determines it
(rlkit.stages.cache.cache_key_inputs). A build made since the record existed keeps in its summary JSON the config its
key hashes, the checkpoint it started from (a chain's stages name each other's keys), its torch version,
thread count and CPU (a bf16 build rounds differently on another CPU or thread count), and when it finished;
older builds show ``-`` there. A build stopped part-way keeps its progress in ``<key>.partial/`` until a job
that needs it resumes it (docs/running.md, "Around a run").

Leftovers that ``--prune`` removes: a ``.partial`` folder beside its finished build (the build was killed as
it finished) and a ``.tmp-<pid>`` folder whose process is gone (killed while saving). A stopped build's progress
is kept unless ``--stopped-older-than DAYS`` says how stale is stale: it is a build some config can still
resume, and only you know whether that config is coming back. Each removal holds the build's lock (the one a
job building that key takes), so nothing a running job uses is touched; ``.lock`` files (empty) are never
removed, and neither is anything rlkit did not write (listed as ``foreign``) or a symbolic link.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlkit.cache_dir import legacy_cache_note, user_cache_dir
from rlkit.cli import DefaultsHelpFormatter
from rlkit.distributed.reaper import pid_alive

KINDS = {"grounding": "grounding_summary.json", "sft": "sft_summary.json"}


@dataclass
class Entry:
    """One thing in the cache: a finished build, a stopped one (``state == "stopped"``), or a leftover."""

    kind: str  # grounding | sft
    key: str
    state: str  # built | stopped | building | leftover | foreign
    path: Path
    size: int  # bytes
    mtime: float
    summary: dict | None = None
    note: str = ""


def _size(path: Path) -> int:
    """Bytes under ``path``; files that vanish meanwhile (a build renaming its save) count 0."""
    def size(p: Path) -> int:
        try:
            return p.stat().st_size if p.is_file() and not p.is_symlink() else 0
        except OSError:
            return 0

    return size(path) if not path.is_dir() else sum(size(p) for p in path.rglob("*"))


def _locked(lock: Path) -> bool:
    """Whether a running build holds ``lock`` (rlkit.stages.cache.FileLock: fcntl.flock)."""
    if not lock.exists():
        return False
    with open(lock) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def scan(cache: Path) -> list[Entry]:
    """Every build and leftover under ``cache``, oldest first."""
    out: list[Entry] = []
    for kind, summary_name in KINDS.items():
        folder = cache / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            name = path.name
            key, _, suffix = name.partition(".")
            built = folder / key / summary_name
            lock = folder / f"{key}.lock"
            if not suffix and path.is_dir():
                if built.is_file():
                    out.append(Entry(kind, key, "built", path, _size(path), built.stat().st_mtime,
                                     json.loads(built.read_text())))
                else:
                    out.append(Entry(kind, key, "foreign", path, _size(path), path.stat().st_mtime,
                                     note="a folder without a build summary: not a build rlkit wrote (never pruned)"))
            elif suffix == "partial":
                state_file = path / "state.pt"
                mtime = (state_file if state_file.is_file() else path).stat().st_mtime
                if built.is_file():
                    out.append(Entry(kind, key, "leftover", path, _size(path), mtime,
                                     note="progress of a build that finished"))
                else:
                    out.append(Entry(kind, key, "building" if _locked(lock) else "stopped", path, _size(path), mtime))
            elif suffix.startswith("tmp-"):
                pid = suffix.removeprefix("tmp-")
                if pid.isdigit() and not pid_alive(int(pid)):
                    out.append(Entry(kind, key, "leftover", path, _size(path), path.stat().st_mtime,
                                     note=f"a save cut short (process {pid} is gone)"))
    return sorted(out, key=lambda e: e.mtime)


def _result(e: Entry) -> str:
    s = e.summary or {}
    if e.kind == "sft" and "val_success" in s:
        return f"val success {s['val_success']:.1%}"
    if e.kind == "grounding" and s.get("final"):
        metric = s.get("stop_metric", "all")
        return f"held-out {metric} {s['final'].get(metric, float('nan')):.1%}"
    return "-"


def _start(e: Entry, cache: Path) -> str:
    """The build this one started from: a key of this cache (kind/key), another path, or '-'."""
    start = ((e.summary or {}).get("build") or {}).get("start")
    if not start:
        return "-" if not (e.summary or {}).get("build") else "its config's own weights"
    p = Path(start)
    try:
        rel = p.resolve().relative_to(cache.resolve())
        return str(rel)
    except ValueError:
        return start


def _fmt_size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def list_entries(entries: list[Entry], cache: Path) -> None:
    if not entries:
        print(f"{cache}: no builds")
        return
    total = sum(e.size for e in entries)
    print(f"{cache}: {len(entries)} entries, {_fmt_size(total)}")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.mtime))
        head = f"{e.kind}/{e.key}  {e.state:<8}  {when}  {_fmt_size(e.size):>10}"
        if e.state == "built":
            s = e.summary or {}
            build = s.get("build") or {}
            how = (f"{build['torch_threads']} thread(s), {build.get('cpu') or build.get('device')}"
                   if "torch_threads" in build else "-")
            print(f"{head}  {s.get('steps', '?')} steps, {_result(e)}, {s.get('wall_time_s', 0):.0f} s; "
                  f"from {_start(e, cache)}; built on {how}")
        elif e.state in ("stopped", "building"):
            step = "?"
            try:
                import torch

                # mmap: only the pages the step's pickle needs are read, not the saved weights and optimizer state
                step = torch.load(e.path / "state.pt", map_location="cpu", weights_only=False, mmap=True)["step"]
            except Exception:  # noqa: BLE001 - an unreadable save is reported as such
                step = "unreadable"
            print(f"{head}  stopped at step {step}" if e.state == "stopped" else f"{head}  at step {step} (running)")
        else:
            print(f"{head}  {e.path.name}: {e.note}")


def find(entries: list[Entry], prefix: str) -> Entry:
    hits = [e for e in entries if e.state == "built" and e.key.startswith(prefix)]
    if len(hits) != 1:
        keys = ", ".join(f"{e.kind}/{e.key}" for e in hits) or "none"
        raise SystemExit(f"--show {prefix}: {len(hits)} finished builds match ({keys}); give more of the key")
    return hits[0]


def prune(entries: list[Entry], stopped_days: float | None, dry_run: bool) -> int:
    now, freed = time.time(), 0
    for e in entries:
        stale_stop = (e.state == "stopped" and stopped_days is not None and now - e.mtime > stopped_days * 86400)
        if (e.state != "leftover" and not stale_stop) or e.path.is_symlink():
            continue
        lock = e.path.parent / f"{e.key}.lock"
        why = e.note or f"stopped {((now - e.mtime) / 86400):.1f} days ago"
        if dry_run:
            if not _locked(lock):
                print(f"would remove {e.path} ({_fmt_size(e.size)}; {why})")
                freed += e.size
            continue
        with open(lock, "a") as fh:  # the lock a job building this key takes (rlkit.stages.cache.FileLock)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a job is building or resuming it right now
            print(f"removing {e.path} ({_fmt_size(e.size)}; {why})")
            freed += e.size
            shutil.rmtree(e.path) if e.path.is_dir() else e.path.unlink()
    return freed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="the cache (default: train.py's paths.cache_dir: $RLKIT_CACHE_DIR, else "
                         "$XDG_CACHE_HOME/rlkit, else ~/.cache/rlkit)")
    ap.add_argument("--show", metavar="KEY", help="print one finished build's summary record (a key or its prefix)")
    ap.add_argument("--prune", action="store_true", help="remove leftovers (module doc)")
    ap.add_argument("--stopped-older-than", type=float, metavar="DAYS", default=None,
                    help="with --prune: also remove stopped builds' progress untouched for this many days")
    ap.add_argument("--dry-run", action="store_true", help="with --prune: only say what would be removed")
    args = ap.parse_args(argv)
    if (args.stopped_older_than is not None or args.dry_run) and not args.prune:
        ap.error("--stopped-older-than and --dry-run go with --prune")
    if args.stopped_older_than is not None and args.stopped_older_than < 0:
        ap.error(f"--stopped-older-than {args.stopped_older_than}: a number of days >= 0")
    cache = args.cache_dir or user_cache_dir()
    if not cache.is_dir():
        ap.error(f"--cache-dir {cache}: no such folder (train.py caches its builds in $RLKIT_CACHE_DIR, else "
                 "$XDG_CACHE_HOME/rlkit, else ~/.cache/rlkit; before issue 77 in ./.cache of the folder it ran in)")
    if args.cache_dir is None and (note := legacy_cache_note(cache)):
        print(note, file=sys.stderr)
    entries = scan(cache)
    if args.show:
        e = find(entries, args.show)
        print(json.dumps({"path": str(e.path), "steps": (e.summary or {}).get("steps"), "result": _result(e),
                          "build": (e.summary or {}).get("build", "not recorded (built before the record existed)")},
                         indent=1))
        return 0
    if args.prune:
        freed = prune(entries, args.stopped_older_than, args.dry_run)
        print(f"{'would free' if args.dry_run else 'freed'} {_fmt_size(freed)}")
        return 0
    list_entries(entries, cache)
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `scripts/cache.py | head` ends quietly
    sys.exit(main())
