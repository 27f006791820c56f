"""How TransferQueue bytes move: the frame codec, ZMQ request/reply, the bulk TCP stream, and shared
memory between processes on one host."""
