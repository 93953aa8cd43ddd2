"""The reconciliation at the close: `maths` is the exchange's arithmetic on plaintext payloads (the
pair key, bucket digests, drops, the keyed report-set hash: `dpcdf.reconcile`), `exchange` plays
each server's part through the task's channel (ReconcileLeader on server 0, ReconcileHelper on
server 1)."""
