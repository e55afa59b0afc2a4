"""Models as the server holds them: load, serve, unload; states, warmup, the admin requests."""
