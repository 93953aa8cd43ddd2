"""The two-server service: task configs, clients that make, seal and upload reports, the report wire
format, HPKE, each server's SQLite store, the servers' reconciliation at the close, the aggregation of
key shares with each server's own noise, the FastAPI server, and the analyst that adds the answers.

Rooms: the shared wire at the top (`task`, `wire`, `hpke`, `http`, `files`, `processes`); `client/`
(the data holder's reports and spool, the analyst); `storage/` (the SQLite store, the segments);
`verification/` (the report check's arithmetic, which the task config, the client and the protocols
use); `protocols/` (the channel, the reconciliation, the report check's steps); `server/` (the FastAPI app, its
routers and state, the aggregation in-process or on Dask). Routers reach storage and protocols only
through the server's state.

May import: `fss`, `dpcdf.release`, `dpcdf.errors`; never `dpcdf.apps` (the applications use the
analyst, not the other way round) nor the CLI.
"""
