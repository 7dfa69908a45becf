"""`peerd backup FILE` and `peerd restore FILE`: a consistent copy of the store, and putting one back.

Backup reads the database file itself with SQLite's online backup API (no route on the daemon: it
works whether or not the daemon runs, and only a user who can read the 0600 file can make one);
one read transaction gives a consistent snapshot while the daemon goes on writing. Restore needs
the daemon stopped: it takes the home lock the daemon holds while it runs, checks the backup, and
keeps the store it replaces beside it. See docs/user/troubleshooting.md.
"""

from __future__ import annotations

import fcntl
import sqlite3
import time
from pathlib import Path

import click

from peerd.cli.common import cli_context, fail, json_option
from peerd.cli.output import emit_json
from peerd.errors import PeerdError

# peerd.store (aiosqlite, structlog) is imported inside the commands: no `peerd.cli` module may
# import it at load (the start-up budget; see peerd/cli/main.py).


def _sqlite_failure(exc: sqlite3.Error, path: Path) -> str:
    from peerd.store.db import storage_fault  # noqa: PLC0415  # aiosqlite: CLI start-up

    fault = storage_fault(exc, path)
    return f"{fault.code}: {fault.message}" if fault is not None else f"{path}: {exc}"


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@json_option
@click.pass_context
def backup(ctx: click.Context, file: Path, as_json: bool) -> None:
    """Write a consistent copy of this environment's store to FILE (a new file, mode 0600).

    Works while the daemon runs (SQLite's online backup of one snapshot) and while it is stopped.
    The copy is checked (`PRAGMA quick_check`) before it is given its name. The identity key
    (`identity/key.pem` in the home) is not in it: keep a copy of that file too.
    """
    from peerd.store import health  # noqa: PLC0415  # aiosqlite: CLI start-up

    paths = cli_context(ctx).paths
    source = paths.db
    if not source.is_file():
        fail(f"there is no store at {source} (is --home right?)")
    dest = file.expanduser().absolute()
    if not dest.parent.is_dir():
        fail(f"{dest.parent} is not a directory")
    try:
        made = health.backup(source, dest)
    except PeerdError as exc:
        fail(exc)
    except sqlite3.Error as exc:
        fail(_sqlite_failure(exc, source))
    except OSError as exc:
        fail(f"cannot write {dest}: {exc.strerror or exc}")
    if as_json:
        emit_json(
            {"source": str(source), "file": made.path, "bytes": made.size, "schemaVersion": made.version}
        )
        return
    click.echo(f"backed up {source} to {made.path} ({made.size} bytes, schema version {made.version})")


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
@click.pass_context
def restore(ctx: click.Context, file: Path, as_json: bool) -> None:
    """Replace this environment's store with the backup FILE; the daemon must be stopped.

    FILE must be a healthy peerd store of a version this peerd knows (checked first; nothing
    changes otherwise). The store it replaces is kept as `peerd.db.before-restore-<time>` in the
    home. Start the daemon afterwards with `peerd serve`.
    """
    from peerd.store import health  # noqa: PLC0415  # aiosqlite: CLI start-up

    home = cli_context(ctx)
    paths = home.paths
    paths.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(paths.lock, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fail(
                f"a peerd daemon is running with home {paths.home}: stop it first "
                "(SIGTERM, or `systemctl --user stop peerd`), then restore"
            )
        try:
            aside = health.restore(
                file.expanduser().absolute(), paths.db, stamp=time.strftime("%Y%m%d-%H%M%S")
            )
        except PeerdError as exc:
            fail(exc)
        except sqlite3.Error as exc:
            fail(_sqlite_failure(exc, file))
        except OSError as exc:
            fail(f"cannot restore into {paths.db}: {exc.strerror or exc}")
    if as_json:
        emit_json(
            {"file": str(file), "store": str(paths.db), "previous": None if aside is None else str(aside)}
        )
        return
    kept = f"; the previous store is kept as {aside}" if aside is not None else ""
    click.echo(f"restored {file} into {paths.db}{kept}. Start the daemon: {home.command('serve')}")
