"""`gemma-cy serve`: OpenAI's HTTP API over the batching engine (docs/server.md).
Needs the ``server`` extra (FastAPI, uvicorn, prometheus_client)."""
