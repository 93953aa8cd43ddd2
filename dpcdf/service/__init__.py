"""The two-server service: task configs, clients that make, seal and upload reports, the report wire
format, HPKE, each server's SQLite store, the servers' reconciliation at the close, the aggregation of
key shares with each server's own noise, the FastAPI server, and the analyst that adds the answers.

May import: `fss`, `dpcdf.release`, `dpcdf.errors`; never `dpcdf.apps` (the applications use the
analyst, not the other way round) nor the CLI.
"""
