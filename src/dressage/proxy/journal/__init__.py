"""The Proxy journal: a write-ahead log of its sessions (framing, record codec) replayed on restart."""
