"""nereid's own HTTP/1.1 engine: connections, request reading, heads, limits, the ASGI bridge."""
