"""The gateway's own REST API: /v1/sandboxes and what hangs under it."""
