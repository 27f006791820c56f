"""What the Proxy records: the recording core and its commit region (StepRecords, the TQ write behind the
answer), sessions and turns, pause and resume, weight versions, and the per-call and per-session limits."""
