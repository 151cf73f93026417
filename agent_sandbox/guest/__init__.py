"""In-sandbox guest agent and its wire protocol (stdlib only)."""
