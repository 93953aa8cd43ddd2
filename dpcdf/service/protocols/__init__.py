"""The server-to-server protocols: one `channel.Channel` per task that every message goes through
(its key, its named message kinds, the one-shot journal), and each protocol's two sides as objects,
`reconciliation` (ReconcileLeader on server 0, ReconcileHelper on server 1) and `report_check`
(CheckLeader, CheckHelper). The HTTP routers only parse, authenticate and call them."""
