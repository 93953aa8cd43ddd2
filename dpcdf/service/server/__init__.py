"""One of the two servers: a FastAPI application over a SQLite store, served by uvicorn.

    dpcdf serve --party 0 --port 8000 --data DIR

Routers: health (GET /health, GET /hpke: this server's HPKE public keys), tasks (POST /tasks to
register; for the analyst, with its bearer token, GET /tasks/{id} status and POST /tasks/{id}/close,
which relays the servers' reconciliation), reports (POST /tasks/{id}/reports and .../reports/batch,
binary) and queries (POST /tasks/{id}/query, for the analyst). Every refusal is a 4xx with
{"error": message}. Secrets (noise seeds, key shares, the HPKE private key) never appear in
responses or logs.
"""
from .app import MAX_BODY, TESTING_ENV, create_app, serve
from .errors import HttpError

__all__ = ["create_app", "serve", "HttpError", "MAX_BODY", "TESTING_ENV"]
