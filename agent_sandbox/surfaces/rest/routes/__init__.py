"""The gateway's resources, one router each."""
