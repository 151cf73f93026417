"""The gateway process: the REST and E2B APIs in one ASGI app, on TCP or a unix socket."""
