"""gRPC's HTTP/2 on the asyncio loop: frames, header blocks, streams, the sender, limits, the connection."""
