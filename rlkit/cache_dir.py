"""Where the one-time builds are cached by default: a user cache folder, the same from any working directory.

``user_cache_dir()`` is ``paths.cache_dir``'s default (conf/train.yaml ``${rlkit_cache_dir:}``, the resolver
``register_resolver`` adds; rlkit.config registers it with the schema, so every composition has it):
``$RLKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlkit``, else ``~/.cache/rlkit``. The order is the XDG Base
Directory one that platformdirs' ``user_cache_dir`` follows on Linux (an empty or relative ``XDG_CACHE_HOME``
is ignored, as the spec says), with rlkit's own variable first. The grounding stages, warm starts and tiny
models built under it (``grounding/``, ``sft/``, ``tiny_vl/``) are then found whichever folder a job starts in.

Before issue 77 the default was ``<working dir>/.cache``; nothing moves or deletes such a folder.
``legacy_cache_note`` says, once, how to keep using one (``RLKIT_CACHE_DIR=./.cache``) when it holds builds
and the new default holds none.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The environment variable that names the cache folder outright (tests and clusters set it).
CACHE_ENV = "RLKIT_CACHE_DIR"
#: The OmegaConf resolver conf/train.yaml's ``paths.cache_dir`` calls: ``${rlkit_cache_dir:}``.
RESOLVER = "rlkit_cache_dir"
#: The build kinds whose presence makes a cache folder "hold builds" (rlkit.stages.warm_start writes them).
BUILD_KINDS = ("grounding", "sft")


def user_cache_dir() -> Path:
    """The default cache folder (absolute when its source is): ``$RLKIT_CACHE_DIR`` when set and not empty,
    else ``$XDG_CACHE_HOME/rlkit`` when that is an absolute path, else ``~/.cache/rlkit``.

    Follows the XDG Base Directory specification (``$XDG_CACHE_HOME``, default ``$HOME/.cache``; a relative
    value is invalid and ignored), as platformdirs' ``user_cache_dir`` does on Linux. Nothing is created.

    Raises: nothing; ``~`` falls back to the password database's home when ``$HOME`` is unset
    (``os.path.expanduser``).
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "rlkit"
    return Path(os.path.expanduser("~")) / ".cache" / "rlkit"


def _has_builds(cache: Path) -> bool:
    """Whether ``cache`` holds a finished or stopped build folder (``grounding/<key>``, ``sft/<key>``)."""
    for kind in BUILD_KINDS:
        folder = cache / kind
        if folder.is_dir() and any(p.is_dir() for p in folder.iterdir()):
            return True
    return False


def legacy_cache_note(cache_dir: str | Path, cwd: str | Path | None = None) -> str | None:
    """A one-line note when the working directory's old default cache (``<cwd>/.cache``) holds builds but the
    cache in use (``cache_dir``, the new default) holds none; else None.

    Only the default is meant: None when ``$RLKIT_CACHE_DIR`` is set or ``cache_dir`` is not
    ``user_cache_dir()``, and when ``cache_dir`` is the old folder itself. Reads folder listings only.

    Raises: OSError when a folder exists but cannot be listed.
    """
    if os.environ.get(CACHE_ENV):
        return None
    cache = Path(cache_dir).expanduser()
    old = Path(cwd if cwd is not None else os.getcwd()) / ".cache"
    if cache.resolve() != user_cache_dir().resolve() or cache.resolve() == old.resolve():
        return None
    if not _has_builds(old) or _has_builds(cache):
        return None
    return (f"note: the builds are now cached in {cache} (was ./.cache); {old} holds earlier builds, which this "
            f"job does not use. To keep using them: RLKIT_CACHE_DIR=./.cache (docs/running.md)")


def register_resolver() -> None:
    """Add the ``${rlkit_cache_dir:}`` OmegaConf resolver (``user_cache_dir`` as a string); idempotent."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, lambda: str(user_cache_dir()))
