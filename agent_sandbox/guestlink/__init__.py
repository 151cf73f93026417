"""The host end of the guest channel: bounded, checked, cancellable."""
