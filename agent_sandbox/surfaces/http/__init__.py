"""What the gateway's HTTP APIs (REST and E2B's) share: API keys and who is calling,
quotas, metrics, the error shape, and streaming between blocking calls and ASGI."""
