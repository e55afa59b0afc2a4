"""nereid on Ray Serve."""
