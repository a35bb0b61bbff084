"""The ``hint`` added to an operator command's error document (docs/cli.md
§Output): what a person does next, by code and, where the options differ, by
command."""
from __future__ import annotations

from typing import Optional

# Codes not listed need no more than their message.
ERROR_HINTS = {
    "checkpoint_ahead": "if the host or worker crashed while writing (the usual cause), stop "
                        "every worker and run the `next` command (repair-checkpoint): it "
                        "re-anchors the checkpoint to the verified database and keeps every "
                        "open operation blocking",
    "owner_running": "stop the worker (or wait for the call to finish), then run `status` "
                     "again; `resolve --force` only when you know the worker can no longer "
                     "act, and say why in --evidence",
    "journal_absent": "no journal in this data directory, and it is not the data directory of "
                      "a Hermes profile (<home>/plugin-data/crash-recovery beside the home's "
                      "config.yaml): check the profile (-p PROFILE) or --data-dir you meant; "
                      "`next` runs status on the profile's own",
    "operation_not_open": "the operation is already settled: `show OP` prints its history",
    "unknown_operation": "copy the operation id from `status`",
    "repair_not_applicable": "repair-checkpoint only clears checkpoint_ahead (`found` says what "
                             "the journal shows; `ok` needs no repair); for any other "
                             "integrity verdict, stop every worker and run the `next` command "
                             "(restart-journal): it keeps the broken files as evidence and "
                             "every operation that may have run open",
    "journal_rolled_back": "events head.json vouched for are missing: a deleted "
                           "journal.sqlite3-wal, deleted events or an older copy restored. Stop "
                           "every worker and run the `next` command (restart-journal): it keeps "
                           "the broken files as evidence and every operation that may have run "
                           "open",
    "wal_missing": "the journal's write-ahead log (journal.sqlite3-wal), or its index "
                   "(journal.sqlite3-shm), was deleted. While a worker still has the journal "
                   "open (workers_running), it holds the deleted log's events, and they return "
                   "to the database when it exits (a lost index is rebuilt): stop every "
                   "worker of the profile, then run status again. With no worker left, run the "
                   "`next` command (restart-journal): it keeps the remaining files as evidence "
                   "and every operation that may have run open",
    "database_locked": "a process holds the journal's writer lock; retry in a moment. If it "
                       "stays, look at the process named in writer_pid: protected calls are "
                       "refused until it lets go",
    "nothing_to_acknowledge": "`status` lists the late outcomes that need acknowledging; an "
                              "operation that is still open is settled with `resolve`",
    "read_access_only": "this user may read the journal but not write it: run the command as "
                        "the user the workers run as (the owner of the data directory)",
    "foreign_file": "error.file holds something else than the plugin's regular file "
                    "(error.file_type). If you put a symbolic link there on purpose, put the real "
                    "file back instead; otherwise stop every worker and run the `next` command "
                    "(restart-journal): it keeps that file, untouched, as evidence",
    "restart_interrupted": "restart-journal stopped half-way: stop every worker and run the "
                           "`next` command (restart-journal) again; it finishes the restart the "
                           "first run began, with the same operations carried over",
    "checkpoint_lost_in_restart": "the restart brought back an operation of tool unknown for "
                                  "the events it could not verify, which this export vouches "
                                  "for: settle it (status) after checking the services in its "
                                  "window",
}


# Hints that depend on the command that met the code: a hint names only
# options of its own command, or of a command it names before them.
COMMAND_HINTS = {
    ("archive", "owner_running"): "a protected call is out: one running now, or one an operator "
                                  "resolved whose worker still runs (status lists it under "
                                  "resolved_running): its outcome may still be recorded. Let it "
                                  "finish or stop that worker, then run `archive` again",
}


def hint_for(command: Optional[str], code: str) -> Optional[str]:
    """The ``hint`` of an error ``code`` met by ``command`` (docs/cli.md
    §Output), or None."""
    return COMMAND_HINTS.get((command, code), ERROR_HINTS.get(code))
