"""The cluster's backups with pgBackRest: the WAL archived continuously, full backups, point-in-time restore.

The repository is `.cluster/backup/` (`config.cluster_conf.pgbackrest_conf`);
every member's `archive_command` pushes its completed WAL segments there, so
the archive goes on from whichever member leads, across failovers (a new
timeline is a new history file in the same archive). A backup is taken from
the leader. A restore never touches the members: it recovers a backup and the
archived WAL into a new data directory, up to the time asked, starts a
PostgreSQL of its own on it, checks the ledger's invariants there
(`manage.py check_invariants`) and starts an API server on it.
"""

from __future__ import annotations

import shutil
import socket
import sys
import time
from pathlib import Path

import psycopg

from config.cluster_conf import app_env, member_dir, pgbackrest_conf, pgbackrest_conf_path
from config.cluster_patroni import leader
from config.cluster_programs import manage, own, pg_ctl, program, run, spawn, stop_pid, wait_http
from config.cluster_state import SCOPE, STATE_DIR, Ports, State

RESTORED_DIR = STATE_DIR / "restored"


def pgbackrest(*args: str) -> str:
    return run(
        [program("pgbackrest"), f"--config={pgbackrest_conf_path()}", f"--stanza={SCOPE}", *args],
        as_server=True,
    )


def _leader_options(ports: Ports) -> list[str]:
    index = leader(ports)
    if index is None:
        raise SystemExit("no member leads: a backup is taken from the leader")
    return [f"--pg1-path={member_dir(index)}", f"--pg1-port={ports.member(index)}"]


def stanza_create(state: State) -> None:
    """Once the first member leads: the stanza, where the members' archive_command pushes to."""
    pgbackrest_conf_path().write_text(pgbackrest_conf())
    (STATE_DIR / "backup").mkdir(exist_ok=True)
    own(STATE_DIR / "backup")
    own(pgbackrest_conf_path())
    pgbackrest(*_leader_options(state.ports), "stanza-create")


def backup(state: State) -> str:
    """A full backup from the leader; `check` first proves that the WAL archive works."""
    options = _leader_options(state.ports)
    pgbackrest(*options, "check")
    pgbackrest(*options, "--type=full", "backup")
    return pgbackrest("info")


def _stop_restored(state: State) -> None:
    pid = state.pids.pop("restored-api", None)
    if pid is not None:
        stop_pid(pid)
    if (RESTORED_DIR / "postmaster.pid").exists():
        try:
            pg_ctl(RESTORED_DIR, "stop")
        except SystemExit as error:
            print(error, file=sys.stderr)
    state.save()


def restored_url(state: State) -> str:
    return f"postgres://postgres@127.0.0.1:{state.restored_port}/postgres"


def _free_port(preferred: int) -> int:
    """`preferred`, unless something holds it: its block lies in the OS's range of outgoing ports, and
    one of the many connections to the cluster may have it as its own end. Then any port free now."""
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise SystemExit("no free port for the restored server")


def _mark_the_end(ports: Ports) -> None:
    """One committed transaction with an id, then its WAL segment archived (`pgbackrest check` waits).

    Recovery to a time stops at the first commit after it; with none in the
    archive, PostgreSQL refuses to end a recovery that never reached its
    target. So while a member still leads, a commit that is now marks the end.
    """
    with psycopg.connect(
        f"postgresql://postgres@127.0.0.1:{ports.primary}/postgres", autocommit=True
    ) as conn:
        conn.execute("SELECT txid_current()")
    pgbackrest(*_leader_options(ports), "check")


def restore(state: State, target_time: str | None) -> None:
    """Recover the latest backup before `target_time`, and the WAL up to it, into `.cluster/restored/`.

    Without a time, up to the end of the archive (the primary is gone: all there is).
    """
    ports = state.ports
    if leader(ports) is not None:
        _mark_the_end(ports)
    _stop_restored(state)
    if RESTORED_DIR.exists():
        shutil.rmtree(RESTORED_DIR)
    RESTORED_DIR.mkdir(mode=0o700)
    own(RESTORED_DIR)
    print(f"restore: to {target_time or 'the end of the archive'} into {RESTORED_DIR}", flush=True)
    target = ["--type=time", f"--target={target_time}", "--target-action=promote"] if target_time else []
    pgbackrest(f"--pg1-path={RESTORED_DIR}", *target, "restore")
    # A server of its own: not archiving into the cluster's repository, not waiting for a
    # synchronous standby it does not have, on its own port.
    state.restored_port = _free_port(ports.restored)
    state.save()
    pg_ctl(
        RESTORED_DIR,
        "start",
        port=state.restored_port,
        options=(
            "-c archive_mode=off -c synchronous_standby_names='' -c listen_addresses=127.0.0.1"
            f" -c hba_file={RESTORED_DIR / 'pg_hba.conf'} -c ident_file={RESTORED_DIR / 'pg_ident.conf'}"
        ),
    )
    _wait_promoted(state)
    env = app_env(ports, direct=True) | {"DATABASE_URL": restored_url(state)}
    print(manage("check_invariants", env=env).rstrip(), flush=True)
    args = [
        str(Path(sys.executable).parent / "gunicorn"),
        "config.wsgi",
        *("--bind", f"127.0.0.1:{ports.restored_api}", "--worker-class", "gthread", "--threads", "8"),
    ]
    state.pids["restored-api"] = spawn("restored-api", args, env=env)
    state.save()
    wait_http(f"http://127.0.0.1:{ports.restored_api}/", what="the API on the restored database")
    print(
        f"""
The restored database (as of {target_time or "the end of the archive"}):
  PostgreSQL             127.0.0.1:{state.restored_port}  ({RESTORED_DIR})
  API                    http://127.0.0.1:{ports.restored_api}/
  DATABASE_URL={restored_url(state)}""",
        flush=True,
    )


def _wait_promoted(state: State, timeout: float = 120.0) -> None:
    """Recovery replays the WAL up to the target, then promotes: wait until the server takes writes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(restored_url(state), autocommit=True, connect_timeout=2) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                if row is not None and not row[0]:
                    return
        except psycopg.Error:
            pass
        if not (RESTORED_DIR / "postmaster.pid").exists():
            log = (STATE_DIR / "logs" / "restored.log").read_text().splitlines()[-8:]
            raise SystemExit("the restored server stopped:\n" + "\n".join(log))
        if time.monotonic() > deadline:
            raise SystemExit(f"the restored server did not finish its recovery (logs in {STATE_DIR}/logs/)")
        time.sleep(0.3)


def stop_restored(state: State) -> None:
    _stop_restored(state)
