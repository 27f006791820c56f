"""The session and trajectory use cases upstream Dressage's clients rely on: finalize, discard, read."""
