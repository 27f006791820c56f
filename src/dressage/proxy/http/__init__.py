"""The Proxy's HTTP face: the one ASGI app, its request guard, and the routes that map each endpoint to a
serving object. Nothing below this package knows about HTTP."""
