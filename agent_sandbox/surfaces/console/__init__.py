"""The web console at /ui: pages over the REST API, signed in with a session cookie."""
