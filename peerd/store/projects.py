"""Projects: registered git checkouts."""

from __future__ import annotations

import aiosqlite

from peerd.contracts import Page, Project
from peerd.core.ownership import Owner
from peerd.errors import Conflict, InvalidRequest, ProjectExists, ProjectNotFound
from peerd.store import ownership
from peerd.store.db import Database
from peerd.store.ids import new_id


def _project(row: aiosqlite.Row) -> Project:
    return Project(
        id=row["id"],
        name=row["name"],
        path=row["path"],
        repository_key=row["repository_key"],
        created_at=row["created_at"],
    )


async def add(db: Database, *, name: str, path: str, repository_key: str | None, now: float) -> Project:
    async with db.write() as tx:
        async with tx.execute("SELECT id FROM projects WHERE path = ?", (path,)) as cur:
            existing = await cur.fetchone()
        if existing is not None:
            raise ProjectExists(f"{path} is already registered as project {existing['id']}.")
        async with tx.execute("SELECT id FROM projects WHERE name = ?", (name,)) as cur:
            same_name = await cur.fetchone()
        if same_name is not None:
            raise ProjectExists(
                f"A project named {name!r} exists already ({same_name['id']}); choose another with --name."
            )
        project_id = new_id("prj")
        await tx.execute(
            "INSERT INTO projects (id, name, path, repository_key, created_at) VALUES (?, ?, ?, ?, ?)",
            (project_id, name, path, repository_key, now),
        )
        await ownership.claim(
            tx,
            project_id=project_id,
            holding="checkout",
            name=path,
            owner=Owner.person(),
            purpose="checkout",
            now=now,
        )
    return Project(id=project_id, name=name, path=path, repository_key=repository_key, created_at=now)


async def get(db: Database, project_id: str) -> Project:
    row = await db.lookup("SELECT * FROM projects WHERE id = ?", (project_id,))
    if row is None:
        row = await db.lookup("SELECT * FROM projects WHERE name = ?", (project_id,))
    if row is None:
        raise ProjectNotFound(f"No project {project_id!r} here. `peerd project list` shows them.")
    return _project(row)


async def by_path(db: Database, path: str) -> Project | None:
    """The project registered at exactly `path`, if any."""
    row = await db.lookup("SELECT * FROM projects WHERE path = ?", (path,))
    return None if row is None else _project(row)


async def set_repository_key(db: Database, project_id: str, key: str) -> None:
    async with db.write() as tx:
        await tx.execute("UPDATE projects SET repository_key = ? WHERE id = ?", (key, project_id))


async def page(db: Database, *, cursor: str | None, limit: int) -> Page[Project]:
    after = _cursor(cursor)
    rows = await db.fetchall(
        "SELECT rowid, * FROM projects WHERE rowid > ? ORDER BY rowid LIMIT ?", (after, limit + 1)
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[Project](
        items=[_project(r) for r in rows], next_cursor=str(rows[-1]["rowid"]) if more else None
    )


def _cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        return int(cursor)
    except ValueError:
        raise InvalidRequest(f"cursor {cursor!r} is not one this API returned.") from None


async def remove(db: Database, project_id: str) -> Project:
    project = await get(db, project_id)
    async with db.write() as tx:
        async with tx.execute(
            "SELECT count(*) FROM threads WHERE project_id = ? AND status != 'archived'", (project.id,)
        ) as cur:
            row = await cur.fetchone()
        active = int(row[0]) if row else 0
        if active:
            raise Conflict(
                f"Project {project.name} has {active} thread(s) that are not archived; archive them "
                "first (`peerd thread archive ID`)."
            )
        await tx.execute("DELETE FROM projects WHERE id = ?", (project.id,))
        # What its threads, links and orchestrations made stays in git, unrecorded: the person's.
        await tx.execute("DELETE FROM git_owners WHERE project_id = ?", (project.id,))
    return project


async def thread_ids_of_project(db: Database, project_id: str) -> list[str]:
    """Every thread of the project, whatever its status (those a removal takes with it)."""
    rows = await db.fetchall("SELECT id FROM threads WHERE project_id = ?", (project_id,))
    return [r["id"] for r in rows]


async def count(db: Database) -> int:
    return int(await db.scalar("SELECT count(*) FROM projects"))
