"""Where sandboxes run: runc containers on this host, or Pods of a cluster."""
