"""`dpcdf admin`: the operator's commands (issue 24). tasks, close, delete, sweep and metrics ask one
server with the operator's token (--token-file, else $DPCDF_ADMIN_TOKEN); backup and check-backup work
on a data directory on this machine (no token: reading the directory is the authority), while its
server runs. Errors end as every dpcdf command's: one line `dpcdf: ...`, exit status 2."""
from __future__ import annotations

import argparse
import json
import time


def add_parser(sub) -> None:
    a = sub.add_parser("admin", help="the operator: list, close and delete tasks, run the retention sweep, "
                       "read metrics, back a data directory up",
                       description="The operator's commands. Those that talk to a server need its operator token "
                       "(--token-file, else $DPCDF_ADMIN_TOKEN); backup reads a data directory on this machine.")
    cmds = a.add_subparsers(dest="admin_cmd", required=True, metavar="ACTION")

    def remote(name: str, text: str, task: bool = False) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("--server", required=True, help="the server's URL")
        p.add_argument("--token-file", help="the operator's token (default: $DPCDF_ADMIN_TOKEN)")
        if task:
            p.add_argument("task_id", metavar="TASK_ID", help="the task's id (dpcdf admin tasks lists them)")
        return p

    remote("tasks", "list the server's tasks with their state and counts")
    remote("close", "close a task's collection as its analyst's close does (server 0)", task=True)
    remote("delete", "delete a task's reports and key shares on this server; it answers nothing again", task=True)
    remote("sweep", "run the server's retention sweep now")
    remote("metrics", "print the server's metrics (Prometheus text format)")
    b = cmds.add_parser("backup", help="back a server's data directory up, consistently, while it runs",
                        description="Copies DATA's SQLite store with SQLite's online backup API, then its segment "
                        "files (checked against their recorded SHA-256) and keys, into a new directory with a "
                        "MANIFEST.json of checksums. Restore: dpcdf serve --data DIR on the backup (or a copy).")
    b.add_argument("--data", required=True, help="the server's data directory")
    b.add_argument("--to", required=True, metavar="DIR", help="where to write the backup (a new or empty directory)")
    c = cmds.add_parser("check-backup", help="check a backup against its manifest's checksums")
    c.add_argument("dir", metavar="DIR", help="the backup directory")


def cmd_admin(args) -> None:
    if args.admin_cmd == "backup":
        from .service.storage.backup import backup

        start = time.monotonic()
        out = backup(args.data, args.to)
        left = f"; segments left out (rebuilt on restore): {', '.join(out['segments_left_out'])}" if out["segments_left_out"] else ""
        print(f"backed up {args.data} to {args.to}: {out['tasks']} tasks, {out['files']} files, {out['bytes']} bytes "
              f"in {time.monotonic() - start:.2f} s{left}")
        if out["unfinished"]:
            print(f"{out['unfinished']} of the tasks were not finished (collecting or closing): a server restored from "
                  "this backup refuses their uploads, close and server-to-server steps (discard them on both servers "
                  "and run them again as new tasks, under new ids)")
        return
    if args.admin_cmd == "check-backup":
        from .service.storage.backup import check

        manifest = check(args.dir)
        print(f"{args.dir}: {len(manifest['files'])} files match the manifest of {manifest['created']}")
        if not manifest["marked"]:
            print("UNMARKED: made by a release before restore marks. Serve it unchanged, MANIFEST.json included, "
                  "with this release or later: the server marks it at its first start and refuses its unfinished "
                  "tasks; an older release serves it unguarded")
        return
    from .service.client import admin

    token = admin.operator_token(args.token_file)
    if args.admin_cmd == "tasks":
        listing = admin.tasks(args.server, token)
        print(f"server {listing['party']}: {len(listing['tasks'])} tasks")
        print(f"{'task':<34} {'state':<11} {'verified':>8} {'stored':>9} {'counted':>9} {'segments':>8} {'queries':>7}")
        for t in listing["tasks"]:
            counted = "-" if t["counted"] is None else t["counted"]
            note = "  restored unfinished: refused, run it again" if t.get("restored") == "unfinished" else ""
            name = f"  {t['name']}" if t.get("name") else ""
            print(f"{t['task_id']:<34} {t['state']:<11} {'yes' if t['verified_task'] else 'no':>8} {t['stored']:>9} "
                  f"{counted:>9} {t['segment_files']:>8} {t['queries']:>7}{name}{note}")
    elif args.admin_cmd == "close":
        print(json.dumps(admin.close(args.server, token, args.task_id)))
    elif args.admin_cmd == "delete":
        out = admin.delete(args.server, token, args.task_id)
        print(f"task {out['task_id']} {out['reason']}: {out['reports']} report rows and {out['files']} segment files deleted")
    elif args.admin_cmd == "sweep":
        purged = admin.sweep(args.server, token)["purged"]
        print(f"{len(purged)} tasks purged" + "".join(f"\n{p['task_id']} {p['reason']}: {p['reports']} report rows, "
                                                    f"{p['files']} segment files" for p in purged))
    else:
        print(admin.metrics(args.server, token), end="")
